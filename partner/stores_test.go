package partner_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/partner"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// The schedules a partner's limits derive keep the same slots on every
// store: seeded runs of reservations, settles for less and for more,
// cancels and time passing give the same delays and the same remaining
// units on the memory store, a Redis node and a Redis cluster (each on
// the shaper's simulated clock), for every counting model at once.
func TestSchedulesAreTheSameOnEveryStore(t *testing.T) {
	node, cluster := redistest.NodeAndCluster(t)
	limits := []partner.Limit{
		partner.TrailingWindow("requests", 40, 10*time.Second).PerRequest(),
		partner.TrailingWindow("tokens", 5000, time.Minute),
		partner.Window("daily", 100000, 24*time.Hour),
		partner.Bucket("input", 3000, shaper.PerMinute(3000)),
	}
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for seed := range uint64(4) {
		var runs [][]string
		for i, st := range []func(t *testing.T) shaper.Store{
			func(t *testing.T) shaper.Store { return memstore.New(memstore.WithSweepInterval(0)) },
			func(t *testing.T) shaper.Store {
				return redisstore.New(node, redisstore.WithClientClock(), redisstore.WithTimeout(redistest.SlowMachine))
			},
			func(t *testing.T) shaper.Store {
				return redisstore.New(cluster, redisstore.WithClientClock(), redisstore.WithTimeout(redistest.SlowMachine))
			},
		} {
			store := st(t)
			clock := timer.NewFake(start)
			s, err := partner.New(store, limits, partner.WithShaper(shaper.WithClock(clock), shaper.WithName(fmt.Sprintf("same%d-%d", seed, i))))
			if err != nil {
				t.Fatal(err)
			}
			runs = append(runs, script(t, s, clock, seed))
			if c, ok := store.(interface{ Close() error }); ok {
				_ = c.Close()
			}
		}
		for i, name := range []string{"a Redis node", "a Redis cluster"} {
			for j := range runs[0] {
				if runs[i+1][j] != runs[0][j] {
					t.Fatalf("seed %d, step %d: memory %s, %s %s", seed, j, runs[0][j], name, runs[i+1][j])
				}
			}
		}
	}
}

// script plays a seeded run on s and returns what each step saw.
func script(t *testing.T, s *shaper.Shaper, clock *timer.Fake, seed uint64) []string {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 5))
	type hold struct {
		r    shaper.Reservation
		cost int64
	}
	var held []hold
	var out []string
	for step := range 300 {
		switch x := rng.IntN(10); {
		case x < 5:
			cost := 1 + rng.Int64N(900)
			r, err := s.Reserve(ctx, "acct", cost)
			out = append(out, fmt.Sprintf("reserve %d: %v %v", cost, r.Delay, err))
			if err == nil {
				held = append(held, hold{r, cost})
			}
		case x < 7 && len(held) > 0:
			i := rng.IntN(len(held))
			used := held[i].cost * int64(3+rng.IntN(10)) / 10 // 0.3x to 1.2x
			err := held[i].r.Settle(ctx, used)
			out = append(out, fmt.Sprintf("settle %d: %v", used, err))
			held = append(held[:i], held[i+1:]...)
		case x < 8 && len(held) > 0:
			i := len(held) - 1
			err := held[i].r.Cancel(ctx)
			out = append(out, fmt.Sprintf("cancel: %v", err))
			held = held[:i]
		default:
			d := time.Duration(rng.IntN(3000)) * time.Millisecond
			clock.Advance(d)
			out = append(out, fmt.Sprintf("advance %v", d))
		}
		st, err := s.Status(ctx, "acct", 1)
		if err != nil {
			t.Fatalf("step %d: Status: %v", step, err)
		}
		out[len(out)-1] += fmt.Sprintf(" | remaining %d next %v", st.Remaining, st.Next.Sub(clock.Now()))
	}
	return out
}
