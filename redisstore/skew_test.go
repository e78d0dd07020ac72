package redisstore

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// The estimate of how far the shaper's clock runs ahead of the server's is
// an upper bound at every call (so no slot is early on the server's
// timeline) while the clocks only drift, and after a step of the server's
// clock is below by at most the way to the server; it is never looser than
// the call's own bound (no slot later than anchoring at its reply), and it
// comes down only to a tighter bound a call found (so slot instants come
// closer only by that much): random histories of calls with random
// latencies.
func TestSkewIsAnUpperBoundThatComesDownSlowly(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var k skew
		local := rng.Float64() * 1e6                  // the shaper's clock, ms since its base
		theta := local - (1.7e12 + rng.Float64()*1e9) // ms: the shaper's clock less the server's
		drift := (rng.Float64()*2 - 1) * skewDrift    // within what est allows for
		steps := seed%3 == 0                          // the server's clock is stepped now and then
		prev, maxOut, stepped := 0.0, 0.0, false
		for i := range 2000 {
			step := rng.ExpFloat64() * 5 // ms between calls
			if rng.IntN(50) == 0 {
				step = rng.Float64() * 5000
			}
			local += step
			theta += drift * step
			if steps && rng.IntN(300) == 0 {
				theta += rng.Float64()*200 - 100
				stepped = true
			}
			out := rng.ExpFloat64() * 0.3 // the way to the server
			if rng.IntN(10) == 0 {
				out += rng.Float64() * 20 // a busy pool
			}
			maxOut = max(maxOut, out)
			back := rng.ExpFloat64() * 0.3 // the way back, and reading the reply
			if rng.IntN(5) == 0 {
				back += rng.Float64() * 30 // read late
			}
			took := 0.0
			if rng.IntN(3) == 0 {
				took = rng.Float64() * 2 // a batch ran after deciding
			}
			sent := local
			decided := sent + out - theta
			replied := sent + out + took + back
			hi := replied - decided - took
			est := k.observe(sent, replied, decided, took)
			below := msStep
			if stepped {
				below += maxOut
			}
			if est < theta-below {
				t.Fatalf("seed %d call %d: est %v below θ %v (stepped %v): slots early on the server's timeline", seed, i, est, theta, stepped)
			}
			if est > hi+msStep {
				t.Fatalf("seed %d call %d: est %v looser than the call's own bound %v: slots later than at the reply", seed, i, est, hi)
			}
			if i > 0 && est < prev-msStep && est > hi+msStep {
				t.Fatalf("seed %d call %d: est fell from %v to %v, not to the call's bound %v", seed, i, prev, est, hi)
			}
			prev = est
			local = replied
		}
	}
}

// On Redis TIME, the instants Reservation.Time gives concurrent callers of
// one key keep the contract's spacing however late each reply is read: 64
// callers through a pool of 4 connections on a loaded machine, 200/s burst
// 1, after a few calls found the store's estimate. Every slot whose
// instant is after its reply (a caller that sleeps to it) is at least the
// interval after the one before, less what the estimate came down
// meanwhile (its net fall, read from the store, plus the drift allowance it
// may have risen by and come down again), and no window of 1 s less that
// holds more than 201 of those slots (the contract's rate plus its burst).
// Anchored at each reply, gaps of 0.4 ms were seen, and 202 slots in a
// second. (A slot whose reply is read after it departs at once, late: no
// mapping can help it, and its instant is not judged.)
func TestSlotInstantsDoNotBunchUnderPoolContention(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 4})
	t.Cleanup(func() { _ = client.Close() })
	st := New(client)
	sh, err := shaper.New(st, shaper.PerSecond(200))
	if err != nil {
		t.Fatal(err)
	}
	for range 20 { // the estimate found: the first calls dial and load the script
		if _, err := sh.Reserve(context.Background(), "warm", 1); err != nil {
			t.Fatal(err)
		}
	}
	k := &st.r.skew
	k.mu.Lock()
	warm := k.est
	k.mu.Unlock()
	began := time.Now()
	type slot struct{ at, replied time.Time }
	var (
		mu    sync.Mutex
		slots []slot
		wg    sync.WaitGroup
	)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				r, err := sh.Reserve(context.Background(), "k", 1)
				replied := time.Now()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				slots = append(slots, slot{r.Time(), replied})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// What the estimate came down in all: its net fall since warm plus
	// whatever it rose meanwhile, which is only by the drift allowance
	// (100 ppm of the run) and can come down again. Any one fall between
	// two slots is within it.
	k.mu.Lock()
	fell := max(warm-k.est, 0) + skewDrift*algorithms.DurationMillis(time.Since(began))
	k.mu.Unlock()
	slices.SortFunc(slots, func(a, b slot) int { return a.at.Compare(b.at) })
	interval := 5 * time.Millisecond
	slack := algorithms.Duration(fell+2*msStep) + time.Microsecond
	for i := 1; i < len(slots); i++ {
		if !slots[i].at.After(slots[i].replied) || !slots[i-1].at.After(slots[i-1].replied) {
			continue // a reply read after its slot: that caller leaves late, at once
		}
		if gap := slots[i].at.Sub(slots[i-1].at); gap < interval-slack {
			t.Errorf("slots %d and %d are %v apart, less than %v - %v", i-1, i, gap, interval, slack)
		}
	}
	// The window's count, of the same slots: a slot whose reply was read
	// after it departs at its reply, late, which no mapping can help.
	var onTime []time.Time
	for _, sl := range slots {
		if sl.at.After(sl.replied) {
			onTime = append(onTime, sl.at)
		}
	}
	for i := range onTime {
		j := i
		for j < len(onTime) && onTime[j].Sub(onTime[i]) < time.Second-slack {
			j++
		}
		if j-i > 201 {
			t.Fatalf("%d slot instants within 1 s - %v from slot %d (200/s burst 1 allows 201 in 1 s)", j-i, slack, i)
		}
	}
}
