package algorithms

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

// These tests hold the float64 math to exact rational arithmetic: no slot of
// the GCRA family is ever before the slot the exact recurrence gives (Period
// and Count taken exactly), a backlogged key falls behind it by at most one
// float64 step of its TAT per request (plus the interval's own rounding), and
// the token bucket decides as exact arithmetic does. Everything runs on the
// float64 instants a clock near 2026 gives (t0), without a clock.

// rat is x as an exact rational.
func rat(x float64) *big.Rat { return new(big.Rat).SetFloat64(x) }

// exactInterval is Period/Count exactly, in ms.
func exactInterval(r Rate) *big.Rat {
	x := new(big.Rat).SetFrac64(int64(r.Period), 1e6)
	return x.Quo(x, rat(r.Count))
}

// stepAbove is the float64 step above x (x > 0): how far a TAT rounded up
// can lie above the exact value.
func stepAbove(x float64) float64 { return math.Nextafter(x, math.Inf(1)) - x }

// exactGCRA is the GCRA recurrence in exact rationals, T = Period/Count and
// tau = T*Burst exactly. It is fed the requests the float64 transition
// admitted, so that both schedule the same requests.
type exactGCRA struct {
	t, tau *big.Rat
	tat    *big.Rat // nil: cold
}

func (x *exactGCRA) reserve(now *big.Rat, cost int64) (wait, next *big.Rat) {
	ahead := new(big.Rat)
	if x.tat != nil && x.tat.Cmp(now) > 0 {
		ahead.Sub(x.tat, now)
	}
	tc := new(big.Rat).Mul(x.t, big.NewRat(cost, 1))
	wait = new(big.Rat).Add(ahead, tc)
	if wait.Sub(wait, x.tau); wait.Sign() < 0 {
		wait.SetInt64(0)
	}
	excess := new(big.Rat).Sub(tc, x.tau)
	if excess.Sign() < 0 {
		excess.SetInt64(0)
	}
	base := new(big.Rat).Sub(wait, excess)
	if base.Cmp(ahead) < 0 {
		base = ahead
	}
	next = new(big.Rat).Add(now, base)
	next.Add(next, tc)
	x.tat = next
	return wait, next
}

// slotCheck runs one key through Reserve and the exact recurrence side by
// side and checks every admitted request's slot.
type slotCheck struct {
	g     *GCRA
	r     Rate
	x     exactGCRA
	st    State
	n     int      // requests admitted
	units int64    // their cost
	late  *big.Rat // the lateness allowed so far: per request, one step at its TAT and T*c's excess
	worst float64  // the largest lateness seen, in steps per unit admitted
}

func newSlotCheck(r Rate, maxQueue time.Duration) (*slotCheck, error) {
	g, err := NewLeakyBucket(r, maxQueue)
	if err != nil {
		return nil, err
	}
	t := exactInterval(r)
	return &slotCheck{g: g, r: r, x: exactGCRA{t: t, tau: new(big.Rat).Mul(t, big.NewRat(r.Burst, 1))}, late: new(big.Rat)}, nil
}

// reserve runs a request of cost at now. It returns whether it was admitted
// and its departure (now + Delay, exactly), or an error for a slot early or
// later than allowed.
func (c *slotCheck) reserve(now float64, cost int64) (bool, *big.Rat, error) {
	for cost > 1 && c.g.ValidateCost(cost) != nil {
		cost--
	}
	next, d, err := Reserve(c.g, c.st, now, cost)
	if err != nil || !d.Allowed {
		return false, nil, err
	}
	c.st = next
	c.n++
	nowR := rat(now)
	waitX, tatX := c.x.reserve(nowR, cost)
	depF := new(big.Rat).Add(nowR, big.NewRat(int64(d.Delay), 1e6))
	depX := new(big.Rat).Add(nowR, waitX)
	tatF := rat(next[0])
	what := func() string {
		return fmt.Sprintf("%v per %v burst %d, request %d (cost %d, now t0%+v ms)", c.r.Count, c.r.Period, c.r.Burst, c.n, cost, now-t0)
	}
	if tatF.Cmp(tatX) < 0 {
		d, _ := new(big.Rat).Sub(tatX, tatF).Float64()
		return true, nil, fmt.Errorf("%s: stored TAT %.17g is %.3g ms below the exact %s", what(), next[0], d, tatX.FloatString(12))
	}
	// The delay is (ahead + T*c) - tau rounded to nearest (the scripts
	// compute it so): where float64's step at tau + MaxQueue is a
	// nanosecond or more (T*Burst + MaxQueue beyond 2^32 ms, 49 days) a
	// departure may precede the exact slot by that rounding; below, never.
	early := new(big.Rat)
	if u := stepAbove(c.g.k.Tau + c.g.k.MaxWait + tc(c.g, cost)); u >= 1e-6 {
		early = rat(2 * u)
	}
	if gap := new(big.Rat).Sub(depX, depF); gap.Cmp(early) > 0 {
		e, _ := gap.Float64()
		return true, nil, fmt.Errorf("%s: departs %.3g ms before the exact slot (delay %v, exact %s ms)", what(), e, d.Delay, waitX.FloatString(12))
	}
	per := rat(stepAbove(next[0]))
	if over := new(big.Rat).Sub(rat(tc(c.g, cost)), new(big.Rat).Mul(c.x.t, big.NewRat(cost, 1))); over.Sign() > 0 {
		per.Add(per, over)
	}
	c.late.Add(c.late, per)
	if gap := new(big.Rat).Sub(tatF, tatX); gap.Cmp(c.late) > 0 {
		return true, nil, fmt.Errorf("%s: stored TAT %s ms after the exact one, more than the %s allowed", what(), gap.FloatString(9), c.late.FloatString(9))
	}
	// The departure: the TAT's lateness, plus the rounding of the delay
	// itself (a few ulps of it, and up to 1 ns by Duration) and of tau.
	lim := new(big.Rat).Add(c.late, big.NewRat(1, 1e6))
	lim.Add(lim, rat(4*stepAbove(max(d.raw[0], 1))))
	tauDiff := new(big.Rat).Sub(rat(c.g.k.Tau), c.x.tau)
	lim.Add(lim, tauDiff.Abs(tauDiff))
	gap := new(big.Rat).Sub(depF, depX)
	if gap.Cmp(lim) > 0 {
		return true, nil, fmt.Errorf("%s: departs %s ms after the exact slot, more than the %s allowed", what(), gap.FloatString(9), lim.FloatString(9))
	}
	c.units += cost
	if g, _ := gap.Float64(); g/float64(c.units)/stepAbove(next[0]) > c.worst {
		c.worst = g / float64(c.units) / stepAbove(next[0])
	}
	return true, depF, nil
}

// tc is T*c as the kernel computes it.
func tc(g *GCRA, cost int64) float64 { return float64(g.k.Interval * float64(cost)) }

// runNeverEarly drives a key of r with n requests of costs up to
// maxCost, arriving as pattern says (0: all at once; 1: faster than the
// rate; 2: faster than the rate with idle gaps).
func runNeverEarly(r Rate, n int, maxCost int64, pattern int, seed uint64) (*slotCheck, error) {
	interval, _ := exactInterval(r).Float64()
	queue := float64(n) * interval * float64(maxCost) * 1.2 * 1e6 // ns
	if queue > math.MaxInt64/2 {
		queue = math.MaxInt64 / 2
	}
	c, err := newSlotCheck(r, time.Duration(queue))
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 15))
	now := t0
	for range n {
		switch pattern {
		case 1:
			now += rng.Float64() * interval * 0.7
		case 2:
			now += rng.Float64() * interval * 0.7
			if rng.IntN(40) == 0 {
				now += interval * float64(r.Burst+maxCost) * (1 + rng.Float64())
			}
		}
		if _, _, err := c.reserve(now, 1+rng.Int64N(maxCost)); err != nil {
			return c, err
		}
	}
	return c, nil
}

// slow reports an interval above 1000 hours: a queue (a time.Duration, at
// most 292 years) holds few of them.
func slow(r Rate) bool {
	t, _ := exactInterval(r).Float64()
	return t > 1000*hour
}

// neverEarlyRates spans the accepted range: MinInterval and MaxInterval,
// odd counts and periods, fractional counts, dyadic and non-dyadic
// intervals.
var neverEarlyRates = []Rate{
	{Count: 100000, Period: time.Second}, // MinInterval
	{Count: 99000, Period: time.Second},  // the rate
	{Count: 10000, Period: time.Second},  //
	{Count: 7, Period: 3 * time.Second},  // 428.571428... ms
	{Count: 7, Period: time.Minute},      // 8571.428... ms
	{Count: 3, Period: time.Second},      // 333.333... ms, rounded up
	{Count: 1, Period: 24 * time.Hour},   // 1/day
	{Count: 1, Period: MaxInterval},      // the slowest accepted
	{Count: 0.7, Period: time.Second},    // a fractional count
	{Count: 13, Period: 7 * time.Millisecond},
	{Count: 1000, Period: time.Hour},
	{Count: 3, Period: 1001 * time.Microsecond},
	{Count: 99999.5, Period: time.Second},
}

// TestGCRASlotsAreNeverEarly is (c): over the accepted range of rates,
// bursts, costs and arrival patterns, a backlogged key's every slot is at or
// after the exact rational slot, and after it by at most one float64 step
// of the TAT per request (plus T*c's own rounding), at most one step per
// unit on average.
func TestGCRASlotsAreNeverEarly(t *testing.T) {
	t.Parallel()
	for i, r := range neverEarlyRates {
		for _, burst := range []int64{1, 3, 50} {
			for pattern := range 3 {
				r.Burst = burst
				n := 400
				if slow(r) { // a queue of at most 292 years
					n = 8
				}
				c, err := runNeverEarly(r, n, burst+2, pattern, uint64(i*100+pattern))
				if err != nil {
					t.Fatal(err)
				}
				if c.n < n/4 {
					t.Fatalf("%v per %v burst %d: only %d of %d admitted: the test does not exercise a backlog", r.Count, r.Period, burst, c.n, n)
				}
				if c.worst > 1 {
					t.Fatalf("%v per %v burst %d: %v steps late per unit", r.Count, r.Period, burst, c.worst)
				}
			}
		}
	}
}

// FuzzGCRASlotsNeverEarly is TestGCRASlotsAreNeverEarly over any rate the
// constructors accept, burst, cost range and arrival pattern.
func FuzzGCRASlotsNeverEarly(f *testing.F) {
	f.Add(uint64(1), uint32(99000), uint32(1000), uint8(1), uint8(1), uint8(0))
	f.Add(uint64(2), uint32(7), uint32(60000), uint8(1), uint8(3), uint8(1))
	f.Add(uint64(3), uint32(7), uint32(3000), uint8(5), uint8(7), uint8(2))
	f.Add(uint64(4), uint32(1), uint32(86400000), uint8(2), uint8(2), uint8(1))
	f.Add(uint64(5), uint32(100000), uint32(1000), uint8(200), uint8(3), uint8(2))
	f.Fuzz(func(t *testing.T, seed uint64, count, periodMS uint32, burst, maxCost, pattern uint8) {
		r := Rate{Count: float64(count), Period: time.Duration(periodMS) * time.Millisecond, Burst: int64(burst)}
		if seed%3 == 0 { // fractional counts too
			r.Count /= 10
		}
		if _, err := NewLeakyBucket(r, time.Second); err != nil {
			return
		}
		n := 200
		if slow(r) {
			n = 8
		}
		if _, err := runNeverEarly(r, n, 1+int64(maxCost%8), int(pattern%3), seed); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGCRAAtHighRatesNeverOverAdmits is (a): at 99,000/s (and at 100,000/s
// and 10,000/s) burst 1, a backlogged key lets at most W*rate + 1 units go
// by W = 100, 200, 300 ms after its first slot, counted exactly; and, as
// MinInterval's doc states, at least W/(T + one step) of them.
func TestGCRAAtHighRatesNeverOverAdmits(t *testing.T) {
	t.Parallel()
	const step = 1.0 / 4096 // ms: the float64 step of instants from 2004 to 2039
	for _, count := range []int64{99000, 100000, 10000} {
		for _, spread := range []bool{false, true} {
			r := Rate{Count: float64(count), Period: time.Second, Burst: 1}
			g := must(NewLeakyBucket(r, time.Second))
			var st State
			now := t0
			var offsets []*big.Rat // each departure, in ms after t0
			for range count * 31 / 100 {
				if spread { // arrivals every 0.3 to 0.7 intervals: always backlogged
					now += (0.3 + 0.4*float64(len(offsets)%5)/4) * 1e3 / float64(count)
				}
				var d Decision
				st, d, _ = Reserve(g, st, now, 1)
				if !d.Allowed {
					t.Fatalf("%d/s: refused after %d", count, len(offsets))
				}
				o := new(big.Rat).Sub(rat(now), rat(t0))
				offsets = append(offsets, o.Add(o, big.NewRat(int64(d.Delay), 1e6)))
			}
			for _, w := range []int64{100, 200, 300} {
				n := int64(0)
				end := new(big.Rat).Add(offsets[0], big.NewRat(w, 1))
				for _, o := range offsets {
					if o.Cmp(end) <= 0 {
						n++
					}
				}
				if most := w * count / 1000; n > most+1 {
					t.Errorf("%d/s (spread %v): %d units within %d ms of the first, the contract allows %d+1", count, spread, n, w, most)
				}
				if least := int64(float64(w) / (1e3/float64(count) + step)); n < least {
					t.Errorf("%d/s (spread %v): %d units within %d ms, fewer than the %d MinInterval's doc promises", count, spread, n, w, least)
				}
				t.Logf("%d/s (spread %v): %d units within %d ms (contract %d+1)", count, spread, n, w, w*count/1000)
			}
		}
	}
}

// TestGCRA7PerMinuteSlotsNeverEarly is (b): at 7/min, burst 1, the k-th slot
// after the first (k up to 1000) is never before k*Period/Count exactly; the
// 14th was 1.5 µs early when TATs were rounded to nearest.
func TestGCRA7PerMinuteSlotsNeverEarly(t *testing.T) {
	t.Parallel()
	r := Rate{Count: 7, Period: time.Minute, Burst: 1}
	for _, spread := range []bool{false, true} {
		g := must(NewLeakyBucket(r, 3*time.Hour))
		var st State
		now := t0
		var first *big.Rat
		rng := rand.New(rand.NewPCG(7, 60))
		for k := range int64(1001) {
			if spread {
				now += rng.Float64() * 8000
			}
			var d Decision
			st, d, _ = Reserve(g, st, now, 1)
			if !d.Allowed {
				t.Fatalf("slot %d refused", k)
			}
			dep := new(big.Rat).Add(rat(now), big.NewRat(int64(d.Delay), 1e6))
			if first == nil {
				first = dep
			}
			exact := new(big.Rat).Add(first, big.NewRat(k*60000, 7))
			if dep.Cmp(exact) < 0 {
				e, _ := new(big.Rat).Sub(exact, dep).Float64()
				t.Fatalf("spread %v: slot %d is %.3g µs early", spread, k, e*1e3)
			}
		}
	}
}

// exactBucket is the token bucket in exact rationals: the level, capped at
// burst, refilled at Count/Period from the last update (a clock that steps
// back refills nothing until it passes the last update again).
type exactBucket struct {
	rate, burst *big.Rat // tokens per ms, capacity
	level, last *big.Rat // nil: cold
}

func (b *exactBucket) at(now *big.Rat) (level, last *big.Rat) {
	if b.level == nil {
		return new(big.Rat).Set(b.burst), now
	}
	level, last = new(big.Rat).Set(b.level), b.last
	if el := new(big.Rat).Sub(now, b.last); el.Sign() > 0 {
		level.Add(level, el.Mul(el, b.rate))
		last = now
	}
	if level.Cmp(b.burst) > 0 {
		level.Set(b.burst)
	}
	return level, last
}

// TestTokenBucketDecidesAsExactArithmetic is (d): the token bucket makes no
// refusal and no admission that exact arithmetic does not, over 4,800 steps
// of three kinds: requests of 1 at exact multiples of 50, 100, 250, 1000/3
// (as float64) and 1000 ms (a bucket of 3 per second that gained 0.3 token
// per 100 ms reached 2.9999999999999996 after a second, not 3: hundreds of
// wrong refusals); whole-millisecond steps; and steps on the float64 grid of
// present-day instants, with the clock sometimes set back. With a whole or
// dyadic Count and a Period of whole milliseconds the credit arithmetic is
// exact, so every decision must agree; with Count 0.1 (not a float64) a
// disagreement is allowed only where the exact level is within 1e-9 of the
// cost.
func TestTokenBucketDecidesAsExactArithmetic(t *testing.T) {
	t.Parallel()
	for _, r := range []Rate{
		{Count: 3, Period: time.Second, Burst: 3},
		{Count: 3, Period: time.Second, Burst: 1},
		{Count: 3, Period: time.Second, Burst: 5},
		{Count: 7, Period: 3 * time.Second, Burst: 5},
		{Count: 1000, Period: time.Hour, Burst: 50},
		{Count: 0.5, Period: time.Second, Burst: 2},
		{Count: 10, Period: time.Second, Burst: 3},
		{Count: 0.1, Period: time.Second, Burst: 2},
	} {
		exactRate := r.Count != 0.1
		for mode := range 7 {
			b := must(NewTokenBucket(r))
			x := &exactBucket{rate: new(big.Rat).Quo(rat(r.Count), new(big.Rat).SetFrac64(int64(r.Period), 1e6)), burst: big.NewRat(r.Burst, 1)}
			rng := rand.New(rand.NewPCG(uint64(r.Burst), uint64(mode)))
			var st State
			now := t0
			wrongRefusals, wrongAdmissions, admitted := 0, 0, 0
			for i := range 4800 {
				cost := 1 + rng.Int64N(r.Burst)
				switch mode {
				case 0, 1, 2, 3, 4: // requests of 1 at exact multiples of a step
					now = t0 + float64(i)*[]float64{50, 100, 250, 1000.0 / 3, 1000}[mode]
					cost = 1
				case 5: // whole milliseconds
					now += []float64{0, 1, 100, 250, 333, 334, 1000}[rng.IntN(7)]
				case 6: // the float64 grid of present-day instants
					now += math.Round(rng.Float64()*900*4096) / 4096
				}
				if mode >= 5 && rng.IntN(50) == 0 {
					now -= 700 // the clock set back
				}
				next, d, err := Reserve(b, st, now, cost)
				if err != nil {
					t.Fatal(err)
				}
				level, last := x.at(rat(now))
				if want := level.Cmp(big.NewRat(cost, 1)) >= 0; d.Allowed != want {
					margin, _ := new(big.Rat).Sub(level, big.NewRat(cost, 1)).Float64()
					if exactRate || math.Abs(margin) > 1e-9 {
						t.Errorf("%v per %v burst %d, mode %d step %d (cost %d): allowed %v, exact level %s", r.Count, r.Period, r.Burst, mode, i, cost, d.Allowed, level.FloatString(18))
					}
					if d.Allowed {
						wrongAdmissions++
					} else {
						wrongRefusals++
					}
				}
				if d.Allowed { // the exact bucket follows the float one's decisions
					admitted++
					st = next
					x.level, x.last = level.Sub(level, big.NewRat(cost, 1)), last
				}
			}
			if wrongRefusals+wrongAdmissions > 0 {
				t.Logf("%v per %v burst %d, mode %d: %d wrong refusals, %d wrong admissions in 4,800 steps", r.Count, r.Period, r.Burst, mode, wrongRefusals, wrongAdmissions)
			}
			if admitted < 20 {
				t.Errorf("%v per %v burst %d, mode %d: only %d admitted", r.Count, r.Period, r.Burst, mode, admitted)
			}
		}
	}
}

// A state of the earlier layout, [tokens, last], and one stored under
// another period (the rate changed live) are read through their tokens.
func TestTokenBucketReadsOtherLayouts(t *testing.T) {
	t.Parallel()
	b := must(NewTokenBucket(Rate{Count: 3, Period: time.Second, Burst: 5}))
	for _, c := range []struct {
		st   State
		want float64
	}{
		{State{2, t0}, 2},
		{State{2.5, t0 - 1000}, 5},       // 2.5 + 3 refilled, capped at 5
		{State{9, t0}, 5},                // a larger bucket's
		{State{4 * 60000, t0, 60000}, 4}, // 4 tokens under a period of a minute
		{State{3000, t0, 1000}, 3},
	} {
		if rem, _ := b.Status(c.st, t0); rem != c.want {
			t.Errorf("%v: %v tokens, want %v", c.st, rem, c.want)
		}
	}
	st := b.Commit(State{2, t0}, t0, 0, 1)
	if len(st) != 3 || st[0] != 1000 || st[2] != 1000 {
		t.Fatalf("commit of the earlier layout stores %v", st)
	}
}

// TestMinIntervalFigures checks the figures MinInterval's comment gives for
// what the rounding of the interval costs a backlogged key: the rate each
// contract runs at is Period over the rounded interval, computed here.
func TestMinIntervalFigures(t *testing.T) {
	for _, c := range []struct {
		count  float64
		period time.Duration
		want   float64 // units per period, as the comment gives them
		digits float64 // to the precision given
		slow   float64 // relative loss, as given (0: none)
	}{
		{1, time.Second, 1, 1e-12, 0},
		{25, time.Second, 25, 1e-12, 0},
		{1000, time.Second, 1000, 1e-12, 0},
		{500, time.Minute, 500, 1e-12, 0},
		{60, time.Hour, 60, 1e-12, 0},
		{100000, time.Second, 99902.4, 0.05, 9.8e-4},
		{10000, time.Second, 9990.2, 0.05, 9.8e-4},
		{99000, time.Second, 97523.8, 0.05, 1.5e-2},
		{90000, time.Minute, 89989.0, 0.05, 1.2e-4},
		{3, time.Second, 2.99999854, 5e-9, 4.9e-7},
		{7, time.Minute, 6.99999989, 5e-9, 1.6e-8},
	} {
		T := intervalUp(c.count, c.period)
		exact := DurationMillis(c.period) / c.count
		got := DurationMillis(c.period) / T
		if math.Abs(got-c.want) > c.digits {
			t.Errorf("%v per %v runs at %.9f per period backlogged; the comment says %v", c.count, c.period, got, c.want)
		}
		slow := (T - exact) / T
		if c.slow == 0 && slow != 0 || c.slow != 0 && math.Abs(slow-c.slow)/c.slow > 0.05 {
			t.Errorf("%v per %v runs %.3g slow; the comment says %v", c.count, c.period, slow, c.slow)
		}
		if T-exact >= tatStep || T < exact {
			t.Errorf("%v per %v: interval %v rounded to %v: not up by less than a step", c.count, c.period, exact, T)
		}
	}
	// The worst cases: one step above a whole number of steps.
	for _, c := range []struct{ interval, atLeast float64 }{{0.01, 97616}, {0.1, 9975}} {
		if got := 1000 / (c.interval + tatStep); got < c.atLeast {
			t.Errorf("%v ms plus a step runs at %v per second; the comment says at least %v", c.interval, got, c.atLeast)
		}
	}
}
