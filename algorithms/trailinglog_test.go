package algorithms

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The departures a trailing log grants, with what their requests gave
// back, never put more than its limit in a window of its length
// (the partner's window plus the spread), they never go back in time, and
// a queue of requests is paced at the limit per partner's window.
func TestTrailingLogNeverOverfillsAWindow(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 3))
		limit := float64(1 + rng.IntN(200))
		window := time.Duration(1+rng.IntN(5000)) * time.Millisecond
		spread := time.Duration(rng.IntN(50)) * time.Millisecond
		l := must(NewTrailingLog(limit, window, spread, time.Hour))
		type dep struct {
			at    float64
			units float64
		}
		var st State
		var deps []dep
		now, last := 1.7e12, 0.0
		for range 600 {
			now += float64(rng.IntN(int(window.Milliseconds())/4 + 2))
			cost := int64(1 + rng.IntN(int(limit)))
			if rng.IntN(3) == 0 {
				cost = 1
			}
			var dec Decision
			var err error
			st, dec, err = Reserve(l, st, now, cost)
			if err != nil || !dec.Allowed {
				t.Fatalf("seed %d: cost %d refused (%v) with an hour's queue", seed, cost, err)
			}
			at := now + dec.Wait()
			if at < last {
				t.Fatalf("seed %d: departure %v before the one granted before it, %v", seed, at, last)
			}
			if rng.IntN(10) == 0 && (len(deps) == 0 || deps[len(deps)-1].at < at) { // cancelled: its entry is gone
				st = l.GiveBack(st, 0, at, cost)
				if n := len(st); n >= 4 && st[n-2] == at {
					t.Fatalf("seed %d: a cancelled newest entry stayed in the log", seed)
				}
				continue
			}
			last = at
			used := float64(cost)
			if rng.IntN(2) == 0 { // settled for less
				back := int64(rng.IntN(int(cost))) // all of it is a cancel, above
				st = l.GiveBack(st, 0, at, back)
				used -= float64(back)
			}
			if n := len(deps); n > 0 && deps[n-1].at == at {
				deps[n-1].units += used
			} else {
				deps = append(deps, dep{at, used})
			}
		}
		span := DurationMillis(window + spread)
		for i := range deps {
			sum := 0.0
			for j := i; j < len(deps) && deps[j].at < deps[i].at+span; j++ {
				sum += deps[j].units
			}
			if sum > limit {
				t.Fatalf("seed %d: %v units leave within %v ms of %v, limit %v", seed, sum, span, deps[i].at, limit)
			}
		}
		if !slices.IsSortedFunc(deps, func(a, b dep) int { return int(a.at - b.at) }) {
			t.Fatalf("seed %d: departures out of order", seed)
		}
	}
}

// A queue of unit requests on a cold log leaves one every Window/Limit:
// the pace's tolerance, a hundredth of the window, is one unit of 100.
func TestTrailingLogPaces(t *testing.T) {
	l := must(NewTrailingLog(100, time.Second, 0, time.Hour)) // tolerance 10 ms, interval 10 ms
	var st State
	now := 1.7e12
	var waits []float64
	for range 10 {
		var dec Decision
		st, dec, _ = Reserve(l, st, now, 1)
		waits = append(waits, dec.Wait())
	}
	want := []float64{0, 10, 20, 30, 40, 50, 60, 70, 80, 90}
	if !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
}

// Reservations granted ahead and then cancelled, in any order, hold
// nothing: a request after them waits no longer than it would have
// without them, but for the pace's tolerance (a hundredth of the window),
// and the log keeps the same departures (issue 38: the
// horizon gates of a fleet cancel slots granted too far ahead, and an
// empty entry or a pace left behind by them held the key for seconds).
func TestTrailingLogCancelsHoldNothing(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 8))
		limit := float64(5 + rng.IntN(100))
		window := time.Duration(100+rng.IntN(5000)) * time.Millisecond
		l := must(NewTrailingLog(limit, window, time.Duration(rng.IntN(20))*time.Millisecond, time.Hour))
		var st State
		now := 1.7e12
		for range rng.IntN(40) { // what the key did before
			now += float64(rng.IntN(int(window.Milliseconds())/8 + 1))
			var dec Decision
			cost := int64(1 + rng.IntN(int(limit)))
			st, dec, _ = Reserve(l, st, now, cost)
			if rng.IntN(3) == 0 {
				st = l.GiveBack(st, 0, now+dec.Wait(), int64(rng.IntN(int(cost)+1)))
			}
		}
		probe := int64(1 + rng.IntN(int(limit)))
		want := l.Delay(st, now, probe)
		live := func(st State) []float64 {
			first, _ := l.live(st, now)
			var out []float64
			for i := first; i+1 < len(st); i += 2 {
				if st[i+1] > 0 {
					out = append(out, st[i], st[i+1])
				}
			}
			return out
		}
		before := live(slices.Clone(st))
		st, held := reserveThenCancel(l, st, now, int(limit), rng)
		if got := l.Delay(st, now, probe); got > want+l.tolerance+1e-3 {
			t.Fatalf("seed %d: a request of %d waits %v ms after %d cancelled reservations, %v before them", seed, probe, got, held, want)
		}
		if after := live(st); !slices.Equal(after, before) {
			t.Fatalf("seed %d: the departures changed: %v, were %v", seed, after, before)
		}
	}
}
