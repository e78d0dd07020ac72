package shaper

import (
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// Clock is the time source of a shaper: Now and one-shot timers. The default
// is the system clock; tests pass their own (see WithClock).
type Clock = timer.Clock

// Timer is a one-shot timer created by a Clock.
type Timer = timer.Timer

// DefaultMaxQueue is the longest wait a shaper grants unless WithMaxQueue says
// otherwise. A request that would wait longer fails at once with a
// *QueueFullError.
const DefaultMaxQueue = 30 * time.Second

// Option configures New and All.
type Option func(*config)

type config struct {
	alg      Algorithm
	maxQueue time.Duration
	prefix   string
	name     string
	clock    Clock
	precise  time.Duration // 0: default sleeps
	err      error
}

func defaults() config {
	return config{alg: LeakyBucket, maxQueue: DefaultMaxQueue, clock: timer.Real()}
}

// WithAlgorithm chooses the algorithm (default LeakyBucket).
func WithAlgorithm(a Algorithm) Option { return func(c *config) { c.alg = a } }

// WithMaxQueue sets the longest wait granted (default DefaultMaxQueue). For
// the leaky bucket it bounds the reservation's delay; for the other algorithms
// it bounds how long Wait keeps retrying. Zero means never wait.
func WithMaxQueue(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.err = &ConfigError{Algorithm: "shaper", Field: "MaxQueue", Value: d, Reason: "must be >= 0"}
		}
		c.maxQueue = d
	}
}

// WithPrefix sets the namespace of the shaper's keys in its store (default
// "tk:" followed by the name). Shapers that share a store and a prefix share
// their keys' budgets, so they must have the same configuration; a memory store
// refuses a second shaper on the same prefix with a different one.
func WithPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithName names the shaper for errors, metrics and the default prefix.
func WithName(n string) Option { return func(c *config) { c.name = n } }

// WithClock sets the clock (default: the system clock). Every time the shaper
// reads or sleeps goes through it.
func WithClock(clk Clock) Option {
	return func(c *config) {
		if clk == nil {
			c.err = &ConfigError{Algorithm: "shaper", Field: "Clock", Value: nil, Reason: "must not be nil"}
			return
		}
		c.clock = clk
	}
}

// WithPreciseSleep makes Wait finish each sleep by yielding the processor for
// the last window before the departure instead of trusting the timer (window
// 0 means 2 ms). Departures then leave within microseconds of their slot
// rather than up to about a millisecond late, at the cost of CPU during the
// window. Worth it for a sequential caller above about 1,000/s; see
// docs/TIMER.md.
func WithPreciseSleep(window time.Duration) Option {
	return func(c *config) {
		if window <= 0 {
			window = timer.DefaultPreciseWindow
		}
		c.precise = window
	}
}

// Algorithm selects how a shaper limits: the values LeakyBucket, GCRA,
// TokenBucket, FixedWindow, SlidingWindow and SlidingWindowLog, or
// SlidingWindowBuckets(n) and Quota(cadence).
type Algorithm struct {
	kind    algKind
	buckets int
	cadence algorithms.Cadence
}

type algKind int

const (
	kindLeaky algKind = iota + 1
	kindGCRA
	kindToken
	kindFixed
	kindSliding
	kindLog
	kindQuota
)

var (
	// LeakyBucket (the default) gives every request a departure slot: it waits
	// rather than being refused, unless the wait would exceed MaxQueue.
	LeakyBucket = Algorithm{kind: kindLeaky}
	// GCRA is the leaky bucket's recurrence without waiting: Reserve refuses
	// any request that cannot depart at once; Wait sleeps and retries.
	GCRA = Algorithm{kind: kindGCRA}
	// TokenBucket holds Burst tokens refilled at the rate; it starts full.
	TokenBucket = Algorithm{kind: kindToken}
	// FixedWindow admits Count per epoch-aligned Period. Up to 2*Count can
	// pass within one Period across a window boundary.
	FixedWindow = Algorithm{kind: kindFixed}
	// SlidingWindow estimates the count over the trailing Period from 10
	// sub-buckets (error at most one sub-bucket). See SlidingWindowBuckets.
	SlidingWindow = Algorithm{kind: kindSliding, buckets: 10}
	// SlidingWindowLog admits exactly Count per trailing Period; its state
	// grows with Count, so keep Count small.
	SlidingWindowLog = Algorithm{kind: kindLog}
)

// SlidingWindowBuckets is SlidingWindow with n sub-buckets (1 to 256; 1 is the
// classic two-counter estimate).
func SlidingWindowBuckets(n int) Algorithm { return Algorithm{kind: kindSliding, buckets: n} }

// Cadence lays out a quota's periods; see Daily, Weekly, Monthly, Fixed and Rolling.
type Cadence = algorithms.Cadence

// Quota admits Count per period of c (the Rate's Period is not used).
func Quota(c Cadence) Algorithm { return Algorithm{kind: kindQuota, cadence: c} }

// Daily is a calendar day at a fixed UTC offset (within ±14h).
func Daily(offset time.Duration) Cadence { return algorithms.Daily(offset) }

// Weekly is a calendar week starting on first at a fixed UTC offset.
func Weekly(offset time.Duration, first time.Weekday) Cadence {
	return algorithms.Weekly(offset, first)
}

// Monthly is a calendar month at a fixed UTC offset.
func Monthly(offset time.Duration) Cadence { return algorithms.Monthly(offset) }

// Fixed is a sequence of equal periods, one of which starts at anchor.
func Fixed(period time.Duration, anchor time.Time) Cadence { return algorithms.Fixed(period, anchor) }

// Rolling is the trailing window, estimated from buckets sub-buckets.
func Rolling(window time.Duration, buckets int) Cadence { return algorithms.Rolling(window, buckets) }

// String names the algorithm.
func (a Algorithm) String() string {
	switch a.kind {
	case kindLeaky:
		return "leaky-bucket"
	case kindGCRA:
		return "gcra"
	case kindToken:
		return "token-bucket"
	case kindFixed:
		return "fixed-window"
	case kindSliding:
		return fmt.Sprintf("sliding-window(%d)", a.buckets)
	case kindLog:
		return "sliding-log"
	case kindQuota:
		return "quota"
	}
	return "invalid"
}

// build returns the transition for rate r, and the one Allow uses (the same
// transition with no waiting; they share a state layout).
func (a Algorithm) build(r Rate, maxQueue time.Duration) (main, allow algorithms.Algorithm, err error) {
	if r.Count < 1 {
		return nil, nil, &ConfigError{Algorithm: a.String(), Field: "Count", Value: r.Count, Reason: "must be >= 1"}
	}
	if r.Burst < 0 {
		return nil, nil, &ConfigError{Algorithm: a.String(), Field: "Burst", Value: r.Burst, Reason: "must be >= 0 (0 means 1)"}
	}
	ar := algorithms.Rate{Count: float64(r.Count), Period: r.Period, Burst: r.burst()}
	count := float64(r.Count)
	var alg algorithms.Algorithm
	switch a.kind {
	case kindLeaky:
		leaky, err := algorithms.NewLeakyBucket(ar, maxQueue)
		if err != nil {
			return nil, nil, err
		}
		gcra, err := algorithms.NewGCRA(ar)
		if err != nil {
			return nil, nil, err
		}
		return leaky, gcra, nil
	case kindGCRA:
		alg, err = algorithms.NewGCRA(ar)
	case kindToken:
		alg, err = algorithms.NewTokenBucket(ar)
	case kindFixed:
		alg, err = algorithms.NewFixedWindow(count, r.Period)
	case kindSliding:
		alg, err = algorithms.NewSlidingWindow(count, r.Period, a.buckets)
	case kindLog:
		alg, err = algorithms.NewSlidingLog(count, r.Period)
	case kindQuota:
		alg, err = algorithms.NewQuota(count, a.cadence)
	default:
		return nil, nil, &ConfigError{Algorithm: "shaper", Field: "Algorithm", Value: a, Reason: "use LeakyBucket, GCRA, TokenBucket, FixedWindow, SlidingWindow, SlidingWindowLog or Quota(...)"}
	}
	if err != nil {
		return nil, nil, err
	}
	return alg, alg, nil
}
