package shaper

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// Wait reserves cost units on key and sleeps until their slot. A slot past
// ctx's deadline is refused at once with a *DeadlineError, and nothing is
// taken; if ctx ends while sleeping, the slot is given back (see Cancel) and
// ctx.Err() returned. A request
// whose key is paused while it sleeps takes a new slot after the pause. For
// algorithms other than the leaky bucket, Wait sleeps until the request
// would be admitted and retries, for at most MaxQueue.
//
// A shaper with an in-flight dimension refuses Wait with a *ConfigError:
// use Acquire, whose reservation can be released.
func (s *Shaper) Wait(ctx context.Context, key string, cost int64) error {
	_, err := s.acquire(ctx, key, cost, forWait)
	return err
}

// How acquire treats an in-flight dimension's permit.
const (
	forWait    = iota // refuse: Wait's caller could not release it
	forAcquire        // take it first (holding)
	taken             // the caller holds it already, or there is none
)

// Acquire is Wait that returns the reservation the request departs on, to
// Settle once the call's actual cost is known:
//
//	r, err := s.Acquire(ctx, "account-42", estimate)
//	...call, and read its usage...
//	_ = r.Settle(ctx, used)
//
// For the algorithms that do not queue it returns the admission it got
// (Delay 0), which can be settled too.
//
// With an in-flight dimension it first waits for a permit of key, in
// arrival order among the requests of this process (by their flows' turns
// when their ctx carry flows: WithFlow), woken when one is
// released anywhere in the fleet; it holds no slot of the other
// dimensions while it waits, and takes its slot once it has a permit. The
// wait ends with ctx, or at once with a *QueueFullError (InFlight set) when
// Dimension.MaxWaiting requests already wait. The reservation holds the
// permit until Release (see Reservation.Release).
func (s *Shaper) Acquire(ctx context.Context, key string, cost int64) (Reservation, error) {
	return s.acquire(ctx, key, cost, forAcquire) // inlined: the path copies no Reservation
}

// acquire is Acquire and Wait; permit says what becomes of an in-flight
// dimension's permit.
func (s *Shaper) acquire(ctx context.Context, key string, cost int64, permit int) (Reservation, error) {
	switch {
	case s == nil:
		return Reservation{}, errNilShaper
	case s.flight != nil && permit == forWait:
		return Reservation{}, s.errHoldsPermits()
	case s.flight != nil && permit == forAcquire:
		return s.holding(ctx, key, cost, holdAcquire)
	}
	if f, ok := ctx.Value(flowCtxKey{}).(Flow); ok {
		return s.fair(ctx, key, cost, f)
	}
	if !s.queues {
		return s.waitRetry(ctx, key, cost)
	}
	if s.learner != nil {
		// A learning key's slots are taken just in time: at most a
		// gateSpan of them ahead in the fleet (this process's share),
		// so that a lower rate learned applies to every request within
		// gateSpan.
		leave, err := s.learner.gate(ctx, s, key)
		if err != nil {
			return Reservation{}, err
		}
		defer leave()
	}
	if s.ahead != nil {
		leave, err := s.ahead.enter(ctx, s, s.live(), key, cost)
		if err != nil {
			return Reservation{}, err
		}
		return s.acquireSlot(ctx, key, cost, leave)
	}
	return s.acquireSlot(ctx, key, cost, nil)
}

// acquireSlot reserves a slot and sleeps until it, as often as a pause or
// a late wake-up makes it take a new one. granted, if not nil, is called
// once, with the first slot's time (zero if none was granted), before the
// sleep.
func (s *Shaper) acquireSlot(ctx context.Context, key string, cost int64, granted func(time.Time)) (Reservation, error) {
	if granted != nil {
		defer func() {
			if granted != nil {
				granted(time.Time{})
			}
		}()
	}
	// A pause set or extended while we wait: the slot fell inside it and is
	// lost with it; take a new one after the pause, as often as pauses keep
	// coming (MaxQueue and the ctx's deadline bound the wait: reserve
	// refuses a slot past them).
	for {
		limit := noLimit
		if dl, ok := ctx.Deadline(); ok {
			limit = algorithms.DurationMillis(time.Until(dl))
		}
		r, err := s.reserve(ctx, key, cost, limit, false)
		if err != nil {
			return Reservation{}, err
		}
		if granted != nil {
			if span := s.ahead.span; r.Delay > span {
				// Held by the horizon: a slot further ahead goes back, and
				// this request (the first of its key in this process)
				// asks again when that slot is within the span, or a span
				// from now (calls settling meanwhile may bring it closer).
				if err := r.Cancel(context.WithoutCancel(ctx)); err == nil {
					again := r.Time().Add(-span)
					if soon := s.cfg.clock.Now().Add(span); soon.Before(again) {
						again = soon
					}
					if err := s.sleepUntil(ctx, again); err != nil {
						return Reservation{}, err
					}
					continue
				}
			}
			granted(r.Time())
			granted = nil
		}
		if r.Delay <= 0 {
			return r, nil
		}
		paused, err := s.sleepChecking(ctx, key, r)
		if err != nil {
			return Reservation{}, err
		}
		if !paused {
			return r, nil
		}
	}
}

// pauseLead is how long before a slot Wait asks a remote store whether the
// key was paused while it slept.
const pauseLead = 5 * time.Millisecond

// sleepChecking sleeps until r's slot and reports whether the key was paused
// while it slept, or the caller woke too late (WithLateness: its slot is
// settled at nothing, and it takes a new one) (a partner's Retry-After seen by another process, say). Its
// slot then fell inside the pause and is lost with it: Wait reserves a new
// one, which the pause places after its end, and sleeps until that. So
// requests held by a pause leave paced after it, not all together when it
// ends.
//
// The check costs one read per request that actually waited. In memory it is
// a map lookup at the slot. A remote store is asked pauseLead before the
// slot, with the slot as the answer's deadline: the answer never delays the
// departure, so a stalled server cannot make departures late and bunch them
// after the stall (a pause set in the last pauseLead is not seen). A failed
// or late read does not fail the request, whose slot is already granted.
func (s *Shaper) sleepChecking(ctx context.Context, key string, r Reservation) (bool, error) {
	if !s.remote || r.Delay <= pauseLead {
		if err := s.sleepReserved(ctx, key, r); err != nil {
			return false, err
		}
		return !s.remote && s.pausedPast(ctx, key, s.cfg.clock.Now(), 0) || s.late(ctx, &r), nil
	}
	if dl, ok := ctx.Deadline(); ok && r.Delay > time.Until(dl) {
		_ = r.Cancel(context.WithoutCancel(ctx))
		return false, &DeadlineError{Key: key, Delay: r.Delay, Deadline: dl}
	}
	if err := s.sleepUntil(ctx, r.Time().Add(-pauseLead)); err != nil {
		_ = r.Cancel(context.WithoutCancel(ctx))
		return false, err
	}
	askCtx, cancel := context.WithDeadline(ctx, r.Time())
	now := s.cfg.clock.Now()
	paused := s.pausedPast(askCtx, key, now, r.Time().Sub(now))
	cancel()
	if err := s.sleepReserved(ctx, key, r); err != nil {
		return false, err
	}
	return paused || s.late(ctx, &r), nil
}

// late reports whether r's caller woke later after its slot than
// WithLateness allows; it then settles r at nothing (what the key's
// schedule can take back it takes), so that the caller takes a new slot.
func (s *Shaper) late(ctx context.Context, r *Reservation) bool {
	if s.cfg.lateness <= 0 || s.cfg.clock.Now().Sub(r.Time()) <= s.cfg.lateness {
		return false
	}
	_ = r.Settle(context.WithoutCancel(ctx), 0)
	s.lates.Add(1)
	return true
}

// pausedPast reports whether a pause on key, read at now, lasts past
// now + d (a slot d away: a pause that ends before it leaves it alone), as
// the store says; a failed read says no.
func (s *Shaper) pausedPast(ctx context.Context, key string, now time.Time, d time.Duration) bool {
	ks, err := s.keys(key)
	if err != nil {
		return false
	}
	st := startStore(ctx)
	left, err := s.store.PauseLeft(ctx, ks, algorithms.Millis(now))
	st.done("pause_left", err)
	return err == nil && left > algorithms.DurationMillis(max(d, 0))
}

// sleepReserved sleeps until r's slot; if the slot falls past ctx's deadline,
// or ctx ends first, it gives the slot back and fails. It may be called
// part of the way to the slot (sleepChecking): what is left to wait is
// measured now, not r.Delay, which counts from the grant.
func (s *Shaper) sleepReserved(ctx context.Context, key string, r Reservation) error {
	if r.Delay <= 0 {
		return nil
	}
	left := r.Time().Sub(s.cfg.clock.Now())
	if left <= 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && left > time.Until(dl) {
		_ = r.Cancel(context.WithoutCancel(ctx))
		return &DeadlineError{Key: key, Delay: left, Deadline: dl}
	}
	if err := s.sleepUntil(ctx, r.Time()); err != nil {
		_ = r.Cancel(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// waitRetry serves Wait for the algorithms that cannot hold a slot.
func (s *Shaper) waitRetry(ctx context.Context, key string, cost int64) (Reservation, error) {
	start := s.cfg.clock.Now()
	for {
		var dec algorithms.Decision
		c := s.live()
		now, g, local, m, err := s.decide(ctx, c, key, cost, false, noLimit, &dec)
		if err != nil {
			return Reservation{}, err
		}
		if dec.Allowed {
			return Reservation{s: s, c: c, now: now, rem: dec.Remaining, key: key, cost: cost, g: g, local: local, m: m, done: m == nothingToLimit, once: c.once()}, nil
		}
		retry := dec.RetryAfter
		if waited := now.Sub(start); waited+retry > c.maxQueue {
			return Reservation{}, &QueueFullError{Key: key, Dimension: binding(m), Delay: waited + retry, MaxQueue: c.maxQueue}
		}
		if dl, ok := ctx.Deadline(); ok && retry > time.Until(dl) {
			return Reservation{}, &DeadlineError{Key: key, Delay: retry, Deadline: dl}
		}
		if err := s.sleepUntil(ctx, now.Add(retry+jitter(retry))); err != nil {
			return Reservation{}, err
		}
	}
}

// jitter spreads retries of waiters that were refused together: up to an
// eighth of the wait, at most 50 ms, and at least 1 µs so that a retry always
// lands after the instant it was told.
func jitter(wait time.Duration) time.Duration {
	j := min(wait/8, 50*time.Millisecond)
	return time.Microsecond + time.Duration(jitterN(int64(j)+1))
}

// jitterN draws a jitter in [0, n): the model-based test replaces it with
// a seeded source, so that a seed replays its retries exactly.
var jitterN = rand.Int64N

func (s *Shaper) sleepUntil(ctx context.Context, t time.Time) error {
	if s.cfg.precise > 0 {
		return timer.SleepUntilPrecise(ctx, s.cfg.clock, t, s.cfg.precise)
	}
	return timer.SleepUntil(ctx, s.cfg.clock, t)
}
