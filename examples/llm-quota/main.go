// Command llm-quota paces calls to an LLM API that limits one account in two
// dimensions at once, requests and tokens, when a call's token count is
// known only after its response.
//
// Each call reserves 1 request and its max_tokens (the estimate: WithCost)
// in one atomic step (shaper.All) and departs when both budgets allow it.
// The fake API answers with the tokens it used, about a quarter of the
// estimate. The program runs twice: first keeping every estimate, then
// settling each call with its usage (transport.Settle), which gives the
// unused tokens back to the account. It prints the tokens used per second
// in each run against the contract, and the fake API checks both limits
// over every sliding 1 s window.
//
// The real contract would be per minute; to finish in seconds the demo
// runs it per second at a smaller scale: 40 requests/s and 3,000 tokens/s
// (burst 6,000).
//
//	go run ./examples/llm-quota [-short]
package main

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/throttlekit/throttlekit-go/examples/internal/window"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

const (
	requestsPerSec = 40
	tokensPerSec   = 3000
	tokenBurst     = 6000
	workers        = 8
)

func main() {
	short := flag.Bool("short", false, "run for less time (CI)")
	flag.Parse()
	d := 5 * time.Second
	if *short {
		d = 2 * time.Second
	}
	if _, err := run(os.Stdout, d); err != nil {
		fmt.Fprintln(os.Stderr, "llm-quota:", err)
		os.Exit(1)
	}
}

// api is the fake LLM API: it answers each call with the tokens it used (a
// quarter of max_tokens on average) and records every arrival with them.
type api struct {
	mu       sync.Mutex
	rng      *rand.Rand
	arrivals []time.Time
	used     []int64
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	max, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
	a.mu.Lock()
	used := max/8 + a.rng.Int64N(max/4+1) // from 1/8 to 3/8 of max_tokens
	a.arrivals = append(a.arrivals, time.Now())
	a.used = append(a.used, used)
	a.mu.Unlock()
	_ = json.NewEncoder(w).Encode(map[string]any{"usage": map[string]int64{"total_tokens": used}})
}

// Result is one run's figures.
type Result struct {
	Calls      int
	TokensUsed float64 // tokens used per second, after the first second
	MaxReq     int     // the most requests in any 1 s window
	MaxTok     int64   // the most tokens used in any 1 s window
}

// run runs both modes for d each and returns their results: keeping the
// estimates, then settling.
func run(w io.Writer, d time.Duration) ([2]Result, error) {
	fmt.Fprintf(w, "account limits: %d requests/s and %d tokens/s (burst %d); %d workers;\n"+
		"each call reserves max_tokens (400..800) and uses about a quarter of it\n\n",
		requestsPerSec, tokensPerSec, tokenBurst, workers)
	var res [2]Result
	for i, settle := range []bool{false, true} {
		r, err := once(d, settle)
		if err != nil {
			return res, err
		}
		res[i] = r
		mode := "keeping each estimate"
		if settle {
			mode = "settling each call  "
		}
		fmt.Fprintf(w, "%s: %4d calls, %5.0f tokens used/s (%3.0f%% of the contract); busiest 1 s: %d requests, %d tokens\n",
			mode, r.Calls, r.TokensUsed, 100*r.TokensUsed/tokensPerSec, r.MaxReq, r.MaxTok)
		if r.MaxReq > requestsPerSec+1 || r.MaxTok > tokensPerSec+tokenBurst {
			return res, fmt.Errorf("the contract was exceeded: %d requests, %d tokens in one second", r.MaxReq, r.MaxTok)
		}
	}
	fmt.Fprintf(w, "\nsettling used %.1fx the tokens per second, within the same contract\n", res[1].TokensUsed/res[0].TokensUsed)
	return res, nil
}

// once runs the workers for d against a fresh account.
func once(d time.Duration, settle bool) (Result, error) {
	a := &api{rng: rand.New(rand.NewPCG(7, 7))}
	srv := httptest.NewServer(a)
	defer srv.Close()
	store := memstore.New()
	defer store.Close()
	// One account, two contracts: each call counts once in requests; the
	// tokens dimension charges the estimate, and then the usage.
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "requests", Rate: shaper.PerSecond(requestsPerSec), Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: shaper.PerSecond(tokensPerSec).WithBurst(tokenBurst)},
	}, shaper.WithName("llm"), shaper.WithMaxQueue(time.Minute))
	if err != nil {
		return Result{}, err
	}
	client := &http.Client{Transport: transport.New(s,
		transport.WithKey(func(*http.Request) string { return "account-1" }),
		transport.WithCost(func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
			return n
		}))}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for ctx.Err() == nil {
				if err := call(ctx, client, srv.URL, 400+rng.Int64N(401), settle); err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return Result{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := Result{Calls: len(a.arrivals)}
	var used int64
	for i, t := range a.arrivals {
		if t.Sub(start) >= time.Second {
			used += a.used[i]
		}
	}
	r.TokensUsed = float64(used) / (d - time.Second).Seconds()
	r.MaxReq = window.MostInOneSecond(a.arrivals)
	r.MaxTok = window.MostWeightInOneSecond(a.arrivals, a.used)
	return r, nil
}

// call sends one completion request reserving maxTokens and, if settle,
// settles its reservation with the usage the API reports.
func call(ctx context.Context, client *http.Client, url string, maxTokens int64, settle bool) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	req.Header.Set("X-Max-Tokens", strconv.FormatInt(maxTokens, 10))
	resp, err := client.Do(req)
	if err != nil {
		var qf *shaper.QueueFullError
		if errors.As(err, &qf) {
			return nil // backpressure: try again
		}
		if errors.Is(err, context.DeadlineExceeded) { // the run ends before its slot
			return nil
		}
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Usage struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	if settle {
		return transport.Settle(ctx, resp, body.Usage.TotalTokens)
	}
	return nil
}
