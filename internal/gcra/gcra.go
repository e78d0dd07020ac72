// Package gcra is the one Go implementation of GCRA's transition, and of its
// waiting form, the leaky-bucket shaper, on a key's bare TAT (theoretical
// arrival time). algorithms.GCRA (on a State), the memory store's hot path
// (on a slab of TATs) and the Redis store (recomputing what reserve_gcra.lua
// decided) all call it; the Lua scripts are its only other form, checked
// against it step by step by the conformance test.
//
// With interval T = Period/Count and tolerance tau = T*Burst, a request of
// cost c at now computes, relative to now,
//
//	ahead = max(tat - now, 0)
//	delay = max(0, (ahead + T*c) - tau)
//	next  = now + (max(ahead, delay - max(0, T*c - tau)) + T*c)
//
// and is admitted when delay <= MaxWait (0 for GCRA). Times are float64
// milliseconds; every product is rounded on its own (float64()) so that no
// fused multiply-add makes Go differ from the Lua VM.
//
// Every TAT the kernel stores (next, Cancel, SettleTail) is rounded up, never
// to nearest: it is at or above the exact value of the expression it stands
// for, computed from the same float64 operands, and at most one float64 step
// above it (see sumUp: the smallest such float64 whenever the span added is
// below half the instant, as for every TAT of today). A stored slot is
// therefore never early because of rounding. package algorithms makes T a
// whole multiple of 2^-12 ms, the step of instants from 2004 to 2039, so that
// on a present-day key every figure is exact and the rounding never fires;
// it is the safety net for other magnitudes. The delay a decision returns is
// (ahead + T*c) - tau rounded to nearest (the Lua scripts compute it so),
// exact whenever its operands are whole steps below 2^53 of them (70 years),
// and a departure converted with algorithms.Duration rounds it up to the
// nanosecond.
package gcra

import "math"

// Cold is the TAT of a cold key: below every now, so the key behaves as if
// it had no state.
var Cold = math.Inf(-1)

// MaxExactCost is the largest cost whose float64 conversion is exact (2^53).
const MaxExactCost = 1 << 53

// Kernel is one configuration: T, tau and MaxWait, in milliseconds.
type Kernel struct {
	Interval float64 // T
	Tau      float64 // T*Burst
	MaxWait  float64 // MaxQueue; 0 for GCRA
}

// FromParams returns the kernel of an algorithm of kind "g" from its
// parameters (algorithms.Algorithm.Params): interval, tau, max wait.
func FromParams(p [6]float64) *Kernel { return &Kernel{Interval: p[0], Tau: p[1], MaxWait: p[2]} }

// Admissible is the exact admissibility rule: the delay of cost on a cold
// key, T*c - tau, fits in MaxWait. It is the very expression the transition
// evaluates on a cold key ((0 + T*c) - tau), so the two cannot disagree.
func (k *Kernel) Admissible(cost int64) bool {
	return cost >= 1 && cost <= MaxExactCost && float64(k.Interval*float64(cost))-k.Tau <= k.MaxWait
}

// ahead returns how far tat lies after now (0 when it has passed).
func ahead(tat, now float64) float64 {
	if tat > now {
		return tat - now
	}
	return 0
}

// delay is the transition's delay for a key ahead ms behind and tc = T*c.
func (k *Kernel) delay(ahead, tc float64) float64 {
	if w := (ahead + tc) - k.Tau; w > 0 {
		return w
	}
	return 0
}

// next is the TAT to store for a request departing delay ms after now. When
// the request departs later than it needed to (another dimension binds, or a
// pause), the TAT is computed as if it had arrived as late as possible while
// still departing then, so that departures stay at least T*c apart on this
// key as well.
func (k *Kernel) next(ahead, now, delay, tc float64) float64 {
	excess := tc - k.Tau
	if excess < 0 {
		excess = 0
	}
	base := ahead
	if v := delay - excess; v > base {
		base = v
	}
	return sumUp(now, base, tc)
}

// twoSum returns a + b rounded to nearest and the rounding error: s + e is
// exactly a + b (Knuth's TwoSum, six additions, no product: no fused
// multiply-add can change it, and the Lua VM computes it identically).
func twoSum(a, b float64) (s, e float64) {
	s = a + b
	bb := s - a
	e = (a - (s - bb)) + (b - bb)
	return s, e
}

// up returns the next float64 above x (lib.lua's gcra_up: for a normal x,
// x + 2^(e-53) with x = m*2^e, 0.5 <= |m| < 1, one binade lower when x is a
// negative power of two).
func up(x float64) float64 { return math.Nextafter(x, math.Inf(1)) }

// sumUp returns now + (base + tc) rounded up: at or above the exact sum of
// the three float64 operands and at most one step above it, for now >= 0
// (every clock reading) and base, tc >= 0. The two additions are rounded to
// nearest and their errors, exact by twoSum, are added (their float sum has
// the sign of their exact sum): when it is positive the nearest sum lost
// something, and the next float64 above it is at or above the exact sum,
// since the two errors together are at most one step there. When base + tc
// is below half of now (every TAT of today: spans of up to decades) the
// result is the smallest float64 at or above the exact sum. It is the
// rounded-to-nearest sum whenever that is exact (every sum of whole or
// dyadic milliseconds), so it changes nothing there. lib.lua's gcra_sum_up
// and the next_tat line of reserve_gcra.lua compute the very same
// operations.
func sumUp(now, base, tc float64) float64 {
	y, e := twoSum(base, tc)
	r, err := twoSum(now, y)
	if err+e > 0 {
		r = up(r)
	}
	return r
}

// diffUp returns a - b rounded up (the smallest float64 at or above the
// exact difference).
func diffUp(a, b float64) float64 {
	r, err := twoSum(a, -b)
	if err > 0 {
		r = up(r)
	}
	return r
}

// Delay returns how long after now a request of cost first conforms.
func (k *Kernel) Delay(tat, now float64, cost int64) float64 {
	return k.delay(ahead(tat, now), float64(k.Interval*float64(cost)))
}

// Commit returns the TAT to store for a request of cost admitted at now
// that departs delay ms later.
func (k *Kernel) Commit(tat, now, delay float64, cost int64) float64 {
	return k.next(ahead(tat, now), now, delay, float64(k.Interval*float64(cost)))
}

// Reserve is the whole transition for an admissible cost (see Admissible)
// at a finite now, on a key nobody may leave before notBefore (a floor at or
// before now changes nothing). Admitted, it returns the TAT to store and
// the delay; refused, tat unchanged and how far the wait passes MaxWait.
func (k *Kernel) Reserve(tat, now, notBefore float64, cost int64) (next, wait float64, allowed bool) {
	a := ahead(tat, now)
	tc := float64(k.Interval * float64(cost))
	wait = k.delay(a, tc)
	if floor := notBefore - now; floor > wait {
		wait = floor
	}
	if wait > k.MaxWait {
		return tat, wait - k.MaxWait, false
	}
	return k.next(a, now, wait, tc), wait, true
}

// Units floors a remaining-capacity figure to whole units, never below 0
// nor above 2^53 (the largest exact cost).
func Units(x float64) int64 {
	switch {
	case !(x > 0):
		return 0
	case x >= 1<<53:
		return 1 << 53
	}
	return int64(math.Floor(x))
}

// Remaining is Status's remaining figure in whole units.
func (k *Kernel) Remaining(tat, now float64) int64 {
	rem, _ := k.Status(tat, now)
	return Units(rem)
}

// Status returns the units admissible at once and the time until tat passes.
func (k *Kernel) Status(tat, now float64) (remaining, resetAfter float64) {
	if tat < now {
		tat = now
	}
	return ((now + k.Tau) - tat) / k.Interval, tat - now
}

// Cancel refunds a reservation of cost whose commit stored tat, if and only
// if the key's schedule still ends with it (stored == tat): no later
// reservation depends on its slot. It returns the TAT to store, tat - T*c
// rounded up, and whether it refunded.
func (k *Kernel) Cancel(stored, tat float64, cost int64) (float64, bool) {
	if stored != tat {
		return stored, false
	}
	return diffUp(tat, float64(k.Interval*float64(cost))), true
}

// SettleTail applies the actual cost of the reservation at the tail of a
// key's schedule (the caller checked: its commit stored tat, and nothing
// was granted since), which departs at t: with less, the TAT it stored
// comes back down as far as its own term allows, max(tat - T*(cost -
// actual), t + min(T*actual, tau)), all the way for actual 0; with more, it
// grows by the extra. Both terms are rounded up (T*cost below the TAT, as
// for any instant of today): tat - (tc - ta) from the exact difference of
// the float64 operands, t + min(ta, tau) as sumUp. (settle.lua's tail
// branch computes them rounded to nearest.)
func (k *Kernel) SettleTail(tat, t float64, cost, actual int64) float64 {
	tc, ta := float64(k.Interval*float64(cost)), float64(k.Interval*float64(actual))
	if actual == 0 {
		return diffUp(tat, tc)
	}
	d, e := twoSum(tc, -ta) // d + e = tc - ta exactly
	r, err := twoSum(tat, -d)
	if err-e > 0 { // tat - (tc - ta) = r + err - e
		r = up(r)
	}
	return math.Max(r, sumUp(t, 0, math.Min(ta, k.Tau)))
}
