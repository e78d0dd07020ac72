package algorithms

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestMillisTimeRoundTrip(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		want := time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).UTC()
		got := Time(Millis(want))
		if d := got.Sub(want); d < -250*time.Nanosecond || d > 250*time.Nanosecond {
			t.Fatalf("Time(Millis(%v)) = %v, off by %v (resolution is 0.24 µs)", want, got, d)
		}
	}
	if got := Millis(time.Unix(1, 500_000_000)); got != 1500 {
		t.Fatalf("Millis(1.5 s) = %v", got)
	}
}

func TestDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ms   float64
		want time.Duration
	}{
		{0, 0}, {-5, 0}, {math.NaN(), 0}, {math.Inf(-1), 0},
		{1, time.Millisecond}, {0.0000004, time.Nanosecond}, {0.0000006, time.Nanosecond}, {1234.5678912, 1234567892 * time.Nanosecond},
		{0.000001, time.Nanosecond}, {100, 100 * time.Millisecond}, {1.5, 1500 * time.Microsecond},
		{math.Inf(1), math.MaxInt64}, {1e300, math.MaxInt64},
	} {
		if got := Duration(c.ms); got != c.want {
			t.Errorf("Duration(%v) = %v, want %v", c.ms, got, c.want)
		}
	}
	// Rounded up, never down: the Duration is at or above the exact value of
	// the float64, and less than a nanosecond above it.
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 200000 {
		ms := rng.Float64() * math.Pow(10, float64(rng.IntN(17)-3)) // up to 10^13 ms: beyond 2^53 ns too
		if i%4 == 0 {                                               // products that land on or next to a whole nanosecond
			ms = float64(rng.Int64N(1e12)) / 1e6
		}
		if ms >= 9.2e12 { // beyond time.Duration: saturates (checked above)
			continue
		}
		got := Duration(ms)
		exact := new(big.Rat).Mul(new(big.Rat).SetFloat64(ms), big.NewRat(1e6, 1))
		d := new(big.Rat).Sub(new(big.Rat).SetInt64(int64(got)), exact)
		if d.Sign() < 0 || d.Cmp(big.NewRat(1, 1)) >= 0 {
			t.Fatalf("Duration(%v) = %d ns, exact %s ns", ms, int64(got), exact.FloatString(9))
		}
	}
	// A configured duration comes back as it was.
	for range 10000 {
		d := time.Duration(rng.Int64N(1 << 50))
		if got := roundDuration(DurationMillis(d)); got != d {
			t.Fatalf("roundDuration(DurationMillis(%d)) = %d", d, got)
		}
	}
	if DurationMillis(1500*time.Microsecond) != 1.5 {
		t.Error("DurationMillis(1.5ms) != 1.5")
	}
}

func TestErrorsSayWhatWasWrong(t *testing.T) {
	t.Parallel()
	_, err := NewTokenBucket(Rate{Count: 10, Period: time.Second, Burst: 0})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Burst" || !strings.Contains(err.Error(), "token-bucket: invalid Burst 0: must be between 1 and 2^53") {
		t.Errorf("burst 0: %v", err)
	}
	_, err = NewTokenBucket(Rate{Count: 10, Period: 0, Burst: 1})
	if !errors.As(err, &ce) || ce.Field != "Period" {
		t.Errorf("period 0: %v", err)
	}
	_, err = NewTokenBucket(Rate{Count: 10, Period: time.Second, Burst: 1 << 60})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("burst 2^60: %v", err)
	}
	w := must(NewSlidingLog(5, time.Second))
	_, _, err = Reserve(w, nil, t0, 6)
	var cost *CostError
	if !errors.As(err, &cost) || cost.Cost != 6 || err.Error() != "throttlekit: sliding-log: invalid cost 6: exceeds the limit 5 and could never be admitted" {
		t.Errorf("cost 6: %v", err)
	}
	s := must(NewLeakyBucket(Rate{Count: 1, Period: time.Second, Burst: 1}, 2*time.Second))
	if _, _, err = Reserve(s, nil, t0, 4); err == nil || !strings.Contains(err.Error(), "MaxQueue 2s") {
		t.Errorf("shaper cost 4: %v", err)
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	var names []string
	for _, s := range benchSubjects() {
		names = append(names, s.alg.Name())
	}
	want := "gcra leaky-bucket token-bucket fixed-window sliding-window sliding-window sliding-log quota"
	if got := strings.Join(names, " "); got != want {
		t.Fatalf("names %q, want %q", got, want)
	}
	g := must(NewGCRA(Rate{Count: 4, Period: time.Second, Burst: 3}))
	if _, p := g.Params(); g.Interval() != 250 || p[1] != 750 {
		t.Fatalf("interval %v tolerance %v, want 250 and 750", g.Interval(), p[1])
	}
}
