package algorithms

import (
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
	admitted, partial, refused, floored := 0, 0, 0, 0
	for round := range 300 {
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
				t.Fatalf("round %d step %d: %v", round, step, err)
			}
			if d.Binding != pb {
				t.Fatalf("round %d step %d: PeekAny binds %d, AnyWithin %d", round, step, pb, d.Binding)
			}
			if !d.Allowed {
				refused++
				for i := range dims {
					if !slices.Equal(dims[i].State, before[i]) {
						t.Fatalf("round %d step %d: a refusal changed dimension %d", round, step, i)
					}
				}
				continue
			}
			admitted++
			if floor > now+earliest {
				floored++
			}
			if want := max(earliest, floor-now); d.Wait != want {
				t.Fatalf("round %d step %d: departs after %v, the earliest admission is %v", round, step, d.Wait, want)
			}
			for i := range dims {
				took := d.Took&(1<<i) != 0
				if took != (delays[i] <= d.Wait) {
					t.Fatalf("round %d step %d: dimension %d (delay %v) took=%v at a departure after %v", round, step, i, delays[i], took, d.Wait)
				}
				if !took && !slices.Equal(dims[i].State, before[i]) {
					t.Fatalf("round %d step %d: dimension %d did not admit but changed", round, step, i)
				}
				if took {
					deps[i] = append(deps[i], timedDeparture{real: now + d.Wait, reading: now + d.Wait, cost: float64(dims[i].Cost)})
				}
			}
			if bits := popcount(d.Took); bits < n {
				partial++
			}
		}
		for i := range dims {
			if err := subjects[i].check(deps[i], true); err != nil {
				t.Fatalf("round %d: dimension %d (%s) broke its contract: %v", round, i, dims[i].Alg.Name(), err)
			}
		}
	}
	if admitted == 0 || refused == 0 || partial == 0 || floored == 0 {
		t.Fatalf("the timelines did not exercise AnyWithin: %d admitted (%d by some dimensions only, %d at a floor), %d refused", admitted, partial, floored, refused)
	}
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}
