package algorithms

import (
	"fmt"
	"time"
)

// Rate is the contract of the rate-based algorithms: Count units per Period,
// with up to Burst units admitted back to back. Count may be fractional (7 per
// 3 s is Count 7, Period 3*time.Second).
type Rate struct {
	Count  float64
	Period time.Duration
	Burst  int64
}

// MinInterval is the shortest emission interval (Period/Count) accepted: 10 µs,
// that is at most 100,000 units per second per key.
//
// Times are float64 milliseconds, whose step from late 2004 to 2039 is 2^-12
// ms, about 0.24 µs. No slot is ever early because of that rounding: the GCRA
// family runs at Period/Count rounded up to a whole step (so that on a
// present-day key every sum is exact and a burst is whole), stores every
// other TAT rounded up, and delays are rounded up to the nanosecond. The
// price is paid by a backlogged key: each unit takes ceil(T*4096)/4096 ms
// instead of T = Period/Count ms, so the key runs slow by that difference
// over the rounded interval, less than one step (0.244 µs) per unit. An
// interval that is a whole number of steps (1/s, 25/s, 1,000/s, 500/min,
// 60/h) loses nothing. Otherwise, exactly: 100,000/s and 10,000/s run at
// 99,902.4 and 9,990.2 per second (9.8 * 10^-4 slow), 99,000/s at 97,523.8
// (1.5 %), 90,000/min at 89,989.0 (1.2 * 10^-4), 3/s at 2.99999854 per
// second (4.9 * 10^-7, 0.16 µs per unit) and 7/min at 6.99999989 per minute
// (1.6 * 10^-8, 0.14 µs per unit). The worst case at a given interval is an
// interval one step above a whole number of steps: at 100,000/s at least
// 97,616 per second (2.4 % slow), at 10,000/s at least 9,975 (0.24 %), at
// 1,000/s 0.024 %. A key that is not backlogged loses nothing: each request
// departs at its slot.
const MinInterval = 10 * time.Microsecond

// MaxInterval is the longest emission interval accepted: one unit per 10,000
// days. Slower contracts are quotas (see [NewQuota]).
const MaxInterval = 10000 * 24 * time.Hour

// MinWindow is the shortest window (or sub-bucket) the window algorithms accept.
const MinWindow = time.Millisecond

// validateRate checks count and period and returns the interval Period/Count in
// milliseconds.
func validateRate(alg string, count float64, period time.Duration) (float64, error) {
	if !finite(count) || count <= 0 {
		return 0, &ConfigError{alg, "Count", count, "must be a finite number > 0"}
	}
	if period <= 0 {
		return 0, &ConfigError{alg, "Period", period, "must be > 0"}
	}
	t := DurationMillis(period) / count
	if !finite(t) || t > DurationMillis(MaxInterval) {
		return 0, &ConfigError{alg, "Count", count, fmt.Sprintf("rate %v per %v is below the minimum of one unit per %v", count, period, MaxInterval)}
	}
	if t < DurationMillis(MinInterval) {
		return 0, &ConfigError{alg, "Count", count, fmt.Sprintf("rate %v per %v is above the maximum of one unit per %v", count, period, MinInterval)}
	}
	return t, nil
}

func validateBurst(alg string, burst int64) (float64, error) {
	if burst < 1 || burst > maxExactCost {
		return 0, &ConfigError{alg, "Burst", burst, "must be between 1 and 2^53"}
	}
	return float64(burst), nil
}

// validateCount checks the limit of a window algorithm or a quota.
func validateCount(alg string, limit float64) error {
	if !finite(limit) || limit < 1 || limit > maxExactCost {
		return &ConfigError{alg, "Count", limit, "must be a finite number between 1 and 2^53"}
	}
	return nil
}

// validateLimit checks a window limit and a window length.
func validateLimit(alg string, limit float64, window time.Duration) error {
	if err := validateCount(alg, limit); err != nil {
		return err
	}
	if window < MinWindow {
		return &ConfigError{alg, "Period", window, fmt.Sprintf("window must be at least %v", MinWindow)}
	}
	return nil
}

// limited is what the window algorithms and the quota share: a name, a
// limit per window or period, no waiting, and costs up to the limit.
type limited struct {
	name  string
	limit float64
}

// Name returns the algorithm's name ("fixed-window", "sliding-window",
// "sliding-log" or "quota").
func (l *limited) Name() string { return l.name }

// MaxWait returns 0: these algorithms never queue.
func (*limited) MaxWait() float64 { return 0 }

// ValidateCost refuses costs below 1 and above the limit.
func (l *limited) ValidateCost(cost int64) error {
	return checkCost(l.name, cost, l.limit, "the limit")
}
