package shaper

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// Reservation is a departure slot granted by Reserve: depart at Time(), or
// Cancel.
type Reservation struct {
	// Delay is how long to wait before departing; 0 means at once.
	Delay time.Duration

	s      *Shaper
	c      *contract // the contract it was granted under: it gives back under that one
	now    time.Time // when it was granted: it departs at now + Delay
	rem    int64     // Remaining
	key    string
	cost   int64
	g      store.Grant // the single-key branch's: what gives it back (see store.Settlement)
	m      *store.Request
	local  bool // granted by the Redis store's failure policy
	done   bool
	permit *hold        // the in-flight permit it holds (nil: none), shared by its copies
	once   *atomic.Bool // settled or cancelled, shared by its copies (nil: the store tells; see contract.gives)
}

// Time returns the departure instant, on Clock. A Reservation no shaper
// granted (one a custom Reserver built with Delay alone) departs Delay from
// the call, on the system clock.
func (r *Reservation) Time() time.Time {
	if r.s == nil {
		return timer.Real().Now().Add(r.Delay)
	}
	return r.now.Add(r.Delay)
}

// Remaining is how many units could still depart at once on r's key
// right after r was granted, as Status would have reported it then, in the
// units of the dimension that bound r (chosen by Status's rule); at most 1
// while a partner's clamp holds the key (see Clamp). It is 0
// for a reservation a failure policy granted unpaced (FailOpen) and for
// one no shaper granted.
func (r *Reservation) Remaining() int64 { return r.rem }

// Clock returns the clock of the shaper that granted r (the system clock for
// the zero Reservation), so that a scheduler waits for Time on it.
func (r *Reservation) Clock() Clock {
	if r.s == nil {
		return timer.Real()
	}
	return r.s.cfg.clock
}

// Cancel gives the slot back, if its time has not come: the caller will not
// depart. What the key's schedule can take back without breaking the
// contract it takes (all of it when nothing was reserved after it); on a
// shaper of one contract, the rest is handed to the next reservation that
// can depart at that very instant; an in-flight permit it holds is released.
// After the slot's time it does nothing (the caller may have departed), and
// the reservation can still be settled with what it used, and must still
// be released. A done ctx returns ctx.Err() and changes nothing. A
// reservation is cancelled or settled once; the leaky bucket, GCRA and the
// sliding logs (SlidingWindowLog, TrailingWindow) give back.
func (r *Reservation) Cancel(ctx context.Context) (err error) {
	if r.s == nil || r.done && r.permit == nil {
		return nil
	}
	if err := ctx.Err(); err != nil { // nothing happens: a later call may still cancel
		return err
	}
	if r.s.cfg.clock.Now().After(r.Time()) { // the caller may have departed: Settle still can
		return nil
	}
	if r.permit != nil { // it will not depart: nor will it hold a permit
		perr := r.permit.release(ctx)
		if r.done {
			return perr
		}
		defer func() {
			if err == nil {
				err = perr
			}
		}()
	}
	if r.once != nil && !r.once.CompareAndSwap(false, true) { // a copy settled or cancelled it
		r.done = true
		return nil
	}
	r.done = true
	if err := r.giveBack(ctx, "cancel", -1); err != nil {
		r.done = false // the store refused or failed: a retry may give it back (once: the store dedupes)
		if r.once != nil {
			r.once.Store(false)
		}
		return err
	}
	return nil
}

// Settle records what the call that used r actually cost, once it is known
// (an LLM API's tokens, a GraphQL query's points): reserve an estimate,
// call, then settle. Less than reserved gives the difference back to the
// key, as far as the reservations made after it allow without breaking the
// contract (docs/GUARANTEES.md says how far); more is charged at once, so
// that later reservations wait for it; it is never refused, the call has
// happened. A multi-dimension shaper maps actual through each dimension's
// Cost, as Reserve mapped the estimate (a request count stays 1), and
// settles the dimensions that Costs on ctx names (WithCosts) at their own. A
// reservation is settled or cancelled once, however many copies of it are
// settled or cancelled; settling r again, or after cancelling it, returns
// ErrSettled. (A copy of a leaky bucket's or GCRA's is told apart until its
// key goes cold: settled after that, it charges its extra again, too much
// and never too little; docs/GUARANTEES.md.) The leaky bucket and GCRA give back as above; the sliding logs
// (SlidingWindowLog, TrailingWindow) take the unused units off the call's
// entry, freed when it leaves the window, as a partner counting a trailing
// window frees them; the other algorithms keep what they counted. All of
// them charge an extra at the instant it is settled, even once the key has
// gone idle (its Redis key expired). An actual cost whose extra would hold
// the key back longer than MaxOverrun is a *CostError, and a done ctx
// returns ctx.Err(): nothing is recorded then, and a later Settle may still
// settle it.
func (r *Reservation) Settle(ctx context.Context, actual int64) error {
	if actual < 0 {
		return &CostError{Algorithm: "settle", Cost: actual, Reason: "the actual cost must be >= 0", Key: r.key}
	}
	if r.s == nil || r.m == nothingToLimit {
		return nil
	}
	if r.done {
		return ErrSettled
	}
	if err := ctx.Err(); err != nil { // nothing is recorded: a retry with a live ctx settles
		return err
	}
	if r.once != nil && !r.once.CompareAndSwap(false, true) { // a copy settled or cancelled it
		r.done = true
		return ErrSettled
	}
	r.done = true
	// Even settled at its cost, the store records it: a copy of r cancelled
	// later must find it settled.
	if err := r.giveBack(ctx, "settle", actual); err != nil {
		r.done = false // refused or failed: a retry may settle it (once: the store dedupes)
		if r.once != nil {
			r.once.Store(false)
		}
		return err
	}
	return nil
}

// MaxOverrun is the longest a settle may hold a key back for the extra
// units a call cost beyond its reservation (at Period/Count a unit): more
// is a *CostError that records nothing, almost always a unit mistake.
const MaxOverrun = MaxPause

// checkOverrun refuses an actual cost of d's units whose extra over cost
// would charge more than MaxOverrun, or that float64 cannot hold exactly.
func checkOverrun(d *dim, key string, cost, actual int64) error {
	if actual <= cost {
		return nil
	}
	per := d.rate.Period.Seconds() / float64(d.rate.Count) // seconds a unit
	if actual > gcra.MaxExactCost || float64(actual-cost)*per > MaxOverrun.Seconds() {
		return &CostError{Algorithm: d.Alg.Name(), Cost: actual, Key: key, Dimension: d.Name,
			Reason: fmt.Sprintf("the actual cost would charge %.3g s beyond the reservation at %v, more than MaxOverrun (%v)", float64(actual-cost)*per, d.rate, MaxOverrun)}
	}
	return nil
}

// giveBack hands a cancel (actual -1) or a settle to the store, for the
// dimensions of the GCRA family that took part in r.
func (r *Reservation) giveBack(ctx context.Context, op string, actual int64) error {
	s := r.s
	st := &store.Settlement{At: r.g.At, Now: algorithms.Millis(s.cfg.clock.Now()), Local: r.local}
	if r.m != nil {
		st.KeySet, st.Tags, st.Gens, st.Seqs, st.Costs = r.m.KeySet, r.m.Tags, r.m.Gens, r.m.Seqs, r.m.Costs
		st.At = r.m.At
		if actual >= 0 {
			cs, err := s.costsOf(ctx, r.c, r.key)
			if err != nil {
				return err
			}
			st.Actual = make([]int64, len(r.m.Dims))
			for i, sd := range r.m.Dims {
				d := r.c.of(sd)
				if st.Actual[i], err = mapCost(cs, d, r.key, actual); err != nil {
					return err
				}
				if err := checkOverrun(d, r.m.Keys[i], r.m.Costs[i], st.Actual[i]); err != nil {
					return err
				}
			}
		}
	} else {
		d := r.c.dims[0]
		if !d.Settles(r.cost, actual) {
			return nil
		}
		if actual >= 0 {
			if err := checkOverrun(d, r.key, r.cost, actual); err != nil {
				return err
			}
		}
		st.KeySet = store.KeySet{Dims: []*store.Dim{&d.Dim}, Keys: []string{r.key}, Slot: r.key}
		st.Tags, st.Gens, st.Seqs, st.Costs = []float64{r.g.Tag}, []uint32{r.g.Gen}, []float64{r.g.Seq}, []int64{r.cost}
		st.Holes = true
		if actual >= 0 {
			st.Actual = []int64{actual}
		}
	}
	if len(st.Tags) != len(st.Dims) { // FailOpen granted it: nothing was counted
		return nil
	}
	if cur := s.cur.Load(); cur != r.c {
		// Granted under a contract changed since: the key is settled in the
		// contract in force, whose schedule it holds now (a settle written
		// under the old one would tag the key with it). Where the change
		// left the rates of the reservation's dimensions as they were (a
		// MaxQueue, another dimension's rate, a rate set to what it was),
		// the slot's schedule is the one in force and the settle goes on as
		// it would have (a copy cancelled before is found settled).
		// Otherwise its refund rule knows nothing of a slot granted under
		// another contract, so an extra is charged and nothing is given
		// back (sequence number -1).
		same := sameRates(r.c, cur, st.Dims)
		st.Dims = inContract(st.Dims, cur)
		if !same {
			extra := false
			for i, a := range st.Actual {
				extra = extra || a > st.Costs[i]
			}
			if !extra {
				return nil
			}
			st.Seqs = slices.Repeat([]float64{-1}, len(st.Dims))
		}
	}
	t := startStore(ctx)
	err := s.store.Settle(ctx, st)
	t.done(op, err)
	return err
}

// of returns the dimension of c whose store.Dim sd is.
func (c *contract) of(sd *store.Dim) *dim {
	for _, d := range c.dims {
		if &d.Dim == sd {
			return d
		}
	}
	for _, d := range c.dims { // not reached: a reservation's dimensions are its contract's
		if d.Name == sd.Name {
			return d
		}
	}
	return c.dims[0]
}

// sameRates reports whether every dimension of dims (contract old's) has
// the same rate in contract cur.
func sameRates(old, cur *contract, dims []*store.Dim) bool {
	for _, sd := range dims {
		d := old.of(sd)
		i := slices.IndexFunc(cur.dims, func(cd *dim) bool { return cd.Name == d.Name })
		if i < 0 || cur.dims[i].rate != d.rate {
			return false
		}
	}
	return true
}

// inContract returns dims as contract c has them (by name), in a new slice.
func inContract(dims []*store.Dim, c *contract) []*store.Dim {
	out := make([]*store.Dim, len(dims))
	for i, d := range dims {
		out[i] = d
		for _, cd := range c.dims {
			if cd.Name == d.Name {
				out[i] = &cd.Dim
			}
		}
	}
	return out
}
