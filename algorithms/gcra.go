package algorithms

import (
	"fmt"
	"math/big"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/gcra"
)

// GCRA is the generic cell rate algorithm and its waiting form, the leaky
// bucket shaper. Both keep one number per key, the theoretical arrival time
// (TAT) of the next unit. With interval T = Period/Count (in ms, rounded up
// to a whole 2^-12 ms, the float64 step of present-day instants) and
// tolerance tau = T*Burst, a request of cost c at now computes, relative to
// now,
//
//	ahead = max(stored - now, 0)
//	delay = max(0, (ahead + T*c) - tau)
//	next  = now + (max(ahead, delay - max(0, T*c - tau)) + T*c)
//
// GCRA ([NewGCRA]) admits only when delay is 0. The leaky bucket shaper
// ([NewLeakyBucket]) admits when delay <= MaxQueue and tells the caller to
// depart after delay; beyond MaxQueue it refuses and writes nothing. Admitted
// requests store next. Near the present every figure is a whole number of
// steps and computed exactly; elsewhere the stored TAT is rounded up, never
// to nearest. No slot is ever early because of rounding (see [MinInterval]
// for what that costs a backlogged key).
//
// The decision is made on delays, not on absolute instants, so that on a cold
// key (ahead = 0) the delay is T*c - tau at every now. That makes
// admissibility one exact rule, the same in Go and Lua and independent of the
// clock: a cost c is admissible when c >= 1 and T*c - tau <= MaxQueue (0 for
// GCRA), computed in float64 exactly so. An admissible cost is admitted on a
// cold key, always; an inadmissible one never is (see [GCRA.ValidateCost]).
//
// Over any window of length W the admitted cost is at most W/T + Burst when
// every cost is at most Burst. The shaper also accepts costs above Burst (up to
// what MaxQueue allows): such a request waits until the bucket has drained
// enough to hold it and then departs as one unit of c, so the bound becomes
// W/T + max(Burst, c).
//
// The transition is package internal/gcra's, which the stores call too.
//
// State layout: [tat].
type GCRA struct {
	name    string
	k       gcra.Kernel
	maxCost int64 // the largest admissible cost
}

// NewGCRA returns the deny-mode GCRA for r.
func NewGCRA(r Rate) (*GCRA, error) { return newGCRA("gcra", r, 0) }

// NewLeakyBucket returns the leaky bucket shaper for r: requests are delayed
// rather than refused, up to maxQueue. maxQueue 0 makes it identical to GCRA.
func NewLeakyBucket(r Rate, maxQueue time.Duration) (*GCRA, error) {
	if maxQueue < 0 {
		return nil, &ConfigError{"leaky-bucket", "MaxQueue", maxQueue, "must be >= 0"}
	}
	return newGCRA("leaky-bucket", r, maxQueue)
}

func newGCRA(name string, r Rate, maxQueue time.Duration) (*GCRA, error) {
	if _, err := validateRate(name, r.Count, r.Period); err != nil {
		return nil, err
	}
	b, err := validateBurst(name, r.Burst)
	if err != nil {
		return nil, err
	}
	t := intervalUp(r.Count, r.Period) // the interval, validated, rounded up to a whole tatStep
	g := &GCRA{name: name, k: gcra.Kernel{Interval: t, Tau: float64(t * b), MaxWait: DurationMillis(maxQueue)}}
	g.maxCost = largest(g.k.Admissible)
	return g, nil
}

// tatStep is the float64 step of instants from late 2004 to 2039, 2^-12 ms
// (about 0.24 µs): every present-day instant is a multiple of it.
const tatStep = 1.0 / 4096

// intervalUp returns the interval the GCRA family runs at: the smallest
// multiple of tatStep at or above the exact quotient Period/Count. On a
// present-day key every TAT, tolerance, sum and delay is then a multiple of
// tatStep below 2^53 steps, so the kernel computes them exactly (a burst is
// whole, a backlog keeps its pace); and the interval is never below the
// contract's, so no slot is early. A key that is not backlogged loses
// nothing; a backlogged one runs slower than Count per Period by less than
// one tatStep per unit (see [MinInterval]). It runs once per configuration.
func intervalUp(count float64, period time.Duration) float64 {
	q := new(big.Rat).SetFrac64(int64(period), 1e6)
	q.Quo(q, new(big.Rat).SetFloat64(count))
	q.Mul(q, big.NewRat(4096, 1))
	n, rem := new(big.Int).QuoRem(q.Num(), q.Denom(), new(big.Int))
	if rem.Sign() > 0 {
		n.Add(n, big.NewInt(1))
	}
	f, _ := new(big.Float).SetInt(n).Float64() // exact: MaxInterval is below 2^52 steps
	return f * tatStep
}

// Name returns "gcra" or "leaky-bucket".
func (g *GCRA) Name() string { return g.name }

// Interval returns T, the emission interval in milliseconds.
func (g *GCRA) Interval() float64 { return g.k.Interval }

// MaxWait returns MaxQueue in milliseconds (0 for GCRA).
func (g *GCRA) MaxWait() float64 { return g.k.MaxWait }

// ValidateCost refuses costs below 1 and costs that could never be admitted:
// those whose delay on a cold key, T*c - tau, exceeds MaxQueue (for GCRA,
// whose MaxQueue is 0: costs above Burst).
func (g *GCRA) ValidateCost(cost int64) error {
	if g.k.Admissible(cost) {
		return nil // the common case, without building an error message
	}
	what := "the burst"
	if g.k.MaxWait > 0 {
		what = fmt.Sprintf("the most that fits in MaxQueue %v", roundDuration(g.k.MaxWait))
	}
	return checkCost(g.name, cost, float64(g.maxCost), what)
}

func tatOf(st State) float64 {
	if len(st) > 0 {
		return st[0]
	}
	return gcra.Cold
}

// Delay returns the time until the request conforms.
func (g *GCRA) Delay(st State, now float64, cost int64) float64 {
	return g.k.Delay(tatOf(st), now, cost)
}

// Commit stores the new TAT.
func (g *GCRA) Commit(st State, now, delay float64, cost int64) State {
	return set1(st, g.k.Commit(tatOf(st), now, delay, cost))
}

// Params returns "g": interval, tolerance, MaxWait.
func (g *GCRA) Params() (string, [6]float64) {
	return "g", [6]float64{g.k.Interval, g.k.Tau, g.k.MaxWait}
}

// Status returns the units admissible at once and the time until the TAT passes.
func (g *GCRA) Status(st State, now float64) (remaining, resetAfter float64) {
	return g.k.Status(tatOf(st), now)
}

// Cancel refunds a reservation of cost whose commit stored tat, if and only if
// the key's schedule still ends with it (the stored TAT equals tat): no later
// reservation depends on its slot. It reports whether it refunded.
func (g *GCRA) Cancel(st State, tat float64, cost int64) (State, bool) {
	if len(st) == 0 {
		return st, false
	}
	var ok bool
	st[0], ok = g.k.Cancel(st[0], tat, cost)
	return st, ok
}

// set1 stores a one-number state, reusing st's array when it has one.
func set1(st State, v float64) State {
	if len(st) == 0 {
		return append(st, v)
	}
	st[0] = v
	return st[:1]
}
