package shaper

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/memstore"
)

// snapshot reads the standing of key in every dimension of s from its
// store, as figures on the store's timeline, unrounded (ms; a request of
// one unit): each dimension's delay, remaining and time to cold, which
// any write to its state changes. Package shaper cannot read a store's
// own state (memstore's), only what its contract answers.
func snapshot(t *testing.T, s *Shaper, key string) []algorithms.Standing {
	t.Helper()
	c := s.cur.Load()
	ks, err := s.keysOf(c, key)
	if err != nil {
		t.Fatal(err)
	}
	q := &store.Query{KeySet: ks, Now: algorithms.Millis(s.cfg.clock.Now())}
	for _, d := range c.dims {
		q.Algs, q.Costs = append(q.Algs, d.Alg), append(q.Costs, 1)
	}
	if err := s.store.Status(bg, q); err != nil {
		t.Fatal(err)
	}
	return append(q.Figures, algorithms.Standing{Delay: q.Until - q.At}) // and any pause
}

type dep struct {
	at   time.Time
	cost int64
}

// mostInWindow returns the largest total cost departing within any
// half-open window [t, t+w).
func mostInWindow(deps []dep, w time.Duration) int64 {
	slices.SortFunc(deps, func(a, b dep) int { return a.at.Compare(b.at) })
	var best, sum int64
	j := 0
	for i := range deps {
		for j < len(deps) && deps[j].at.Before(deps[i].at.Add(w)) {
			sum += deps[j].cost
			j++
		}
		best = max(best, sum)
		sum -= deps[i].cost
	}
	return best
}

// 60 requests per minute and 1,000 units per minute (burst 100) with random
// costs: the departures satisfy both contracts in every window, and when one
// dimension refuses, no dimension consumes.
func TestMultiDimensionProperty(t *testing.T) {
	t.Parallel()
	clock := newFakeAt(t0)
	store := memstore.New(memstore.WithSweepInterval(0))
	s, err := All(store, []Dimension{
		{Name: "requests", Rate: PerMinute(60), Cost: func(int64) int64 { return 1 }},
		{Name: "units", Rate: PerMinute(1000).WithBurst(100)},
	}, WithClock(clock), WithMaxQueue(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 8))
	var reqs, units []dep
	refused := map[string]int{}
	for range 4000 {
		clock.Advance(time.Duration(rng.IntN(900)) * time.Millisecond)
		cost := int64(1 + rng.IntN(150))
		before := snapshot(t, s, "acct")
		r, err := s.Reserve(bg, "acct", cost)
		var qf *QueueFullError
		if errors.As(err, &qf) {
			refused[qf.Dimension]++
			after := snapshot(t, s, "acct")
			for i := range before {
				if before[i] != after[i] {
					t.Fatalf("refused by %q, yet dimension %d changed %v -> %v", qf.Dimension, i, before[i], after[i])
				}
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, dep{r.Time(), 1})
		units = append(units, dep{r.Time(), cost})
	}
	for _, w := range []time.Duration{time.Second, 10 * time.Second, time.Minute, 5 * time.Minute} {
		if got, limit := mostInWindow(reqs, w), int64(w/time.Second)+1; got > limit {
			t.Errorf("requests: %d in a %v window, contract allows %d", got, w, limit)
		}
		// W/T + max(burst, largest cost): costs above the burst leave as one block.
		if got, limit := mostInWindow(units, w), int64(w*1000/time.Minute)+150; got > limit {
			t.Errorf("units: %d in a %v window, contract allows %d", got, w, limit)
		}
	}
	if refused["requests"] == 0 || refused["units"] == 0 || len(reqs) < 1000 {
		t.Fatalf("the timeline did not exercise both dimensions: refusals %v, %d admitted", refused, len(reqs))
	}
}

// Keys mapped per dimension: two users share an account dimension.
func TestMultiDimensionSharedAccount(t *testing.T) {
	t.Parallel()
	clock := newFakeAt(t0)
	store := memstore.New(memstore.WithSweepInterval(0))
	account := func(key string) string { return "acct-1" }
	s, err := All(store, []Dimension{
		{Name: "user", Rate: PerSecond(1)},
		{Name: "account", Rate: PerSecond(10), Key: account},
	}, WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	var deps []dep
	for i := range 30 {
		r := mustReserve(t, s, []string{"alice", "bob", "carol"}[i%3], 1)
		deps = append(deps, dep{r.Time(), 1})
	}
	if got := mostInWindow(deps, 100*time.Millisecond); got > 1 {
		t.Fatalf("%d departures on the account within 100 ms", got)
	}
	if got := mostInWindow(deps, time.Second); got > 3 {
		t.Fatalf("%d departures within 1 s: three users at 1/s each allow 3", got)
	}
	// Pausing one user's key pauses the shared account for everyone.
	clock.Advance(time.Hour)
	if err := s.Pause(bg, "alice", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	r := mustReserve(t, s, "bob", 1)
	if r.Delay != 5*time.Second {
		t.Fatalf("bob after alice's account was paused: %v, want 5s", r.Delay)
	}
	// A cost mapped to 0 leaves the dimension out.
	free, err := All(store, []Dimension{
		{Name: "requests", Rate: PerSecond(1), Cost: func(int64) int64 { return 0 }},
		{Name: "tokens", Rate: PerSecond(1000).WithBurst(1000)},
	}, WithClock(clock), WithName("free"))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if r := mustReserve(t, free, "k", 100); r.Delay != 0 {
			t.Fatalf("the requests dimension was consulted: %v", r.Delay)
		}
	}
	// A multi-dimension cost error names the dimension and writes nothing.
	neg, err := All(store, []Dimension{
		{Name: "a", Rate: PerSecond(1)},
		{Name: "b", Rate: PerSecond(1), Cost: func(c int64) int64 { return -c }},
	}, WithClock(clock), WithName("neg"))
	if err != nil {
		t.Fatal(err)
	}
	held := store.Len()
	if _, err := neg.Reserve(bg, "k", 1); !errors.Is(err, ErrInvalidCost) || !strings.Contains(err.Error(), `dimension "b"`) {
		t.Fatalf("negative mapped cost: %v", err)
	}
	big, err := All(store, []Dimension{
		{Name: "a", Rate: PerSecond(1)},
		{Name: "b", Rate: PerSecond(1).WithBurst(2)},
	}, WithClock(clock), WithName("big"), WithAlgorithm(GCRA))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := big.Reserve(bg, "k", 2); !errors.Is(err, ErrInvalidCost) || !strings.Contains(err.Error(), `dimension "a"`) {
		t.Fatalf("cost above dimension a's burst: %v", err)
	}
	if store.Len() != held {
		t.Fatalf("refused costs wrote %d keys", store.Len()-held)
	}
}
