package algorithms

import (
	"fmt"
	"math"
	"time"
)

// GCRA is the generic cell rate algorithm and its waiting form, the leaky
// bucket shaper. Both keep one number per key, the theoretical arrival time
// (TAT) of the next unit. With interval T = Period/Count and tolerance
// tau = T*Burst, a request of cost c at now computes, relative to now,
//
//	ahead = max(stored - now, 0)
//	delay = max(0, (ahead + T*c) - tau)
//	next  = now + (max(ahead, delay - max(0, T*c - tau)) + T*c)
//
// GCRA ([NewGCRA]) admits only when delay is 0. The leaky bucket shaper
// ([NewLeakyBucket]) admits when delay <= MaxQueue and tells the caller to
// depart after delay; beyond MaxQueue it refuses and writes nothing. Admitted
// requests store next.
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
// State layout: [tat].
type GCRA struct {
	name     string
	interval float64 // T, ms per unit
	tau      float64 // T*Burst, ms
	maxWait  float64 // ms; 0 for GCRA
	maxCost  int64   // the largest admissible cost (see admissible)
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
	t, err := validateRate(name, r.Count, r.Period)
	if err != nil {
		return nil, err
	}
	b, err := validateBurst(name, r.Burst)
	if err != nil {
		return nil, err
	}
	g := &GCRA{name: name, interval: t, tau: float64(t * b), maxWait: DurationMillis(maxQueue)}
	g.maxCost = largest(g.admissible)
	return g, nil
}

// admissible is the exact admissibility rule: the delay of cost on a cold
// key, T*c - tau, fits in MaxWait. It is the very expression the transition
// evaluates on a cold key ((0 + T*c) - tau), so the two cannot disagree.
func (g *GCRA) admissible(cost int64) bool {
	return cost >= 1 && cost <= maxExactCost && float64(g.interval*float64(cost))-g.tau <= g.maxWait
}

// Name returns "gcra" or "leaky-bucket".
func (g *GCRA) Name() string { return g.name }

// Interval returns T, the emission interval in milliseconds.
func (g *GCRA) Interval() float64 { return g.interval }

// Tolerance returns tau = T*Burst in milliseconds.
func (g *GCRA) Tolerance() float64 { return g.tau }

// MaxWait returns MaxQueue in milliseconds (0 for GCRA).
func (g *GCRA) MaxWait() float64 { return g.maxWait }

// ValidateCost refuses costs below 1 and costs that could never be admitted:
// those whose delay on a cold key, T*c - tau, exceeds MaxQueue (for GCRA,
// whose MaxQueue is 0: costs above Burst).
func (g *GCRA) ValidateCost(cost int64) error {
	if g.admissible(cost) {
		return nil // the common case, without building an error message
	}
	what := "the burst"
	if g.maxWait > 0 {
		what = fmt.Sprintf("the most that fits in MaxQueue %v", Duration(g.maxWait))
	}
	return checkCost(g.name, cost, float64(g.maxCost), what)
}

// ahead returns how far the TAT lies after now (0 when it has passed).
func ahead(tat, now float64) float64 {
	if tat > now {
		return tat - now
	}
	return 0
}

// delay is the transition's delay for a key ahead ms behind and tc = T*c.
func (g *GCRA) delay(ahead, tc float64) float64 {
	if w := (ahead + tc) - g.tau; w > 0 {
		return w
	}
	return 0
}

// next is the TAT to store for a request departing delay ms after now. When
// the request departs later than it needed to (another dimension of a
// multi-dimension limit binds, or a pause), the TAT is computed as if it had
// arrived as late as possible while still departing then, so that departures
// stay at least T*c apart on this key as well.
func (g *GCRA) next(ahead, now, delay, tc float64) float64 {
	excess := tc - g.tau
	if excess < 0 {
		excess = 0
	}
	base := ahead
	if v := delay - excess; v > base {
		base = v
	}
	return now + (base + tc)
}

func tatOf(st State) float64 {
	if len(st) > 0 {
		return st[0]
	}
	return ColdTAT
}

// Delay returns the time until the request conforms.
func (g *GCRA) Delay(st State, now float64, cost int64) float64 {
	return g.delay(ahead(tatOf(st), now), float64(g.interval*float64(cost)))
}

// Commit stores the new TAT (see next).
func (g *GCRA) Commit(st State, now, delay float64, cost int64) State {
	return set1(st, g.next(ahead(tatOf(st), now), now, delay, float64(g.interval*float64(cost))))
}

// Params returns "g": interval, tolerance, MaxWait.
func (g *GCRA) Params() (string, [6]float64) { return "g", [6]float64{g.interval, g.tau, g.maxWait} }

// Status returns the units admissible at once and the time until the TAT passes.
func (g *GCRA) Status(st State, now float64) (remaining, resetAfter float64) {
	return g.StatusTAT(tatOf(st), now)
}

// Cancel refunds a reservation of cost whose commit stored tat, if and only if
// the key's schedule still ends with it (the stored TAT equals tat): no later
// reservation depends on its slot. It reports whether it refunded.
func (g *GCRA) Cancel(st State, tat float64, cost int64) (State, bool) {
	if len(st) == 0 || st[0] != tat {
		return st, false
	}
	st[0] = tat - float64(g.interval*float64(cost))
	return st, true
}

// set1 stores a one-number state, reusing st's array when it has one.
func set1(st State, v float64) State {
	if len(st) == 0 {
		return append(st, v)
	}
	st[0] = v
	return st[:1]
}

// The methods below are the transitions of GCRA on a state held as a bare
// TAT, for stores that keep one float64 per key instead of a State. They make
// no interface calls and never allocate; each gives, bit for bit, what its
// State counterpart gives for State{tat}, or for a cold key when tat is
// ColdTAT (property-tested).

// ColdTAT is the bare TAT of a cold key: it is below every now, so the key
// behaves as if it had no state.
var ColdTAT = math.Inf(-1)

// ReserveTAT is [ReserveNotBefore] for g on a bare TAT (ColdTAT for a cold
// key). It writes the decision to *dec (so that a hot path copies it once)
// and returns the TAT to store, which is tat itself when refused.
func (g *GCRA) ReserveTAT(tat, now, notBefore float64, cost int64, dec *Decision) (float64, error) {
	if !g.admissible(cost) {
		*dec = Decision{}
		return tat, g.ValidateCost(cost)
	}
	if !finite(now) || !finite(notBefore) {
		*dec = Decision{}
		return tat, ErrInvalidTime
	}
	a := ahead(tat, now)
	tc := float64(g.interval * float64(cost))
	wait := g.delay(a, tc)
	if floor := notBefore - now; floor > wait {
		wait = floor
	}
	if wait > g.maxWait {
		rem, reset := g.StatusTAT(tat, now)
		*dec = MakeDecision(false, wait-g.maxWait, rem, reset)
		return tat, nil
	}
	next := g.next(a, now, wait, tc)
	rem, reset := g.StatusTAT(next, now)
	dec.Allowed, dec.Delay, dec.Remaining, dec.RetryAfter, dec.ResetAfter = true, Duration(wait), units(rem), 0, Duration(reset)
	dec.raw = [3]float64{wait, rem, reset}
	return next, nil
}

// StatusTAT is [GCRA.Status] on a bare TAT.
func (g *GCRA) StatusTAT(tat, now float64) (remaining, resetAfter float64) {
	if tat < now {
		tat = now
	}
	return ((now + g.tau) - tat) / g.interval, tat - now
}

// CancelTAT is [GCRA.Cancel] on a bare TAT: it returns the refunded TAT and
// true if tat is the stored one, else stored and false.
func (g *GCRA) CancelTAT(stored, tat float64, cost int64) (float64, bool) {
	if stored != tat {
		return stored, false
	}
	return tat - float64(g.interval*float64(cost)), true
}
