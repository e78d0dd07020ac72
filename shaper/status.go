package shaper

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// Status is a key's standing, read without consuming anything (see
// Shaper.Status): what to put in RateLimit-Remaining and RateLimit-Reset
// style headers and logs.
type Status struct {
	// Remaining is how many units could depart at once, in the binding
	// dimension's units (0 while the key is paused or has a queue; at most
	// 1 while a partner's clamp holds it, 0 before the clamp's next slot).
	Remaining int64
	// Next is the earliest instant a request of the cost could depart, on
	// the shaper's clock (the read's instant when at once).
	Next time.Time
	// ResetAt is when the key is back to cold: every dimension's state
	// forgotten and any pause over, the whole burst available.
	ResetAt time.Time
	// PausedUntil is when the key's pause ends (Shaper.Pause, a partner's
	// Retry-After), or, under a partner's clamp whose next slot has not
	// come, that slot; zero when it is not paused.
	PausedUntil time.Time
	// Binding names the dimension that sets Next and Remaining: the one the
	// request would wait for longest, else the one with the fewest requests
	// left; "pause" for a pause or a clamp's slot, "" for one contract.
	Binding string
	// Dimensions holds every dimension's own figures, in name order (one,
	// named "", for a shaper of one contract).
	Dimensions []DimensionStatus
	// Learned is what a shaper WithLearning learned of the key: the rate
	// in force and the event that last changed it (nil for a shaper that
	// does not learn). The figures above already count the clamp it
	// sets.
	Learned *Learned
}

// DimensionStatus is one dimension's part of a Status.
type DimensionStatus struct {
	Name      string
	Key       string    // the dimension's key, after its Key mapping
	Remaining int64     // units that could depart at once, in the dimension's units, pauses aside; at most 1 on a dimension the request departs on while a partner's clamp holds a key it departs on (see Status)
	Next      time.Time // when the request's cost in this dimension could depart, pauses and clamps' slots aside (the read's instant for a dimension the request leaves out)
	ResetAt   time.Time // when the dimension's key is back to cold, pauses aside: never before the end of a partner's clamp on it
	InFlight  int64     // an in-flight dimension's permits held on the key, fleet-wide (0 for a rate)
	Waiting   int       // an in-flight dimension's requests of this process waiting for a permit of the key
}

// Status reports key's standing for a request of cost, without consuming
// or writing anything: how many units could depart now, when such a
// request could depart, and when the key is back to cold, per dimension,
// with the binding one named. On Redis it is one read-only script call, on
// Redis TIME; while Redis is down FailLocal answers from its local store
// and the other policies fail (ErrStoreUnavailable). Costs are checked as
// Reserve checks them. On a shaper WithLearning, when the key's learned
// clamp is due for renewal, Status renews it first, as the reservation
// right after it would (it consumes nothing, and writes no record for a
// key the fleet has none of): Next is the slot that reservation gets.
//
// A partner's clamp (Shaper.Clamp) counts as the calls would find it:
// while it holds a key until its reset, nothing departs on the key before
// the clamp's next slot (Next, PausedUntil and Binding "pause" as for a
// pause), and each departure moves that slot an interval on, so at most one
// request departs at once. Remaining is then min(what the contract allows,
// 1) once the slot has come and 0 before it, on every dimension the
// request departs on (under Any, those that would commit); the key is not
// cold (ResetAt) before the clamp's reset.
//
// An in-flight dimension reports the permits held on its key fleet-wide
// (InFlight), the requests of this process waiting for one (Waiting), and
// as Remaining the permits free; with none free it binds (Remaining 0), and
// its Next is zero: when a permit frees is not known.
func (s *Shaper) Status(ctx context.Context, key string, cost int64) (Status, error) {
	if s == nil {
		return Status{}, errNilShaper
	}
	var st Status
	var err error
	if s.flight != nil {
		st, err = s.statusHolding(ctx, key, cost)
	} else {
		st, err = s.status(ctx, key, cost)
	}
	if err == nil && s.learner != nil {
		st.Learned, err = s.learned(ctx, s.live(), key)
	}
	return st, err
}

// status is Status for the dimensions of rate.
func (s *Shaper) status(ctx context.Context, key string, cost int64) (Status, error) {
	c := s.live()
	now, err := s.check(ctx, c, key, cost)
	if err != nil {
		return Status{}, err
	}
	if s.refresh > 0 {
		s.refreshAt(now)
	}
	if s.learner != nil { // the learned rate's clamp, renewed when due, as the reservation right after would (decide)
		s.learnPeek(ctx, c, key, now)
	}
	ks, err := s.keysOf(c, key)
	if err != nil {
		return Status{}, err
	}
	q := &store.Query{KeySet: ks, Algs: make([]algorithms.Algorithm, len(c.dims)), Costs: make([]int64, len(c.dims)), Now: algorithms.Millis(now), Any: s.any}
	var refused error // Any: the first cost a dimension could never admit
	cs, err := s.costsOf(ctx, c, key)
	if err != nil {
		return Status{}, err
	}
	for i, d := range c.dims {
		n, err := mapCost(cs, d, key, cost)
		if err != nil {
			return Status{}, err
		}
		if n > 0 {
			never, err := s.admissible(d, d.Alg, ks.Keys[i], n)
			if err != nil {
				return Status{}, err
			}
			if never != nil { // reported, but out of the request
				refused, n = cmp.Or(refused, never), 0
			}
		}
		q.Algs[i], q.Costs[i] = d.Alg, n
	}
	if refused != nil && !slices.ContainsFunc(q.Costs, func(c int64) bool { return c > 0 }) {
		return Status{}, refused
	}
	st := startStore(ctx)
	err = s.store.Status(ctx, q)
	st.done("status", err)
	if err != nil {
		return Status{}, err
	}
	// Instants on the store's timeline, counted from a reading of the
	// shaper's clock (taken after the reply for a remote store: never early).
	// The figures are relative to the store's now, as a reservation's delay
	// is (an instant in ms since the epoch carries a quarter-µs rounding).
	anchor := s.anchor(now, time.Time{}, false)
	after := func(ms float64) time.Time { return anchor.Add(algorithms.Duration(ms)) }
	out := Status{Dimensions: make([]DimensionStatus, len(c.dims)), ResetAt: after(q.Until - q.At)}
	for i, d := range c.dims {
		f := q.Figures[i]
		ds := DimensionStatus{Name: d.Name, Key: ks.Keys[i], Remaining: gcra.Units(f.Remaining), Next: after(f.Delay), ResetAt: after(f.Reset)}
		out.Dimensions[i] = ds
		if ds.ResetAt.After(out.ResetAt) {
			out.ResetAt = ds.ResetAt
		}
	}
	if q.Until > q.At {
		out.PausedUntil = after(q.Until - q.At)
	}
	if q.Binding < 0 {
		out.Binding, out.Next = "pause", after(q.Until-q.At)
		return out, nil
	}
	b := out.Dimensions[q.Binding]
	out.Binding, out.Remaining, out.Next = b.Name, b.Remaining, b.Next
	if !out.PausedUntil.IsZero() { // paused, if for less time than the request waits anyway
		out.Remaining = 0
	}
	return out, nil
}

// Status reports the standing of key on the Reserver it routes to (see
// Shaper.Status); one that cannot report it fails with a *ConfigError.
func (r *router) Status(ctx context.Context, key string, cost int64) (Status, error) {
	to, err := r.to(key)
	if err != nil {
		return Status{}, err
	}
	if st, ok := to.(StatusReader); ok {
		return st.Status(ctx, key, cost)
	}
	return Status{}, &ConfigError{Algorithm: "route", Field: "pick", Value: fmt.Sprintf("%T", to), Reason: "the Reserver picked for the key has no Status method"}
}

// statusHolding is Status on a shaper with an in-flight dimension: the
// dimensions of rate as status reads them, and the permits beside them.
func (s *Shaper) statusHolding(ctx context.Context, key string, cost int64) (Status, error) {
	if err := s.validate(ctx, s.live(), key, cost); err != nil {
		return Status{}, err
	}
	f := s.flight
	p, err := f.permit(key)
	if err != nil {
		return Status{}, err
	}
	st := startStore(ctx)
	now := s.cfg.clock.Now()
	inUse, err := s.store.PermitsInUse(ctx, &p, algorithms.Millis(now))
	st.done("permits_in_use", err)
	if err != nil {
		return Status{}, err
	}
	out := Status{Next: now, ResetAt: now}
	if !s.rateless {
		if out, err = s.status(ctx, key, cost); err != nil {
			return Status{}, err
		}
	}
	ds := DimensionStatus{Name: f.dim.Name, Key: p.Key, Remaining: max(f.limit-inUse, 0), Next: now, InFlight: inUse, Waiting: f.waiting(p.Key)}
	if inUse == 0 {
		ds.ResetAt = now
	}
	if ds.Remaining == 0 {
		ds.Next = time.Time{}
		if out.Binding != "pause" {
			out.Binding, out.Remaining = ds.Name, 0
		}
	} else if s.rateless {
		out.Binding, out.Remaining = ds.Name, ds.Remaining
	}
	i, _ := slices.BinarySearchFunc(out.Dimensions, ds.Name, func(d DimensionStatus, name string) int { return cmp.Compare(d.Name, name) })
	out.Dimensions = slices.Insert(out.Dimensions, i, ds)
	return out, nil
}
