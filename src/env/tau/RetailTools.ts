/**
 * The 16 retail tools of tau-bench (`tau_bench/envs/retail/tools/*.py` at 59a200c), in upstream's `ALL_TOOLS` order,
 * with upstream's checks in upstream's order, its error strings, and its arithmetic in its order (so float results
 * are bit-identical): see shared/tau-bench/README.md, "Tools that change the DB".
 *
 * Quirks kept on purpose: `modify_pending_order_items` stores the unrounded `abs(diff)`; gift cards are detected by
 * `source == "gift_card"` in some tools and by `"gift_card" in id` in others; the cancel refund entries are appended
 * after the status change; `find_user_id_*` return the first match in file order.
 */
import * as Db from "./Db.ts"
import * as Python from "./Python.ts"
import { at, calculate, count, hasKey, str, strList, type Tool, think, transferToHumanAgents } from "./Tool.ts"

interface Item {
  name: string
  product_id: string
  item_id: string
  price: number
  options: Db.Obj
}
interface Payment {
  transaction_type: string
  amount: number
  payment_method_id: string
}
interface Order {
  user_id: string
  status: string
  items: Array<Item>
  payment_history: Array<Payment>
  [key: string]: unknown
}
interface PaymentMethod {
  source: string
  balance?: number
  [key: string]: unknown
}
interface User {
  name: { first_name: string; last_name: string }
  address: { zip: string }
  email: string
  payment_methods: Record<string, PaymentMethod>
  [key: string]: unknown
}
interface Variant {
  item_id: string
  options: Db.Obj
  available: boolean
  price: number
}
interface Product {
  name: string
  product_id: string
  variants: Record<string, Variant>
}

const order = (db: Db.Db, id: string) => Db.get<Order>(db, "orders", id)
const userOf = (db: Db.Db, o: Order) => at<User>(db.tables["users"], o.user_id)
const product = (db: Db.Db, id: string) => at<Product>(db.tables["products"], id)

const addressArgs = (args: Db.Obj) => ({
  address1: str(args, "address1"),
  address2: str(args, "address2"),
  city: str(args, "city"),
  state: str(args, "state"),
  country: str(args, "country"),
  zip: str(args, "zip")
})
const addressParams = ["address1", "address2", "city", "state", "country", "zip"]

/** The first order item with this id (upstream: `[item for item in order["items"] if …][0]`). */
const firstItem = (o: Order, itemId: string): Item => {
  const item = o.items.find((i) => i.item_id === itemId)
  if (item === undefined) throw new Python.PyException("list index out of range")
  return item
}

/** Python `list[0]`. */
const first = <T>(list: ReadonlyArray<T>): T => {
  if (list.length === 0) throw new Python.PyException("list index out of range")
  return list[0]!
}

/** Checks shared by exchange and modify-items: counts, lengths, availability; returns Σ(new − old) from 0. */
const itemSwapDiff = (db: Db.Db, o: Order, itemIds: ReadonlyArray<string>, newItemIds: ReadonlyArray<string>) => {
  const all = o.items.map((i) => i.item_id)
  for (const id of itemIds) {
    if (count(itemIds, id) > count(all, id)) return `Error: ${id} not found`
  }
  if (itemIds.length !== newItemIds.length) return "Error: the number of items to be exchanged should match"
  let diff = 0
  for (const [k, id] of itemIds.entries()) {
    const newId = newItemIds[k]!
    const item = firstItem(o, id)
    const variants = product(db, item.product_id).variants
    if (!(hasKey(variants, newId) && variants[newId]!.available)) {
      return `Error: new item ${newId} not found or available`
    }
    diff += variants[newId]!.price - item.price
  }
  return diff
}

const cancelPendingOrder: Tool = {
  name: "cancel_pending_order",
  params: ["order_id", "reason"],
  run: (db, args) => {
    const id = str(args, "order_id")
    const reason = args["reason"]
    const found = order(db, id)
    if (found === undefined) return "Error: order not found"
    if (found.status !== "pending") return "Error: non-pending order cannot be cancelled"
    if (reason !== "no longer needed" && reason !== "ordered by mistake") return "Error: invalid reason"
    const o = Db.edit<Order>(db, "orders", id)
    const refunds: Array<Payment> = []
    for (const payment of o.payment_history) {
      const paymentId = payment.payment_method_id
      refunds.push({ transaction_type: "refund", amount: payment.amount, payment_method_id: paymentId })
      if (paymentId.includes("gift_card")) {
        const user = Db.edit<User>(db, "users", o.user_id)
        const method = at<PaymentMethod>(user.payment_methods, paymentId)
        method.balance = Python.round2(at<number>(method, "balance") + payment.amount)
      }
    }
    o.status = "cancelled"
    o["cancel_reason"] = reason
    o.payment_history.push(...refunds)
    return Python.dumps(o)
  }
}

const exchangeDeliveredOrderItems: Tool = {
  name: "exchange_delivered_order_items",
  params: ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
  run: (db, args) => {
    const id = str(args, "order_id")
    const itemIds = strList(args, "item_ids")
    const newItemIds = strList(args, "new_item_ids")
    const paymentMethodId = str(args, "payment_method_id")
    const found = order(db, id)
    if (found === undefined) return "Error: order not found"
    if (found.status !== "delivered") return "Error: non-delivered order cannot be exchanged"
    const diff = itemSwapDiff(db, found, itemIds, newItemIds)
    if (typeof diff === "string") return diff
    const diffPrice = Python.round2(diff)
    const methods = userOf(db, found).payment_methods
    if (!hasKey(methods, paymentMethodId)) return "Error: payment method not found"
    const method = methods[paymentMethodId]!
    if (method.source === "gift_card" && at<number>(method, "balance") < diffPrice) {
      return "Error: insufficient gift card balance to pay for the price difference"
    }
    const o = Db.edit<Order>(db, "orders", id)
    o.status = "exchange requested"
    o["exchange_items"] = [...itemIds].sort()
    o["exchange_new_items"] = [...newItemIds].sort()
    o["exchange_payment_method_id"] = paymentMethodId
    o["exchange_price_difference"] = diffPrice
    return Python.dumps(o)
  }
}

const findUserIdByEmail: Tool = {
  name: "find_user_id_by_email",
  params: ["email"],
  run: (db, args) => {
    const email = str(args, "email").toLowerCase()
    for (const [userId, profile] of Object.entries(db.tables["users"]!)) {
      if ((profile as User).email.toLowerCase() === email) return userId
    }
    return "Error: user not found"
  }
}

const findUserIdByNameZip: Tool = {
  name: "find_user_id_by_name_zip",
  params: ["first_name", "last_name", "zip"],
  run: (db, args) => {
    const first = str(args, "first_name").toLowerCase()
    const last = str(args, "last_name").toLowerCase()
    const zip = str(args, "zip")
    for (const [userId, profile] of Object.entries(db.tables["users"]!)) {
      const u = profile as User
      if (
        u.name.first_name.toLowerCase() === first &&
        u.name.last_name.toLowerCase() === last &&
        u.address.zip === zip
      ) {
        return userId
      }
    }
    return "Error: user not found"
  }
}

const getter = (name: string, param: string, table: string, missing: string): Tool => ({
  name,
  params: [param],
  run: (db, args) => {
    const value = Db.get(db, table, str(args, param))
    return value === undefined ? missing : Python.dumps(value)
  }
})

const listAllProductTypes: Tool = {
  name: "list_all_product_types",
  params: [],
  run: (db) => {
    const byName = new Map<string, string>()
    for (const p of Object.values(db.tables["products"]!)) byName.set((p as Product).name, (p as Product).product_id)
    const sorted = [...byName.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    return Python.dumps(Object.fromEntries(sorted))
  }
}

const modifyPendingOrderAddress: Tool = {
  name: "modify_pending_order_address",
  params: ["order_id", ...addressParams],
  run: (db, args) => {
    const id = str(args, "order_id")
    const address = addressArgs(args)
    const found = order(db, id)
    if (found === undefined) return "Error: order not found"
    if (found.status !== "pending") return "Error: non-pending order cannot be modified"
    const o = Db.edit<Order>(db, "orders", id)
    o["address"] = address
    return Python.dumps(o)
  }
}

const modifyPendingOrderItems: Tool = {
  name: "modify_pending_order_items",
  params: ["order_id", "item_ids", "new_item_ids", "payment_method_id"],
  run: (db, args) => {
    const id = str(args, "order_id")
    const itemIds = strList(args, "item_ids")
    const newItemIds = strList(args, "new_item_ids")
    const paymentMethodId = str(args, "payment_method_id")
    const found = order(db, id)
    if (found === undefined) return "Error: order not found"
    if (found.status !== "pending") return "Error: non-pending order cannot be modified"
    const diffPrice = itemSwapDiff(db, found, itemIds, newItemIds)
    if (typeof diffPrice === "string") return diffPrice
    if (!hasKey(userOf(db, found).payment_methods, paymentMethodId)) return "Error: payment method not found"
    const current = userOf(db, found).payment_methods[paymentMethodId]!
    if (current.source === "gift_card" && at<number>(current, "balance") < diffPrice) {
      return "Error: insufficient gift card balance to pay for the new item"
    }
    const o = Db.edit<Order>(db, "orders", id)
    // not rounded: upstream stores abs(diff) as summed, e.g. 0.009999999999990905
    o.payment_history.push({
      transaction_type: diffPrice > 0 ? "payment" : "refund",
      amount: Math.abs(diffPrice),
      payment_method_id: paymentMethodId
    })
    if (current.source === "gift_card") {
      const method = Db.edit<User>(db, "users", o.user_id).payment_methods[paymentMethodId]!
      method.balance = Python.round2(method.balance! - diffPrice)
    }
    for (const [k, itemId] of itemIds.entries()) {
      const newId = newItemIds[k]!
      const item = firstItem(o, itemId)
      const variant = product(db, item.product_id).variants[newId]!
      item.item_id = newId
      item.price = variant.price
      item.options = structuredClone(variant.options)
    }
    o.status = "pending (item modified)"
    return Python.dumps(o)
  }
}

const modifyPendingOrderPayment: Tool = {
  name: "modify_pending_order_payment",
  params: ["order_id", "payment_method_id"],
  run: (db, args) => {
    const id = str(args, "order_id")
    const paymentMethodId = str(args, "payment_method_id")
    const found = order(db, id)
    if (found === undefined) return "Error: order not found"
    if (found.status !== "pending") return "Error: non-pending order cannot be modified"
    const methods = userOf(db, found).payment_methods
    if (!hasKey(methods, paymentMethodId)) return "Error: payment method not found"
    const history = found.payment_history
    if (history.length > 1 || first(history).transaction_type !== "payment") {
      return "Error: there should be exactly one payment for a pending order"
    }
    const oldId = history[0]!.payment_method_id
    if (oldId === paymentMethodId) return "Error: the new payment method should be different from the current one"
    const amount = history[0]!.amount
    const method = methods[paymentMethodId]!
    if (method.source === "gift_card" && at<number>(method, "balance") < amount) {
      return "Error: insufficient gift card balance to pay for the order"
    }
    const o = Db.edit<Order>(db, "orders", id)
    o.payment_history.push(
      { transaction_type: "payment", amount, payment_method_id: paymentMethodId },
      { transaction_type: "refund", amount, payment_method_id: oldId }
    )
    if (method.source === "gift_card") {
      const m = Db.edit<User>(db, "users", o.user_id).payment_methods[paymentMethodId]!
      m.balance = Python.round2(m.balance! - amount)
    }
    if (oldId.includes("gift_card")) {
      const old = at<PaymentMethod>(Db.edit<User>(db, "users", o.user_id).payment_methods, oldId)
      old.balance = Python.round2(at<number>(old, "balance") + amount)
    }
    return Python.dumps(o)
  }
}

const modifyUserAddress: Tool = {
  name: "modify_user_address",
  params: ["user_id", ...addressParams],
  run: (db, args) => {
    const userId = str(args, "user_id")
    const address = addressArgs(args)
    if (!Db.has(db, "users", userId)) return "Error: user not found"
    const user = Db.edit<User>(db, "users", userId)
    user["address"] = address
    return Python.dumps(user)
  }
}

const returnDeliveredOrderItems: Tool = {
  name: "return_delivered_order_items",
  params: ["order_id", "item_ids", "payment_method_id"],
  run: (db, args) => {
    const id = str(args, "order_id")
    const itemIds = strList(args, "item_ids")
    const paymentMethodId = str(args, "payment_method_id")
    const found = order(db, id)
    if (found === undefined) return "Error: order not found"
    if (found.status !== "delivered") return "Error: non-delivered order cannot be returned"
    if (!hasKey(userOf(db, found).payment_methods, paymentMethodId)) return "Error: payment method not found"
    if (!paymentMethodId.includes("gift_card") && paymentMethodId !== first(found.payment_history).payment_method_id) {
      return "Error: payment method should be either the original payment method or a gift card"
    }
    const all = found.items.map((i) => i.item_id)
    for (const itemId of itemIds) {
      if (count(itemIds, itemId) > count(all, itemId)) return "Error: some item not found"
    }
    const o = Db.edit<Order>(db, "orders", id)
    o.status = "return requested"
    o["return_items"] = [...itemIds].sort()
    o["return_payment_method_id"] = paymentMethodId
    return Python.dumps(o)
  }
}

/** In upstream's `ALL_TOOLS` order (the order of tools.json). */
export const tools: ReadonlyArray<Tool> = [
  calculate,
  cancelPendingOrder,
  exchangeDeliveredOrderItems,
  findUserIdByEmail,
  findUserIdByNameZip,
  getter("get_order_details", "order_id", "orders", "Error: order not found"),
  getter("get_product_details", "product_id", "products", "Error: product not found"),
  getter("get_user_details", "user_id", "users", "Error: user not found"),
  listAllProductTypes,
  modifyPendingOrderAddress,
  modifyPendingOrderItems,
  modifyPendingOrderPayment,
  modifyUserAddress,
  returnDeliveredOrderItems,
  think,
  transferToHumanAgents
]
