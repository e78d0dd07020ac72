package transport

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// A partner's Retry-After: 1, answered to one process, reaches a second
// process through the shared Redis store: no request from either arrives in
// the paused second, not even one whose slot was granted before the pause
// (Wait re-reads the pause after sleeping), once the pause has had time to
// reach Redis. A request that read the key before the pause was written
// may still leave: the pause is written when the 429 has come back to its
// process and been read, a few milliseconds after the partner sent it on
// a quiet host, once 20 ms later (one request of the 50/s) on a loaded
// one under -race. The test gives that 150 ms, for this host's
// scheduling; without the pause, about 40 of the 60 requests would arrive
// in the 830 ms it watches.
func TestRetryAfterReachesTheFleetThroughRedis(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var told time.Time
	p := &partner{respond: func(w http.ResponseWriter, n int) bool {
		if n == 3 {
			mu.Lock()
			told = time.Now()
			mu.Unlock()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}
		return false
	}}
	srv := httptest.NewServer(p)
	defer srv.Close()
	redisSrv := redistest.Start(t)
	var clients []*http.Client
	for range 2 { // two processes: separate stores and shapers, one Redis
		s, err := shaper.New(redisstore.New(redisSrv.Client(), redisstore.WithTimeout(10*time.Second)), shaper.PerSecond(50), shaper.WithName("fleet"))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, &http.Client{Transport: New(s, WithBase(srv.Client().Transport))})
	}
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			for range 30 {
				resp, err := c.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if told.IsZero() {
		t.Fatal("the 429 was never sent")
	}
	const reach = 150 * time.Millisecond // the 429 read and the pause written: see above
	inPause := 0
	var after []time.Duration // every arrival in the paused second, from the 429
	for _, a := range p.arrivals {
		if a.After(told) && a.Before(told.Add(time.Second-20*time.Millisecond)) {
			after = append(after, a.Sub(told))
			if a.After(told.Add(reach)) {
				inPause++
			}
		}
	}
	if inPause != 0 || len(p.arrivals) != 60 {
		t.Fatalf("%d of %d requests arrived within the paused second, %v after the 429 was sent (arrivals after it: %v)", inPause, len(p.arrivals), reach, after)
	}
	t.Logf("arrivals in the paused second, after the 429: %v", after)
}

// With go-retryablehttp, a 429 followed by a 200 sees its retry paced by the
// shaper (here every 500 ms), not sent at once; and a QueueFullError is not
// retried.
func TestRetryableClientPacesEveryAttempt(t *testing.T) {
	t.Parallel()
	p := &partner{respond: func(w http.ResponseWriter, n int) bool {
		if n == 1 {
			w.WriteHeader(http.StatusTooManyRequests) // no Retry-After: backoff alone would retry in ~1 ms
			return true
		}
		return false
	}}
	srv := httptest.NewServer(p)
	defer srv.Close()
	s := newShaper(t, shaper.PerSecond(2), shaper.WithMaxQueue(10*time.Second))
	c := NewRetryableClient(s, WithBase(srv.Client().Transport))
	c.RetryWaitMin, c.RetryWaitMax = time.Millisecond, 2*time.Millisecond
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || p.count() != 2 {
		t.Fatalf("status %d after %d attempts, want 200 after 2", resp.StatusCode, p.count())
	}
	// 500 ms apart by the shaper; >= 400 ms leaves room for a late first
	// departure under load, and an unpaced retry would come in ~1 ms.
	if gap := p.arrivals[1].Sub(p.arrivals[0]); gap < 400*time.Millisecond {
		t.Fatalf("the retry came %v after the 429; the shaper paces attempts 500ms apart", gap)
	}

	tight := newShaper(t, shaper.PerSecond(1), shaper.WithMaxQueue(100*time.Millisecond))
	c2 := NewRetryableClient(tight, WithBase(srv.Client().Transport))
	c2.RetryWaitMin, c2.RetryWaitMax = time.Millisecond, 2*time.Millisecond
	if resp, err := c2.Get(srv.URL); err != nil {
		t.Fatal(err)
	} else {
		_ = resp.Body.Close()
	}
	before := p.count()
	start := time.Now()
	_, err = c2.Get(srv.URL) // the next slot is a second away: beyond MaxQueue
	if !errors.Is(err, shaper.ErrQueueFull) {
		t.Fatalf("got %v, want the QueueFullError", err)
	}
	if p.count() != before || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("a QueueFullError was retried: %d more requests, %v", p.count()-before, time.Since(start))
	}
	var _ retryablehttp.CheckRetry = CheckRetry
}
