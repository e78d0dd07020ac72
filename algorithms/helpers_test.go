package algorithms

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Named time units. Every table starts at t0, a whole UTC minute, and writes
// instants as offsets from it in milliseconds.
var t0 = Millis(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))

const (
	ms     = 1.0
	second = 1000 * ms
	minute = 60 * second
	hour   = 60 * minute
)

// step is one row of a transition table: at t0+at, a request of cost, and the
// expected decision. Durations are in milliseconds.
type step struct {
	name    string
	at      float64
	cost    int64
	allowed bool
	delay   float64
	retry   float64
	remain  int64
}

func run(t *testing.T, a Algorithm, steps []step) State {
	t.Helper()
	var st State
	for _, s := range steps {
		before := slices.Clone(st)
		next, d, err := Reserve(a, st, t0+s.at, s.cost)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if d.Allowed != s.allowed || d.Delay != Duration(s.delay) || d.RetryAfter != Duration(s.retry) || d.Remaining != s.remain {
			t.Fatalf("%s: got allowed=%v delay=%v retry=%v remaining=%d; want allowed=%v delay=%v retry=%v remaining=%d",
				s.name, d.Allowed, d.Delay, d.RetryAfter, d.Remaining, s.allowed, Duration(s.delay), Duration(s.retry), s.remain)
		}
		if !d.Allowed && !sameState(before, next) {
			t.Fatalf("%s: a denial changed the state from %v to %v", s.name, before, next)
		}
		st = next
	}
	return st
}

// sameState compares bit for bit (NaN-safe, -0 distinct from +0).
func sameState(a, b State) bool {
	return slices.EqualFunc(a, b, func(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) })
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestMain checks that no test leaves a goroutine behind (the Lua
// conformance test's Redis clients included).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// reserveThenCancel reserves 1 to 8 requests of 1 to maxCost units at now,
// then cancels each whole (GiveBack at now) in a random order: a schedule
// whose cancels hold nothing is left as it was. It returns the state and
// how many it cancelled.
func reserveThenCancel(a interface {
	Algorithm
	GiveBacker
}, st State, now float64, maxCost int, rng *rand.Rand) (State, int) {
	type held struct {
		at   float64
		cost int64
	}
	var hs []held
	for range 1 + rng.IntN(8) {
		cost := int64(1 + rng.IntN(maxCost))
		var dec Decision
		st, dec, _ = Reserve(a, st, now, cost)
		hs = append(hs, held{now + dec.Wait(), cost})
	}
	rng.Shuffle(len(hs), func(i, j int) { hs[i], hs[j] = hs[j], hs[i] })
	for _, h := range hs {
		st = a.GiveBack(st, now, h.at, h.cost)
	}
	return st, len(hs)
}
