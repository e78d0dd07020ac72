package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

// mostIn1s returns the largest sum of weights in any half-open 1 s window
// of ts (in order).
func mostIn1s(ts []time.Time, weights []int64) int64 {
	var most, sum int64
	j := 0
	for i := range ts {
		sum += weights[i]
		for ts[i].Sub(ts[j]) >= time.Second {
			sum -= weights[j]
			j++
		}
		most = max(most, sum)
	}
	return most
}

// cancelled is the outcome of cancelRun.
type cancelled struct {
	perSec    float64 // departures per second after the warm-up
	share     float64 // of the waits, the share cancelled before their slot
	mostIn1s  int64
	departed  int
	cancelled int
}

// cancelRun runs waiters goroutines on one key of a rate/s shaper for d;
// each waits again as soon as it departs or gives up. A share of the waits
// is given up at a random moment (the context is cancelled, as an HTTP
// caller's is when its client leaves) up to the queue's depth later.
func cancelRun(t *testing.T, rate, waiters int, share float64, d, warm time.Duration) cancelled {
	store := memstore.New()
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(int64(rate)), shaper.WithName("cancel"))
	if err != nil {
		t.Fatal(err)
	}
	depth := time.Duration(waiters) * time.Second / time.Duration(rate)
	ctx, stop := context.WithTimeout(context.Background(), d)
	defer stop()
	var mu sync.Mutex
	var deps []time.Time
	var gaveUp atomic.Int64
	var wg sync.WaitGroup
	for g := range waiters {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for ctx.Err() == nil {
				wctx, cancel := context.WithCancel(ctx)
				var timer *time.Timer
				if rng.Float64() < share {
					timer = time.AfterFunc(time.Duration(rng.Int64N(int64(depth/2))), cancel)
				}
				res, err := s.Acquire(wctx, "partner", 1)
				if timer != nil {
					timer.Stop()
				}
				cancel()
				switch {
				case err == nil: // the slot, not the wake-up (the pacing table measures that lateness)
					mu.Lock()
					deps = append(deps, res.Time())
					mu.Unlock()
				case errors.Is(err, context.Canceled) && ctx.Err() == nil:
					gaveUp.Add(1)
				case errors.Is(err, context.DeadlineExceeded): // the run ends before its slot
				case ctx.Err() == nil:
					t.Errorf("wait: %v", err)
					return
				}
			}
		})
	}
	start := time.Now()
	wg.Wait()
	slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
	var c cancelled
	n := 0
	for _, at := range deps {
		if at.Sub(start) >= warm {
			n++
		}
	}
	c.perSec = float64(n) / (d - warm).Seconds()
	c.departed, c.cancelled = len(deps), int(gaveUp.Load())
	c.share = float64(c.cancelled) / float64(c.departed+c.cancelled)
	ones := make([]int64, len(deps))
	for i := range ones {
		ones[i] = 1
	}
	c.mostIn1s = mostIn1s(deps, ones)
	return c
}

// llm is the outcome of llmRun.
type llm struct {
	tokensPerSec float64 // tokens used per second after the warm-up
	calls        int
	mostTokens   int64 // tokens used in the busiest 1 s
	mostCalls    int64
}

// llmRun sends calls from 8 workers through a pacing transport to a fake
// LLM API for d: each reserves its max_tokens (400 to 800) and the API uses
// 1/8 to 3/8 of it; with settle, each call is settled with its usage.
func llmRun(t *testing.T, requests, tokens, burst int64, settle bool, d, warm time.Duration) llm {
	var mu sync.Mutex
	var arrivals []time.Time
	var used []int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
		u := n/8 + rand.Int64N(n/4+1)
		mu.Lock()
		arrivals, used = append(arrivals, time.Now()), append(used, u)
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]int64{"used": u})
	}))
	defer api.Close()
	store := memstore.New()
	defer store.Close()
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "requests", Rate: shaper.PerSecond(requests), Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: shaper.PerSecond(tokens).WithBurst(burst)},
	}, shaper.WithName("llm"), shaper.WithMaxQueue(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: transport.New(s,
		transport.WithKey(func(*http.Request) string { return "account" }),
		transport.WithCost(func(r *http.Request) int64 {
			n, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
			return n
		}))}
	ctx, stop := context.WithTimeout(context.Background(), d)
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 5))
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL, nil)
				req.Header.Set("X-Max-Tokens", strconv.FormatInt(400+rng.Int64N(401), 10))
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("call (settle %v, at %v): %v", settle, time.Since(start), err)
					}
					continue
				}
				var body struct{ Used int64 }
				err = json.NewDecoder(resp.Body).Decode(&body)
				_ = resp.Body.Close()
				if err == nil && settle {
					err = transport.Settle(ctx, resp, body.Used)
				}
				if err != nil && ctx.Err() == nil {
					t.Errorf("call: %v", err)
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	res := llm{calls: len(arrivals)}
	var sum int64
	ones := make([]int64, len(arrivals))
	for i, at := range arrivals {
		ones[i] = 1
		if at.Sub(start) >= warm {
			sum += used[i]
		}
	}
	res.tokensPerSec = float64(sum) / (d - warm).Seconds()
	res.mostTokens, res.mostCalls = mostIn1s(arrivals, used), mostIn1s(arrivals, ones)
	return res
}

// giveBack reports cancelled slots reused and settled costs given back.
func (r *report) giveBack(t *testing.T) {
	const rate, waiters, share = 200, 1000, 0.3
	r.printf("\n## Settle and cancel\n\n")
	c := cancelRun(t, rate, r.sc.cancelWaiters, share, r.sc.giveBackFor, r.sc.giveBackWarm)
	ratio := c.perSec / rate
	r.printf("**Cancelled slots.** %d waiters on one key at %d/s for %v, each waiting again as soon as it departs or gives up; %.0f%% of the waits are given up (context cancelled) at a random moment within half the queue's depth: %d departed, %d gave up before their slot (%.0f%%). Departures are counted at their slots.\n\n",
		r.sc.cancelWaiters, rate, r.sc.giveBackFor, share*100, c.departed, c.cancelled, c.share*100)
	r.printf("Delivered after the first %v: **%.1f/s = %.1f%% of the contract** (target at least 97%%: %s); busiest 1 s: **%d** (at most rate + burst = %d: %s).\n\n",
		r.sc.giveBackWarm, c.perSec, ratio*100, r.target(ratio >= 0.97, fmt.Sprintf("cancelled slots: %.1f%% of the contract delivered (target 97%%)", ratio*100)),
		c.mostIn1s, rate+1, r.target(c.mostIn1s <= rate+1, fmt.Sprintf("cancelled slots: %d in one 1 s window (allowed %d)", c.mostIn1s, rate+1)))

	const requests, tokens, burst = 40, 3000, 6000
	keep := llmRun(t, requests, tokens, burst, false, r.sc.giveBackFor, r.sc.giveBackWarm)
	settled := llmRun(t, requests, tokens, burst, true, r.sc.giveBackFor, r.sc.giveBackWarm)
	gain := settled.tokensPerSec / keep.tokensPerSec
	r.printf("**Settling.** 8 workers call a fake LLM API through the pacing transport for %v, one account at %d requests/s and %d tokens/s (burst %d); each call reserves its max_tokens (400 to 800) and uses 1/8 to 3/8 of it (a quarter on average).\n\n", r.sc.giveBackFor, requests, tokens, burst)
	r.printf("| | calls | tokens used /s after %v | of the contract | busiest 1 s: requests, tokens (allowed %d, %d) |\n| --- | ---: | ---: | ---: | --- |\n", r.sc.giveBackWarm, requests+1, tokens+burst)
	for _, row := range []struct {
		name string
		l    llm
	}{{"keeping each estimate", keep}, {"settling each call", settled}} {
		r.printf("| %s | %d | %.0f | %.0f%% | %d, %d |\n", row.name, row.l.calls, row.l.tokensPerSec, 100*row.l.tokensPerSec/tokens, row.l.mostCalls, row.l.mostTokens)
	}
	inside := settled.mostTokens <= tokens+burst && settled.mostCalls <= requests+1 && keep.mostTokens <= tokens+burst && keep.mostCalls <= requests+1
	r.printf("\nSettled over kept: **%.2fx** (target at least 3x: %s); inside the contract in every 1 s window: %s.\n",
		gain, r.target(gain >= 3, fmt.Sprintf("settling: %.2fx the kept token throughput (target 3x)", gain)),
		r.target(inside, "settling: a 1 s window above the contract"))
}
