package algorithms_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/lua"
)

// lib.lua's rounding, run by Redis's Lua VM: gcra_up is math.Nextafter up
// for every finite x (powers of two, negatives and subnormals included),
// and gcra.commit stores the TAT the kernel's Commit stores, rounded up,
// bit for bit, over operands where rounding up matters (TwoSum errors of
// either sign, sums exact and not). ARGV holds x values, then triples.
func TestLuaRoundingUpMatchesGo(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	var xs []float64
	for e := -1074; e <= 1023; e += 7 {
		p := math.Ldexp(1, e)
		xs = append(xs, p, math.Nextafter(p, 0), -math.Nextafter(p, 0))
		if e > -1074 { // the next float up of -2^-1074 is -0; Lua's sum gives +0, the same number
			xs = append(xs, -p)
		}
	}
	xs = append(xs, 0, math.Ldexp(1, 40), math.Ldexp(1, 41), 1772366400000, 1772366400002.1499)
	for range 2000 {
		x := math.Float64frombits(rng.Uint64())
		if !math.IsNaN(x) && !math.IsInf(x, 0) && x != math.MaxFloat64 && x != -math.SmallestNonzeroFloat64 {
			xs = append(xs, x)
		}
	}
	type triple struct{ now, base, tc float64 }
	var ts []triple
	for range 3000 {
		now := algorithmsT0 + math.Round(rng.Float64()*1e10*4096)/4096
		if rng.IntN(4) == 0 {
			now = algorithmsT0 + rng.Float64()*1e10 // off the grid (a client clock passes any float)
		}
		tc := []float64{1000.0 / 3, 3000.0 / 7, 0.0101010101010101, 8571.428571428571, 100, 0.25}[rng.IntN(6)] * float64(1+rng.IntN(5))
		base := math.Round(rng.Float64()*1e6*4096) / 4096
		if rng.IntN(3) == 0 {
			base = rng.Float64() * 1e5
		}
		if rng.IntN(10) == 0 {
			base = 0
		}
		ts = append(ts, triple{now, base, tc})
	}
	args := []any{len(xs)}
	for _, x := range xs {
		args = append(args, script.Float(x))
	}
	for _, tr := range ts {
		args = append(args, script.Float(tr.now), script.Float(tr.base), script.Float(tr.tc))
	}
	src := lua.Lib + `
local n = tonumber(ARGV[1])
local out = {}
for i = 1, n do out[#out + 1] = fmt(gcra_up(tonumber(ARGV[1 + i]))) end
for i = n + 2, #ARGV, 3 do
  local now, base, tc = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  -- gcra.commit on a cold key with interval tc, tau tc and delay base: now + (base + tc), rounded up
  out[#out + 1] = fmt(gcra.commit({tc, tc, 1e300}, {}, now, base, 1)[1])
end
return out`
	v, err := client.Eval(ctx, src, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != len(xs)+len(ts) {
		t.Fatalf("%d replies for %d inputs", len(v), len(xs)+len(ts))
	}
	for i, x := range xs {
		if want := script.Float(math.Nextafter(x, math.Inf(1))); v[i] != want {
			t.Fatalf("gcra_up(%s) = %s in Redis, Go's Nextafter %s", script.Float(x), v[i], want)
		}
	}
	bumped := 0
	for i, tr := range ts {
		k := &gcra.Kernel{Interval: tr.tc, Tau: tr.tc, MaxWait: 1e300}
		want := k.Commit(gcra.Cold, tr.now, tr.base, 1)
		if got := v[len(xs)+i]; got != script.Float(want) {
			t.Fatalf("gcra.commit(now %s, base %s, tc %s) = %s in Redis, Go %s", script.Float(tr.now), script.Float(tr.base), script.Float(tr.tc), got, script.Float(want))
		}
		if want != tr.now+(tr.base+tr.tc) {
			bumped++
		}
	}
	if bumped < len(ts)/10 {
		t.Fatalf("only %d of %d TATs rounded up: the test does not exercise the rounding", bumped, len(ts))
	}
}

// algorithmsT0 is 2026-03-01 12:00 UTC in ms, the conformance test's day.
const algorithmsT0 = 1772366400000.0
