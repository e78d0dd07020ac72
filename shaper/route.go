package shaper

import (
	"context"
	"time"
)

// Route returns a Reserver that sends each call to the Reserver pick returns
// for its key (a shaper per partner host, say), behind one transport or
// queue. pick runs on every call and must be safe for concurrent use; a key
// it maps to nil fails with a *KeyError and reserves nothing. The Reserver
// also has Acquire, Status and Clamp (see Shaper), forwarded to the
// Reserver picked.
func Route(pick func(key string) Reserver) Reserver {
	return &router{pick: pick}
}

type router struct {
	pick func(key string) Reserver
}

func (r *router) to(key string) (Reserver, error) {
	if r.pick == nil {
		return nil, &ConfigError{Algorithm: "route", Field: "pick", Value: nil, Reason: "must not be nil"}
	}
	to := r.pick(key)
	if s, ok := to.(*Shaper); to != nil && (!ok || s != nil) { // a typed nil *Shaper is a missed lookup too
		return to, nil
	}
	shown := key
	if len(shown) > 64 {
		shown = shown[:64]
	}
	return nil, &KeyError{Key: shown, Len: len(key), Reason: "Route's pick returned no Reserver for it"}
}

// Reserve reserves on the Reserver key routes to.
func (r *router) Reserve(ctx context.Context, key string, cost int64) (Reservation, error) {
	to, err := r.to(key)
	if err != nil {
		return Reservation{}, err
	}
	return to.Reserve(ctx, key, cost)
}

// Wait waits on the Reserver key routes to.
func (r *router) Wait(ctx context.Context, key string, cost int64) error {
	to, err := r.to(key)
	if err != nil {
		return err
	}
	return to.Wait(ctx, key, cost)
}

// Acquire acquires on the Reserver key routes to (see Shaper.Acquire); one
// without an Acquire method waits, and the zero Reservation is returned: no
// shaper granted it, so it settles nothing (transport.Settle fails on it
// with a *ConfigError).
func (r *router) Acquire(ctx context.Context, key string, cost int64) (Reservation, error) {
	to, err := r.to(key)
	if err != nil {
		return Reservation{}, err
	}
	if a, ok := to.(Acquirer); ok {
		return a.Acquire(ctx, key, cost)
	}
	return Reservation{}, to.Wait(ctx, key, cost)
}

// AwaitTurn waits for the turn on the Reserver key routes to (see
// Shaper.AwaitTurn); one without the method reserves at once (Reserve).
func (r *router) AwaitTurn(ctx context.Context, key string, cost int64) (Reservation, error) {
	to, err := r.to(key)
	if err != nil {
		return Reservation{}, err
	}
	if t, ok := to.(TurnTaker); ok {
		return t.AwaitTurn(ctx, key, cost)
	}
	return to.Reserve(ctx, key, cost)
}

// Learn gives the feedback to the Reserver key routes to (see
// Shaper.Learn); one that does not learn is paused for fb.Pause, or
// clamped to the remaining count when it can be (Clamper).
func (r *router) Learn(ctx context.Context, key string, fb Feedback) error {
	to, err := r.to(key)
	if err != nil {
		return err
	}
	if l, ok := to.(Learner); ok {
		return l.Learn(ctx, key, fb)
	}
	if fb.Pause > 0 {
		return to.Pause(ctx, key, min(fb.Pause, MaxPause))
	}
	if c, ok := to.(Clamper); ok && fb.HasRemaining {
		return c.Clamp(ctx, key, fb.Remaining, min(fb.Reset, MaxPause))
	}
	return nil
}

// Space keeps a margin on the Reserver key routes to (see Shaper.Space);
// one without the method keeps none.
func (r *router) Space(ctx context.Context, key string, margin time.Duration) error {
	to, err := r.to(key)
	if err != nil {
		return err
	}
	if sp, ok := to.(Spacer); ok {
		return sp.Space(ctx, key, margin)
	}
	return nil
}

// HoldsPermits reports whether the Reserver key routes to holds permits
// (see Shaper.HoldsPermits); one without the method holds none.
func (r *router) HoldsPermits(key string) bool {
	to, err := r.to(key)
	if err != nil {
		return false
	}
	h, ok := to.(PermitHolder)
	return ok && h.HoldsPermits(key)
}

// Pause pauses key on the Reserver it routes to.
func (r *router) Pause(ctx context.Context, key string, d time.Duration) error {
	to, err := r.to(key)
	if err != nil {
		return err
	}
	return to.Pause(ctx, key, d)
}
