// Command llm-quota paces calls to an LLM API that limits one account in two
// dimensions at once: requests and tokens. Each call reserves 1 request and
// its token count in one atomic step (shaper.All): it departs when both
// budgets allow it, and a refused call consumes neither.
//
// The real contract would be per minute (3,500 requests and 90,000 tokens);
// to finish in seconds the demo runs it per second at a smaller scale: 20
// requests/s and 3,000 tokens/s. A fake API on loopback enforces both limits
// over sliding 1 s windows and counts every violation; the program prints
// each second's traffic and a summary.
//
//	go run ./examples/llm-quota [-short]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

const (
	requestsPerSec = 20
	tokensPerSec   = 3000
	tokenBurst     = 1000 // the largest prompt fits at once
)

func main() {
	short := flag.Bool("short", false, "send fewer calls (CI)")
	flag.Parse()
	calls := 100
	if *short {
		calls = 40
	}
	if err := run(os.Stdout, calls); err != nil {
		fmt.Fprintln(os.Stderr, "llm-quota:", err)
		os.Exit(1)
	}
}

// api is the fake LLM API: it records every call's arrival and tokens and
// counts calls that break either limit in the 1 s before them.
type api struct {
	mu       sync.Mutex
	start    time.Time
	arrivals []time.Time
	tokens   []int64
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.Header.Get("X-Tokens"), 10, 64)
	a.mu.Lock()
	a.arrivals = append(a.arrivals, time.Now())
	a.tokens = append(a.tokens, n)
	a.mu.Unlock()
	_ = json.NewEncoder(w).Encode(map[string]int64{"tokens": n})
}

// windows returns the most requests and tokens that arrived in any 1 s
// window (each window starting at an arrival).
func (a *api) windows() (maxReq int, maxTok int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	j := 0
	var tok int64
	for i := range a.arrivals {
		tok += a.tokens[i]
		for a.arrivals[i].Sub(a.arrivals[j]) >= time.Second {
			tok -= a.tokens[j]
			j++
		}
		maxReq = max(maxReq, i-j+1)
		maxTok = max(maxTok, tok)
	}
	return maxReq, maxTok
}

func run(w io.Writer, calls int) error {
	a := &api{start: time.Now()}
	srv := httptest.NewServer(a)
	defer srv.Close()

	store := shaper.NewMemoryStore()
	defer store.Close()
	// One account, two contracts. The requests dimension counts each call
	// once; the tokens dimension charges the call's tokens (the cost).
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "requests", Rate: shaper.PerSecond(requestsPerSec), Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: shaper.PerSecond(tokensPerSec).WithBurst(tokenBurst)},
	}, shaper.WithName("llm"), shaper.WithMaxQueue(time.Minute))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "account limits: %d requests/s and %d tokens/s (burst %d); %d calls from 16 goroutines,\n"+
		"short prompts (10..100 tokens: the requests limit binds) then long ones (300..1000: the tokens limit binds)\n\n",
		requestsPerSec, tokensPerSec, tokenBurst, calls)

	rng := rand.New(rand.NewPCG(7, 7))
	prompts := make(chan int64, calls)
	var total int64
	for i := range calls {
		n := 10 + rng.Int64N(91)
		if i >= calls/2 {
			n = 300 + rng.Int64N(701)
		}
		total += n
		prompts <- n
	}
	close(prompts)

	ctx := context.Background()
	start := time.Now()
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for tokens := range prompts {
				// One step for both budgets: depart when both allow.
				if err := s.Wait(ctx, "account-1", tokens); err != nil {
					errs <- err
					continue
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
				req.Header.Set("X-Tokens", strconv.FormatInt(tokens, 10))
				resp, err := srv.Client().Do(req)
				if err != nil {
					errs <- err
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	took := time.Since(start)

	fmt.Fprintf(w, "%6s %9s %7s\n", "second", "requests", "tokens")
	a.mu.Lock()
	perSec := map[int][2]int64{}
	last := 0
	for i, t := range a.arrivals {
		sec := int(t.Sub(start) / time.Second)
		v := perSec[sec]
		v[0]++
		v[1] += a.tokens[i]
		perSec[sec] = v
		last = max(last, sec)
	}
	a.mu.Unlock()
	for sec := 0; sec <= last; sec++ {
		fmt.Fprintf(w, "%6d %9d %7d\n", sec, perSec[sec][0], perSec[sec][1])
	}
	maxReq, maxTok := a.windows()
	fmt.Fprintf(w, "\n%d calls, %d tokens in %v: on average %.1f requests/s, %.0f tokens/s\n",
		calls, total, took.Round(time.Millisecond), float64(calls)/took.Seconds(), float64(total)/took.Seconds())
	fmt.Fprintf(w, "most in any 1 s window: %d requests (limit %d + burst 1), %d tokens (limit %d + burst %d)\n",
		maxReq, requestsPerSec, maxTok, tokensPerSec, tokenBurst)
	if maxReq > requestsPerSec+1 || maxTok > tokensPerSec+tokenBurst {
		return fmt.Errorf("the contract was exceeded: %d requests, %d tokens in one second", maxReq, maxTok)
	}
	return nil
}
