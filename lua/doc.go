// Package lua holds the Redis form of ThrottleKit's algorithms: Lua scripts
// that compute, inside Redis and in one round trip, the very transitions
// package algorithms computes in Go, bit for bit.
//
// lib.lua ports every algorithm line for line (same operations in the same
// order; Go rounds every product on its own with float64(), and the Lua VM
// rounds every operation). The entry scripts (reserve, cancel, pause) are
// lib.lua followed by a few lines each; they are embedded with go:embed and
// run with EVALSHA, falling back to EVAL when Redis answers NOSCRIPT
// (go-redis Script.Run).
//
// Numbers cross the wire as strings formatted with %.17g (Redis truncates Lua
// numbers to integers in replies), and are parsed exactly on both sides. A
// key's state is stored as its numbers separated by spaces, with a TTL after
// which the state is equivalent to a cold key.
//
// reserve_gcra.lua (ReserveGCRA) serves the common case, one dimension of
// the GCRA family (the leaky bucket shaper and GCRA), without lib.lua: the
// same decision and stored state as reserve.lua at a fraction of its cost.
// It replies with its transition's inputs as Redis had them, and
// GCRAReply.Decide recomputes the figures with algorithms.(*GCRA).ReserveTAT;
// the conformance test runs it beside reserve.lua on every GCRA-family
// configuration.
//
// Apart from GCRAReply.Decide, this package knows nothing of the algorithms'
// Go types: package shaper passes each algorithm's kind and parameters
// (algorithms.Algorithm.Params).
package lua
