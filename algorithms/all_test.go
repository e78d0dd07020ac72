package algorithms

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"
)

func clone(dims []Dim) []State {
	out := make([]State, len(dims))
	for i := range dims {
		out[i] = slices.Clone(dims[i].State)
	}
	return out
}

// maxInWindow returns the largest total cost of departures within any
// half-open window [t, t+w), t ranging over the departure times.
func maxInWindow(deps []departure, w float64) float64 {
	sort.Slice(deps, func(i, j int) bool { return deps[i].at < deps[j].at })
	best, sum, j := 0.0, 0.0, 0
	for i := range deps {
		for j < len(deps) && deps[j].at < deps[i].at+w {
			sum += deps[j].cost
			j++
		}
		best = max(best, sum)
		sum -= deps[i].cost
	}
	return best
}

type departure struct{ at, cost float64 }

// The LLM example: 60 requests per minute and 1,000 tokens per minute on one
// account, random token costs. Every departure satisfies both contracts in
// every window, and a refusal consumes in no dimension.
func TestAllTwoContractsProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	req := must(NewLeakyBucket(Rate{Count: 60, Period: time.Minute, Burst: 1}, 2*time.Minute))
	tok := must(NewLeakyBucket(Rate{Count: 1000, Period: time.Minute, Burst: 100}, 2*time.Minute))
	dims := []Dim{{Alg: req}, {Alg: tok}}
	var reqDeps, tokDeps []departure
	now := t0
	refusals, bindings := 0, [2]int{}
	for range 3000 {
		now += float64(rng.IntN(900))
		dims[0].Cost, dims[1].Cost = 1, int64(1+rng.IntN(150))
		before := clone(dims)
		d, err := All(dims, now)
		if err != nil {
			t.Fatal(err)
		}
		bindings[d.Binding]++
		if !d.Allowed {
			refusals++
			for i := range dims {
				if !sameState(before[i], dims[i].State) {
					t.Fatalf("refused, yet dimension %d changed from %v to %v", i, before[i], dims[i].State)
				}
			}
			continue
		}
		at := now + DurationMillis(d.Delay)
		reqDeps = append(reqDeps, departure{at, 1})
		tokDeps = append(tokDeps, departure{at, float64(dims[1].Cost)})
	}
	for _, w := range []float64{1 * second, 10 * second, 1 * minute, 5 * minute} {
		// W/T + max(burst, largest cost), with a microsecond of float slack.
		if got, limit := maxInWindow(reqDeps, w-1e-3), w/1000+1; got > limit {
			t.Errorf("requests: %v in a %v window, contract allows %v", got, w, limit)
		}
		if got, limit := maxInWindow(tokDeps, w-1e-3), w*1000/60000+150; got > limit {
			t.Errorf("tokens: %v in a %v window, contract allows %v", got, w, limit)
		}
	}
	if refusals == 0 || bindings[0] == 0 || bindings[1] == 0 {
		t.Fatalf("the timeline did not exercise refusals (%d) and both bindings (%v)", refusals, bindings)
	}
}

// Two users share one account dimension. User 1's own dimension delays its
// request by seconds; the account dimension must still space every departure
// on the account by T, in departure order, not in reservation order.
func TestAllSharedDimensionStaysPacedWhenAnotherDimensionBinds(t *testing.T) {
	t.Parallel()
	account := must(NewLeakyBucket(Rate{Count: 10, Period: time.Second, Burst: 1}, 10*time.Minute))
	user := must(NewLeakyBucket(Rate{Count: 1, Period: 5 * time.Second, Burst: 1}, 10*time.Minute))
	var acct State
	users := map[int]State{}
	var deps []departure
	now := t0
	for i := range 60 {
		u := i % 3
		dims := []Dim{{account, acct, 1}, {user, users[u], 1}}
		d, err := All(dims, now)
		if err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
		acct, users[u] = dims[0].State, dims[1].State
		deps = append(deps, departure{now + DurationMillis(d.Delay), 1})
		now += 20
	}
	sort.Slice(deps, func(i, j int) bool { return deps[i].at < deps[j].at })
	for i := 1; i < len(deps); i++ {
		if gap := deps[i].at - deps[i-1].at; gap < 100-1e-3 {
			t.Fatalf("departures %d and %d on the account are %v ms apart, want >= 100", i-1, i, gap)
		}
	}
}

func TestAllDenyModeAndBinding(t *testing.T) {
	t.Parallel()
	perSec := must(NewGCRA(Rate{Count: 5, Period: time.Second, Burst: 5}))
	perMin := must(NewFixedWindow(7, time.Minute))
	dims := []Dim{{Alg: perSec, Cost: 1}, {Alg: perMin, Cost: 1}}
	for i := range 5 {
		if d, _ := All(dims, t0); !d.Allowed {
			t.Fatalf("request %d refused", i)
		}
	}
	d, _ := All(dims, t0)
	if d.Allowed || d.Binding != 0 || d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("6th request at t0: %+v, want refused by dimension 0 for 200ms", d)
	}
	All(dims, t0+1000)
	All(dims, t0+1000)
	before := clone(dims)
	d, _ = All(dims, t0+1000)
	if d.Allowed || d.Binding != 1 || d.RetryAfter != 59*time.Second {
		t.Fatalf("8th request: %+v, want refused by the per-minute window for 59s", d)
	}
	if !sameState(before[0], dims[0].State) || !sameState(before[1], dims[1].State) {
		t.Fatal("a refusal by dimension 1 consumed in dimension 0")
	}
	// A mixed limit never queues: the smallest MaxWait wins.
	shaper := must(NewLeakyBucket(Rate{Count: 1, Period: time.Second, Burst: 1}, time.Hour))
	mixed := []Dim{{Alg: shaper, Cost: 1}, {Alg: perMin, Cost: 1}}
	All(mixed, t0+2*minute)
	if d, _ := All(mixed, t0+2*minute); d.Allowed {
		t.Fatalf("mixed limit queued: %+v", d)
	}
}

func TestAllCostErrorWritesNothing(t *testing.T) {
	t.Parallel()
	a := must(NewGCRA(Rate{Count: 5, Period: time.Second, Burst: 5}))
	b := must(NewGCRA(Rate{Count: 5, Period: time.Second, Burst: 2}))
	dims := []Dim{{Alg: a, Cost: 3}, {Alg: b, Cost: 3}}
	d, err := All(dims, t0)
	var ce *CostError
	if !errors.As(err, &ce) || d.Binding != 1 || dims[0].State != nil || dims[1].State != nil {
		t.Fatalf("got %+v, %v; want a CostError naming dimension 1 and nothing written", d, err)
	}
}
