package partner

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// Model is how a partner counts a limit: the rule by which it refuses.
type Model int

const (
	// Trailing counts the units of the arrivals in the trailing Window and
	// refuses one that would bring them above Quota (OpenAI's requests and
	// tokens per minute).
	Trailing Model = iota + 1
	// FixedWindow counts the units of the arrivals in fixed windows of
	// Window, aligned to the partner's clock or to the first arrival
	// (GitHub's hourly limit, a daily quota), and refuses above Quota.
	FixedWindow
	// TokenBucket holds Quota units, refilled continuously at Refill, and
	// refuses an arrival that costs more than it holds (Anthropic, Stripe).
	// A GCRA with a burst counts the same way.
	TokenBucket
	// LimitReq is nginx's limit_req: requests at Refill, with up to Quota-1
	// of them (its burst) ahead of that rate; it measures the spacing of its
	// arrivals in whole milliseconds and refuses one that comes too close.
	LimitReq
	// Concurrency refuses a request beyond Quota open at once.
	Concurrency
)

// String names the model.
func (m Model) String() string {
	switch m {
	case Trailing:
		return "trailing-window"
	case FixedWindow:
		return "fixed-window"
	case TokenBucket:
		return "token-bucket"
	case LimitReq:
		return "limit_req"
	case Concurrency:
		return "concurrency"
	}
	return fmt.Sprintf("Model(%d)", int(m))
}

// Limit is one of a partner's limits as its documentation states it and as
// it counts it. Build one with TrailingWindow, Window, Bucket, NginxLimitReq
// or Concurrent; PerRequest makes it count requests instead of a call's cost.
type Limit struct {
	// Name names the shaper's dimension for it ("requests", "tokens",
	// "tokens-per-day"): unique among a partner's limits.
	Name string
	// Model is how the partner counts it.
	Model Model
	// Quota is the units a window admits (Trailing, FixedWindow), the
	// bucket's capacity (TokenBucket), the requests back to back (LimitReq:
	// its burst plus 1), or the requests open at once (Concurrency).
	Quota int64
	// Window is the window's length (Trailing, FixedWindow).
	Window time.Duration
	// Refill is the bucket's refill rate (TokenBucket, LimitReq); its Burst
	// is not used.
	Refill shaper.Rate
	// Requests makes the limit count requests, one per call, whatever the
	// call's cost (a requests-per-minute limit beside a tokens one).
	Requests bool
}

// TrailingWindow is a limit of quota units in any trailing window: OpenAI's
// "90,000 TPM" is TrailingWindow("tokens", 90000, time.Minute).
func TrailingWindow(name string, quota int64, window time.Duration) Limit {
	return Limit{Name: name, Model: Trailing, Quota: quota, Window: window}
}

// Window is a limit of quota units per fixed window, counted from the
// partner's clock or from the first request: GitHub's "5,000 requests per
// hour" is Window("requests", 5000, time.Hour).PerRequest().
func Window(name string, quota int64, window time.Duration) Limit {
	return Limit{Name: name, Model: FixedWindow, Quota: quota, Window: window}
}

// Bucket is a token bucket of capacity units refilled at refill: Anthropic's
// "40,000 input tokens per minute" is Bucket("input-tokens", 40000,
// shaper.PerMinute(40000)). A GCRA with a burst of B at rate R is Bucket(name,
// B, R).
func Bucket(name string, capacity int64, refill shaper.Rate) Limit {
	return Limit{Name: name, Model: TokenBucket, Quota: capacity, Refill: refill}
}

// NginxLimitReq is nginx's limit_req zone with rate and burst ("rate=25r/s"
// with "burst=5" is NginxLimitReq(shaper.PerSecond(25), 5); no burst is 0).
// It counts requests.
func NginxLimitReq(rate shaper.Rate, burst int64) Limit {
	return Limit{Name: "requests", Model: LimitReq, Quota: burst + 1, Refill: rate, Requests: true}
}

// Concurrent is a limit of n requests open at once.
func Concurrent(name string, n int64) Limit {
	return Limit{Name: name, Model: Concurrency, Quota: n, Requests: true}
}

// PerRequest returns l counting requests, one per call, instead of a
// call's cost.
func (l Limit) PerRequest() Limit {
	l.Requests = true
	return l
}

// Named returns l with its dimension named name.
func (l Limit) Named(name string) Limit {
	l.Name = name
	return l
}

// ErrInvalidLimit is matched by every *LimitError.
var ErrInvalidLimit = errors.New("throttlekit/partner: invalid limit")

// LimitError is a limit that cannot be declared: a field out of range, or
// one the shaper could not keep under the lateness assumed.
type LimitError struct {
	Limit  Limit
	Field  string
	Reason string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("throttlekit/partner: limit %q (%v): %s %s", e.Limit.Name, e.Limit.Model, e.Field, e.Reason)
}

// Is matches ErrInvalidLimit and shaper.ErrInvalidConfig.
func (e *LimitError) Is(target error) bool {
	return target == ErrInvalidLimit || target == shaper.ErrInvalidConfig
}

// nginxTick is the granularity of nginx's clock: it measures spacing in
// whole milliseconds, so two arrivals may look up to a millisecond closer.
const nginxTick = time.Millisecond

// dimension derives the shaper dimension that keeps l's partner from
// refusing any call that arrives within spread after its slot.
func (l Limit) dimension(spread time.Duration) (shaper.Dimension, error) {
	fail := func(field, reason string) (shaper.Dimension, error) {
		return shaper.Dimension{}, &LimitError{Limit: l, Field: field, Reason: reason}
	}
	if l.Name == "" {
		return fail("Name", "must not be empty")
	}
	if l.Quota < 1 {
		return fail("Quota", fmt.Sprintf("%d: must be >= 1", l.Quota))
	}
	d := shaper.Dimension{Name: l.Name}
	if l.Requests {
		d.Cost = perRequest
	}
	switch l.Model {
	case Trailing, FixedWindow:
		// The arrivals in any window of the partner's left their slots
		// within Window+spread: a trailing window that long, with the
		// partner's quota, never lets more arrive in one of its windows,
		// wherever its windows start and whatever its clock reads.
		if l.Window <= 0 {
			return fail("Window", fmt.Sprintf("%v: must be > 0", l.Window))
		}
		d.Rate = shaper.Rate{Count: l.Quota, Period: l.Window}
		d.Algorithm = shaper.TrailingWithin(spread)
	case TokenBucket:
		if l.Refill.Count < 1 || l.Refill.Period <= 0 {
			return fail("Refill", fmt.Sprintf("%v: must be a rate of at least 1 per period > 0", l.Refill))
		}
		if l.Requests {
			rate, err := bucketSchedule(l.Quota, l.Refill, spread)
			if err != nil {
				return fail("Refill", err.Error())
			}
			d.Rate, d.Algorithm = rate, shaper.LeakyBucket
			break
		}
		// A bucket of a call's cost (tokens, settled when known): the
		// same bucket, less the spread's refill, departures in order, and
		// what a call did not use back in the bucket for the departures
		// granted after its settle, as the partner's bucket takes it back.
		rate, err := bucketSchedule(l.Quota, l.Refill, spread)
		if err != nil {
			return fail("Refill", err.Error())
		}
		if rate.Burst >= 1 {
			d.Rate, d.Algorithm = rate, shaper.CostBucket
			break
		}
		// A bucket that refills all but a unit within the spread: a
		// trailing window of its capacity over the time the refill takes
		// to fill it. Any span of L holds at most ceil(L/that) windows, so
		// at most the capacity plus the refill over L.
		fill := float64(l.Refill.Period) * float64(l.Quota) / float64(l.Refill.Count)
		if fill >= float64(100*365*24*time.Hour) {
			return fail("Quota", "takes more than a century to refill")
		}
		d.Rate = shaper.Rate{Count: l.Quota, Period: time.Duration(math.Ceil(fill))}
		d.Algorithm = shaper.TrailingWithin(spread)
	case LimitReq:
		if l.Refill.Count < 1 || l.Refill.Period <= 0 {
			return fail("Refill", fmt.Sprintf("%v: must be a rate of at least 1 per period > 0", l.Refill))
		}
		if l.Model == LimitReq {
			spread += nginxTick
		}
		rate, err := bucketSchedule(l.Quota, l.Refill, spread)
		if err != nil {
			return fail("Refill", err.Error())
		}
		d.Rate = rate
		d.Algorithm = shaper.LeakyBucket
	case Concurrency:
		d.Cost = nil
		d.InFlight = l.Quota
	default:
		return fail("Model", "is not one of Trailing, FixedWindow, TokenBucket, LimitReq or Concurrency")
	}
	return d, nil
}

// perRequest is the cost of a requests limit: one per call.
func perRequest(int64) int64 { return 1 }

// bucketSchedule returns the slots' contract for a bucket of capacity units
// refilled at refill, whose arrivals come up to spread after their slots.
// Slots of a GCRA at the refill rate with a burst of B arrive, over any
// span, with at most B plus the refill over that span and spread: so B is
// the capacity less what spread refills, and the rate is the partner's
// whole rate. When that leaves less than one unit (a bucket of one, as
// nginx without burst), consecutive slots are spaced so that the later
// cannot arrive before the bucket holds a unit again: (2-capacity) refill
// intervals plus spread.
func bucketSchedule(capacity int64, refill shaper.Rate, spread time.Duration) (shaper.Rate, error) {
	interval := float64(refill.Period) / float64(refill.Count) // ns per unit
	during := float64(spread) / interval                       // units refilled during spread
	if b := math.Floor(float64(capacity) - during); b >= 1 {
		return shaper.Rate{Count: refill.Count, Period: refill.Period, Burst: int64(b)}, nil
	}
	gap := math.Ceil((2-float64(capacity))*interval + float64(spread))
	if gap >= math.MaxInt64 {
		return shaper.Rate{}, errors.New("the spacing is out of range")
	}
	return shaper.Rate{Count: 1, Period: time.Duration(gap)}, nil
}
