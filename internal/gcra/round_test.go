package gcra

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func rat(x float64) *big.Rat { return new(big.Rat).SetFloat64(x) }

// checkCeiling fails t unless r is at or above exact and at most one step
// (r's spacing) above it; with minimal, r must also be the smallest float64
// at or above exact.
func checkCeiling(t *testing.T, what string, r float64, exact *big.Rat, minimal bool) {
	t.Helper()
	if rat(r).Cmp(exact) < 0 {
		t.Fatalf("%s = %.17g, below the exact %s", what, r, exact.FloatString(20))
	}
	prev := math.Nextafter(r, math.Inf(-1))
	if over := new(big.Rat).Sub(rat(r), exact); over.Cmp(rat(r-prev)) > 0 && over.Cmp(rat(math.Nextafter(r, math.Inf(1))-r)) > 0 {
		t.Fatalf("%s = %.17g, more than a step above the exact %s", what, r, exact.FloatString(20))
	}
	if minimal && rat(prev).Cmp(exact) >= 0 {
		t.Fatalf("%s = %.17g, but %.17g is at or above the exact %s too", what, r, prev, exact.FloatString(20))
	}
}

// randomTime is an instant: mostly present-day (on its float64 grid, or
// anywhere), sometimes small or huge.
func randomTime(rng *rand.Rand) float64 {
	switch rng.IntN(4) {
	case 0:
		return 1.7e12 + rng.Float64()*1e11
	case 1:
		return math.Round((1.7e12+rng.Float64()*1e11)*4096) / 4096
	case 2:
		return rng.Float64() * math.Pow(10, float64(rng.IntN(8)))
	}
	return math.Ldexp(1+rng.Float64(), rng.IntN(60))
}

// randomSpan is a duration in ms: whole, dyadic, or with a fraction of any
// length, from microseconds to years.
func randomSpan(rng *rand.Rand) float64 {
	x := rng.Float64() * math.Pow(10, float64(rng.IntN(14)-2))
	switch rng.IntN(4) {
	case 0:
		return math.Round(x)
	case 1:
		return math.Round(x*64) / 64
	case 2:
		return float64(1+rng.IntN(1000)) / float64(1+rng.IntN(99)) // 1000/3-style
	}
	return x
}

// TestSumUpIsTheCeilingOfTheExactSum: now + (base + tc) as the kernel
// stores it is never below the exact sum of its operands, at most a step
// above it, the smallest such float64 when base + tc is below half of now
// (every present-day TAT), and the rounded-to-nearest sum whenever that is
// exact.
func TestSumUpIsTheCeilingOfTheExactSum(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	bumped := 0
	for range 300000 {
		now, base, tc := randomTime(rng), randomSpan(rng), randomSpan(rng)
		if rng.IntN(10) == 0 {
			base = 0
		}
		if rng.IntN(50) == 0 {
			tc = 0 // y == 0 when base is 0 too
		}
		exact := new(big.Rat).Add(rat(now), rat(base))
		exact.Add(exact, rat(tc))
		r := sumUp(now, base, tc)
		checkCeiling(t, "sumUp", r, exact, 2*(base+tc) < now)
		if nearest := now + (base + tc); rat(nearest).Cmp(exact) == 0 && r != nearest {
			t.Fatalf("sumUp(%v, %v, %v) = %.17g, the exact sum is %.17g", now, base, tc, r, nearest)
		} else if r != nearest {
			bumped++
		}
	}
	if bumped < 1000 {
		t.Fatalf("only %d sums rounded up: the test does not exercise the rounding", bumped)
	}
}

// TestCancelAndSettleTailRoundUp: the TATs Cancel and SettleTail store are
// never below the exact value of their expressions (T*cost below the TAT,
// as for any instant of today), and at most a step above it.
func TestCancelAndSettleTailRoundUp(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		T := randomSpan(rng)
		if !(T > 0) {
			T = 0.01
		}
		b := int64(1 + rng.IntN(50))
		k := &Kernel{Interval: T, Tau: float64(T * float64(b)), MaxWait: 1e6}
		tat := randomTime(rng) + randomSpan(rng)
		cost := int64(1 + rng.IntN(60))
		tc := float64(T * float64(cost))
		if 2*tc > tat { // a TAT is an instant of today, far above T*cost
			continue
		}
		got, ok := k.Cancel(tat, tat, cost)
		if !ok {
			t.Fatal("Cancel of the tail refunded nothing")
		}
		checkCeiling(t, "Cancel", got, new(big.Rat).Sub(rat(tat), rat(tc)), false)
		actual := rng.Int64N(cost + 3)
		at := tat - rng.Float64()*tc
		ta := float64(T * float64(actual))
		got = k.SettleTail(tat, at, cost, actual)
		var exact *big.Rat
		if actual == 0 {
			exact = new(big.Rat).Sub(rat(tat), rat(tc))
		} else {
			exact = new(big.Rat).Sub(rat(tat), new(big.Rat).Sub(rat(tc), rat(ta)))
			if own := new(big.Rat).Add(rat(at), rat(math.Min(ta, k.Tau))); own.Cmp(exact) > 0 {
				exact = own
			}
		}
		checkCeiling(t, "SettleTail", got, exact, false)
	}
}

// TestUpIsLuaFrexpFormula: lib.lua's gcra_up (and reserve_gcra.lua's inline
// form, for positive x) computes the next float64 up as x + 2^(e-53) from
// frexp, one binade lower for a negative power of two, 2^-1074 among
// subnormals; it is math.Nextafter(x, +Inf) for every finite x, exact
// powers of two and the edges of the subnormals included.
func TestUpIsLuaFrexpFormula(t *testing.T) {
	t.Parallel()
	lua := func(x float64, inline bool) float64 {
		if x == 0 && !inline {
			return math.Ldexp(1, -1074)
		}
		m, e := math.Frexp(x)
		if m == -0.5 {
			e--
		}
		if e < -1021 && !inline {
			e = -1021
		}
		return x + math.Ldexp(1, e-53)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	xs := []float64{0, math.SmallestNonzeroFloat64, -math.SmallestNonzeroFloat64, math.Ldexp(1, -1022), -math.Ldexp(1, -1022),
		math.Ldexp(1, -1021), math.Ldexp(1, -1023), math.MaxFloat64 / 2, 1, -1, 0.5, 2, math.Ldexp(1, 40), math.Ldexp(1, 41),
		math.Nextafter(math.Ldexp(1, 41), 0), 1772366400000, -1772366400000}
	for e := -1074; e <= 1023; e++ {
		xs = append(xs, math.Ldexp(1, e), -math.Ldexp(1, e), math.Nextafter(math.Ldexp(1, e), 0), math.Nextafter(math.Ldexp(1, e), math.Inf(1)))
	}
	for range 200000 {
		x := math.Float64frombits(rng.Uint64())
		if math.IsNaN(x) || math.IsInf(x, 0) || x == math.MaxFloat64 {
			continue
		}
		xs = append(xs, x)
	}
	for _, x := range xs {
		want := math.Nextafter(x, math.Inf(1))
		if x == -math.SmallestNonzeroFloat64 { // the next float up is -0; Lua's sum gives +0, the same number
			want = 0
		}
		if got := lua(x, false); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("gcra_up(%v) = %v, want %v", x, got, want)
		}
		if x > 0 && x >= math.Ldexp(1, -1021) { // the inline form: positive normal instants
			if got := lua(x, true); math.Float64bits(got) != math.Float64bits(want) {
				t.Fatalf("reserve_gcra.lua's up(%v) = %v, want %v", x, got, want)
			}
		}
	}
}

// FuzzSumUp: for any operands a clock and a schedule give (now >= 0,
// base, tc >= 0, all finite), sumUp is at or above the exact sum and at
// most a step above it.
func FuzzSumUp(f *testing.F) {
	f.Add(1772366400000.0, 0.0, 1000.0/3)
	f.Add(1772366400002.1499, 0.0100000000000000002, 428.57142857142856)
	f.Add(0.0, 0.0, 0.0)
	f.Add(1.0, 1e15, 3.0)
	f.Fuzz(func(t *testing.T, now, base, tc float64) {
		now, base, tc = math.Abs(now), math.Abs(base), math.Abs(tc)
		for _, x := range []float64{now, base, tc} {
			if math.IsNaN(x) || x > 1e300 {
				return
			}
		}
		exact := new(big.Rat).Add(rat(now), rat(base))
		exact.Add(exact, rat(tc))
		checkCeiling(t, "sumUp", sumUp(now, base, tc), exact, 2*(base+tc) < now)
	})
}
