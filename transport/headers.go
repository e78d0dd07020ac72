package transport

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ParseRetryAfter reads a Retry-After header value: a whole number of seconds
// or an HTTP date. It returns how long to wait from now, and false for an
// empty, malformed or negative value. A date in the past means 0.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(value)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange && allDigits(v) {
				return math.MaxInt64, true // absurdly far: the caller's cap applies
			}
			return 0, false
		}
		return seconds(float64(secs)), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(0, t.Sub(now)), true
}

func allDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// seconds converts a non-negative number of seconds to a Duration, saturating.
func seconds(s float64) time.Duration {
	if !(s > 0) {
		return 0
	}
	if s >= math.MaxInt64/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

// RateLimitPause reads a response's rate-limit headers and returns how long
// the key should pause when they say nothing is left, and whether they said
// so. It understands:
//
//   - X-RateLimit-Remaining with X-RateLimit-Reset (seconds from now, or a
//     Unix time in seconds or milliseconds when the number is that large);
//   - RateLimit-Remaining with RateLimit-Reset (seconds from now), and the
//     single RateLimit header in its list form ("limit=100, remaining=0,
//     reset=30") and its structured form ("default";r=0;t=30).
//
// Headers can only slow a key down: remaining above zero says nothing here
// (see RateLimitRemaining).
func RateLimitPause(h http.Header, now time.Time) (time.Duration, bool) {
	var pause time.Duration
	found := false
	for _, p := range rateLimitPolicies(h, now) {
		if p.remaining <= 0 {
			found, pause = true, max(pause, p.reset)
		}
	}
	return pause, found
}

// RateLimitRemaining reads the same headers as RateLimitPause and returns
// the tightest of the policies that still have calls left: the fewest
// calls per second of their reset, as a whole number of calls left
// (fractions dropped) and the time until the reset. ok is false when no
// policy states a remaining count of at least 1 with a reset after now.
func RateLimitRemaining(h http.Header, now time.Time) (remaining int64, reset time.Duration, ok bool) {
	for _, p := range rateLimitPolicies(h, now) {
		n := math.Floor(p.remaining)
		if n < 1 || p.reset <= 0 {
			continue
		}
		if n > math.MaxInt64/2 {
			n = math.MaxInt64 / 2
		}
		// Tighter: fewer calls per unit of time, n/reset < remaining/reset.
		if !ok || n*reset.Seconds() < float64(remaining)*p.reset.Seconds() {
			remaining, reset, ok = int64(n), p.reset, true
		}
	}
	return remaining, reset, ok
}

// policy is one rate-limit policy a response states: the calls it has
// left and the time until its reset.
type policy struct {
	remaining float64
	reset     time.Duration
}

// rateLimitPolicies returns every policy the headers state with both a
// remaining count and a reset.
func rateLimitPolicies(h http.Header, now time.Time) []policy {
	var out []policy
	if n, ok := number(h.Get("X-RateLimit-Remaining")); ok {
		if d, ok := resetIn(h.Get("X-RateLimit-Reset"), now); ok {
			out = append(out, policy{n, d})
		}
	}
	if n, ok := number(h.Get("RateLimit-Remaining")); ok {
		if d, ok := number(h.Get("RateLimit-Reset")); ok {
			out = append(out, policy{n, seconds(d)})
		}
	}
	for _, line := range h.Values("RateLimit") {
		out = append(out, rateLimitField(line)...)
	}
	return out
}

func number(v string) (float64, bool) {
	v = strings.Trim(strings.TrimSpace(v), `"`)
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// resetIn reads X-RateLimit-Reset: seconds from now, or a Unix time (seconds
// above 1e9, milliseconds above 1e12) as GitHub and others send it.
func resetIn(v string, now time.Time) (time.Duration, bool) {
	f, ok := number(v)
	if !ok || f < 0 {
		return 0, false
	}
	switch {
	case f >= 1e17: // past what a Unix time in milliseconds can say: absurdly far, the caller's cap applies
		return math.MaxInt64, true
	case f > 1e12:
		return max(0, time.UnixMilli(int64(f)).Sub(now)), true
	case f > 1e9:
		return max(0, time.Unix(int64(f), 0).Sub(now)), true
	}
	return seconds(f), true
}

// rateLimitField reads one RateLimit header line in either form and returns
// its policies that state both a remaining count and a reset (>= 0).
func rateLimitField(line string) []policy {
	var out []policy
	// List form: the keys are spread over the comma-separated elements.
	var listRemaining, listReset string
	for _, elem := range strings.Split(line, ",") {
		params := strings.Split(elem, ";")
		var r, t string
		for _, p := range params {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok {
				continue
			}
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "r":
				r = v
			case "t":
				t = v
			case "remaining":
				listRemaining = v
			case "reset":
				listReset = v
			}
		}
		if n, ok := number(r); ok { // structured form: one policy per element
			if d, ok := number(t); ok && d >= 0 {
				out = append(out, policy{n, seconds(d)})
			}
		}
	}
	if n, ok := number(listRemaining); ok {
		if d, ok := number(listReset); ok && d >= 0 {
			out = append(out, policy{n, seconds(d)})
		}
	}
	return out
}
