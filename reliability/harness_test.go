//go:build faults || soak

package reliability

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	itrace "github.com/throttlekit/throttlekit-go/internal/trace"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

var bg = context.Background()

// recorder collects what a load run saw: each departure's instant (and,
// apart, those of slots the store's failure policy granted), and each
// error by kind.
type recorder struct {
	mu     sync.Mutex
	deps   []time.Time
	served []time.Time // granted by the failure policy (Store.Degraded), not by Redis
	errs   map[string]int
	ok     int
}

func newRecorder() *recorder { return &recorder{errs: map[string]int{}} }

func (r *recorder) depart(t time.Time) { r.departAs(t, false) }

// departAs records a departure at t; byPolicy: its slot was granted by the
// failure policy.
func (r *recorder) departAs(t time.Time, byPolicy bool) {
	r.mu.Lock()
	r.deps = append(r.deps, t)
	if byPolicy {
		r.served = append(r.served, t)
	}
	r.ok++
	r.mu.Unlock()
}

// byPolicy returns the departures the failure policy granted, sorted.
func (r *recorder) byPolicy() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := slices.Clone(r.served)
	slices.SortFunc(d, func(a, b time.Time) int { return a.Compare(b) })
	return d
}

func errKind(err error) string {
	var se *redisstore.Error
	switch {
	case errors.As(err, &se) && strings.Contains(se.Error(), "answered other calls but not this one"):
		// Redis answered the others in time, not this call: this process
		// was starved (thousands of callers at once under -race), and the
		// call fails alone, by design; not an outage.
		return "overloaded"
	case errors.As(err, &se):
		return "store"
	case errors.Is(err, shaper.ErrQueueFull):
		return "queue_full"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return fmt.Sprintf("other: %v", err)
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	r.errs[errKind(err)]++
	r.mu.Unlock()
}

// departures returns the departures sorted.
func (r *recorder) departures() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := slices.Clone(r.deps)
	slices.SortFunc(d, func(a, b time.Time) int { return a.Compare(b) })
	return d
}

// between counts departures in [from, to).
func between(deps []time.Time, from, to time.Time) int {
	n := 0
	for _, t := range deps {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

// mostIn returns the most departures in any window of length w that starts
// at a departure in [from, to), and where that window starts.
func mostIn(deps []time.Time, w time.Duration, from, to time.Time) (int, time.Time) {
	most, at, j := 0, time.Time{}, 0
	for i := range deps {
		for j < len(deps) && deps[j].Sub(deps[i]) < w {
			j++
		}
		if deps[i].Before(from) || !deps[i].Before(to) {
			continue
		}
		if j-i > most {
			most, at = j-i, deps[i]
		}
	}
	return most, at
}

// load runs waiters goroutines, each waiting for a slot on key in a loop
// (with a per-call timeout) and recording what happened, until ctx ends. A
// call is recorded at its slot, the instant the contract is about: under
// -race, with thousands of goroutines at once (the burst fault), wake-ups
// run late together and bunch (make bench measures that lateness).
func load(ctx context.Context, r *shaper.Shaper, key string, waiters int, rec *recorder) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			for ctx.Err() == nil {
				var byPolicy atomic.Bool
				cctx, cancel := context.WithTimeout(itrace.With(ctx, &itrace.Hooks{Degraded: func(context.Context, string) { byPolicy.Store(true) }}), 2*time.Second)
				res, err := r.Acquire(cctx, key, 1)
				cancel()
				if err == nil {
					rec.departAs(res.Time(), byPolicy.Load())
					continue
				}
				if ctx.Err() != nil {
					return
				}
				rec.fail(err)
				time.Sleep(5 * time.Millisecond) // a failing store: do not spin
			}
		})
	}
	return &wg
}

// without returns the sorted deps less the sorted departures in drop (each
// dropped once).
func without(deps, drop []time.Time) []time.Time {
	out := make([]time.Time, 0, len(deps))
	j := 0
	for _, t := range deps {
		for j < len(drop) && drop[j].Before(t) {
			j++
		}
		if j < len(drop) && drop[j].Equal(t) {
			j++
			continue
		}
		out = append(out, t)
	}
	return out
}
