package transport

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"120", 2 * time.Minute, true},
		{" 0 ", 0, true},
		{"1", time.Second, true},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"", 0, false},
		{"soon", 0, false},
		{"99999999999999999999999", math.MaxInt64, true},
		{"Sun, 01 Mar 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Sunday, 01-Mar-26 12:01:00 GMT", time.Minute, true},
		{"Sun Mar  1 12:00:10 2026", 10 * time.Second, true},
		{"Sun, 01 Mar 2026 11:00:00 GMT", 0, true}, // in the past: no wait
		{"Sun, 01 Mar 2026 25:00:00 GMT", 0, false},
	} {
		got, ok := ParseRetryAfter(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestRateLimitPause(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"none", header(), 0, false},
		{"remaining left", header("X-RateLimit-Remaining", "3", "X-RateLimit-Reset", "30"), 0, false},
		{"x- delta seconds", header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "30"), 30 * time.Second, true},
		{"x- unix seconds (GitHub)", header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1772366445"), 45 * time.Second, true},
		{"x- unix milliseconds", header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1772366401500"), 1500 * time.Millisecond, true},
		{"x- reset in the past", header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1772366000"), 0, true},
		{"x- remaining without reset", header("X-RateLimit-Remaining", "0"), 0, false},
		{"draft separate headers", header("RateLimit-Remaining", "0", "RateLimit-Reset", "7"), 7 * time.Second, true},
		{"draft list form", header("RateLimit", "limit=100, remaining=0, reset=12"), 12 * time.Second, true},
		{"draft list form, some left", header("RateLimit", "limit=100, remaining=4, reset=12"), 0, false},
		{"structured form", header("RateLimit", `"default";r=0;t=30`), 30 * time.Second, true},
		{"structured, two policies", header("RateLimit", `"burst";r=5;t=1, "daily";r=0;t=3600`), time.Hour, true},
		{"structured, fractional", header("RateLimit", `"p";r=0;t=1.5`), 1500 * time.Millisecond, true},
		{"garbage", header("X-RateLimit-Remaining", "none", "RateLimit", "r=;t=x"), 0, false},
		{"longest wins", header("X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "5", "RateLimit", `"a";r=0;t=9`), 9 * time.Second, true},
	} {
		got, ok := RateLimitPause(c.h, now)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %v, %v; want %v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// FuzzParseRetryAfter: never panics, never negative, and a plain number of
// seconds is read exactly.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"120", "-1", "Sun, 01 Mar 2026 12:00:30 GMT", "", "1e9", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, now)
		if d < 0 || !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, %v", v, d, ok)
		}
		if ok && allDigits(strings.TrimSpace(v)) && len(strings.TrimSpace(v)) < 10 && d%time.Second != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, not whole seconds", v, d)
		}
	})
}

// FuzzRateLimitPause: never panics and never returns a negative pause.
func FuzzRateLimitPause(f *testing.F) {
	for _, s := range []string{`"default";r=0;t=30`, "limit=1, remaining=0, reset=5", "r=0;t=-3", ";;==,,", `"a";r=0;t=1e308`} {
		f.Add(s, "0", "1772366445")
	}
	f.Fuzz(func(t *testing.T, rl, remaining, reset string) {
		h := header("RateLimit", rl, "X-RateLimit-Remaining", remaining, "X-RateLimit-Reset", reset, "RateLimit-Remaining", remaining, "RateLimit-Reset", reset)
		if d, ok := RateLimitPause(h, now); d < 0 || !ok && d != 0 {
			t.Fatalf("RateLimitPause(%q, %q, %q) = %v, %v", rl, remaining, reset, d, ok)
		}
	})
}

func TestRateLimitRemaining(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		h     http.Header
		n     int64
		reset time.Duration
		ok    bool
	}{
		{"none", header(), 0, 0, false},
		{"nothing left: a pause, not a clamp", header("RateLimit-Remaining", "0", "RateLimit-Reset", "7"), 0, 0, false},
		{"x- delta seconds", header("X-RateLimit-Remaining", "3", "X-RateLimit-Reset", "30"), 3, 30 * time.Second, true},
		{"x- unix seconds (GitHub)", header("X-RateLimit-Remaining", "9", "X-RateLimit-Reset", "1772366445"), 9, 45 * time.Second, true},
		{"x- reset in the past", header("X-RateLimit-Remaining", "9", "X-RateLimit-Reset", "1772366000"), 0, 0, false},
		{"remaining without reset", header("X-RateLimit-Remaining", "999"), 0, 0, false},
		{"draft separate headers", header("RateLimit-Remaining", "4", "RateLimit-Reset", "2"), 4, 2 * time.Second, true},
		{"draft list form", header("RateLimit", "limit=100, remaining=40, reset=12"), 40, 12 * time.Second, true},
		{"structured form", header("RateLimit", `"default";r=5;t=30`), 5, 30 * time.Second, true},
		{"fractions dropped", header("RateLimit", `"p";r=2.9;t=1.5`), 2, 1500 * time.Millisecond, true},
		{"under one call", header("RateLimit", `"p";r=0.5;t=10`), 0, 0, false},
		{"the tightest policy: fewest calls per second", header("RateLimit", `"burst";r=5;t=1, "daily";r=100;t=3600`), 100, time.Hour, true},
		{"across forms", header("X-RateLimit-Remaining", "10", "X-RateLimit-Reset", "10", "RateLimit-Remaining", "3", "RateLimit-Reset", "6"), 3, 6 * time.Second, true},
		{"garbage", header("X-RateLimit-Remaining", "many", "X-RateLimit-Reset", "10", "RateLimit", "r=x;t=1"), 0, 0, false},
	} {
		n, reset, ok := RateLimitRemaining(c.h, now)
		if n != c.n || reset != c.reset || ok != c.ok {
			t.Errorf("%s: %d, %v, %v; want %d, %v, %v", c.name, n, reset, ok, c.n, c.reset, c.ok)
		}
	}
}

// FuzzRateLimitRemaining: never panics; what it returns is at least one
// call and a reset after now, and a policy with nothing left is never one.
func FuzzRateLimitRemaining(f *testing.F) {
	for _, s := range []string{`"default";r=3;t=30`, "limit=1, remaining=2, reset=5", "r=1e300;t=1e-300", ";;==,,", `"a";r=9;t=1e308`} {
		f.Add(s, "3", "1772366445")
	}
	f.Fuzz(func(t *testing.T, rl, remaining, reset string) {
		h := header("RateLimit", rl, "X-RateLimit-Remaining", remaining, "X-RateLimit-Reset", reset, "RateLimit-Remaining", remaining, "RateLimit-Reset", reset)
		n, d, ok := RateLimitRemaining(h, now)
		if ok && (n < 1 || d <= 0) || !ok && (n != 0 || d != 0) {
			t.Fatalf("RateLimitRemaining(%q, %q, %q) = %d, %v, %v", rl, remaining, reset, n, d, ok)
		}
	})
}
