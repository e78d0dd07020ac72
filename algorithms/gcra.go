package algorithms

import (
	"fmt"
	"math"
	"time"
)

// GCRA is the generic cell rate algorithm and its waiting form, the leaky
// bucket shaper. Both keep one number per key, the theoretical arrival time
// (TAT) of the next unit. With interval T = Period/Count and tolerance
// tau = T*Burst, a request of cost c at now computes
//
//	tat     = max(stored, now)
//	next    = tat + T*c
//	allowAt = next - tau
//	delay   = max(0, allowAt - now)
//
// GCRA ([NewGCRA]) admits only when delay is 0. The leaky bucket shaper
// ([NewLeakyBucket]) admits when delay <= MaxQueue and tells the caller to
// depart after delay; beyond MaxQueue it refuses and writes nothing. Admitted
// requests store next.
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
	maxCost  float64
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
	g.maxCost = b
	if g.maxWait > 0 {
		// The largest c whose delay on a cold key, T*c - tau, fits in MaxQueue.
		g.maxCost = (g.maxWait + g.tau) / t
	}
	return g, nil
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
// above Burst for GCRA, or whose delay on a cold key would exceed MaxQueue for
// the shaper.
func (g *GCRA) ValidateCost(cost int64) error {
	if cost >= 1 && float64(cost) <= g.maxCost {
		return nil // the common case, without building an error message
	}
	what := "the burst"
	if g.maxWait > 0 {
		what = fmt.Sprintf("the most that fits in MaxQueue %v", Duration(g.maxWait))
	}
	return checkCost(g.name, cost, g.maxCost, what)
}

// Earliest returns allowAt, or now if that has passed.
func (g *GCRA) Earliest(st State, now float64, cost int64) float64 {
	tat := now
	if len(st) > 0 && st[0] > now {
		tat = st[0]
	}
	allowAt := (tat + float64(g.interval*float64(cost))) - g.tau
	if allowAt < now {
		return now
	}
	return allowAt
}

// Commit stores the new TAT. When the request departs later than it needed to
// (at > Earliest, because another dimension of a multi-dimension limit binds),
// the TAT is computed as if the request had arrived as late as possible while
// still departing at at, so that departures stay at least T*c apart on this
// key as well.
func (g *GCRA) Commit(st State, now, at float64, cost int64) State {
	tc := float64(g.interval * float64(cost))
	base := now
	if len(st) > 0 && st[0] > base {
		base = st[0]
	}
	excess := tc - g.tau
	if excess < 0 {
		excess = 0
	}
	if v := at - excess; v > base {
		base = v
	}
	return set1(st, base+tc)
}

// Params returns "g": interval, tolerance, MaxWait.
func (g *GCRA) Params() (string, [6]float64) { return "g", [6]float64{g.interval, g.tau, g.maxWait} }

// Status returns the units admissible at once and the time until the TAT passes.
func (g *GCRA) Status(st State, now float64) (remaining, resetAfter float64) {
	tat := now
	if len(st) > 0 && st[0] > now {
		tat = st[0]
	}
	return ((now + g.tau) - tat) / g.interval, tat - now
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
	if cost < 1 || float64(cost) > g.maxCost {
		*dec = Decision{}
		return tat, g.ValidateCost(cost)
	}
	if !finite(now) || !finite(notBefore) {
		*dec = Decision{}
		return tat, ErrInvalidTime
	}
	from := now // max(stored, now), as Earliest and Commit compute it
	if tat > now {
		from = tat
	}
	tc := float64(g.interval * float64(cost))
	at := (from + tc) - g.tau
	if at < now {
		at = now
	}
	if notBefore > at {
		at = notBefore
	}
	wait := at - now
	if wait > g.maxWait {
		rem, reset := g.StatusTAT(tat, now)
		*dec = MakeDecision(false, wait-g.maxWait, rem, reset)
		return tat, nil
	}
	excess := tc - g.tau
	if excess < 0 {
		excess = 0
	}
	base := from
	if v := at - excess; v > base {
		base = v
	}
	next := base + tc
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
