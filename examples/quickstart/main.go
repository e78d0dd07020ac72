// Command quickstart is ThrottleKit's main demo (`make demo`). It starts a
// fake partner API on loopback that allows 25 requests per second and answers
// 429 beyond, then sends the same burst of 100 requests twice: through a plain
// http.Client, and through one whose Transport is transport.New(shaper), the
// shaper declared from the partner's limit (package partner). A
// live line shows progress; a summary compares the two.
//
//	go run ./examples/quickstart [-short]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/partner"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

const rate = 25 // the partner's contract, requests per second

// requests is the burst each client sends (-short: 50).
var requests = 100

func main() {
	short := flag.Bool("short", false, "send a burst of 50 instead of 100 (CI)")
	flag.Parse()
	if *short {
		requests = 50
	}
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// fakePartner enforces the contract like a strict GCRA with burst 1: a request
// arriving more than half an interval before its theoretical time gets a 429.
// (Half an interval absorbs scheduling jitter and still refuses two requests
// in one slot.)
type fakePartner struct {
	mu       sync.Mutex
	interval time.Duration
	tat      time.Time
}

func (p *fakePartner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	now := time.Now()
	p.mu.Lock()
	ok := !now.Before(p.tat.Add(-p.interval / 2))
	if ok {
		if p.tat.Before(now) {
			p.tat = now
		}
		p.tat = p.tat.Add(p.interval)
	}
	p.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

type result struct {
	name           string
	ok, throttled  int
	rate           float64 // 2xx per second while the client was busy
	took, p50, p99 time.Duration
}

func run(w io.Writer) error {
	p := &fakePartner{interval: time.Second / rate}
	srv := httptest.NewServer(p)
	defer srv.Close()
	fmt.Fprintf(w, "partner on %s allows %d requests/s (429 beyond); each client sends %d at once\n\n", srv.URL, rate, requests)

	plain := &http.Client{Transport: srv.Client().Transport}
	store := memstore.New()
	defer store.Close()
	// The partner's limit, declared as it counts it: a bucket of one
	// request refilled 25 times a second (it lets a request come up to half
	// an interval early, which the declaration does not count on). The
	// shaper spaces its departures so that, a few milliseconds late or not,
	// none arrives too soon.
	s, err := partner.New(store, []partner.Limit{partner.Bucket("requests", 1, shaper.PerSecond(rate)).PerRequest()})
	if err != nil {
		return err
	}
	shaped := &http.Client{Transport: transport.New(s, transport.WithBase(srv.Client().Transport))}

	var results []result
	for _, c := range []struct {
		name   string
		client *http.Client
	}{{"plain client", plain}, {"shaped client", shaped}} {
		p.mu.Lock()
		p.tat = time.Time{} // each client meets a fresh partner
		p.mu.Unlock()
		r, err := burst(w, c.name, c.client, srv.URL)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	fmt.Fprintf(w, "\n%-14s %5s %5s %5s %9s %9s %9s %9s\n", "", "sent", "2xx", "429", "took", "2xx/s", "p50", "p99")
	for _, r := range results {
		fmt.Fprintf(w, "%-14s %5d %5d %5d %9v %9.1f %9v %9v\n", r.name, requests, r.ok, r.throttled, r.took, r.rate, r.p50, r.p99)
	}
	fmt.Fprintf(w, "\np50/p99: time from calling Do to the response; the shaped client waits for its slot instead of collecting 429s.\n")
	if results[1].throttled > 0 {
		return fmt.Errorf("the shaped client got %d 429s", results[1].throttled)
	}
	return nil
}

// burst sends all requests at once through client, showing progress.
func burst(w io.Writer, name string, client *http.Client, url string) (result, error) {
	var ok, throttled, done atomic.Int64
	lat := make([]time.Duration, requests)
	errs := make(chan error, requests)
	stop := make(chan struct{})
	var progress sync.WaitGroup
	progress.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			fmt.Fprintf(w, "\r%-14s %3d/%d done, %3d ok, %3d got 429", name, done.Load(), requests, ok.Load(), throttled.Load())
			select {
			case <-stop:
				fmt.Fprintf(w, "\r%-14s %3d/%d done, %3d ok, %3d got 429\n", name, done.Load(), requests, ok.Load(), throttled.Load())
				return
			case <-tick.C:
			}
		}
	})
	start := time.Now()
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			t := time.Now()
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			lat[i] = time.Since(t)
			if resp.StatusCode == http.StatusTooManyRequests {
				throttled.Add(1)
			} else {
				ok.Add(1)
			}
			done.Add(1)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	progress.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return result{}, err
	}
	slices.Sort(lat)
	return result{
		name: name, ok: int(ok.Load()), throttled: int(throttled.Load()),
		rate: float64(ok.Load()) / elapsed.Seconds(), took: elapsed.Round(time.Millisecond),
		p50: lat[len(lat)/2].Round(time.Millisecond), p99: lat[len(lat)*99/100].Round(time.Millisecond),
	}, nil
}
