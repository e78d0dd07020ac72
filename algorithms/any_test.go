package algorithms

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// AnyWithin over random combinations of every algorithm (a leaky bucket
// among them or not), on random timelines with pause floors: a request
// departs at the earliest instant some dimension admits it (the floor
// aside), exactly the dimensions that admit it then commit, a refusal
// writes nothing, PeekAny names the binding dimension, and the departures
// each dimension committed keep that dimension's contract in every window.
func TestAnyWithinProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(11, 13))
	var seen anyCounts
	for round := range 300 {
		if err := anyRound(rng, &seen); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	if seen.admitted == 0 || seen.refused == 0 || seen.partial == 0 || seen.floored == 0 {
		t.Fatalf("the timelines did not exercise AnyWithin: %+v", seen)
	}
}

// FuzzAnyWithin is TestAnyWithinProperty's round on the fuzzer's seeds.
func FuzzAnyWithin(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(11), uint64(13))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		if err := anyRound(rand.New(rand.NewPCG(a, b)), &anyCounts{}); err != nil {
			t.Fatal(err)
		}
	})
}

// anyCounts is what the rounds exercised.
type anyCounts struct{ admitted, partial, refused, floored int }

// anyRound runs one random combination of 2 to 4 algorithms through 80
// AnyWithin steps and checks the property of TestAnyWithinProperty.
func anyRound(rng *rand.Rand, seen *anyCounts) error {
	n := 2 + rng.IntN(3)
	dims := make([]Dim, n)
	subjects := make([]subject, n)
	deps := make([][]timedDeparture, n)
	for i := range dims {
		subjects[i] = newSubject(uint8(rng.IntN(7)), uint16(rng.IntN(1<<16)), uint16(rng.IntN(1<<16)))
		dims[i].Alg = subjects[i].alg
	}
	now := t0
	for step := range 80 {
		now += float64(rng.IntN(300))
		floor := now
		if rng.IntN(10) == 0 {
			floor += float64(rng.IntN(1500))
		}
		for i := range dims {
			dims[i].Cost = 1 + rng.Int64N(subjects[i].maxCost)
			for dims[i].Cost > 1 && dims[i].Alg.ValidateCost(dims[i].Cost) != nil {
				dims[i].Cost--
			}
		}
		before := clone(dims)
		delays := make([]float64, n)
		earliest := math.Inf(1)
		for i := range dims {
			delays[i] = dims[i].Alg.Delay(dims[i].State, now, dims[i].Cost)
			earliest = min(earliest, delays[i])
		}
		peek := make([]Standing, n)
		pb := PeekAny(dims, now, floor, peek)
		d, err := AnyWithin(dims, now, floor, math.Inf(1))
		if err != nil {
			return fmt.Errorf("step %d: %v", step, err)
		}
		if d.Binding != pb {
			return fmt.Errorf("step %d: PeekAny binds %d, AnyWithin %d", step, pb, d.Binding)
		}
		if !d.Allowed {
			seen.refused++
			for i := range dims {
				if !slices.Equal(dims[i].State, before[i]) {
					return fmt.Errorf("step %d: a refusal changed dimension %d", step, i)
				}
			}
			continue
		}
		seen.admitted++
		if floor > now+earliest {
			seen.floored++
		}
		if want := max(earliest, floor-now); d.Wait != want {
			return fmt.Errorf("step %d: departs after %v, the earliest admission is %v", step, d.Wait, want)
		}
		for i := range dims {
			took := d.Took&(1<<i) != 0
			if took != (delays[i] <= d.Wait) {
				return fmt.Errorf("step %d: dimension %d (delay %v) took=%v at a departure after %v", step, i, delays[i], took, d.Wait)
			}
			if !took && !slices.Equal(dims[i].State, before[i]) {
				return fmt.Errorf("step %d: dimension %d did not admit but changed", step, i)
			}
			if took {
				deps[i] = append(deps[i], timedDeparture{real: now + d.Wait, reading: now + d.Wait, cost: float64(dims[i].Cost)})
			}
		}
		if popcount(d.Took) < n {
			seen.partial++
		}
	}
	for i := range dims {
		if err := subjects[i].check(deps[i], true); err != nil {
			return fmt.Errorf("dimension %d (%s) broke its contract: %v", i, dims[i].Alg.Name(), err)
		}
	}
	return nil
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}
