package transport

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// pausedFor reports how long key is paused on s: the delay a reservation
// would need, read from the refusal (a pause far beyond MaxQueue).
func pausedFor(t *testing.T, s *shaper.Shaper, key string) time.Duration {
	t.Helper()
	_, err := s.Reserve(context.Background(), key, 1)
	var qf *shaper.QueueFullError
	if !errors.As(err, &qf) {
		t.Fatalf("key %q is not paused: Reserve gave %v", key, err)
	}
	return qf.Delay
}

// Every wait a partner dictates is capped at the configured maximum, never
// ignored and never obeyed beyond it: Retry-After: 999999999 (31.7 years)
// in the retryable client's backoff, the same header under a WithMaxPause
// above shaper.MaxPause, and an X-RateLimit-Reset no clock can reach
// (10^30, in digits: an exponent is no number there).
func TestPartnerWaitsAreCapped(t *testing.T) {
	t.Parallel()
	resp429 := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"999999999"}}}
	for _, c := range []struct {
		maxPause, waitMax, want time.Duration
	}{
		{DefaultMaxPause, 30 * time.Second, 30 * time.Second},
		{5 * time.Second, 30 * time.Second, 5 * time.Second},
		{shaper.MaxPause, math.MaxInt64, shaper.MaxPause},
	} {
		if got := Backoff(c.maxPause)(time.Second, c.waitMax, 1, resp429); got != c.want {
			t.Fatalf("Backoff(%v) with RetryWaitMax %v: %v, want %v", c.maxPause, c.waitMax, got, c.want)
		}
	}
	if got := Backoff(time.Minute)(time.Second, 30*time.Second, 0, &http.Response{StatusCode: 500}); got != time.Second {
		t.Fatalf("without Retry-After the backoff is retryablehttp's: %v, want 1s", got)
	}

	// End to end: a partner that always answers 429 with Retry-After: 999999999.
	forever := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "999999999")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer forever.Close()
	s := newShaper(t, shaper.PerSecond(100))
	client := NewRetryableClient(s, WithBase(forever.Client().Transport), WithMaxPause(time.Hour))
	client.RetryMax, client.RetryWaitMax = 2, 50*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := client.Do(must(retryablehttp.NewRequestWithContext(ctx, http.MethodGet, forever.URL, nil)))
	if resp != nil {
		_ = resp.Body.Close()
	}
	if ctx.Err() != nil {
		t.Fatalf("the client slept the raw Retry-After: still waiting after %v", time.Since(start))
	}
	if err == nil {
		t.Fatal("a partner that always refuses: no error")
	}
	if d := pausedFor(t, s, forever.Listener.Addr().String()); d < 59*time.Minute || d > time.Hour {
		t.Fatalf("the key was paused for %v, want the cap of 1h", d)
	}

	// WithMaxPause above shaper.MaxPause caps at shaper.MaxPause, and an
	// absurd X-RateLimit-Reset pauses for the cap, not for nothing.
	for name, h := range map[string]http.Header{
		"retry-after": {"Retry-After": {"999999999"}},
		"reset":       {"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"1" + strings.Repeat("0", 30)}},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for k, v := range h {
				w.Header()[k] = v
			}
			w.WriteHeader(http.StatusTooManyRequests)
		}))
		s := newShaper(t, shaper.PerSecond(100))
		hc := &http.Client{Transport: New(s, WithBase(srv.Client().Transport), WithMaxPause(100*365*24*time.Hour), WithKey(func(*http.Request) string { return name }))}
		resp, err := hc.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		srv.Close()
		if d := pausedFor(t, s, name); d < shaper.MaxPause-time.Minute || d > shaper.MaxPause {
			t.Fatalf("%s: paused for %v, want shaper.MaxPause (%v)", name, d, shaper.MaxPause)
		}
	}
	if d, ok := RateLimitPause(http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"1" + strings.Repeat("0", 30)}}, time.Now()); !ok || d != math.MaxInt64 {
		t.Fatalf("X-RateLimit-Reset: 10^30 gives %v %v, want the longest pause, for the caller's cap", d, ok)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A Route whose pick misses (a nil *Shaper from a map) fails the request
// with a typed error and sends nothing; it used to panic in RoundTrip.
func TestRouteToANilShaperFailsTheRequest(t *testing.T) {
	t.Parallel()
	p := &partner{}
	srv := httptest.NewServer(p)
	defer srv.Close()
	shapers := map[string]*shaper.Shaper{}
	r := shaper.Route(func(key string) shaper.Reserver { return shapers[key] })
	for _, rt := range []http.RoundTripper{New(r, WithBase(srv.Client().Transport)), New((*shaper.Shaper)(nil), WithBase(srv.Client().Transport))} {
		req, body := newRequest(t, context.Background(), srv.URL)
		resp, err := rt.RoundTrip(req)
		if resp != nil || !(errors.Is(err, shaper.ErrInvalidKey) || errors.Is(err, shaper.ErrInvalidConfig)) {
			t.Fatalf("RoundTrip through a nil *Shaper: %v %v, want a typed error", resp, err)
		}
		if body.closed.Load() != 1 {
			t.Fatalf("the request body was closed %d times, want 1", body.closed.Load())
		}
	}
	if p.count() != 0 {
		t.Fatalf("%d requests reached the partner", p.count())
	}
}
