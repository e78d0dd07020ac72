package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// partner is a fake API that enforces a rate like a strict GCRA (burst 1):
// a request arriving more than tolerance before its theoretical time gets a
// 429. The tolerance absorbs scheduling jitter on the client and in the
// handler. Alone, the timer wakes up to ~1.1 ms late (p99, docs/TIMER.md); but
// make test runs every package at once under -race on 2 cores, and there a
// 3 ms tolerance was exceeded once in three full runs. Half an interval
// (10 ms at 50/s) still rejects any two requests in one slot, so an unshaped
// burst fails as surely as before.
type partner struct {
	mu        sync.Mutex
	interval  time.Duration
	tolerance time.Duration
	tat       time.Time
	arrivals  []time.Time
	rejected  int
	respond   func(w http.ResponseWriter, n int) bool // optional override; true if it answered
}

func (p *partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	now := time.Now()
	p.mu.Lock()
	p.arrivals = append(p.arrivals, now)
	n := len(p.arrivals)
	ok := p.interval == 0 || !now.Before(p.tat.Add(-p.tolerance))
	if ok && p.interval > 0 {
		if p.tat.Before(now) {
			p.tat = now
		}
		p.tat = p.tat.Add(p.interval)
	}
	if !ok {
		p.rejected++
	}
	respond := p.respond
	p.mu.Unlock()
	if respond != nil && respond(w, n) {
		return
	}
	if !ok {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (p *partner) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.arrivals)
}

func newShaper(t *testing.T, rate shaper.Rate, opts ...shaper.Option) *shaper.Shaper {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { _ = store.Close() })
	s, err := shaper.New(store, rate, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// served is a RoundTripper that serves each request with h in the
// process: in a synctest bubble a request reaches h at its departure,
// exactly.
type served struct{ h http.Handler }

func (s served) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body == nil { // as a server reads it
		r = r.Clone(r.Context())
		r.Body = http.NoBody
	}
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, r)
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// 100 concurrent requests at 50/s, burst 1, against a partner that
// refuses any arrival before its interval has passed: none refused, and
// the partner sees them 22 ms apart (20 ms and the spacing margin, kept
// from the first request: WithSpacingMargin). On the fake clock, so that
// the slots are what is checked, not the host's wake-up lateness (the
// nginx tests meet that).
func TestConcurrentRequestsArrivePaced(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		p := &partner{interval: 20 * time.Millisecond}
		store := memstore.New(memstore.WithSweepInterval(0))
		defer store.Close()
		s, err := shaper.New(store, shaper.PerSecond(50))
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: New(s, WithBase(served{p}), WithSpacingMargin(DefaultSpacingMargin))}
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() {
				resp, err := client.Get("http://partner.test/")
				if err != nil {
					t.Error(err)
					return
				}
				_ = resp.Body.Close()
			})
		}
		wg.Wait()
		if p.rejected > 0 {
			t.Fatalf("the partner rejected %d of 100 paced requests", p.rejected)
		}
		if len(p.arrivals) != 100 {
			t.Fatalf("%d arrivals, want 100", len(p.arrivals))
		}
		slices.SortFunc(p.arrivals, func(a, b time.Time) int { return a.Compare(b) })
		gaps := make([]time.Duration, 0, 99)
		for i := 1; i < len(p.arrivals); i++ {
			gaps = append(gaps, p.arrivals[i].Sub(p.arrivals[i-1]))
		}
		slices.Sort(gaps)
		// 50/s is a strict contract the transport keeps its spacing margin
		// on (a tenth of the 20 ms interval, 2 ms): the slots are 22 ms
		// apart, and none closer than the interval.
		if gaps[0] < 20*time.Millisecond {
			t.Fatalf("smallest gap at the partner %v, want at least 20ms", gaps[0])
		}
		if med := gaps[len(gaps)/2]; med != 22*time.Millisecond {
			t.Fatalf("median gap at the partner %v, want 22ms (20 ms and the 2 ms margin)", med)
		}
	})
}

// countingBody records whether it was closed.
type countingBody struct {
	io.Reader
	closed atomic.Int32
}

func (b *countingBody) Close() error { b.closed.Add(1); return nil }

func newRequest(t *testing.T, ctx context.Context, url string) (*http.Request, *countingBody) {
	t.Helper()
	body := &countingBody{Reader: bytes.NewReader([]byte("payload"))}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Caller", "mine")
	return req, body
}

// Every refusal closes the request body and sends nothing; a refusal past the
// deadline is immediate and gives the slot back; the caller's request is not
// modified.
func TestRefusalsSendNothingAndCloseTheBody(t *testing.T) {
	t.Parallel()
	p := &partner{}
	srv := httptest.NewServer(p)
	defer srv.Close()
	s := newShaper(t, shaper.PerSecond(2), shaper.WithMaxQueue(5*time.Second))
	rt := New(s, WithBase(srv.Client().Transport))

	req, body := newRequest(t, bg, srv.URL)
	before := req.Clone(bg)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if req.URL.String() != before.URL.String() || req.Header.Get("X-Caller") != "mine" || len(req.Header) != len(before.Header) || req.Host != before.Host {
		t.Fatalf("the caller's request was modified: %+v", req)
	}
	if body.closed.Load() == 0 {
		t.Fatal("the base transport should have closed the sent body")
	}

	deadline, cancel := context.WithTimeout(bg, 100*time.Millisecond) // the next slot is 500 ms away
	defer cancel()
	cancelled, cancelNow := context.WithCancel(bg)
	cases := []struct {
		name string
		rt   http.RoundTripper
		ctx  context.Context
		is   error
	}{
		{"past the deadline", rt, deadline, context.DeadlineExceeded},
		{"beyond MaxWait", New(s, WithBase(srv.Client().Transport), WithMaxWait(100*time.Millisecond)), bg, shaper.ErrQueueFull},
		{"invalid cost", New(s, WithBase(srv.Client().Transport), WithCost(func(*http.Request) int64 { return 0 })), bg, shaper.ErrInvalidCost},
		{"cancelled while waiting", rt, cancelled, context.Canceled},
	}
	time.AfterFunc(50*time.Millisecond, cancelNow)
	for _, c := range cases {
		req, body := newRequest(t, c.ctx, srv.URL)
		start := time.Now()
		_, err := c.rt.RoundTrip(req)
		if !errors.Is(err, c.is) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.is)
		}
		if body.closed.Load() != 1 {
			t.Fatalf("%s: the request body was closed %d times, want once", c.name, body.closed.Load())
		}
		if c.name == "past the deadline" && time.Since(start) > 50*time.Millisecond {
			t.Fatalf("the deadline refusal took %v; it should be immediate", time.Since(start))
		}
	}
	if n := p.count(); n != 1 {
		t.Fatalf("the server saw %d requests, want only the first", n)
	}
	// The refusals gave their slots back: the next request waits for the
	// second slot (500 ms after the first), not for a later one.
	r, err := s.Reserve(bg, strings.TrimPrefix(srv.URL, "http://"), 1)
	if err != nil || r.Delay > 500*time.Millisecond {
		t.Fatalf("after the refusals the next slot is %v away (%v), want at most 500ms", r.Delay, err)
	}
}

var bg = context.Background()

// Feedback: a 429 with Retry-After pauses the key; rate-limit headers with
// nothing remaining do too; remaining > 0 never speeds a key up.
func TestFeedbackPausesTheKey(t *testing.T) {
	t.Parallel()
	p := &partner{respond: func(w http.ResponseWriter, n int) bool {
		switch n {
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		case 2:
			w.Header().Set("RateLimit", `"default";r=0;t=1`)
			w.WriteHeader(http.StatusOK)
		default:
			w.Header().Set("X-RateLimit-Remaining", "999")
			w.WriteHeader(http.StatusOK)
		}
		return true
	}}
	srv := httptest.NewServer(p)
	defer srv.Close()
	client := &http.Client{Transport: New(newShaper(t, shaper.PerSecond(100)), WithBase(srv.Client().Transport))}
	for range 4 {
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	p.mu.Lock()
	arr := slices.Clone(p.arrivals)
	p.mu.Unlock()
	if gap := arr[1].Sub(arr[0]); gap < 950*time.Millisecond {
		t.Fatalf("after a 429 with Retry-After: 1 the next request came %v later", gap)
	}
	if gap := arr[2].Sub(arr[1]); gap < 950*time.Millisecond {
		t.Fatalf("after RateLimit r=0;t=1 the next request came %v later", gap)
	}
	// remaining=999 must not pause: the next request comes at its 10 ms slot,
	// far inside 500 ms. (No lower bound: a request that departed late by L
	// has its successor's slot L nearer, so under a loaded -race run the gap
	// can shrink to the round trip; pacing itself is tested above.)
	if gap := arr[3].Sub(arr[2]); gap > 500*time.Millisecond {
		t.Fatalf("remaining=999 paused the key: gap %v, want the configured 10ms", gap)
	}
	off := &http.Client{Transport: New(newShaper(t, shaper.PerSecond(100)), WithBase(srv.Client().Transport), WithFeedback(false))}
	p.mu.Lock()
	p.arrivals = nil
	p.mu.Unlock()
	for range 2 {
		resp, _ := off.Get(srv.URL)
		_ = resp.Body.Close()
	}
	if gap := p.arrivals[1].Sub(p.arrivals[0]); gap > 500*time.Millisecond {
		t.Fatalf("WithFeedback(false) still paused: %v", gap)
	}
}

// clamps records the Clamp calls the transport makes, over a shaper.
type clamps struct {
	*shaper.Shaper
	mu    sync.Mutex
	calls []string
}

func (c *clamps) Clamp(ctx context.Context, key string, remaining int64, reset time.Duration) error {
	c.mu.Lock()
	c.calls = append(c.calls, fmt.Sprintf("%s %d %v", key, remaining, reset))
	c.mu.Unlock()
	return c.Shaper.Clamp(ctx, key, remaining, reset)
}

// Learn records the clamp the feedback asks for (the shaper applies it,
// see shaper.Shaper.Learn).
func (c *clamps) Learn(ctx context.Context, key string, fb shaper.Feedback) error {
	if fb.HasRemaining && fb.Pause == 0 {
		c.mu.Lock()
		c.calls = append(c.calls, fmt.Sprintf("%s %d %v", key, fb.Remaining, fb.Reset))
		c.mu.Unlock()
	}
	return c.Shaper.Learn(ctx, key, fb)
}

// Rate-limit headers with calls left clamp the key with what they say
// (the shaper decides whether that is slower than its contract); nothing
// left pauses it instead; WithFeedback(false) does neither.
func TestFeedbackClampsTheKey(t *testing.T) {
	t.Parallel()
	p := &partner{respond: func(w http.ResponseWriter, n int) bool {
		switch n {
		case 1:
			w.Header().Set("RateLimit-Remaining", "3")
			w.Header().Set("RateLimit-Reset", "6")
		case 2:
			w.Header().Set("RateLimit", `"default";r=0;t=1`)
		}
		w.WriteHeader(http.StatusOK)
		return true
	}}
	srv := httptest.NewServer(p)
	defer srv.Close()
	for _, on := range []bool{true, false} {
		p.mu.Lock()
		p.arrivals = nil
		p.mu.Unlock()
		r := &clamps{Shaper: newShaper(t, shaper.PerSecond(1000), shaper.WithName(fmt.Sprint(on)))}
		client := &http.Client{Transport: New(r, WithBase(srv.Client().Transport), WithFeedback(on), WithKey(func(*http.Request) string { return "partner" }))}
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		want := "[partner 3 6s]"
		if !on {
			want = "[]"
		}
		if got := fmt.Sprint(r.calls); got != want {
			t.Fatalf("feedback %v: Clamp calls %v, want %s", on, got, want)
		}
		if on {
			// 3 calls in 6 s: the first under the clamp leaves at once
			// (1000/s keeps no margin, so no clamp held a slot), the next
			// 2 s after it. The store keeps instants in ms: 1 ms of
			// tolerance.
			first, err := r.Reserve(context.Background(), "partner", 1)
			if err != nil {
				t.Fatal(err)
			}
			st, err := r.Status(context.Background(), "partner", 1)
			if err != nil {
				t.Fatal(err)
			}
			if gap := st.Next.Sub(first.Time()); gap < 2*time.Second-time.Millisecond || gap > 2*time.Second+time.Millisecond || first.Delay > 2*time.Second+time.Millisecond {
				t.Fatalf("after a clamp of 3 in 6 s the first call leaves in %v and the next %v after it", first.Delay, gap)
			}
		}
	}
}

// By default the spacing margin is kept on a key only once its partner
// refused a request of it: a partner that never refuses (one counting
// requests per window) loses none of its rate to it.
func TestSpacingMarginStartsAtARefusal(t *testing.T) {
	t.Parallel()
	refuse := atomic.Bool{}
	p := &partner{respond: func(w http.ResponseWriter, n int) bool {
		if refuse.CompareAndSwap(true, false) {
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}
		return false
	}}
	srv := httptest.NewServer(p)
	defer srv.Close()
	client := &http.Client{Transport: New(newShaper(t, shaper.PerSecond(50)), WithBase(srv.Client().Transport))}
	batch := func() time.Duration {
		p.mu.Lock()
		from := len(p.arrivals)
		p.mu.Unlock()
		var wg sync.WaitGroup
		for range 30 {
			wg.Go(func() {
				resp, err := client.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				_ = resp.Body.Close()
			})
		}
		wg.Wait()
		p.mu.Lock()
		defer p.mu.Unlock()
		arr := slices.Clone(p.arrivals[from:])
		slices.SortFunc(arr, func(a, b time.Time) int { return a.Compare(b) })
		gaps := make([]time.Duration, 0, len(arr))
		for i := 1; i < len(arr); i++ {
			gaps = append(gaps, arr[i].Sub(arr[i-1]))
		}
		slices.Sort(gaps)
		return gaps[len(gaps)/2]
	}
	if med := batch(); med > 21*time.Millisecond {
		t.Fatalf("before any refusal: median gap %v, want 20ms (no margin)", med)
	}
	refuse.Store(true)
	resp, err := client.Get(srv.URL) // refused: the margin starts
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if med := batch(); med < 21*time.Millisecond || med > 24*time.Millisecond {
		t.Fatalf("after a refusal: median gap %v, want about 22ms (20 ms and the 2 ms margin)", med)
	}
}
