package algorithms

import (
	"errors"
	"math"
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
		{1, time.Millisecond}, {0.0000004, 0}, {0.0000006, time.Nanosecond}, {1234.5678912, 1234567891 * time.Nanosecond},
		{math.Inf(1), math.MaxInt64}, {1e300, math.MaxInt64},
	} {
		if got := Duration(c.ms); got != c.want {
			t.Errorf("Duration(%v) = %v, want %v", c.ms, got, c.want)
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
