package transport

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// ParseRetryAfter reads a Retry-After header value: a whole number of seconds
// or an HTTP date. It returns how long to wait from now, and false for an
// empty, malformed or negative value. A date in the past means 0.
func ParseRetryAfter(value string, now time.Time) (time.Duration, bool) {
	v := trimOWS(value)
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

// RateLimitPause reads a response's rate-limit headers, in every dialect
// ParseLimits reads, and returns how long the key should pause when they
// say nothing is left (the longest time to a reset among the limits with
// less than one unit remaining), and whether they said so. Headers can
// only slow a key down: remaining above zero says nothing here (see
// RateLimitRemaining).
func RateLimitPause(h http.Header, now time.Time) (time.Duration, bool) {
	var pause time.Duration
	found := false
	for _, l := range ParseLimits(h, now) {
		if l.HasRemaining && l.HasReset && l.Remaining < 1 {
			found, pause = true, max(pause, l.Reset)
		}
	}
	return pause, found
}

// RateLimitRemaining reads the same headers as RateLimitPause and returns
// the tightest of the limits that still have units left: the fewest per
// second of their reset, as a whole number left (fractions dropped) and
// the time until the reset. ok is false when no limit states a remaining
// count of at least 1 with a reset after now.
func RateLimitRemaining(h http.Header, now time.Time) (remaining int64, reset time.Duration, ok bool) {
	for _, l := range ParseLimits(h, now) {
		n := math.Floor(l.Remaining)
		if !l.HasRemaining || !l.HasReset || n < 1 || l.Reset <= 0 {
			continue
		}
		if n > math.MaxInt64/2 {
			n = math.MaxInt64 / 2
		}
		// Tighter: fewer calls per unit of time, n/reset < remaining/reset.
		if !ok || n*reset.Seconds() < float64(remaining)*l.Reset.Seconds() {
			remaining, reset, ok = int64(n), l.Reset, true
		}
	}
	return remaining, reset, ok
}

// resetIn reads X-RateLimit-Reset: seconds from now, or a Unix time (seconds
// above 1e9, milliseconds above 1e12) as GitHub and others send it, as
// plain digits with an optional fraction (plainDecimal).
func resetIn(v string, now time.Time) (time.Duration, bool) {
	f, ok := plainDecimal(v)
	if !ok {
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
