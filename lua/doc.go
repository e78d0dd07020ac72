// Package lua holds the Redis form of ThrottleKit's algorithms: Lua scripts
// that compute, inside Redis and in one round trip, the very transitions
// package algorithms computes in Go, bit for bit. It exports the scripts'
// text, for audit; the Redis store runs them.
//
// Lib ports every algorithm line for line (same operations in the same
// order; Go rounds every product on its own with float64(), and the Lua VM
// rounds every operation). The entry scripts (Reserve, Settle, Status, Pause) are
// Lib followed by a few lines each. ReserveGCRA serves the common case, one
// dimension of the leaky bucket or GCRA, without Lib: the same decision and
// stored state as Reserve at a fraction of its cost; it replies with its
// transition's inputs and the store recomputes the figures with the Go
// kernel. Ledger ports the rule by which a key gives back what settled and
// cancelled reservations did not use; the scripts call it only for a key
// that has a Ledger. ReserveBatch decides many reservations in one call
// (the store's coalescing) by running the bodies of ReserveGCRA and Reserve
// in turn, each under pcall, so that every reservation gets its own reply or
// error, exactly as its own call would.
//
// PermitTake, PermitRelease, PermitRenew and PermitCount keep an in-flight
// key's leases (a sorted set of lease ids scored by their expiry on the
// script's clock): they are bookkeeping, not one of the algorithms, and
// have no Go twin to match.
//
// A key's state is stored as its numbers (%.17g) separated by spaces, with a
// TTL after which the state is equivalent to a cold key. The conformance
// test of package algorithms runs every script beside the Go math, step by
// step, on every configuration, against a golden transcript.
package lua
