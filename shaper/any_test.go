package shaper

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// Any: a request departs when the first dimension admits it, and only the
// dimensions that admit it then consume; the same on memory, a Redis node
// and the cluster. Each account has its own 1/s and draws on a pool of 2
// per minute (burst 2) shared by all.
func TestAnyConsumesOnlyWhereItAdmits(t *testing.T) {
	t.Parallel()
	single, cluster := nodeAndCluster(t)
	for _, st := range []struct {
		name   string
		client redis.UniversalClient
	}{{"memory", nil}, {"redis", single}, {"cluster", cluster}} {
		t.Run(st.name, func(t *testing.T) {
			clock := timer.NewFake(t0)
			var store Store = memstore.New(memstore.WithSweepInterval(0))
			if st.client != nil {
				store = redisstore.New(st.client, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
			}
			s, err := Any(store, []Dimension{
				{Name: "own", Rate: PerSecond(1)},
				{Name: "pool", Rate: PerMinute(2).WithBurst(2), Key: func(string) string { return "pool" }},
			}, WithClock(clock), WithMaxQueue(5*time.Second), WithPrefix("any:"+st.name+":"))
			if err != nil {
				t.Fatal(err)
			}
			// figures reads a's standing: each dimension's remaining and wait.
			figures := func() string {
				t.Helper()
				s, err := s.Status(bg, "a", 1)
				if err != nil {
					t.Fatal(err)
				}
				now := clock.Now()
				return fmt.Sprintf("own %d +%v, pool %d +%v, binding %s", s.Dimensions[0].Remaining, s.Dimensions[0].Next.Sub(now),
					s.Dimensions[1].Remaining, s.Dimensions[1].Next.Sub(now), s.Binding)
			}
			steps := []struct {
				key        string
				wantDelay  time.Duration
				wantStatus string
			}{
				{"a", 0, "own 0 +1s, pool 1 +0s, binding pool"},           // both admitted it: both consumed
				{"a", 0, "own 0 +1s, pool 0 +30s, binding own"},           // own would wait: the pool alone
				{"a", time.Second, "own 0 +2s, pool 0 +30s, binding own"}, // the pool is out: own, in 1 s; the pool untouched
				{"b", 0, "own 0 +2s, pool 0 +30s, binding own"},           // b's own admits at once; the pool untouched
			}
			for i, step := range steps {
				r, err := s.Reserve(bg, step.key, 1)
				if err != nil || r.Delay != step.wantDelay {
					t.Fatalf("step %d (%s): %v %v, want a slot in %v", i, step.key, r.Delay, err, step.wantDelay)
				}
				if got := figures(); got != step.wantStatus {
					t.Fatalf("step %d (%s): %s, want %s", i, step.key, got, step.wantStatus)
				}
			}
			for range 4 { // a's own queue: +2 s to +5 s (MaxQueue)
				mustReserve(t, s, "a", 1)
			}
			var qf *QueueFullError
			if _, err := s.Reserve(bg, "a", 1); !errors.As(err, &qf) || qf.Dimension != "own" {
				t.Fatalf("own 5 s ahead, the pool 30 s: %v, want a QueueFullError bound by own (the soonest)", err)
			}
			clock.Advance(31 * time.Second)
			// Both admit; the pool has a little more than one request left (it
			// refills for 31 s of its 30 s interval).
			if got := figures(); got != "own 1 +0s, pool 1 +0s, binding pool" {
				t.Fatalf("31 s later: %s", got)
			}
		})
	}
}

// Any with a cost one dimension could never admit leaves that dimension
// out; a cost none could ever admit is a *CostError; Any refuses more
// dimensions than it can combine.
func TestAnyCostsAndLimits(t *testing.T) {
	t.Parallel()
	clock := timer.NewFake(t0)
	s, err := Any(memstore.New(memstore.WithSweepInterval(0)), []Dimension{
		{Name: "small", Rate: PerSecond(10).WithBurst(2)},
		{Name: "large", Rate: PerSecond(100).WithBurst(50)},
	}, WithClock(clock), WithAlgorithm(GCRA))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.Reserve(bg, "k", 30); err != nil || r.Delay != 0 {
		t.Fatalf("a cost only large admits: %v %v", r.Delay, err)
	}
	st, err := s.Status(bg, "k", 1)
	if err != nil || st.Dimensions[0].Remaining != 20 || st.Dimensions[1].Remaining != 2 { // in name order: large, small
		t.Fatalf("after 30 through large alone: %+v %v", st, err)
	}
	if _, err := s.Reserve(bg, "k", 51); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("a cost no dimension could ever admit: %v", err)
	}
	if _, err := s.Status(bg, "k", 51); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("Status of a cost no dimension could ever admit: %v", err)
	}
	many := make([]Dimension, 65)
	for i := range many {
		many[i] = Dimension{Name: fmt.Sprint(i), Rate: PerSecond(1)}
	}
	if _, err := Any(memstore.New(memstore.WithSweepInterval(0)), many); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("65 dimensions: %v", err)
	}
}
