package algorithms

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Peek reads what All decides, and changes nothing: over random
// combinations of every algorithm, at random instants with random pause
// floors, Peek names the binding dimension All then names, its delay is
// All's wait (admitted) or wait past MaxWait (refused), and the states are
// untouched.
func TestPeekPredictsAll(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 5))
	for round := range 400 {
		n := 1 + rng.IntN(3)
		dims := make([]Dim, n)
		subjects := make([]subject, n)
		for i := range dims {
			subjects[i] = newSubject(uint8(rng.IntN(7)), uint16(rng.IntN(1<<16)), uint16(rng.IntN(1<<16)))
			dims[i].Alg = subjects[i].alg
		}
		now := t0
		for step := range 60 {
			now += float64(rng.IntN(400))
			floor := now
			if rng.IntN(8) == 0 {
				floor += float64(rng.IntN(2000))
			}
			for i := range dims {
				dims[i].Cost = 1 + rng.Int64N(subjects[i].maxCost)
			}
			out := make([]Standing, n)
			before := clone(dims)
			binding := Peek(dims, now, floor, out)
			for i := range dims {
				if !slices.Equal(dims[i].State, before[i]) {
					t.Fatalf("round %d step %d: Peek changed dimension %d's state", round, step, i)
				}
			}
			d, err := AllNotBefore(dims, now, floor)
			if err != nil {
				continue // a cost past this dimension's own limit: All refuses it, Peek is not asked to
			}
			if d.Binding != binding {
				t.Fatalf("round %d step %d: Peek binds %d, All %d", round, step, binding, d.Binding)
			}
			want := floor - now
			if binding >= 0 {
				want = out[binding].Delay
			}
			got := d.Wait
			if !d.Allowed {
				got += minMaxWait(dims)
			}
			if got != want {
				t.Fatalf("round %d step %d: Peek's delay %v, All waited %v", round, step, want, got)
			}
		}
	}
}

func minMaxWait(dims []Dim) float64 {
	w := dims[0].Alg.MaxWait()
	for _, d := range dims {
		w = min(w, d.Alg.MaxWait())
	}
	return w
}

// When no dimension makes a request wait, the binding one is the one with
// the fewest requests of its cost left: an LLM account with 50 requests
// left and 2,000 tokens, for a request of 700 tokens, is bound by tokens
// (2 such requests left), and by requests for one of 10 tokens.
func TestTheBindingDimensionIsTheNearestToRunningOut(t *testing.T) {
	t.Parallel()
	req := must(NewLeakyBucket(Rate{Count: 60, Period: time.Second, Burst: 50}, time.Minute))
	tok := must(NewLeakyBucket(Rate{Count: 1000, Period: time.Second, Burst: 2000}, time.Minute))
	for _, c := range []struct {
		tokens int64
		want   int
	}{{700, 1}, {10, 0}} {
		dims := []Dim{{Alg: req, Cost: 1}, {Alg: tok, Cost: c.tokens}}
		out := make([]Standing, 2)
		if b := Peek(dims, t0, t0, out); b != c.want {
			t.Fatalf("%d tokens: Peek binds %d, want %d (%+v)", c.tokens, b, c.want, out)
		}
		d, err := All(dims, t0)
		if err != nil || d.Binding != c.want {
			t.Fatalf("%d tokens: All binds %d (%v), want %d", c.tokens, d.Binding, err, c.want)
		}
	}
}
