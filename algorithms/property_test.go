package algorithms

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// event is one step of a timeline: the clock reading moves by step ms (a
// negative step is the clock being set back), then a request of cost arrives.
type event struct {
	step float64
	cost int64
}

// subject is an algorithm under property test with the contract it promises.
type subject struct {
	alg     Algorithm
	maxCost int64
	// check returns an error if the departures break the contract. monotone
	// reports whether the timeline never stepped back (reading == real time).
	check func(deps []timedDeparture, monotone bool) error
}

type timedDeparture struct {
	real, reading, cost float64
}

// simulate runs events through s.alg and asserts the invariants that hold at
// every step: (a) a denial never changes state, (c) every figure is finite,
// every delay >= 0 and within MaxWait. Real time advances with every forward
// step; a backward step moves only the reading, so the reading lags real time
// by a drift that never shrinks (a forward clock jump is not a fault an
// algorithm can defend against).
func simulate(s subject, events []event) ([]timedDeparture, bool, error) {
	var st State
	real, reading := t0, t0
	monotone := true
	var deps []timedDeparture
	for i, e := range events {
		if e.step >= 0 {
			real += e.step
			reading += e.step
		} else {
			reading += e.step
			monotone = false
		}
		before := slices.Clone(st)
		w := s.alg.Delay(st, reading, e.cost)
		if !finite(w) || w < 0 {
			return nil, false, fmt.Errorf("event %d: Delay = %v at now %v", i, w, reading)
		}
		next, d, err := Reserve(s.alg, st, reading, e.cost)
		if err != nil {
			return nil, false, fmt.Errorf("event %d: %v", i, err)
		}
		rem, reset := s.alg.Status(next, reading)
		if !finite(rem) || !finite(reset) || reset < 0 || d.Delay < 0 || d.RetryAfter < 0 || d.ResetAfter < 0 || d.Remaining < 0 {
			return nil, false, fmt.Errorf("event %d: decision %+v, status (%v, %v)", i, d, rem, reset)
		}
		for _, x := range next {
			if !finite(x) {
				return nil, false, fmt.Errorf("event %d: state %v is not finite", i, next)
			}
		}
		if err := coldAfterReset(s, next, reading, d.ResetAfter, e.cost); err != nil {
			return nil, false, fmt.Errorf("event %d: %v", i, err)
		}
		if !d.Allowed {
			if !sameState(before, next) {
				return nil, false, fmt.Errorf("event %d: denial changed state %v -> %v", i, before, next)
			}
			if d.Delay != 0 || d.RetryAfter == 0 && s.alg.MaxWait() == 0 && w > 0 {
				return nil, false, fmt.Errorf("event %d: denial %+v", i, d)
			}
			continue
		}
		if DurationMillis(d.Delay) > s.alg.MaxWait()+1e-6 {
			return nil, false, fmt.Errorf("event %d: delay %v beyond MaxWait %v", i, d.Delay, s.alg.MaxWait())
		}
		deps = append(deps, timedDeparture{real + w, reading + w, float64(e.cost)})
		st = next
	}
	return deps, monotone, nil
}

// coldAfterReset checks (d): once ResetAfter has passed, the key decides
// exactly as a cold key would (this is what eviction and Redis TTLs rely on).
// It probes a microsecond later to absorb float rounding.
func coldAfterReset(s subject, st State, now float64, reset time.Duration, cost int64) error {
	at := now + DurationMillis(reset) + 1e-3
	_, got, _ := Reserve(s.alg, slices.Clone(st), at, cost)
	_, want, _ := Reserve(s.alg, nil, at, cost)
	if public(got) != public(want) { // the raw figures may differ below the rounding
		return fmt.Errorf("ResetAfter %v: state %v decides %+v, a cold key %+v", reset, st, got, want)
	}
	return nil
}

// public drops a decision's raw figures.
func public(d Decision) Decision {
	d.raw = [3]float64{}
	return d
}

// slack absorbs float64 rounding of departure instants (times are float64 ms,
// about 0.24 µs apart today).
const slack = 1e-3

func realDeps(deps []timedDeparture) []departure {
	out := make([]departure, len(deps))
	for i, d := range deps {
		out[i] = departure{d.real, d.cost}
	}
	return out
}

// rateBound: admitted cost in every window [t, t+W) <= W/T + max(burst, largest cost).
func rateBound(interval, burst float64, windows ...float64) func([]timedDeparture, bool) error {
	return func(deps []timedDeparture, _ bool) error {
		maxCost := burst
		for _, d := range deps {
			maxCost = max(maxCost, d.cost)
		}
		for _, w := range windows {
			if got, limit := maxInWindow(realDeps(deps), w-slack), w/interval+maxCost; got > limit+1e-9 {
				return fmt.Errorf("%v admitted in a %v ms window; the contract allows %v", got, w, limit)
			}
		}
		return nil
	}
}

// windowBound: at most limit in every sliding window of length w.
func windowBound(limit, w float64) func([]timedDeparture, bool) error {
	return func(deps []timedDeparture, _ bool) error {
		if got := maxInWindow(realDeps(deps), w-slack); got > limit {
			return fmt.Errorf("%v admitted in a %v ms window; limit %v", got, w, limit)
		}
		return nil
	}
}

// alignedBound: on a monotone timeline at most limit per aligned period
// (period index = floor((t - anchor)/w)); on any timeline at most twice that in
// any window of length w (the fixed-window boundary effect).
func alignedBound(limit, w, anchor float64) func([]timedDeparture, bool) error {
	return func(deps []timedDeparture, monotone bool) error {
		if monotone {
			per := map[float64]float64{}
			for _, d := range deps {
				k := math.Floor((d.reading - anchor) / w)
				if per[k] += d.cost; per[k] > limit {
					return fmt.Errorf("%v admitted in aligned period %v; limit %v", per[k], k, limit)
				}
			}
		}
		if got := maxInWindow(realDeps(deps), w-slack); got > 2*limit {
			return fmt.Errorf("%v admitted in a %v ms window; at most twice the limit %v", got, w, limit)
		}
		return nil
	}
}

// slidingBound: at most limit plus the largest sub-bucket count in any window
// (the estimate's error is one bucket); never more than twice the limit.
func slidingBound(limit, w float64, buckets int) func([]timedDeparture, bool) error {
	width := w / float64(buckets)
	return func(deps []timedDeparture, monotone bool) error {
		got := maxInWindow(realDeps(deps), w-slack)
		if got > 2*limit {
			return fmt.Errorf("%v admitted in a %v ms window; at most twice the limit %v", got, w, limit)
		}
		if monotone {
			per, biggest := map[float64]float64{}, 0.0
			for _, d := range deps {
				k := math.Floor(d.reading / width)
				per[k] += d.cost
				biggest = max(biggest, per[k])
			}
			if got > limit+biggest {
				return fmt.Errorf("%v admitted in a %v ms window; limit %v plus one bucket %v", got, w, limit, biggest)
			}
		}
		return nil
	}
}

// newSubject builds one of the algorithms from small parameters (as the
// fuzzer supplies them).
func newSubject(kind uint8, p1, p2 uint16) subject {
	count := float64(1 + p1%50)
	period := time.Duration(1+p2%5) * time.Second
	burst := int64(1 + p1%7)
	if kind%7 == 0 || kind%7 == 1 { // fractional rates: 7 per 3 s style
		period = time.Duration(1+p2%5000) * time.Millisecond
	}
	interval := DurationMillis(period) / count
	limit := float64(1 + p1%20)
	window := time.Duration(1+p2%3000) * time.Millisecond
	w := DurationMillis(window)
	switch kind % 7 {
	case 0:
		g := must(NewGCRA(Rate{count, period, burst}))
		return subject{g, burst, rateBound(interval, float64(burst), interval, 10*interval, 100*interval, DurationMillis(period))}
	case 1:
		g := must(NewLeakyBucket(Rate{count, period, burst}, time.Duration(p2%20)*time.Second))
		return subject{g, 5, rateBound(interval, float64(burst), interval, 10*interval, 100*interval, DurationMillis(period))}
	case 2:
		b := must(NewTokenBucket(Rate{count, period, burst}))
		return subject{b, burst, rateBound(interval, float64(burst), interval, 10*interval, 100*interval)}
	case 3:
		f := must(NewFixedWindow(limit, window))
		return subject{f, int64(limit), alignedBound(limit, w, 0)}
	case 4:
		s := int(1 + p2%8)
		if window/time.Duration(s) < MinWindow {
			s = 1
		}
		sw := must(NewSlidingWindow(limit, window, s))
		return subject{sw, int64(limit), slidingBound(limit, w, s)}
	case 5:
		l := must(NewSlidingLog(limit, window))
		return subject{l, int64(limit), windowBound(limit, w)}
	default:
		anchor := time.UnixMilli(int64(p1) * 37)
		q := must(NewQuota(limit, Fixed(window, anchor)))
		return subject{q, int64(limit), alignedBound(limit, w, Millis(anchor))}
	}
}

// decodeEvents turns fuzz bytes into a timeline: mostly steps of 0-900 ms,
// sometimes idle gaps of up to hours, sometimes the clock set back.
func decodeEvents(data []byte, maxCost int64) []event {
	var out []event
	for i := 0; i+2 < len(data) && len(out) < 2000; i += 3 {
		b0, b1, b2 := data[i], float64(data[i+1]), float64(data[i+2])
		var step float64
		switch b0 % 16 {
		case 0:
			step = -(b1*20 + b2) // back by up to ~5 s
		case 1:
			step = b1 * 10 * minute / 255 // idle up to 10 min
		case 2:
			step = b1 * 3 * hour / 255 // idle up to 3 h
		default:
			step = float64(int(b1)<<8|int(b2)) / 65535 * 900
		}
		out = append(out, event{step, 1 + int64(b0>>4)%min(maxCost, 5)})
	}
	return out
}

func checkTimeline(kind uint8, p1, p2 uint16, data []byte) error {
	s := newSubject(kind, p1, p2)
	for s.maxCost > 1 && s.alg.ValidateCost(s.maxCost) != nil {
		s.maxCost--
	}
	deps, monotone, err := simulate(s, decodeEvents(data, s.maxCost))
	if err != nil {
		return fmt.Errorf("%s: %w", s.alg.Name(), err)
	}
	if err := s.check(deps, monotone); err != nil {
		return fmt.Errorf("%s (p1=%d p2=%d, %d departures, monotone=%v): %w", s.alg.Name(), p1, p2, len(deps), monotone, err)
	}
	return nil
}

// TestInvariantsOnRandomTimelines runs 50 seeded random timelines per
// algorithm through the same checks as the fuzz target.
func TestInvariantsOnRandomTimelines(t *testing.T) {
	t.Parallel()
	for kind := range uint8(7) {
		rng := rand.New(rand.NewPCG(uint64(kind), 99))
		for run := range 50 {
			data := make([]byte, 3*(100+rng.IntN(700)))
			for i := range data {
				data[i] = byte(rng.UintN(256))
			}
			if run%2 == 0 { // half the timelines never step back
				for i := 0; i < len(data); i += 3 {
					if data[i]%16 == 0 {
						data[i]++
					}
				}
			}
			if err := checkTimeline(kind, uint16(rng.UintN(65536)), uint16(rng.UintN(65536)), data); err != nil {
				t.Fatalf("run %d: %v", run, err)
			}
		}
	}
}

// FuzzInvariants: over any timeline of steps (including backward) and costs,
// (a) a denial never changes state, (b) the admitted cost in every window
// stays within the contract, (c) every decision is finite, every delay >= 0,
// (d) after ResetAfter the key decides as a cold key.
func FuzzInvariants(f *testing.F) {
	for kind := range uint8(7) {
		f.Add(kind, uint16(3), uint16(2), []byte{3, 0, 0, 3, 0, 0, 19, 1, 1, 35, 200, 200, 0, 10, 10, 3, 255, 255})
		f.Add(kind, uint16(49), uint16(4999), []byte{1, 255, 0, 51, 0, 0, 51, 0, 0, 51, 0, 0, 0, 255, 255, 67, 3, 3})
		f.Add(kind, uint16(6), uint16(1), []byte{2, 255, 0, 83, 1, 2, 83, 1, 2, 16, 2, 3, 4, 128, 0, 4, 128, 0})
	}
	f.Fuzz(func(t *testing.T, kind uint8, p1, p2 uint16, data []byte) {
		if err := checkTimeline(kind, p1, p2, data); err != nil {
			t.Fatal(err)
		}
	})
}
