package shaper

import (
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// Clock is a shaper's time source (WithClock); shapertest.Clock is a fake one.
type Clock = timer.Clock

// Timer is a one-shot timer created by a Clock.
type Timer = timer.Timer

// DefaultMaxQueue is the longest wait a shaper grants unless WithMaxQueue says otherwise.
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
	refresh  time.Duration // WithContractRefresh
	maxRun   int           // WithMaxPriorityRun
	learning *Learning     // WithLearning
	lateness time.Duration // WithLateness; 0: any
	horizon  time.Duration // WithHorizon; 0: none
	err      error

	maxRunSet bool

	refreshSet bool
}

func defaults() config {
	return config{alg: LeakyBucket, maxQueue: DefaultMaxQueue, clock: timer.Real()}
}

// WithLateness bounds how late after its slot Wait and Acquire let a
// request go (default: any lateness): a caller that wakes later than that
// (a loaded machine's timer, a stalled scheduler) gives its slot back,
// settled at nothing, and takes a new one, so that every request they
// return departs within d of a slot of the contract. A partner that counts
// its own way is then kept to by a schedule that allows for d (package
// partner does this). Reserve's caller keeps its own time.
func WithLateness(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.err = &ConfigError{Algorithm: "shaper", Field: "Lateness", Value: d, Reason: "must be >= 0 (0: any)"}
		}
		c.lateness = d
	}
}

// WithAlgorithm chooses the algorithm (default LeakyBucket).
func WithAlgorithm(a Algorithm) Option { return func(c *config) { c.alg = a } }

// WithMaxQueue sets the longest wait granted (default DefaultMaxQueue; 0:
// never wait). For the algorithms other than the leaky bucket it bounds how
// long Wait keeps retrying.
func WithMaxQueue(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.err = &ConfigError{Algorithm: "shaper", Field: "MaxQueue", Value: d, Reason: "must be >= 0"}
		}
		c.maxQueue = d
	}
}

// WithPrefix sets the namespace of the shaper's keys in its store (default
// "tk:" + name). Shapers sharing a store and a prefix share their budgets, so
// they must be configured alike.
func WithPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithName names the shaper for errors, metrics and the default prefix.
func WithName(n string) Option { return func(c *config) { c.name = n } }

// WithClock sets the clock the shaper reads and sleeps on (default: the system clock).
func WithClock(clk Clock) Option {
	return func(c *config) {
		if clk == nil {
			c.err = &ConfigError{Algorithm: "shaper", Field: "Clock", Value: nil, Reason: "must not be nil"}
			return
		}
		c.clock = clk
	}
}

// WithPreciseSleep makes Wait spend the last window (0: 2 ms) before each
// departure yielding the processor instead of trusting the timer: departures
// within microseconds of their slot, for CPU. See docs/TIMER.md.
func WithPreciseSleep(window time.Duration) Option {
	return func(c *config) {
		if window <= 0 {
			window = timer.DefaultPreciseWindow
		}
		c.precise = window
	}
}

// Algorithm selects how a shaper limits (WithAlgorithm); see docs/ALGORITHMS.md.
type Algorithm struct {
	kind    algKind
	buckets int
	cadence algorithms.Cadence
	spread  time.Duration // TrailingWithin
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
	kindTrailing
	kindCostBucket
)

var (
	// LeakyBucket (the default) delays each request to its slot, up to MaxQueue.
	LeakyBucket = Algorithm{kind: kindLeaky}
	// GCRA admits only what conforms now; Wait sleeps and retries.
	GCRA = Algorithm{kind: kindGCRA}
	// TokenBucket holds Burst tokens refilled at the rate; it starts full.
	TokenBucket = Algorithm{kind: kindToken}
	// FixedWindow admits Count per epoch-aligned Period.
	FixedWindow = Algorithm{kind: kindFixed}
	// SlidingWindow estimates the trailing Period's count from 10 sub-buckets.
	SlidingWindow = Algorithm{kind: kindSliding, buckets: 10}
	// SlidingWindowLog admits exactly Count per trailing Period.
	SlidingWindowLog = Algorithm{kind: kindLog}
	// TrailingWindow delays each request to its slot, up to MaxQueue, as the
	// leaky bucket does, so that the departures put at most Count units in
	// any trailing Period, paced at Count per Period: the schedule of a
	// partner that counts a trailing window (OpenAI's requests and tokens
	// per minute). Burst is not used. A settle for less than reserved gives
	// the unused units back. TrailingWithin allows for departures that
	// reach the partner late; package partner uses it.
	TrailingWindow = Algorithm{kind: kindTrailing}
	// CostBucket delays each request to its slot, up to MaxQueue, in the
	// order they come, so that a token bucket of Burst units refilled at
	// Count per Period always holds the cost of the next departure: the
	// schedule of a partner that counts a bucket of a call's cost
	// (Anthropic's tokens per minute). A settle for less than reserved puts
	// the unused units back in the bucket, as the partner's bucket does;
	// package partner uses it.
	CostBucket = Algorithm{kind: kindCostBucket}
)

// TrailingWithin is TrailingWindow for requests that reach the partner up
// to spread after their slots (a loaded machine's timer, the network's
// jitter): its log spans Period+spread, so that no trailing Period of the
// partner's counts more than Count, while the pace stays Count per Period.
func TrailingWithin(spread time.Duration) Algorithm {
	return Algorithm{kind: kindTrailing, spread: spread}
}

// SlidingWindowBuckets is SlidingWindow with n sub-buckets (1 to 256).
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
	case kindTrailing:
		if a.spread > 0 {
			return fmt.Sprintf("trailing-window(+%v)", a.spread)
		}
		return "trailing-window"
	case kindCostBucket:
		return "cost-bucket"
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
	case kindTrailing:
		q, err := algorithms.NewTrailingLog(count, r.Period, a.spread, maxQueue)
		if err != nil {
			return nil, nil, err
		}
		now, err := algorithms.NewTrailingLog(count, r.Period, a.spread, 0)
		if err != nil {
			return nil, nil, err
		}
		return q, now, nil
	case kindCostBucket:
		q, err := algorithms.NewCostBucket(float64(r.burst()), r.Count, r.Period, maxQueue)
		if err != nil {
			return nil, nil, err
		}
		now, err := algorithms.NewCostBucket(float64(r.burst()), r.Count, r.Period, 0)
		if err != nil {
			return nil, nil, err
		}
		return q, now, nil
	case kindQuota:
		alg, err = algorithms.NewQuota(count, a.cadence)
	default:
		return nil, nil, &ConfigError{Algorithm: "shaper", Field: "Algorithm", Value: a, Reason: "use LeakyBucket, GCRA, TokenBucket, FixedWindow, SlidingWindow, SlidingWindowLog, TrailingWindow, CostBucket or Quota(...)"}
	}
	if err != nil {
		return nil, nil, err
	}
	return alg, alg, nil
}

// queues reports whether the algorithm grants delays (a slot later than
// now) instead of refusing.
func (a Algorithm) queues() bool {
	return a.kind == kindLeaky || a.kind == kindTrailing || a.kind == kindCostBucket
}
