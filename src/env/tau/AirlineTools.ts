/**
 * The 14 airline tools of tau-bench (`tau_bench/envs/airline/tools/*.py` at 59a200c), in upstream's order, with its
 * checks, error strings and arithmetic (all integers in this domain; nothing is rounded).
 *
 * Upstream bugs kept, because the golden hashes and the observations depend on them:
 * - `book_reservation` takes the first free id of HATHAT, HATHAU, HATHAV and overwrites HATHAV after that; it stores
 *   no `status` and does not decrement seats; certificates are deleted, gift cards debited, cards untouched.
 * - `cancel_reservation` checks no status and refunds no balance (a second cancel appends refunds again).
 * - `update_reservation_flights` never updates `reservation.cabin`.
 * - `get_reservation_details` says `Error: user not found` for an unknown reservation.
 * - `search_onestop_flight` builds the next day as `2024-05-<day+1>` (no zero padding), reads the second leg's
 *   fields from `flight2.dates[date]` (a KeyError when absent) and compares arrival and departure as strings.
 *
 * Departure: `send_certificate` when all three certificate ids are taken returns `None` upstream, which crashes
 * upstream's `step`; here it is the observation `Error: send_certificate returned None`.
 */
import * as Db from "./Db.ts"
import * as Python from "./Python.ts"
import { at, calculate, hasKey, int, objList, str, type Tool, think, transferToHumanAgents } from "./Tool.ts"

interface Segment {
  flight_number?: unknown
  date?: unknown
  price?: unknown
  origin?: unknown
  destination?: unknown
  [key: string]: unknown
}
interface Reservation {
  user_id: string
  cabin: string
  flights: Array<Segment>
  passengers: Array<Db.Obj>
  payment_history: Array<{ payment_id: string; amount: number }>
  nonfree_baggages: number
  [key: string]: unknown
}
interface PaymentMethod {
  source: string
  amount?: number
  [key: string]: unknown
}
interface User {
  payment_methods: Record<string, PaymentMethod>
  reservations: Array<string>
  [key: string]: unknown
}
interface FlightDate {
  status: string
  available_seats?: Record<string, number>
  prices?: Record<string, number>
  [key: string]: unknown
}
interface Flight {
  flight_number: string
  origin: string
  destination: string
  scheduled_departure_time_est: string
  scheduled_arrival_time_est: string
  dates: Record<string, FlightDate>
  [key: string]: unknown
}

/** Looks up a segment's flight and date as booking and flight changes do; an error text, or the priced fields. */
const priceSegment = (db: Db.Db, segment: Segment, cabin: string, passengers: number) => {
  const flightNumber = at<string>(segment, "flight_number")
  if (!Db.has(db, "flights", flightNumber)) return `Error: flight ${flightNumber} not found`
  const flight = Db.get<Flight>(db, "flights", flightNumber)!
  const date = at<string>(segment, "date")
  if (!hasKey(flight.dates, date)) return `Error: flight ${flightNumber} not found on date ${date}`
  const onDate = flight.dates[date]!
  if (onDate.status !== "available") return `Error: flight ${flightNumber} not available on date ${date}`
  if (at<number>(at(onDate, "available_seats"), cabin) < passengers) {
    return `Error: not enough seats on flight ${flightNumber}`
  }
  segment.price = at<number>(at(onDate, "prices"), cabin)
  segment.origin = flight.origin
  segment.destination = flight.destination
  return segment.price as number
}

const bookReservation: Tool = {
  name: "book_reservation",
  params: [
    "user_id",
    "origin",
    "destination",
    "flight_type",
    "cabin",
    "flights",
    "passengers",
    "payment_methods",
    "total_baggages",
    "nonfree_baggages",
    "insurance"
  ],
  run: (db, args) => {
    const userId = str(args, "user_id")
    const cabin = str(args, "cabin")
    const flights = objList(args, "flights") as Array<Segment>
    const passengers = objList(args, "passengers")
    const paymentMethods = objList(args, "payment_methods")
    const nonfree = int(args, "nonfree_baggages")
    if (!Db.has(db, "users", userId)) return "Error: user not found"
    let reservationId = "HATHAT"
    if (Db.has(db, "reservations", reservationId)) {
      reservationId = "HATHAU"
      if (Db.has(db, "reservations", reservationId)) reservationId = "HATHAV"
    }
    const reservation = {
      reservation_id: reservationId,
      user_id: userId,
      origin: args["origin"],
      destination: args["destination"],
      flight_type: args["flight_type"],
      cabin,
      flights,
      passengers,
      payment_history: paymentMethods,
      created_at: "2024-05-15T15:00:00",
      total_baggages: args["total_baggages"],
      nonfree_baggages: nonfree,
      insurance: args["insurance"]
    }
    let totalPrice = 0
    for (const segment of flights) {
      const price = priceSegment(db, segment, cabin, passengers.length)
      if (typeof price === "string") return price
      totalPrice += price * passengers.length
    }
    if (args["insurance"] === "yes") totalPrice += 30 * passengers.length
    totalPrice += 50 * nonfree
    const methods = Db.get<User>(db, "users", userId)!.payment_methods
    for (const payment of paymentMethods) {
      const paymentId = at<string>(payment, "payment_id")
      const amount = at<number>(payment, "amount")
      if (!hasKey(methods, paymentId)) return `Error: payment method ${paymentId} not found`
      const method = methods[paymentId]!
      if ((method.source === "gift_card" || method.source === "certificate") && at<number>(method, "amount") < amount) {
        return `Error: not enough balance in payment method ${paymentId}`
      }
    }
    let paid = 0
    for (const payment of paymentMethods) paid += payment["amount"] as number
    if (paid !== totalPrice) {
      return `Error: payment amount does not add up, total price is ${totalPrice}, but paid ${paid}`
    }
    const user = Db.edit<User>(db, "users", userId)
    for (const payment of paymentMethods) {
      const paymentId = payment["payment_id"] as string
      const method = at<PaymentMethod>(user.payment_methods, paymentId)
      if (method.source === "gift_card") method.amount = (method.amount as number) - (payment["amount"] as number)
      else if (method.source === "certificate") delete user.payment_methods[paymentId]
    }
    Db.put(db, "reservations", reservationId, reservation)
    user.reservations.push(reservationId)
    return Python.dumps(reservation)
  }
}

const cancelReservation: Tool = {
  name: "cancel_reservation",
  params: ["reservation_id"],
  run: (db, args) => {
    const id = str(args, "reservation_id")
    if (!Db.has(db, "reservations", id)) return "Error: reservation not found"
    const reservation = Db.edit<Reservation>(db, "reservations", id)
    const refunds = reservation.payment_history.map((p) => ({ payment_id: p.payment_id, amount: -p.amount }))
    reservation.payment_history.push(...refunds)
    reservation["status"] = "cancelled"
    return Python.dumps(reservation)
  }
}

const getReservationDetails: Tool = {
  name: "get_reservation_details",
  params: ["reservation_id"],
  run: (db, args) => {
    const r = Db.get(db, "reservations", str(args, "reservation_id"))
    return r === undefined ? "Error: user not found" : Python.dumps(r)
  }
}

const getUserDetails: Tool = {
  name: "get_user_details",
  params: ["user_id"],
  run: (db, args) => {
    const u = Db.get(db, "users", str(args, "user_id"))
    return u === undefined ? "Error: user not found" : Python.dumps(u)
  }
}

const airports: ReadonlyArray<readonly [string, string]> = [
  ["SFO", "San Francisco"],
  ["JFK", "New York"],
  ["LAX", "Los Angeles"],
  ["ORD", "Chicago"],
  ["DFW", "Dallas"],
  ["DEN", "Denver"],
  ["SEA", "Seattle"],
  ["ATL", "Atlanta"],
  ["MIA", "Miami"],
  ["BOS", "Boston"],
  ["PHX", "Phoenix"],
  ["IAH", "Houston"],
  ["LAS", "Las Vegas"],
  ["MCO", "Orlando"],
  ["EWR", "Newark"],
  ["CLT", "Charlotte"],
  ["MSP", "Minneapolis"],
  ["DTW", "Detroit"],
  ["PHL", "Philadelphia"],
  ["LGA", "LaGuardia"]
]

const listAllAirports: Tool = {
  name: "list_all_airports",
  params: [],
  run: () => Python.dumps(Object.fromEntries(airports))
}

/** The flight without `dates`, merged with one date's entry (`{k: v for k != "dates"}.update(dates[date])`). */
const onDate = (flight: Flight, entry: FlightDate): Db.Obj => {
  const { dates: _dates, ...rest } = flight
  return { ...rest, ...entry }
}

const searchDirectFlight: Tool = {
  name: "search_direct_flight",
  params: ["origin", "destination", "date"],
  run: (db, args) => {
    const origin = args["origin"]
    const destination = args["destination"]
    const date = str(args, "date")
    const results: Array<Db.Obj> = []
    for (const value of Object.values(db.tables["flights"]!)) {
      const flight = value as Flight
      if (flight.origin === origin && flight.destination === destination) {
        if (hasKey(flight.dates, date) && flight.dates[date]!.status === "available") {
          results.push(onDate(flight, flight.dates[date]!))
        }
      }
    }
    return Python.dumps(results)
  }
}

/** Python `int(s)` for the day of month, with its ValueError text. */
const pyInt = (s: string): number => {
  if (!/^\s*[+-]?\d+\s*$/.test(s))
    throw new Python.PyException(`invalid literal for int() with base 10: ${Python.reprString(s)}`)
  return Number.parseInt(s.trim(), 10)
}

const searchOnestopFlight: Tool = {
  name: "search_onestop_flight",
  params: ["origin", "destination", "date"],
  run: (db, args) => {
    const origin = args["origin"]
    const destination = args["destination"]
    const date = str(args, "date")
    const flights = Object.values(db.tables["flights"]!) as Array<Flight>
    const results: Array<[Db.Obj, Db.Obj]> = []
    for (const flight1 of flights) {
      if (flight1.origin !== origin) continue
      for (const flight2 of flights) {
        if (!(flight2.destination === destination && flight1.destination === flight2.origin)) continue
        const date2 = flight1.scheduled_arrival_time_est.includes("+1") ? `2024-05-${pyInt(date.slice(-2)) + 1}` : date
        if (flight1.scheduled_arrival_time_est > flight2.scheduled_departure_time_est) continue
        if (hasKey(flight1.dates, date) && hasKey(flight2.dates, date2)) {
          if (flight1.dates[date]!.status === "available" && flight2.dates[date2]!.status === "available") {
            const result1 = { ...onDate(flight1, flight1.dates[date]!), date }
            const result2 = { ...onDate(flight2, at<FlightDate>(flight2.dates, date)), date: date2 }
            results.push([result1, result2])
          }
        }
      }
    }
    return Python.dumps(results)
  }
}

const sendCertificate: Tool = {
  name: "send_certificate",
  params: ["user_id", "amount"],
  run: (db, args) => {
    const userId = str(args, "user_id")
    const amount = args["amount"]
    if (!Db.has(db, "users", userId)) return "Error: user not found"
    for (const id of [3221322, 3221323, 3221324]) {
      const paymentId = `certificate_${id}`
      if (!hasKey(Db.get<User>(db, "users", userId)!.payment_methods, paymentId)) {
        const user = Db.edit<User>(db, "users", userId)
        user.payment_methods[paymentId] = { source: "certificate", amount: amount as number, id: paymentId }
        return `Certificate ${paymentId} added to user ${userId} with amount ${typeof amount === "number" ? amount : Python.dumps(amount)}.`
      }
    }
    return "Error: send_certificate returned None"
  }
}

/** The payment method of a reservation's owner for an update, or the update's error text. */
const updatePayment = (db: Db.Db, reservation: Reservation, paymentId: string, price: number) => {
  const methods = at<User>(db.tables["users"], reservation.user_id).payment_methods
  if (!hasKey(methods, paymentId)) return "Error: payment method not found"
  const method = methods[paymentId]!
  if (method.source === "certificate") return "Error: certificate cannot be used to update reservation"
  if (method.source === "gift_card" && at<number>(method, "amount") < price)
    return "Error: gift card balance is not enough"
  return method
}

const chargeGiftCard = (db: Db.Db, userId: string, paymentId: string, price: number): void => {
  const method = Db.edit<User>(db, "users", userId).payment_methods[paymentId]!
  if (method.source === "gift_card") method.amount = (method.amount as number) - price
}

const updateReservationBaggages: Tool = {
  name: "update_reservation_baggages",
  params: ["reservation_id", "total_baggages", "nonfree_baggages", "payment_id"],
  run: (db, args) => {
    const id = str(args, "reservation_id")
    const nonfree = int(args, "nonfree_baggages")
    const paymentId = str(args, "payment_id")
    if (!Db.has(db, "reservations", id)) return "Error: reservation not found"
    const found = Db.get<Reservation>(db, "reservations", id)!
    const totalPrice = 50 * Math.max(0, nonfree - found.nonfree_baggages)
    const method = updatePayment(db, found, paymentId, totalPrice)
    if (typeof method === "string") return method
    const reservation = Db.edit<Reservation>(db, "reservations", id)
    reservation["total_baggages"] = args["total_baggages"]
    reservation.nonfree_baggages = nonfree
    if (method.source === "gift_card") chargeGiftCard(db, reservation.user_id, paymentId, totalPrice)
    if (totalPrice !== 0) reservation.payment_history.push({ payment_id: paymentId, amount: totalPrice })
    return Python.dumps(reservation)
  }
}

const updateReservationFlights: Tool = {
  name: "update_reservation_flights",
  params: ["reservation_id", "cabin", "flights", "payment_id"],
  run: (db, args) => {
    const id = str(args, "reservation_id")
    const cabin = str(args, "cabin")
    const flights = objList(args, "flights") as Array<Segment>
    const paymentId = str(args, "payment_id")
    if (!Db.has(db, "reservations", id)) return "Error: reservation not found"
    const found = Db.get<Reservation>(db, "reservations", id)!
    const passengers = found.passengers.length
    let totalPrice = 0
    for (const segment of flights) {
      const same = found.flights.filter(
        (f) =>
          f.flight_number === at(segment, "flight_number") && f.date === at(segment, "date") && cabin === found.cabin
      )
      if (same.length > 0) {
        const kept = same[0]!
        totalPrice += (kept.price as number) * passengers
        segment.price = kept.price
        segment.origin = kept.origin
        segment.destination = kept.destination
        continue
      }
      const price = priceSegment(db, segment, cabin, passengers)
      if (typeof price === "string") return price
      totalPrice += price * passengers
    }
    let old = 0
    for (const f of found.flights) old += f.price as number
    totalPrice -= old * passengers
    const method = updatePayment(db, found, paymentId, totalPrice)
    if (typeof method === "string") return method
    if (method.source === "gift_card") chargeGiftCard(db, found.user_id, paymentId, totalPrice)
    const reservation = Db.edit<Reservation>(db, "reservations", id)
    reservation.flights = flights
    if (totalPrice !== 0) reservation.payment_history.push({ payment_id: paymentId, amount: totalPrice })
    return Python.dumps(reservation)
  }
}

const updateReservationPassengers: Tool = {
  name: "update_reservation_passengers",
  params: ["reservation_id", "passengers"],
  run: (db, args) => {
    const id = str(args, "reservation_id")
    const passengers = objList(args, "passengers")
    if (!Db.has(db, "reservations", id)) return "Error: reservation not found"
    if (passengers.length !== Db.get<Reservation>(db, "reservations", id)!.passengers.length) {
      return "Error: number of passengers does not match"
    }
    const reservation = Db.edit<Reservation>(db, "reservations", id)
    reservation.passengers = passengers
    return Python.dumps(reservation)
  }
}

/** In upstream's `ALL_TOOLS` order (the order of tools.json). */
export const tools: ReadonlyArray<Tool> = [
  bookReservation,
  calculate,
  cancelReservation,
  getReservationDetails,
  getUserDetails,
  listAllAirports,
  searchDirectFlight,
  searchOnestopFlight,
  sendCertificate,
  think,
  transferToHumanAgents,
  updateReservationBaggages,
  updateReservationFlights,
  updateReservationPassengers
]
