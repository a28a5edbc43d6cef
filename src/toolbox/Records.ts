/**
 * The toolbox's built-in record store: a small, fixed set of customers, orders and products, so that multi-step
 * tasks ("how much did Carol Evans spend?") need chained lookups: `find_customer(name) → id`,
 * `get_orders(customer_id) → order ids`, `get_order(order_id) → { item, price, qty }`. Task generators read the
 * same data to compute ground truth, so the answers and the server can never disagree.
 */

export interface Customer {
  readonly id: string
  readonly name: string
  readonly city: string
}

export interface Order {
  readonly id: string
  readonly customerId: string
  readonly item: string
  readonly price: number // per unit, whole currency units
  readonly qty: number
}

export const customers: ReadonlyArray<Customer> = [
  { id: "C001", name: "Alice Chen", city: "Oslo" },
  { id: "C002", name: "Bob Diaz", city: "Lima" },
  { id: "C003", name: "Carol Evans", city: "Perth" },
  { id: "C004", name: "Dan Fox", city: "Oslo" },
  { id: "C005", name: "Eve Green", city: "Kyoto" },
  { id: "C006", name: "Frank Hill", city: "Lima" }
]

export const orders: ReadonlyArray<Order> = [
  { id: "O1001", customerId: "C001", item: "lamp", price: 25, qty: 2 },
  { id: "O1002", customerId: "C001", item: "desk", price: 120, qty: 1 },
  { id: "O1003", customerId: "C002", item: "chair", price: 45, qty: 4 },
  { id: "O1004", customerId: "C003", item: "pen", price: 3, qty: 10 },
  { id: "O1005", customerId: "C003", item: "notebook", price: 7, qty: 5 },
  { id: "O1006", customerId: "C003", item: "lamp", price: 25, qty: 1 },
  { id: "O1007", customerId: "C004", item: "monitor", price: 180, qty: 2 },
  { id: "O1008", customerId: "C005", item: "keyboard", price: 60, qty: 1 },
  { id: "O1009", customerId: "C005", item: "mouse", price: 20, qty: 3 },
  { id: "O1010", customerId: "C006", item: "chair", price: 45, qty: 2 }
]

const normalise = (name: string) => name.trim().toLowerCase().replace(/\s+/g, " ")

/** Case- and whitespace-insensitive exact name match. */
export const findCustomer = (name: string): Customer | undefined =>
  customers.find((c) => normalise(c.name) === normalise(name))

export const ordersOf = (customerId: string): ReadonlyArray<Order> =>
  orders.filter((o) => o.customerId === customerId.trim().toUpperCase())

export const findOrder = (orderId: string): Order | undefined =>
  orders.find((o) => o.id === orderId.trim().toUpperCase())

/** Σ price·qty over a customer's orders: the ground truth of "how much did X spend". */
export const totalSpent = (customerId: string): number =>
  ordersOf(customerId).reduce((sum, o) => sum + o.price * o.qty, 0)
