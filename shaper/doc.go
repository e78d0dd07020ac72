// Package shaper gives every outbound request a departure slot, so that a
// service's traffic reaches a partner as a steady stream inside its contract
// instead of a burst followed by 429s.
//
// A shaper keeps each key's state in a store, from package memstore or
// package redisstore:
//
//	store := memstore.New() // or redisstore.New(client): one budget for a fleet
//	defer store.Close()
//	s, err := shaper.New(store, shaper.PerSecond(10)) // or shaper.ParseRate("600/min burst 5")
//	...
//	if err := s.Wait(ctx, "account-42", 1); err != nil {
//		return err // *QueueFullError, *DeadlineError, ctx.Err(), ...
//	}
//	// call the partner
//
// Most callers want Wait. Reserve returns the slot without sleeping; Allow
// admits only what may leave now; Status reads what is left without
// consuming; Pause holds a key (a partner's 429); Clamp spreads what a
// partner says is left until its reset; Reset forgets it. A wait
// longer than MaxQueue is refused at once with a *QueueFullError and
// consumes nothing. All combines several contracts (requests and tokens per
// minute); Any admits what any one of them admits. A dimension with
// InFlight caps the calls open at once beside the rates, fleet-wide: each
// reservation holds a permit until Reservation.Release. A request whose
// ctx carries a Flow (WithFlow: a tenant, its weight and priority class)
// waits in Wait, Acquire or AwaitTurn for its flow's turn among the
// requests waiting on its key, fleet-wide, instead of arrival order
// (docs/FAIRNESS.md). SetRate and SetMaxQueue
// change a running shaper's contract, and every process sharing its Redis
// budget follows. WithLearning makes a shaper learn each key's rate from
// its partner's feedback (Learn, which package transport calls for every
// response), below its own contract, fleet-wide (docs/LEARNING.md); Space
// keeps a margin between a strict contract's departures, for a partner
// that measures their spacing strictly. Bad input gets a typed error and
// writes nothing; a done ctx returns ctx.Err() unchanged. Shapers and
// stores are safe for concurrent use.
//
// Package partner declares a partner's limits as its documentation states
// them (trailing or fixed windows, token buckets, nginx's limit_req,
// concurrency) and returns the shaper that keeps them, allowing for the
// lateness of departures: start there for a partner's stated limits
// (docs/START.md).
//
// Package transport paces an http.Client, package queue runs a paced worker
// pool, and package otelshaper records metrics and traces. Each takes a
// Reserver: a *Shaper, or Route's choice of one per key. The transport and
// otelshaper use a Reserver's optional capabilities (Acquirer, StatusReader,
// Clamper, Learner, Spacer) when it has them. The docs/ folder says what
// each algorithm guarantees and how a fleet shares a budget.
package shaper
