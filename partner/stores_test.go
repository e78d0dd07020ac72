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
// cancels (in and out of order) and time passing give the same delays and the same remaining
// units on the memory store, a Redis node and a Redis cluster (each on
// the shaper's simulated clock), for every counting model at once, with
// calls costed as one number and calls costed per dimension (input and
// output tokens, shaper.WithCosts).
func TestSchedulesAreTheSameOnEveryStore(t *testing.T) {
	sameOnEveryStore(t, "same", []partner.Limit{
		partner.TrailingWindow("requests", 40, 10*time.Second).PerRequest(),
		partner.TrailingWindow("tokens", 5000, time.Minute),
		partner.Window("daily", 100000, 24*time.Hour),
		partner.Bucket("input", 3000, shaper.PerMinute(3000)),
		partner.Bucket("output", 1500, shaper.PerMinute(1500)),
	}, 900, 3000*time.Millisecond, true)
}

// A trailing window that queues deep, its reservations cancelled in and
// out of order (as a fleet's horizon gates do): the same on every store.
func TestQueuedTrailingWindowIsTheSameOnEveryStore(t *testing.T) {
	sameOnEveryStore(t, "queued", []partner.Limit{partner.TrailingWindow("tokens", 60, 10*time.Second)}, 12, 400*time.Millisecond, false)
}

// sameOnEveryStore plays script on limits on each store, calls of up to
// maxCost (split: an "output" part reserved apart in half of them), and
// the clock advancing up to maxStep at a time.
func sameOnEveryStore(t *testing.T, name string, limits []partner.Limit, maxCost int64, maxStep time.Duration, split bool) {
	node, cluster := redistest.NodeAndCluster(t)
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
			s, err := partner.New(store, limits, partner.WithShaper(shaper.WithClock(clock), shaper.WithMaxQueue(time.Hour), shaper.WithName(fmt.Sprintf("%s%d-%d", name, seed, i))))
			if err != nil {
				t.Fatal(err)
			}
			runs = append(runs, script(t, s, clock, seed, maxCost, maxStep, split))
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
func script(t *testing.T, s *shaper.Shaper, clock *timer.Fake, seed uint64, maxCost int64, maxStep time.Duration, split bool) []string {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 5))
	type hold struct {
		r    shaper.Reservation
		cost int64
		out  int64 // its output tokens reserved on their own (0: none)
	}
	var held []hold
	var out []string
	for step := range 300 {
		switch x := rng.IntN(10); {
		case x < 5:
			cost, maxOut := 1+rng.Int64N(maxCost), int64(0)
			rctx := ctx
			if split && rng.IntN(2) == 0 { // input and output apart: the output at its most
				maxOut = 1 + rng.Int64N(400)
				rctx = shaper.WithCosts(ctx, shaper.Costs{"output": maxOut})
			}
			r, err := s.Reserve(rctx, "acct", cost)
			out = append(out, fmt.Sprintf("reserve %d+%d: %v %v", cost, maxOut, r.Delay, err))
			if err == nil {
				held = append(held, hold{r, cost, maxOut})
			}
		case x < 7 && len(held) > 0:
			i := rng.IntN(len(held))
			used := held[i].cost * int64(3+rng.IntN(10)) / 10 // 0.3x to 1.2x
			sctx := ctx
			if h := held[i]; h.out > 0 {
				sctx = shaper.WithCosts(ctx, shaper.Costs{"output": h.out * int64(rng.IntN(11)) / 10}) // 0 to all of it
			}
			err := held[i].r.Settle(sctx, used)
			out = append(out, fmt.Sprintf("settle %d: %v", used, err))
			held = append(held[:i], held[i+1:]...)
		case x < 8 && len(held) > 0:
			// the newest, any (out of order), or the two newest, the
			// older first (an empty entry left newest)
			picks := []int{len(held) - 1}
			switch rng.IntN(3) {
			case 0:
				picks[0] = rng.IntN(len(held))
			case 1:
				if len(held) >= 2 {
					picks = []int{len(held) - 2, len(held) - 2}
				}
			}
			for _, i := range picks {
				err := held[i].r.Cancel(ctx)
				out = append(out, fmt.Sprintf("cancel: %v", err))
				held = append(held[:i], held[i+1:]...)
			}
		default:
			d := time.Duration(rng.Int64N(int64(maxStep/time.Millisecond))) * time.Millisecond
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
