/**
 * policyVersion = the number of optimizer steps applied to the weights that produced a token. Version 0 is the
 * initial checkpoint. Versions only grow; a version going backwards is a defect.
 */
import { Schema } from "effect"

export const PolicyVersion = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)).pipe(Schema.brand("PolicyVersion"))
export type PolicyVersion = typeof PolicyVersion.Type

export const make = (n: number): PolicyVersion => PolicyVersion.make(n)
export const initial: PolicyVersion = make(0)
export const next = (v: PolicyVersion): PolicyVersion => make(v + 1)
