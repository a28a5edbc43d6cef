import { readFileSync } from "node:fs"
import * as path from "node:path"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Db from "../../../src/env/tau/Db.ts"
import * as Hash from "../../../src/env/tau/Hash.ts"
import * as Python from "../../../src/env/tau/Python.ts"
import * as Reward from "../../../src/env/tau/Reward.ts"

const dataDir = path.resolve("../shared/tau-bench")

interface Golden {
  readonly initial: { readonly canonical_hash: string }
  readonly tasks: ReadonlyArray<{
    readonly split: string
    readonly id: number
    readonly canonical_hash: string
    readonly observations: ReadonlyArray<{ action: string; is_error: boolean; observation: string | null }>
  }>
}
const golden = (domain: Db.Domain): Golden =>
  JSON.parse(readFileSync(path.join(dataDir, domain, "golden.json"), "utf8")) as Golden

const load = (domain: Db.Domain) => Db.loadDomain(dataDir, domain).pipe(Effect.provide(NodeServices.layer))

const task = (data: Db.DomainData, split: string, id: number) =>
  data.tasks.find((t) => t.split === split && t.id === id)!

describe("Hash.canon", () => {
  it("writes the README's example with sorted keys, JS numbers and -0 as 0", () => {
    const value = { b: [1, 46.0, "x", ["only"]], a: { z: true, y: null }, c: {}, d: 0.1, e: -0.0, f: 1e-7 }
    assert.strictEqual(
      Hash.canon(value),
      '{"a":{"y":null,"z":true},"b":[1,46,"x",["only"]],"c":{},"d":0.1,"e":0,"f":1e-7}'
    )
    assert.strictEqual(Hash.hash(value), "30539510d82f993201f9629f7c97e2b7ff2ba6fcadac8f957fe84fc423d1675c")
  })

  it("sorts integer-like keys as strings, which JSON.stringify of a sorted object would not", () => {
    assert.strictEqual(Hash.canon({ b: 1, "429815": 2, a: 3 }), '{"429815":2,"a":3,"b":1}')
    assert.strictEqual(Hash.canon({ "10": 1, "9": 2 }), '{"10":1,"9":2}')
  })
})

describe("Python", () => {
  it("round2 rounds the exact binary value half to even: 1.115 → 1.11, 2.675 → 2.67, 0.125 → 0.12, 0.375 → 0.38", () => {
    assert.deepStrictEqual(
      [1.115, 2.675, 0.125, 0.375, -0.125, 1093.345].map(Python.round2),
      [1.11, 2.67, 0.12, 0.38, -0.12, 1093.35]
    )
  })

  it("reprFloat writes Python's float repr", () => {
    assert.deepStrictEqual([46, 0.1, 1e-5, 1e16, -0, 2.33, 123456789012345.6].map(Python.reprFloat), [
      "46.0",
      "0.1",
      "1e-05",
      "1e+16",
      "-0.0",
      "2.33",
      "123456789012345.6"
    ])
  })

  it("calculate evaluates Python arithmetic and always prints a float", () => {
    assert.strictEqual(Python.calculate("2 + 2"), "4.0")
    assert.strictEqual(Python.calculate("7 / 3"), "2.33")
    assert.strictEqual(Python.calculate("(1 + 2) * -3 ** 2"), "-27.0")
    assert.strictEqual(Python.calculate("7 // 2 + 2 ** -1"), "3.5")
    assert.strictEqual(Python.calculate("1093.34 - 46.0"), "1047.34")
    assert.strictEqual(Python.calculate("1/0"), "Error: division by zero")
    assert.strictEqual(Python.calculate("2 + x"), "Error: invalid characters in expression")
    assert.strictEqual(Python.calculate("2 +"), "Error: invalid syntax (<string>, line 1)")
    assert.isTrue(Python.calculate("012 + 1").startsWith("Error: leading zeros in decimal integer literals"))
  })

  it("dumps uses json.dumps separators", () => {
    assert.strictEqual(Python.dumps({ a: [1, "x"], b: { c: null } }), '{"a": [1, "x"], "b": {"c": null}}')
  })
})

describe("tau-bench tools: golden replays", () => {
  it.effect("every golden task's ground truth gives its canonical_hash, and the tool texts upstream gave", () =>
    Effect.gen(function* () {
      const counts: Record<string, number> = {}
      for (const domain of Db.domains) {
        const data = yield* load(domain)
        const g = golden(domain)
        assert.strictEqual(Reward.hashDb(Db.fresh(data)), g.initial.canonical_hash)
        for (const expected of g.tasks) {
          const { db, observations } = Reward.replay(data, task(data, expected.split, expected.id).actions)
          assert.strictEqual(Reward.hashDb(db), expected.canonical_hash, `${domain} ${expected.split} ${expected.id}`)
          const shown = expected.observations.filter((o) => o.action !== "transfer_to_human_agents")
          for (const [i, o] of shown.entries()) {
            const got = observations[i]!
            assert.strictEqual(got.action, o.action)
            assert.strictEqual(got.isError, o.is_error, `${domain} ${expected.split} ${expected.id} #${i}`)
            if (o.observation === null) continue
            // JSON texts differ in key order and in 46 vs 46.0 only; compare them as values
            if (o.observation.startsWith("{") || o.observation.startsWith("[")) {
              assert.deepStrictEqual(JSON.parse(got.text), JSON.parse(o.observation))
            } else {
              assert.strictEqual(got.text, o.observation, `${domain} ${expected.split} ${expected.id} #${i}`)
            }
          }
          const key = `${domain}/${expected.split}`
          counts[key] = (counts[key] ?? 0) + 1
        }
      }
      assert.deepStrictEqual(counts, { "retail/train": 500, "retail/dev": 20, "retail/test": 10, "airline/test": 10 })
    })
  )
})

describe("tau-bench tools: upstream's error strings", () => {
  const run = (
    domain: Db.Domain,
    name: string,
    kwargs: Record<string, unknown>,
    setup: ReadonlyArray<Db.Action> = []
  ) =>
    Effect.map(load(domain), (data) => {
      const db = Reward.replay(data, setup).db
      const before = Reward.hashDb(db)
      const out = Reward.act(db, { name, kwargs })
      return { text: out.text, isError: out.isError, changed: Reward.hashDb(db) !== before, db }
    })

  it.effect("retail: the checks' texts, in upstream's order, change nothing", () =>
    Effect.gen(function* () {
      const cases: ReadonlyArray<[string, Record<string, unknown>, string]> = [
        ["cancel_pending_order", { order_id: "#W0000000", reason: "no longer needed" }, "Error: order not found"],
        [
          "cancel_pending_order",
          { order_id: "#W2611340", reason: "no longer needed" },
          "Error: non-pending order cannot be cancelled"
        ],
        ["get_order_details", { order_id: "W2611340" }, "Error: order not found"],
        ["get_product_details", { product_id: "6469567736" }, "Error: product not found"],
        ["get_user_details", { user_id: "nobody" }, "Error: user not found"],
        ["find_user_id_by_email", { email: "nobody@example.com" }, "Error: user not found"],
        [
          "return_delivered_order_items",
          { order_id: "#W2611340", item_ids: [], payment_method_id: "x" },
          "Error: non-delivered order cannot be returned"
        ],
        [
          "modify_user_address",
          { user_id: "nobody", address1: "", address2: "", city: "", state: "", country: "", zip: "" },
          "Error: user not found"
        ],
        [
          "modify_user_address",
          { user_id: "noah_brown_6181" },
          "Error: ModifyUserAddress.invoke() missing 6 required positional arguments: 'address1', 'address2', 'city', 'state', 'country', and 'zip'"
        ],
        [
          "get_user_details",
          { user_id: "x", extra: 1 },
          "Error: GetUserDetails.invoke() got an unexpected keyword argument 'extra'"
        ],
        ["lookup_everything", {}, "Unknown action lookup_everything"]
      ]
      for (const [name, kwargs, text] of cases) {
        const out = yield* run("retail", name, kwargs)
        assert.strictEqual(out.text, text, name)
        assert.isTrue(out.isError)
        assert.isFalse(out.changed)
      }
    })
  )

  it.effect(
    'retail: find_user_id_by_email is case-insensitive; think returns ""; transfer says Transfer successful',
    () =>
      Effect.gen(function* () {
        assert.strictEqual(
          (yield* run("retail", "find_user_id_by_email", { email: "NOAH.BROWN7922@example.com" })).text,
          "noah_brown_6181"
        )
        assert.strictEqual((yield* run("retail", "think", { thought: "hm" })).text, "")
        assert.strictEqual(
          (yield* run("retail", "transfer_to_human_agents", { summary: "s" })).text,
          "Transfer successful"
        )
      })
  )

  it.effect("airline: get_reservation_details says user not found (sic); bookings take HATHAT, HATHAU, HATHAV", () =>
    Effect.gen(function* () {
      assert.strictEqual(
        (yield* run("airline", "get_reservation_details", { reservation_id: "ZZZZZZ" })).text,
        "Error: user not found"
      )
      const data = yield* load("airline")
      const { observations } = Reward.replay(data, task(data, "test", 9).actions)
      const ids = observations
        .filter((o) => o.action === "book_reservation")
        .map((o) => JSON.parse(o.text).reservation_id)
      assert.deepStrictEqual(ids, ["HATHAT", "HATHAU", "HATHAV"])
      const certificate = yield* run("airline", "send_certificate", { user_id: "mia_li_3668", amount: 50 })
      assert.strictEqual(certificate.text, "Certificate certificate_3221322 added to user mia_li_3668 with amount 50.")
      assert.isTrue(certificate.changed)
    })
  )

  it.effect("edits stay private to their DB: a fresh DB still hashes to the initial hash", () =>
    Effect.gen(function* () {
      const data = yield* load("retail")
      Reward.replay(data, task(data, "test", 32).actions)
      assert.strictEqual(Reward.hashDb(Db.fresh(data)), golden("retail").initial.canonical_hash)
    })
  )
})
