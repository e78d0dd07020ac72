// Command llm-quota paces calls to an LLM API that limits one account in
// two dimensions at once, requests and tokens, each counted in a trailing
// window the way OpenAI documents its RPM and TPM limits, when a call's
// token count is known only after its response.
//
// The account's limits are declared as the API states them (package
// partner): 20 requests and 3,000 tokens per trailing 2 s (the real
// contract would be per minute; the demo runs it 30 times faster). Each call
// reserves its max_tokens (400..800, the estimate: transport.WithCost); the
// fake API admits a call against its max_tokens, counts the tokens it used
// (about a quarter of the estimate), and refuses with a 429 any call that
// would overfill either window, as it counts it.
// The program runs twice: first keeping every estimate, then settling each
// call with the usage its response body reports (transport.WithUsage),
// which gives the unused tokens back when they leave the window. It prints
// what each run delivered against the limits, and fails if the API refused
// a call. (The API admits a call only while its max_tokens fit beside the
// tokens its window holds, so a window full of calls that used 150 tokens
// admits about 2,400 of them: with settling the tokens limit binds at about
// 80 %, as the API counts it.)
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

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/partner"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

const (
	window   = 2 * time.Second
	requests = 20   // per trailing window
	tokens   = 3000 // per trailing window
	workers  = 8
)

func main() {
	short := flag.Bool("short", false, "run for less time (CI)")
	flag.Parse()
	d := 8 * time.Second
	if *short {
		d = 4 * time.Second
	}
	if _, err := run(os.Stdout, d); err != nil {
		fmt.Fprintln(os.Stderr, "llm-quota:", err)
		os.Exit(1)
	}
}

// api is the fake LLM API. It counts, for the account, the requests and the
// tokens of the calls that arrived in the trailing window: a call is
// admitted against its max_tokens and, answered at once, counts the tokens
// it used. A call that would bring either count over its limit is refused
// with 429 and Retry-After, and counts nothing.
type api struct {
	mu      sync.Mutex
	rng     *rand.Rand
	calls   []apiCall
	refused int
}

type apiCall struct {
	at     time.Time
	tokens int64 // max_tokens until answered, then the tokens used
}

// inWindow returns the requests and tokens counted in the window ending at
// now; a.mu is held.
func (a *api) inWindow(now time.Time) (n int, t int64) {
	for _, c := range a.calls {
		if now.Sub(c.at) < window {
			n++
			t += c.tokens
		}
	}
	return n, t
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	maxTokens, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
	now := time.Now()
	a.mu.Lock()
	n, t := a.inWindow(now)
	if n+1 > requests || t+maxTokens > tokens {
		a.refused++
		a.mu.Unlock()
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	used := maxTokens/8 + a.rng.Int64N(maxTokens/4+1) // from 1/8 to 3/8 of max_tokens
	a.calls = append(a.calls, apiCall{at: now, tokens: used})
	a.mu.Unlock()
	_ = json.NewEncoder(w).Encode(map[string]any{"usage": map[string]int64{"total_tokens": used}})
}

// Result is one run's figures, after its first window.
type Result struct {
	Calls     int     // calls answered
	Refused   int     // calls the API refused
	ReqShare  float64 // requests answered, as a share of the requests limit
	TokShare  float64 // tokens used, as a share of the tokens limit
	TokPerSec float64 // tokens used per second
}

// run runs both modes for d each and returns their results: keeping the
// estimates, then settling.
func run(w io.Writer, d time.Duration) ([2]Result, error) {
	fmt.Fprintf(w, "the API allows %d requests and %d tokens per trailing %v, counted as it counts them;\n"+
		"%d workers; each call reserves max_tokens (400..800) and uses about a quarter of it\n\n",
		requests, tokens, window, workers)
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
		fmt.Fprintf(w, "%s: %4d calls, %d refused; %3.0f%% of the requests limit, %3.0f%% of the tokens limit (%.0f tokens used/s)\n",
			mode, r.Calls, r.Refused, 100*r.ReqShare, 100*r.TokShare, r.TokPerSec)
		if r.Refused > 0 {
			return res, fmt.Errorf("the API refused %d calls", r.Refused)
		}
	}
	fmt.Fprintf(w, "\nsettling served %.1fx the calls, and the API refused none in either run\n", float64(res[1].Calls)/float64(res[0].Calls))
	return res, nil
}

// once runs the workers for d against a fresh account.
func once(d time.Duration, settle bool) (Result, error) {
	a := &api{rng: rand.New(rand.NewPCG(7, 7))}
	srv := httptest.NewServer(a)
	defer srv.Close()
	store := memstore.New()
	defer store.Close()
	// The API's limits, as it states them. The API runs on this host, which
	// `make test` loads with other packages under the race detector: allow
	// its arrivals 25 ms of jitter after their departures (the default, 1 ms,
	// is for a partner reached over a steady path; 25 ms costs a 2 s window
	// 1.25 % of its quota).
	s, err := partner.New(store, []partner.Limit{
		partner.TrailingWindow("requests", requests, window).PerRequest(),
		partner.TrailingWindow("tokens", tokens, window),
	}, partner.WithJitter(25*time.Millisecond), partner.WithShaper(shaper.WithName("llm")))
	if err != nil {
		return Result{}, err
	}
	opts := []transport.Option{
		transport.WithKey(func(*http.Request) string { return "account-1" }),
		transport.WithCost(func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
			return n
		}),
	}
	if settle {
		opts = append(opts, transport.WithUsage(usage))
	}
	client := &http.Client{Transport: transport.New(s, opts...)}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for ctx.Err() == nil {
				if err := call(ctx, client, srv.URL, 400+rng.Int64N(401)); err != nil {
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
	r := Result{Calls: len(a.calls), Refused: a.refused}
	var n int
	var used int64
	for _, c := range a.calls {
		if c.at.Sub(start) >= window && c.at.Sub(start) < d {
			n++
			used += c.tokens
		}
	}
	windows := float64(d-window) / float64(window)
	r.ReqShare = float64(n) / (requests * windows)
	r.TokShare = float64(used) / (tokens * windows)
	r.TokPerSec = float64(used) / (d - window).Seconds()
	return r, nil
}

// usage reads the tokens a call used from its response body.
func usage(_ *http.Response, body []byte) (int64, bool) {
	var v struct {
		Usage *struct {
			TotalTokens int64 `json:"total_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &v) != nil || v.Usage == nil {
		return 0, false
	}
	return v.Usage.TotalTokens, true
}

// call sends one completion request reserving maxTokens.
func call(ctx context.Context, client *http.Client, url string, maxTokens int64) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	req.Header.Set("X-Max-Tokens", strconv.FormatInt(maxTokens, 10))
	resp, err := client.Do(req)
	if err != nil {
		var qf *shaper.QueueFullError
		if errors.As(err, &qf) {
			return nil // backpressure: try again
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) { // the run ends before its slot
			return nil
		}
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body) // the body's end settles the call (WithUsage)
	return err
}
