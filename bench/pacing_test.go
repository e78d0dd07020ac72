package bench

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// pacers are the limiters whose pacing is measured. Each returns a take
// function that blocks until the caller may depart and returns the slot it
// was given (the instant the limiter meant it to depart).
var pacers = []struct {
	name string
	make func(perSec int) (take func() time.Time, stop func())
}{
	{"throttlekit", func(perSec int) (func() time.Time, func()) { return tkPacer(perSec, false) }},
	{"throttlekit-precise", func(perSec int) (func() time.Time, func()) { return tkPacer(perSec, true) }},
	{"xrate", func(perSec int) (func() time.Time, func()) {
		l := rate.NewLimiter(rate.Limit(perSec), 1)
		return func() time.Time {
			// Limiter.Wait is ReserveN and a timer for its delay; done here
			// by hand to learn the slot.
			now := time.Now()
			r := l.ReserveN(now, 1)
			d := r.DelayFrom(now)
			if d > 0 {
				t := time.NewTimer(d)
				<-t.C
			}
			return now.Add(d)
		}, func() {}
	}},
	{"uber", func(perSec int) (func() time.Time, func()) {
		l := ratelimit.New(perSec, ratelimit.WithoutSlack)
		return func() time.Time { return l.Take() }, func() {} // Take returns its slot
	}},
}

// tkPacer is Shaper.Wait on a memory store done in its two steps, Reserve
// then the same sleep Wait uses, so that the slot is known.
func tkPacer(perSec int, precise bool) (func() time.Time, func()) {
	store := memstore.New()
	s, err := shaper.New(store, shaper.PerSecond(int64(perSec)), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		panic(err)
	}
	return func() time.Time {
		r, err := s.Reserve(context.Background(), "k", 1)
		if err != nil {
			panic(err)
		}
		if r.Delay > 0 {
			if precise {
				_ = timer.SleepUntilPrecise(context.Background(), timer.Real(), r.Time(), timer.DefaultPreciseWindow)
			} else {
				_ = timer.SleepUntil(context.Background(), timer.Real(), r.Time())
			}
		}
		return r.Time()
	}, func() { _ = store.Close() }
}

// pacing is what one pacing run measured.
type pacing struct {
	departures     []time.Time // sorted
	start          time.Time
	rate           float64 // achieved, first to last departure
	errPct         float64 // (rate - target) / target
	gapP50, gapP99 time.Duration
	gapMax         time.Duration
	lateP50        time.Duration // departure minus the slot the limiter gave
	lateP99        time.Duration
	lateMax        time.Duration
	mostIn1s       int
}

// pace runs waiters goroutines against one limiter at perSec for d, each
// taking a slot and departing in a loop, and measures the departures.
func pace(limiter func(int) (func() time.Time, func()), perSec, waiters int, d time.Duration) pacing {
	take, stop := limiter(perSec)
	defer stop()
	start := time.Now()
	end := start.Add(d)
	var mu sync.Mutex
	var deps []time.Time
	var late []time.Duration
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			myDeps := []time.Time{}
			myLate := []time.Duration{}
			for {
				slot := take()
				now := time.Now()
				if now.After(end) {
					break
				}
				myDeps = append(myDeps, now)
				myLate = append(myLate, now.Sub(slot))
			}
			mu.Lock()
			deps = append(deps, myDeps...)
			late = append(late, myLate...)
			mu.Unlock()
		})
	}
	wg.Wait()
	p := pacing{start: start}
	if len(deps) < 2 {
		return p
	}
	slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
	slices.Sort(late)
	p.departures = deps
	p.rate = float64(len(deps)-1) / deps[len(deps)-1].Sub(deps[0]).Seconds()
	p.errPct = (p.rate - float64(perSec)) / float64(perSec) * 100
	gaps := make([]time.Duration, len(deps)-1)
	for i := range gaps {
		gaps[i] = deps[i+1].Sub(deps[i])
	}
	slices.Sort(gaps)
	p.gapP50, p.gapP99, p.gapMax = gaps[len(gaps)/2], gaps[len(gaps)*99/100], gaps[len(gaps)-1]
	p.lateP50, p.lateP99, p.lateMax = late[len(late)/2], late[len(late)*99/100], late[len(late)-1]
	j := 0
	for i := range deps {
		for deps[i].Sub(deps[j]) >= time.Second {
			j++
		}
		p.mostIn1s = max(p.mostIn1s, i-j+1)
	}
	return p
}

// perBucket counts departures per bucket from start, for the chart.
func (p pacing) perBucket(bucket time.Duration, n int) []int {
	out := make([]int, n)
	for _, t := range p.departures {
		if i := int(t.Sub(p.start) / bucket); i >= 0 && i < n {
			out[i]++
		}
	}
	return out
}
