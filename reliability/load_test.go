//go:build faults

package reliability

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// TestLoadMillionReservations: 1,000,000 reservations over 10,000 keys from
// 64 goroutines through one Redis, at one per 10 s per key so that every
// reservation after a key's first queues (100 per key: 1,000 s deep). Every
// one is granted, and no key is over-admitted: recomputed from the recorded
// slots, consecutive slots of a key are at least one interval apart. The store runs on the client clock so
// that each recorded slot is exactly the instant the script computed.
func TestLoadMillionReservations(t *testing.T) {
	const (
		total   = 1_000_000
		nkeys   = 10_000
		workers = 64
		every   = 10 * time.Second // per key: every reservation after the first queues
	)
	srv := redistest.Start(t)
	client := srv.Client(func(o *redis.Options) { o.PoolSize = 128 })
	store := redisstore.New(client, redisstore.WithClientClock(), redisstore.WithTimeout(5*time.Second))
	s, err := shaper.New(store, shaper.Every(every), shaper.WithName("load"), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	slots := make([][]time.Time, nkeys)
	locks := make([]sync.Mutex, nkeys)
	var next, failed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				k := int(i % nkeys)
				r, err := s.Reserve(bg, keys[k], 1)
				if err != nil {
					if failed.Add(1) <= 5 {
						t.Errorf("reservation %d: %v", i, err)
					}
					continue
				}
				locks[k].Lock()
				// Slots are wall-clock instants: strip the monotonic reading,
				// which drifts from the wall clock by about a ppm here and
				// would otherwise decide Sub.
				slots[k] = append(slots[k], r.Time().Round(0))
				locks[k].Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	interval := every
	granted, worst := 0, time.Duration(1<<62)
	for k, ts := range slots {
		granted += len(ts)
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		for i := 1; i < len(ts); i++ {
			gap := ts[i].Sub(ts[i-1])
			worst = min(worst, gap)
			// Float64 milliseconds carry about 0.1 µs of rounding at this epoch.
			if gap < interval-time.Microsecond {
				t.Fatalf("key %d over-admitted: slots %v and %v are %v apart, interval %v", k, ts[i-1], ts[i], gap, interval)
			}
		}
	}
	report := fmt.Sprintf("load: %d reservations over %d keys from %d goroutines in %v (%.0f/s): %d granted, %d failed, smallest gap between a key's slots %v (interval %v)",
		total, nkeys, workers, took.Round(time.Millisecond), total/took.Seconds(), granted, failed.Load(), worst, interval)
	fmt.Println(report)
	t.Log(report)
	if granted != total || failed.Load() != 0 {
		t.Fatalf("%d of %d granted, %d failed", granted, total, failed.Load())
	}
}
