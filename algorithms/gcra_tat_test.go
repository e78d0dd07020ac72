package algorithms

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/gcra"
)

// FuzzGCRATATMatchesState drives the GCRA kernel's whole transition on a
// bare TAT (what the memory store's hot path and the Redis store's
// reserve_gcra.lua decoding call) and the generic State path
// (ReserveNotBefore through Delay, Commit and Status) through the same
// random timeline (clock steps back and forth, pauses, costs out of range,
// cancels of the tail and of older slots), and requires the same TAT, the
// same decision and the same refusals at every step, bit for bit: the fast
// path may not drift from the math the Lua scripts are checked against.
func FuzzGCRATATMatchesState(f *testing.F) {
	f.Add(uint64(1), uint16(10), uint16(1000), uint8(0), uint16(0))
	f.Add(uint64(2), uint16(7), uint16(3000), uint8(3), uint16(5000))
	f.Add(uint64(3), uint16(1), uint16(1), uint8(255), uint16(60000))
	f.Add(uint64(4), uint16(1000), uint16(1), uint8(1), uint16(1))
	f.Fuzz(func(t *testing.T, seed uint64, count, periodMS uint16, burst uint8, queueMS uint16) {
		if count == 0 || periodMS == 0 {
			return
		}
		r := Rate{Count: float64(count), Period: time.Duration(periodMS) * time.Millisecond, Burst: int64(burst)}
		var g *GCRA
		var err error
		if queueMS == 0 {
			g, err = NewGCRA(r)
		} else {
			g, err = NewLeakyBucket(r, time.Duration(queueMS)*time.Millisecond)
		}
		if err != nil {
			return // a configuration the constructors refuse has no transitions
		}
		rng := rand.New(rand.NewPCG(seed, 7))
		var st State
		tat := gcra.Cold
		k := &g.k
		now := t0
		var tags []float64
		for i := range 400 {
			now += rng.Float64()*2*g.Interval() - g.Interval()/4 // mostly forward, sometimes back
			notBefore := now
			if rng.IntN(8) == 0 {
				notBefore = now + rng.Float64()*float64(queueMS+1)
			}
			cost := int64(rng.IntN(int(burst)+3)) - 1 // 0 and -1 included
			if rng.IntN(50) == 0 {
				cost = math.MaxInt64
			}
			if rng.IntN(200) == 0 {
				now = math.NaN()
			}
			next, dec, err := ReserveNotBefore(g, st, now, notBefore, cost)
			// The kernel's callers check admissibility (and the shaper's
			// clock is always finite) before calling it.
			if valid := k.Admissible(cost) && !math.IsNaN(now); valid != (err == nil) {
				t.Fatalf("step %d: cost %d at %v: admissible %v, ReserveNotBefore says %v", i, cost, now, valid, err)
			}
			tnext, twait, tallowed := tat, 0.0, false
			if err == nil {
				tnext, twait, tallowed = k.Reserve(tat, now, notBefore, cost)
			} else if !errors.Is(err, ErrInvalidTime) && !errors.Is(err, ErrInvalidCost) {
				t.Fatalf("step %d: %v", i, err)
			}
			if err == nil && (dec.Allowed != tallowed || math.Float64bits(dec.raw[0]) != math.Float64bits(twait)) {
				t.Fatalf("step %d (now %v, cost %d): decisions differ:\n state %+v\n kernel allowed %v wait %v", i, now, cost, dec, tallowed, twait)
			}
			if !sameTAT(next, tnext) {
				t.Fatalf("step %d: state %v, bare TAT %v", i, next, tnext)
			}
			st, tat = next, tnext
			if math.IsNaN(now) {
				now = t0 + float64(i)*g.Interval()
				continue
			}
			if rem, reset := g.Status(st, now); true {
				trem, treset := k.Status(tat, now)
				if rem != trem || reset != treset {
					t.Fatalf("step %d: Status %v %v, StatusTAT %v %v", i, rem, reset, trem, treset)
				}
			}
			if dec.Allowed {
				tags = append(tags, tat)
			}
			if len(tags) > 0 && rng.IntN(6) == 0 { // cancel the tail or an older slot
				tag := tags[rng.IntN(len(tags))]
				var ok, tok bool
				st, ok = g.Cancel(st, tag, max(cost, 1))
				tat, tok = k.Cancel(tat, tag, max(cost, 1))
				if ok != tok || !sameTAT(st, tat) {
					t.Fatalf("step %d: Cancel %v %v, CancelTAT %v %v", i, st, ok, tat, tok)
				}
			}
		}
	})
}

// sameTAT reports whether st and the bare tat hold the same state.
func sameTAT(st State, tat float64) bool {
	if len(st) == 0 {
		return tat == gcra.Cold
	}
	return len(st) == 1 && math.Float64bits(st[0]) == math.Float64bits(tat)
}
