package algorithms

import (
	"math"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/gcra"
)

// State is the per-key state of an algorithm: a short vector of float64. A nil
// or empty State is a cold key (never seen, or idle long enough to be
// forgotten). Each algorithm documents its layout; the Redis scripts store the
// same numbers, so Go and Lua states can be compared bit for bit.
//
// Transitions may reuse the backing array of the State they are given.
type State []float64

// Decision is the outcome of one transition.
type Decision struct {
	// Allowed reports whether the request was admitted (and the state updated).
	Allowed bool
	// Delay is how long an admitted request must wait before it departs. It is
	// zero for algorithms that do not queue (every algorithm but the leaky
	// bucket shaper) and zero whenever Allowed is false.
	Delay time.Duration
	// Remaining is how many cost units could still be admitted right now
	// without waiting, after this decision.
	Remaining int64
	// RetryAfter is zero when Allowed. When refused, it is how long until the
	// same request would be admitted, assuming nobody else consumes meanwhile.
	RetryAfter time.Duration
	// ResetAfter is how long until the key's state is equivalent to a cold key.
	ResetAfter time.Duration

	raw [3]float64 // wait-or-retry (ms), remaining, reset (ms), before rounding
}

// Wait returns an admitted request's delay in milliseconds, unrounded: the
// departure its transition committed is now+Wait() exactly. It is 0 when
// the request was refused.
func (d Decision) Wait() float64 {
	if !d.Allowed {
		return 0
	}
	return d.raw[0]
}

// Algorithm is the transition every rate-limiting algorithm implements, split
// into a read-only evaluation and a commit so that several algorithms can be
// combined atomically (see [All]). Times are float64 milliseconds since the
// Unix epoch (see [Millis]); durations are float64 milliseconds.
//
// Implementations are immutable after construction and safe for concurrent
// use; they never read a clock, start a goroutine or allocate, except that
// Commit may grow a State (a cold key, or the sliding-window log).
type Algorithm interface {
	// Name identifies the algorithm, e.g. "gcra".
	Name() string
	// ValidateCost reports, with a *CostError, a cost that can never be admitted.
	ValidateCost(cost int64) error
	// MaxWait is the longest delay, in milliseconds, that the algorithm grants
	// instead of refusing. It is zero for every algorithm except the leaky
	// bucket shaper.
	MaxWait() float64
	// Delay returns how long after now, in milliseconds (>= 0), a request of
	// cost first conforms, given st. It does not modify st. Decisions are made
	// on delays relative to now, never on absolute instants, so that a cold
	// key gives the same delay at every now: a cost that ValidateCost accepts
	// is admitted on a cold key, always, and one it refuses never is.
	Delay(st State, now float64, cost int64) float64
	// Commit records a request of cost that was admitted at now and departs
	// delay ms later (0 <= delay <= MaxWait()). It returns the new state,
	// which may share st's backing array.
	Commit(st State, now, delay float64, cost int64) State
	// Status reports, for st at now, how many units could be admitted at once
	// and after how many milliseconds st becomes equivalent to a cold key.
	Status(st State, now float64) (remaining, resetAfter float64)
	// Params describes the algorithm for its Lua form: a one-letter kind and
	// up to six numbers (see package lua).
	Params() (kind string, p [6]float64)
}

// makeDecision builds a Decision from the raw figures of a transition:
// wait (admitted) or retry (refused) in milliseconds, remaining units and
// reset in milliseconds.
func makeDecision(allowed bool, wait, remaining, reset float64) Decision {
	raw := [3]float64{wait, remaining, reset}
	if allowed {
		return Decision{Allowed: true, Delay: Duration(wait), Remaining: units(remaining), ResetAfter: Duration(reset), raw: raw}
	}
	return Decision{RetryAfter: Duration(wait), Remaining: units(remaining), ResetAfter: Duration(reset), raw: raw}
}

// Reserve runs one transition of a: it validates cost, finds the earliest
// instant the request conforms and, if that is no more than a.MaxWait() away,
// commits it. A refused request returns st unchanged: a denial never consumes.
func Reserve(a Algorithm, st State, now float64, cost int64) (State, Decision, error) {
	return ReserveNotBefore(a, st, now, now, cost)
}

// ReserveNotBefore is [Reserve] for a key that nobody may leave before
// notBefore (a paused key): the request departs at the later of its earliest
// conforming instant and notBefore, and is refused if that is more than
// a.MaxWait() away. A notBefore at or before now changes nothing.
func ReserveNotBefore(a Algorithm, st State, now, notBefore float64, cost int64) (State, Decision, error) {
	if err := a.ValidateCost(cost); err != nil {
		return st, Decision{}, err
	}
	if !finite(now) || !finite(notBefore) {
		return st, Decision{}, ErrInvalidTime
	}
	wait := a.Delay(st, now, cost)
	if floor := notBefore - now; floor > wait {
		wait = floor
	}
	if maxWait := a.MaxWait(); wait > maxWait {
		rem, reset := a.Status(st, now)
		return st, makeDecision(false, wait-maxWait, rem, reset), nil
	}
	st = a.Commit(st, now, wait, cost)
	rem, reset := a.Status(st, now)
	return st, makeDecision(true, wait, rem, reset), nil
}

// Millis converts t to float64 milliseconds since the Unix epoch, the time
// unit of every transition. It is computed as seconds*1000 + nanoseconds/1e6,
// the same operations the Lua scripts apply to Redis TIME, and is exact to
// about a quarter of a microsecond for present-day dates.
func Millis(t time.Time) float64 {
	return float64(float64(t.Unix())*1000) + float64(t.Nanosecond())/1e6
}

// Time converts float64 milliseconds since the Unix epoch back to a time.Time
// (UTC), rounded to the nearest nanosecond.
func Time(ms float64) time.Time {
	sec := math.Floor(ms / 1000)
	nsec := math.Round((ms - float64(sec*1000)) * 1e6)
	return time.Unix(int64(sec), int64(nsec)).UTC()
}

// Duration converts float64 milliseconds to a time.Duration rounded up to
// the nanosecond: the smallest whole number of nanoseconds at or above the
// exact value of ms, so that a delay (a departure, a retry-after) converted
// with it never ends before the instant it stands for. Negative and NaN
// inputs give 0; values beyond the range of time.Duration saturate at its
// maximum.
func Duration(ms float64) time.Duration {
	if !(ms > 0) {
		return 0
	}
	p := ms * 1e6
	ns := math.Ceil(p)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	d := time.Duration(ns)
	if ns == p {
		// The product is a whole number, but it may have been rounded onto
		// it (by up to half its ulp, more than 1 ns beyond 2^53 ns, 104
		// days): ms*1e6 - p, exact by an FMA, says by how much, and its
		// ceiling corrects d to the ceiling of the exact value. A product
		// with a fraction is within half an ulp of the exact value, which
		// cannot reach the next whole number.
		inc := time.Duration(math.Ceil(math.FMA(ms, 1e6, -p)))
		if inc > 0 && d > math.MaxInt64-inc {
			return math.MaxInt64
		}
		d += inc
	}
	return d
}

// roundDuration converts float64 milliseconds that stand for a configured
// duration (DurationMillis of one) back to it, rounded to the nearest
// nanosecond, so that the round trip gives the duration back exactly.
func roundDuration(ms float64) time.Duration {
	if !(ms > 0) {
		return 0
	}
	ns := math.Round(ms * 1e6)
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// DurationMillis converts a time.Duration to float64 milliseconds.
func DurationMillis(d time.Duration) float64 { return float64(d) / 1e6 }

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// units floors a remaining-capacity figure to whole units, never below zero.
func units(x float64) int64 { return gcra.Units(x) }
