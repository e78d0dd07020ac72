// Package shaper is ThrottleKit's public face: an outbound traffic shaper that
// gives every request a departure slot, so that traffic reaches a partner as a
// steady stream inside its contract instead of a burst followed by 429s.
//
// Create a store, then a shaper per contract:
//
//	store := shaper.NewMemoryStore() // one process; shaper.NewRedisStore(client) shares a budget across a fleet
//	defer store.Close()
//	s, err := shaper.New(store, shaper.PerSecond(10)) // or shaper.ParseRate("600/min burst 5")
//	...
//	if err := s.Wait(ctx, "account-42", 1); err != nil {
//		return err // *QueueFullError, *DeadlineError, ctx.Err(), ...
//	}
//	// call the partner
//
// # Which method
//
//   - Wait (most callers): reserve a slot and sleep until it. If the slot
//     would fall after ctx's deadline, it fails at once and gives the slot back.
//   - Reserve: reserve a slot without sleeping; the Reservation says how long
//     to wait, and Cancel gives the slot back if the caller will not go.
//   - Allow: admit only what may leave right now, never queue.
//   - Pause: hold a key for a while (a partner's 429 with Retry-After).
//   - Reset: forget a key.
//
// A request whose wait would exceed MaxQueue (default 30 s) is refused at once
// with a *QueueFullError (errors.Is(err, ErrQueueFull)): the caller learns
// immediately instead of after waiting, and nothing is consumed.
//
// # Algorithms
//
// The default is the leaky-bucket shaper (GCRA that waits). WithAlgorithm
// selects GCRA, TokenBucket, FixedWindow, SlidingWindow, SlidingWindowLog or
// Quota(Daily|Weekly|Monthly|Fixed|Rolling). Algorithms other than the leaky
// bucket cannot hold a slot for later: their Reserve admits or refuses at once
// and their Wait sleeps until the request would be admitted, then tries again.
// The math lives in package algorithms; docs/ALGORITHMS.md gives each
// algorithm's contract.
//
// # Several limits at once
//
// All combines dimensions (requests per minute and tokens per minute, say): a
// request departs when every dimension allows it, and consumes in all of them
// or in none. Each dimension may map the key (an account-wide limit over
// per-user keys) and the cost.
//
// # Errors
//
// Bad input gets a typed error at the call and writes nothing: *ConfigError
// and *RateError (ErrInvalidConfig), *CostError (ErrInvalidCost), *KeyError
// (ErrInvalidKey). A context that is done returns ctx.Err() unchanged.
//
// A Shaper and a MemoryStore are safe for concurrent use.
package shaper
