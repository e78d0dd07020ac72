//go:build soak

package reliability

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/queue"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

// TestSoak runs mixed load for SOAK_DURATION (default 5m): Wait, Reserve and
// Cancel, Allow and Pause on memory and Redis stores, several algorithms, a
// multi-dimension shaper, the transport against a local server and the
// queue, over churning keys. It samples the live heap and the goroutine
// count every 10 s and fails if either grows from the first minute to the
// last: a leak shows up as steady growth under steady load.
func TestSoak(t *testing.T) {
	d := 5 * time.Minute
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	srv := redistest.Start(t)
	client := srv.Client(func(o *redis.Options) { o.PoolSize = 64 })
	redisStore := redisstore.New(client, redisstore.WithFailurePolicy(redisstore.FailLocal(1)))
	defer redisStore.Close()
	mem := memstore.New(memstore.WithSweepInterval(2 * time.Second))
	defer mem.Close()

	mk := func(st shaper.Store, name string, r shaper.Rate, opts ...shaper.Option) *shaper.Shaper {
		s, err := shaper.New(st, r, append([]shaper.Option{shaper.WithName(name), shaper.WithMaxQueue(2 * time.Second)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	shapers := []*shaper.Shaper{
		mk(mem, "leaky", shaper.PerSecond(200)),
		mk(mem, "window", shaper.PerSecond(100), shaper.WithAlgorithm(shaper.SlidingWindow)),
		mk(redisStore, "redis-leaky", shaper.PerSecond(300)),
		mk(redisStore, "redis-token", shaper.PerSecond(100).WithBurst(20), shaper.WithAlgorithm(shaper.TokenBucket)),
	}
	multi, err := shaper.All(mem, []shaper.Dimension{
		{Name: "requests", Rate: shaper.PerSecond(100), Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: shaper.PerSecond(5000).WithBurst(500)},
	}, shaper.WithName("multi"), shaper.WithMaxQueue(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rand.IntN(200) == 0 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer partner.Close()
	httpClient := &http.Client{Transport: transport.New(otelshaper.Wrap(shapers[2]), transport.WithBase(partner.Client().Transport),
		transport.WithKey(func(r *http.Request) string { return "host-" + r.URL.Query().Get("k") }))}
	defer httpClient.CloseIdleConnections()
	q := queue.New(shapers[0], queue.WithWorkers(8), queue.WithMaxPending(500))

	ctx, stop := context.WithCancel(context.Background())
	var ops, errs atomic.Int64
	var wg sync.WaitGroup
	worker := func(f func(i int) error) {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				if err := f(i); err != nil && ctx.Err() == nil {
					errs.Add(1)
				}
				ops.Add(1)
			}
		})
	}
	key := func(i int) string { return "k" + strconv.Itoa(rand.IntN(2000)) } // churning keys: the sweeper must keep up
	for g := range 4 {
		s := shapers[g]
		worker(func(i int) error {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			err := s.Wait(wctx, key(i), 1)
			if err != nil && (shaperRefusal(err) || wctx.Err() != nil) {
				time.Sleep(time.Millisecond) // a refusal returns at once: do not spin on it
				return nil
			}
			return err
		})
		worker(func(i int) error {
			r, err := s.Reserve(ctx, key(i), 1)
			if err == nil && i%2 == 0 {
				return r.Cancel(ctx)
			}
			if shaperRefusal(err) {
				time.Sleep(time.Millisecond)
				return nil
			}
			return err
		})
	}
	worker(func(i int) error {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err := multi.Wait(wctx, "account-"+strconv.Itoa(i%5), int64(1+rand.IntN(200)))
		if err != nil && (shaperRefusal(err) || wctx.Err() != nil) {
			time.Sleep(time.Millisecond)
			return nil
		}
		return err
	})
	for range 4 {
		worker(func(i int) error {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(rctx, http.MethodGet, partner.URL+"/?k="+strconv.Itoa(rand.IntN(50)), nil)
			resp, err := httpClient.Do(req)
			if err != nil {
				if shaperRefusal(err) || rctx.Err() != nil {
					return nil
				}
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.Body.Close()
		})
	}
	worker(func(i int) error {
		err := q.Submit(ctx, queue.Job{Key: key(i), Run: func(context.Context) error { return nil }})
		if err != nil && (shaperRefusal(err) || err == queue.ErrFull) {
			time.Sleep(time.Millisecond)
			return nil
		}
		return err
	})
	worker(func(i int) error {
		time.Sleep(100 * time.Millisecond)
		return shapers[i%4].Pause(ctx, key(i), 50*time.Millisecond)
	})

	type sample struct {
		at         time.Duration
		heap       uint64
		goroutines int
	}
	var samples []sample
	start := time.Now()
	tick := time.NewTicker(10 * time.Second)
	for time.Since(start) < d {
		<-tick.C
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		s := sample{time.Since(start).Round(time.Second), m.HeapAlloc, runtime.NumGoroutine()}
		samples = append(samples, s)
		fmt.Printf("soak %6v  heap %7.1f MiB  goroutines %4d  ops %9d  errors %d  memory keys %6d  redis degraded %d\n",
			s.at, float64(s.heap)/(1<<20), s.goroutines, ops.Load(), errs.Load(), mem.Len(), redisStore.Degraded())
	}
	tick.Stop()
	stop()
	wg.Wait()
	if err := q.Close(context.Background()); err != nil {
		t.Error(err)
	}
	if errs.Load() > 0 {
		t.Errorf("%d unexpected errors in %d operations", errs.Load(), ops.Load())
	}
	if len(samples) < 4 {
		t.Fatalf("only %d samples: run for at least 40 s", len(samples))
	}
	// Compare the first and the last quarter of the run.
	n := max(1, len(samples)/4)
	avg := func(ss []sample) (float64, float64) {
		var h, g float64
		for _, s := range ss {
			h += float64(s.heap)
			g += float64(s.goroutines)
		}
		return h / float64(len(ss)), g / float64(len(ss))
	}
	h0, g0 := avg(samples[:n])
	h1, g1 := avg(samples[len(samples)-n:])
	fmt.Printf("soak: %d operations in %v; first quarter heap %.1f MiB, goroutines %.0f; last quarter heap %.1f MiB, goroutines %.0f\n",
		ops.Load(), d, h0/(1<<20), g0, h1/(1<<20), g1)
	if h1 > h0*1.25+(1<<20) {
		t.Errorf("the live heap grew from %.1f to %.1f MiB", h0/(1<<20), h1/(1<<20))
	}
	if g1 > g0+5 {
		t.Errorf("goroutines grew from %.0f to %.0f", g0, g1)
	}
}

// shaperRefusal: a documented refusal under load, not a failure.
func shaperRefusal(err error) bool {
	return err != nil && (errKind(err) == "queue_full" || errKind(err) == "deadline")
}
