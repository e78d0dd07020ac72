// Package algorithms is ThrottleKit's rate-limiting math: one pure transition
// per algorithm, (state, now, cost) -> (state, decision), with no clock reads,
// no goroutines, no I/O and no allocation on a warm key.
//
// Most users want package shaper, which keeps per-key state in memory or in
// Redis and reads the clock. This package is for those who store state
// themselves, and it is the specification the Redis Lua scripts follow bit
// for bit.
//
// # Algorithms
//
//   - [NewLeakyBucket]: the shaper. Every request is given a departure slot;
//     it waits rather than being refused, unless the wait would exceed
//     MaxQueue. This is ThrottleKit's default.
//   - [NewGCRA]: the same recurrence, refusing instead of waiting.
//   - [NewTokenBucket]: a bucket of Burst tokens refilled continuously.
//   - [NewFixedWindow]: a counter per epoch-aligned window.
//   - [NewSlidingWindow]: a weighted estimate over S sub-buckets.
//   - [NewSlidingLog]: an exact log of admissions in the window.
//   - [NewQuota]: a limit per calendar day, week or month at a fixed UTC
//     offset, per fixed period from an anchor, or over a rolling window.
//   - [All]: several of the above at once (requests per minute and tokens per
//     minute, say), committing in every dimension or in none.
//
// # Time and numbers
//
// Instants are float64 milliseconds since the Unix epoch ([Millis]) and
// durations float64 milliseconds; decisions come back as time.Duration, rounded
// up to the nanosecond, never to the millisecond. The Lua scripts use the same
// numbers in the same order of operations (products are wrapped in float64() so
// that no platform fuses a multiply-add), so Go and Redis compute identical
// states. Near the present, float64 milliseconds resolve 2^-12 ms, about 0.24
// µs. Rounding never makes a slot early: the GCRA family's interval is
// Period/Count rounded up to a whole 2^-12 ms, so that on a present-day key
// every sum is exact (a burst is whole); any other TAT it stores is rounded up,
// never to nearest; and delays become time.Duration rounded up to the
// nanosecond. A backlogged key may therefore run slower than its rate by less
// than one step per request, at most 2.4 % at the fastest rate accepted and
// 0.24 % at 10,000/s ([MinInterval] gives the figures). (Where a figure exceeds
// 2^53 steps, T*Burst + MaxQueue beyond 70 years, the delay is rounded to
// nearest from its slot, as the Lua scripts compute it.) The token bucket keeps
// its level as credit (tokens times Period, refilled by elapsed ms times
// Count), which is exact in whole milliseconds, so it never refuses a request
// that exact arithmetic admits there.
//
// # Contracts
//
// Every transition obeys three rules, checked by the property tests and the
// fuzz target over timelines that include clock steps backwards:
//
//  1. A refused request never changes state.
//  2. The admitted cost never exceeds the algorithm's contract (documented on
//     each constructor) in any window.
//  3. Every figure is finite and every delay is >= 0.
//
// A clock that steps backwards is treated conservatively: no algorithm refills
// or opens a new window because time seemed to run backwards.
//
// # State
//
// A [State] is a short []float64; nil is a cold key. Transitions may write into
// the State they are given (that is how they avoid allocating), so a caller
// that wants to keep the old state must copy it first. Each constructor's doc
// gives the layout.
package algorithms
