// Command retryable composes ThrottleKit with hashicorp/go-retryablehttp:
// every attempt, retries included, takes a departure slot, and a partner's
// 503 or 429 with Retry-After pauses the key for every caller, so retries do
// not pile onto a partner that asked for quiet.
//
// A fake partner on loopback allows 20 requests/s, fails 10% of requests
// with a transient 500, and one second into the run goes into maintenance
// for one second, answering 503 with Retry-After: 1. Ten goroutines send the
// requests through transport.NewRetryableClient; the program prints how
// each request fared and what the partner saw.
//
//	go run ./examples/retryable [-short]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/throttlekit/throttlekit-go/examples/internal/window"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

const (
	rate    = 20 // the partner's contract, requests per second
	workers = 10
)

func main() {
	short := flag.Bool("short", false, "send fewer requests (CI)")
	flag.Parse()
	n := 80
	if *short {
		n = 40
	}
	if err := run(os.Stdout, n); err != nil {
		fmt.Fprintln(os.Stderr, "retryable:", err)
		os.Exit(1)
	}
}

// partner records arrivals and answers 200, a transient 500, or during its
// maintenance window 503 with Retry-After.
type partner struct {
	mu                 sync.Mutex
	start              time.Time
	maintFrom, maintTo time.Time
	rng                *rand.Rand
	arrivals           []time.Time
	codes              map[int]int
	first503           time.Time
}

func (p *partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	p.mu.Lock()
	p.arrivals = append(p.arrivals, now)
	code := http.StatusOK
	switch {
	case !now.Before(p.maintFrom) && now.Before(p.maintTo):
		code = http.StatusServiceUnavailable
		if p.first503.IsZero() {
			p.first503 = now
		}
	case p.rng.IntN(10) == 0:
		code = http.StatusInternalServerError
	}
	p.codes[code]++
	p.mu.Unlock()
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(code)
}

func run(w io.Writer, n int) error {
	start := time.Now()
	p := &partner{start: start, maintFrom: start.Add(time.Second), maintTo: start.Add(2 * time.Second),
		rng: rand.New(rand.NewPCG(1, 2)), codes: map[int]int{}}
	srv := httptest.NewServer(p)
	defer srv.Close()

	store := memstore.New()
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(rate), shaper.WithName("partner"))
	if err != nil {
		return err
	}
	client := transport.NewRetryableClient(s, transport.WithBase(srv.Client().Transport))
	client.RetryMax = 6
	client.RetryWaitMin = 50 * time.Millisecond
	client.RetryWaitMax = 2 * time.Second
	defer client.HTTPClient.CloseIdleConnections()

	fmt.Fprintf(w, "partner allows %d requests/s, fails 10%% with 500, and answers 503 + Retry-After: 1 from 1 s to 2 s;\n%d requests from %d goroutines through transport.NewRetryableClient\n\n", rate, n, workers)

	var ok, failed atomic.Int64
	var mu sync.Mutex
	var firstErr error
	jobs := make(chan int, n)
	for i := range n {
		jobs <- i
	}
	close(jobs)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range jobs {
				req, err := retryablehttp.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
				if err == nil {
					var resp *http.Response
					if resp, err = client.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							err = fmt.Errorf("status %d", resp.StatusCode)
						}
					}
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					firstErr = err
					mu.Unlock()
					continue
				}
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)

	p.mu.Lock()
	defer p.mu.Unlock()
	pausedArrivals := 0
	for _, t := range p.arrivals {
		// After the first 503 reached the client, the key is paused for 1 s:
		// only requests already on the wire may still arrive.
		if t.After(p.first503.Add(20*time.Millisecond)) && t.Before(p.first503.Add(time.Second)) {
			pausedArrivals++
		}
	}
	most := window.MostInOneSecond(p.arrivals)
	fmt.Fprintf(w, "requests: %d ok, %d failed, %d attempts (%d retries) in %v\n", ok.Load(), failed.Load(), len(p.arrivals), len(p.arrivals)-n, took.Round(time.Millisecond))
	fmt.Fprintf(w, "partner answered: %d x 200, %d x 500, %d x 503\n", p.codes[200], p.codes[500], p.codes[503])
	fmt.Fprintf(w, "arrivals during the 1 s pause that followed the first 503: %d (requests already on the wire)\n", pausedArrivals)
	fmt.Fprintf(w, "most arrivals in any 1 s window: %d (contract %d + burst 1)\n", most, rate)
	switch {
	case firstErr != nil:
		return fmt.Errorf("a request failed: %w", firstErr)
	case failed.Load() > 0:
		return fmt.Errorf("%d requests failed", failed.Load())
	case most > rate+1:
		return fmt.Errorf("the partner saw %d arrivals in one second", most)
	case pausedArrivals > workers:
		return fmt.Errorf("%d arrivals during the pause: Retry-After was not honoured", pausedArrivals)
	}
	return nil
}
