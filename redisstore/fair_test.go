package redisstore

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// Two shapers on two stores (two clients, as two processes have), flows
// split across them: A (weight 3) waits in one, B (weight 1) in the other,
// both backlogged on one key at 50/s. The turns are decided in Redis, so
// the shares hold whatever the timing: after a first second, A's share is
// within 5 % of 75 %, and no 1 s window holds more than the rate and its
// burst, on a node and on a 3-master cluster. Wall clock: 5 s per client;
// the slots are Redis TIME's, read back from each reservation (Time),
// which counts from a client clock reading after the reply, so a window
// is allowed the burst above the rate (the tolerance) for that
// lag, no more.
func TestFairSharesAcrossTwoStores(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t)
	for name, clients := range map[string][2]redis.UniversalClient{
		"node":    {srv.Client(), srv.Client()},
		"cluster": {cluster.Client(t), cluster.Client(t)},
	} {
		t.Run(name, func(t *testing.T) {
			const rate, burst = 50, 1
			var sh [2]*shaper.Shaper
			for i, c := range clients {
				st := New(c, WithTimeout(slowMachine))
				t.Cleanup(func() { _ = st.Close() })
				s, err := shaper.New(st, shaper.PerSecond(rate), shaper.WithName("fair-two-"+name), shaper.WithMaxQueue(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				sh[i] = s
			}
			ctx, cancel := context.WithTimeout(bg, 5*time.Second)
			defer cancel()
			var mu sync.Mutex
			deps := map[string][]time.Time{}
			var wg sync.WaitGroup
			for i, f := range []shaper.Flow{{Name: "A", Weight: 3}, {Name: "B", Weight: 1}} {
				fctx := shaper.WithFlow(ctx, f)
				for range 64 {
					wg.Go(func() {
						for {
							r, err := sh[i].Acquire(fctx, "k", 1)
							if err != nil { // the end of the run: its deadline refuses the last turns at once
								var de *shaper.DeadlineError
								if ctx.Err() == nil && !errors.As(err, &de) {
									t.Errorf("%s: %v", f.Name, err)
								}
								return
							}
							mu.Lock()
							deps[f.Name] = append(deps[f.Name], r.Time())
							mu.Unlock()
						}
					})
				}
			}
			wg.Wait()
			var all []time.Time
			start := time.Now().Add(-5 * time.Second)
			n := map[string]int{}
			for name, ts := range deps {
				all = append(all, ts...)
				for _, at := range ts {
					if at.Sub(start) >= time.Second {
						n[name]++
					}
				}
			}
			slices.SortFunc(all, func(a, b time.Time) int { return a.Compare(b) })
			most, j := 0, 0
			for i := range all {
				for all[i].Sub(all[j]) >= time.Second {
					j++
				}
				most = max(most, i-j+1)
			}
			share := float64(n["A"]) / float64(n["A"]+n["B"])
			t.Logf("A %d, B %d after the first second: A's share %.3f; busiest 1 s %d", n["A"], n["B"], share, most)
			if math.Abs(share-0.75) > 0.05*0.75 {
				t.Errorf("A's share %.3f, want 0.75 within 5 %%", share)
			}
			if most > rate+burst {
				t.Errorf("%d departures in one second, more than the rate and its burst (%d)", most, rate+burst)
			}
			if total := n["A"] + n["B"]; float64(total) < 0.9*4*rate {
				t.Errorf("%d departures in the last 4 s at %d/s", total, rate)
			}
		})
	}
}

// The failure policies apply to fair requests: while Redis is down, a
// process serves its flows in their order (FailLocal's memory store takes
// their turns), and each reservation meets the policy: FailClosed fails
// it with an *Error matching ErrStoreUnavailable, FailOpen and FailLocal
// grant it. Two flows backlogged under FailLocal still take turns.
func TestFairRequestsUnderTheFailurePolicies(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	shaperOf := func(policy FailurePolicy) *shaper.Shaper {
		c := srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 })
		st := New(c, WithTimeout(100*time.Millisecond), WithFailurePolicy(policy))
		t.Cleanup(func() { _ = st.Close() })
		s, err := shaper.New(st, shaper.PerSecond(20), shaper.WithName("fair-fail"), shaper.WithMaxQueue(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	closed, open, local := shaperOf(FailClosed), shaperOf(FailOpen), shaperOf(FailLocal(1))
	a := shaper.WithFlow(bg, shaper.Flow{Name: "A"})
	for _, s := range []*shaper.Shaper{closed, open, local} {
		if err := s.Wait(a, "up", 1); err != nil {
			t.Fatalf("with Redis up: %v", err)
		}
	}
	srv.Kill()
	if err := closed.Wait(a, "k", 1); !errors.Is(err, shaper.ErrStoreUnavailable) || !errors.As(err, new(*Error)) {
		t.Fatalf("FailClosed: %v, want an *Error matching ErrStoreUnavailable", err)
	}
	if err := open.Wait(a, "k", 1); err != nil {
		t.Fatalf("FailOpen: %v", err)
	}
	// FailLocal (its memory store takes the turns): A's backlog of 10,
	// then B's 5: B's go one in two. (FailOpen paces nothing: every
	// request leaves at once, its turn included.)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	first := make(chan struct{}) // A's first departure: the other 9 wait 450 ms more
	var once sync.Once
	for _, f := range []string{"A", "B"} {
		n := map[string]int{"A": 10, "B": 5}[f]
		ctx := shaper.WithFlow(bg, shaper.Flow{Name: f})
		for range n {
			wg.Go(func() {
				if err := local.Wait(ctx, "k2", 1); err != nil {
					t.Errorf("FailLocal, %s: %v", f, err)
					return
				}
				mu.Lock()
				order = append(order, f)
				mu.Unlock()
				once.Do(func() { close(first) })
			})
		}
		<-first // B's requests arrive while A's wait
	}
	wg.Wait()
	got := strings.Join(order, "")
	t.Logf("FailLocal departures: %s", got)
	if i := strings.IndexByte(got, 'B'); i < 0 || i > 4 || !strings.Contains(got, "BABABAB") {
		t.Fatalf("FailLocal departures %s: B's requests do not take turns with A's", got)
	}
}
