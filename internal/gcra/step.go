package gcra

import "math"

// Key is what a store holds for one key of the GCRA family, as a
// reservation's step (Kernel.Step) reads it.
type Key struct {
	TAT    float64 // as this kernel reads it (Cold for a new key)
	Ledger *Ledger // nil: none
	// Floor is the instant before which nothing departs: a pause's end or a
	// partner's clamp's next slot (now when neither).
	Floor float64
	// Clamped: a partner's clamp holds the key, one request departs per
	// slot, so Remaining is at most 1.
	Clamped bool
}

// Step is the outcome of one reservation on a key: the decision, and what
// the store keeps.
type Step struct {
	Allowed   bool
	Wait      float64 // ms: the delay when allowed, else how long until it would be
	Remaining int64
	At        float64 // the departure (allowed)
	// TAT is the key's TAT after the step, to store when Moved (it is
	// unchanged when the request took a hole a cancel left).
	TAT   float64
	Moved bool
	Seq   float64 // its sequence number in the Ledger (0: none)
	// Ledger is the key's Ledger after the step (nil: none, or dropped).
	Ledger *Ledger
}

// Step is one reservation of cost at now on key, as reserve_gcra.lua makes
// it in one script: the schedule, the Ledger's holes, the floor and the
// clamp, written to *out (the caller's zero Step). A key with a Ledger
// departs in the earliest hole a cancelled reservation left that fits it
// before its own slot, or else at its slot, recorded in the Ledger. A key
// that once gave back keeps a Ledger while it is held (a Ledger made on a
// busy key could not refund the reservations departing before its older
// departures): on a cold key it starts afresh; one made under another
// contract (changed live) is not used, and dropped at the next slot. The
// arguments are pointers so that the hot path copies nothing; neither is
// kept.
func (k *Kernel) Step(key *Key, now float64, cost int64, out *Step) {
	if key.Ledger != nil {
		k.ledgerStep(key, now, cost, out)
		return
	}
	next, wait, allowed := k.Reserve(key.TAT, now, key.Floor, cost)
	out.Wait, out.TAT = wait, key.TAT
	if !allowed {
		return
	}
	out.Allowed, out.At, out.TAT, out.Moved = true, now+wait, next, true
	out.Remaining = k.clamp(k.Remaining(next, now), key.Clamped)
}

// ledgerStep is Step on a key with a Ledger.
func (k *Kernel) ledgerStep(key *Key, now float64, cost int64, out *Step) {
	next, wait, allowed := k.Reserve(key.TAT, now, key.Floor, cost)
	l := key.Ledger
	out.Ledger, out.TAT = l, key.TAT
	fits := l.Fits(k)
	if fits {
		before := math.Inf(1)
		if allowed {
			before = now + wait
		}
		if at, seq, ok := l.Take(k, now, key.Floor, before, cost); ok {
			out.Allowed, out.Wait, out.At, out.Seq = true, at-now, at, seq
			out.Remaining = k.clamp(k.Remaining(key.TAT, now), key.Clamped)
			return
		}
	}
	out.Wait = wait
	if !allowed {
		return
	}
	out.Allowed, out.At, out.TAT, out.Moved = true, now+wait, next, true
	out.Remaining = k.clamp(k.Remaining(next, now), key.Clamped)
	switch {
	case l.Idle(key.TAT, now): // cold, no hole ahead: a fresh Ledger, whose steps know every departure
		out.Ledger = k.RenewLedger(l, key.TAT, now)
		out.Seq = out.Ledger.Grant(k, out.At, cost)
	case !fits: // busy under another contract: the key goes on without one
		out.Ledger = nil
	default:
		out.Seq = l.Grant(k, out.At, cost)
	}
}

// clamp caps remaining at 1 while a partner's clamp holds the key.
func (k *Kernel) clamp(remaining int64, clamped bool) int64 {
	if clamped && remaining > 1 {
		return 1
	}
	return remaining
}
