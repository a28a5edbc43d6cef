import { Client } from "@modelcontextprotocol/sdk/client/index.js"
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js"
import { assert, describe, it } from "vitest"
import * as Toolbox from "../../src/toolbox/Toolbox.ts"

describe("toolbox latency", () => {
  it("parses a fixed latency and a MIN-MAX range, and rejects the rest", () => {
    assert.deepStrictEqual(Toolbox.parseLatency("0"), [0, 0])
    assert.deepStrictEqual(Toolbox.parseLatency("50"), [50, 50])
    assert.deepStrictEqual(Toolbox.parseLatency("50-200"), [50, 200])
    assert.deepStrictEqual(Toolbox.parseLatency("2.5-7.5"), [2.5, 7.5])
    for (const bad of ["", "-5", "200-50", "fast", "50-", "50-200-300"]) {
      assert.strictEqual(Toolbox.parseLatency(bad), undefined, bad)
    }
  })

  it("with a range, every call waits between its ends, and not always the same time", async () => {
    const server = Toolbox.make({ latencyMs: 20, latencyMaxMs: 60 })
    const client = new Client({ name: "latency-test", version: "0" })
    const [a, b] = InMemoryTransport.createLinkedPair()
    await Promise.all([server.connect(a), client.connect(b)])
    const waits: Array<number> = []
    for (let i = 0; i < 8; i++) {
      const t0 = performance.now()
      const result = await client.callTool({ name: "add", arguments: { a: i, b: 1 } })
      waits.push(performance.now() - t0)
      assert.deepStrictEqual(result.content, [{ type: "text", text: String(i + 1) }])
    }
    await client.close()
    for (const w of waits) assert.isAtLeast(w, 19, JSON.stringify(waits))
    assert.isBelow(Math.min(...waits), 200, JSON.stringify(waits))
    // 8 uniform draws from a 40 ms range all within 2 ms of each other: odds ~1e-7
    assert.isAbove(Math.max(...waits) - Math.min(...waits), 2, JSON.stringify(waits))
  })
})
