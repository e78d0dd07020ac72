package algorithms

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestGCRA(t *testing.T) {
	t.Parallel()
	// 10 per second (T = 100 ms), burst 3 (tau = 300 ms).
	g := must(NewGCRA(Rate{Count: 10, Period: time.Second, Burst: 3}))
	run(t, g, []step{
		{"t0 cold key admits", 0, 1, true, 0, 0, 2},
		{"t0 second of the burst", 0, 1, true, 0, 0, 1},
		{"t0 third of the burst", 0, 1, true, 0, 0, 0},
		{"t0 burst spent: deny, retry after T", 0, 1, false, 0, 100, 0},
		{"t1=50ms still early", 50, 1, false, 0, 50, 0},
		{"t2=100ms one unit drained", 100, 1, true, 0, 0, 0},
		{"t3=150ms cost 2 waits for two units", 150, 2, false, 0, 150, 0},
		{"t4=300ms cost 2 fits", 300, 2, true, 0, 0, 0},
		{"t5=1h idle: clamped to a full burst, not more", 1 * hour, 3, true, 0, 0, 0},
		{"t5 nothing beyond the burst", 1 * hour, 1, false, 0, 100, 0},
	})
}

func TestGCRABackwardClockNeverOverAdmits(t *testing.T) {
	t.Parallel()
	g := must(NewGCRA(Rate{Count: 10, Period: time.Second, Burst: 1}))
	run(t, g, []step{
		{"t0", 10 * second, 1, true, 0, 0, 0},
		{"t-1: clock steps back 5 s", 5 * second, 1, false, 0, 5*second + 100, 0},
		{"t-2: still behind", 9 * second, 1, false, 0, 1*second + 100, 0},
		{"t1: back at the schedule", 10*second + 100, 1, true, 0, 0, 0},
	})
}

func TestLeakyBucketQueues(t *testing.T) {
	t.Parallel()
	// 10 per second, burst 1, MaxQueue 250 ms.
	g := must(NewLeakyBucket(Rate{Count: 10, Period: time.Second, Burst: 1}, 250*time.Millisecond))
	run(t, g, []step{
		{"t0 cold key departs now", 0, 1, true, 0, 0, 0},
		{"t0 next departs at +100ms", 0, 1, true, 100, 0, 0},
		{"t0 next at +200ms", 0, 1, true, 200, 0, 0},
		{"t0 +300ms exceeds MaxQueue: refused", 0, 1, false, 0, 50, 0},
		{"t1=50ms the refused one's slot is free: +250ms", 50, 1, true, 250, 0, 0},
		{"t2=60ms cost 3 (above burst): delay (400+300-100)-60 = 540ms, 290ms past MaxQueue", 60, 3, false, 0, 290, 0},
		{"t3=10s idle: cost 3 departs after 2*T", 10 * second, 3, true, 200, 0, 0},
	})
}

// 1,000 reservations at 100/s, burst 1, at one instant on a cold key get
// delays of exactly k*10 ms; one whose delay would exceed MaxQueue is refused
// and the next reservation gets the slot it would have had.
func TestLeakyBucketExactSlots(t *testing.T) {
	t.Parallel()
	// MaxQueue 9.99 s holds exactly the slots 0, 10 ms, ..., 9.99 s.
	g := must(NewLeakyBucket(Rate{Count: 100, Period: time.Second, Burst: 1}, 9990*time.Millisecond))
	var st State
	for k := range 1000 {
		var d Decision
		var err error
		st, d, err = Reserve(g, st, t0, 1)
		if want := time.Duration(k) * 10 * time.Millisecond; err != nil || !d.Allowed || d.Delay != want {
			t.Fatalf("reservation %d: %+v, %v; want delay exactly %v", k, d, err, want)
		}
	}
	before := slices.Clone(st)
	st, d, err := Reserve(g, st, t0, 1)
	if err != nil || d.Allowed || d.RetryAfter != 10*time.Millisecond || !sameState(before, st) {
		t.Fatalf("the 1,001st (10 s away): %+v, %v, state %v -> %v; want refused, retry 10ms, nothing written", d, err, before, st)
	}
	_, d, err = Reserve(g, st, t0+10, 1)
	if err != nil || !d.Allowed || d.Delay != 9990*time.Millisecond {
		t.Fatalf("10 ms later: %+v, %v; want the slot at t0+10s that the refused one would have had", d, err)
	}
}

func TestGCRACancelRefundsOnlyTheTail(t *testing.T) {
	t.Parallel()
	g := must(NewLeakyBucket(Rate{Count: 10, Period: time.Second, Burst: 1}, time.Minute))
	var st State
	st, _, _ = Reserve(g, st, t0, 1) // departs t0
	st, _, _ = Reserve(g, st, t0, 1) // departs t0+100ms
	aTat := st[0]
	st, _, _ = Reserve(g, st, t0, 1) // departs t0+200ms
	cTat := st[0]

	if _, ok := g.Cancel(append(State(nil), st...), aTat, 1); ok {
		t.Fatal("cancel of a reservation that others depend on refunded")
	}
	st, ok := g.Cancel(st, cTat, 1)
	if !ok {
		t.Fatal("cancel of the tail did not refund")
	}
	_, d, _ := Reserve(g, st, t0, 1)
	if d.Delay != 200*time.Millisecond {
		t.Fatalf("after refunding the tail the next reservation waits %v, want its slot 200ms", d.Delay)
	}
}

// A floor (a paused key) holds every algorithm's departures back without
// consuming anything, and the key's ordinary contract applies after it.
func TestReserveNotBefore(t *testing.T) {
	t.Parallel()
	for _, burst := range []int64{1, 5} {
		g := must(NewLeakyBucket(Rate{Count: 10, Period: time.Second, Burst: burst}, time.Minute))
		st, d, _ := ReserveNotBefore(g, nil, t0, t0+3*second, 1)
		if d.Delay != 3*time.Second {
			t.Fatalf("burst %d: first departure under a 3 s floor waits %v, want 3s", burst, d.Delay)
		}
		_, d, _ = ReserveNotBefore(g, st, t0, t0+3*second, 1)
		// Burst 1: paced T after the floor. Burst 5: the burst is available at the floor.
		if want := map[int64]time.Duration{1: 3100 * time.Millisecond, 5: 3 * time.Second}[burst]; d.Delay != want {
			t.Fatalf("burst %d: second departure waits %v, want %v", burst, d.Delay, want)
		}
	}
	w := must(NewFixedWindow(5, time.Second))
	st, d, _ := ReserveNotBefore(w, nil, t0, t0+500, 1)
	if d.Allowed || d.RetryAfter != 500*time.Millisecond || st != nil {
		t.Fatalf("fixed window under a floor: %+v, state %v; want refused for 500ms, nothing written", d, st)
	}
	if _, d, _ = ReserveNotBefore(w, nil, t0+500, t0+500, 1); !d.Allowed {
		t.Fatalf("fixed window at the end of the floor: %+v", d)
	}
	if _, _, err := ReserveNotBefore(w, nil, t0, t0/(t0-t0), 1); err != ErrInvalidTime {
		t.Fatalf("NaN floor: %v", err)
	}
	dims := []Dim{{Alg: must(NewLeakyBucket(Rate{Count: 1, Period: time.Second, Burst: 1}, time.Minute)), Cost: 1}}
	ad, _ := AllNotBefore(dims, t0, t0+2*second)
	if !ad.Allowed || ad.Delay != 2*time.Second || ad.Binding != -1 {
		t.Fatalf("All under a floor: %+v, want a 2 s delay bound by the floor (-1)", ad)
	}
}

func TestGCRAConfigErrors(t *testing.T) {
	t.Parallel()
	nan := 0.0
	nan /= nan
	bad := []Rate{
		{Count: 0, Period: time.Second, Burst: 1},
		{Count: -1, Period: time.Second, Burst: 1},
		{Count: nan, Period: time.Second, Burst: 1},
		{Count: 1 / (nan - nan + 0), Period: time.Second, Burst: 1},
		{Count: 10, Period: 0, Burst: 1},
		{Count: 10, Period: -time.Second, Burst: 1},
		{Count: 10, Period: time.Second, Burst: 0},
		{Count: 1e9, Period: time.Second, Burst: 1},    // above 100,000/s
		{Count: 1e-300, Period: time.Second, Burst: 1}, // interval overflows
	}
	for _, r := range bad {
		_, err := NewGCRA(r)
		var ce *ConfigError
		if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) {
			t.Errorf("NewGCRA(%+v) = %v, want a *ConfigError", r, err)
		}
	}
	if _, err := NewLeakyBucket(Rate{Count: 1, Period: time.Second, Burst: 1}, -time.Second); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("negative MaxQueue: %v", err)
	}
}

func TestCostErrors(t *testing.T) {
	t.Parallel()
	g := must(NewGCRA(Rate{Count: 10, Period: time.Second, Burst: 3}))
	s := must(NewLeakyBucket(Rate{Count: 10, Period: time.Second, Burst: 1}, time.Second))
	cases := []struct {
		a    Algorithm
		cost int64
	}{
		{g, 0}, {g, -1}, {g, 4}, // burst 3: 4 can never be admitted in deny mode
		{s, 12}, // T*12 - tau = 1.1 s > MaxQueue 1 s
		{s, 1 << 60},
	}
	for _, c := range cases {
		st := State{t0}
		_, d, err := Reserve(c.a, st, t0, c.cost)
		var ce *CostError
		if !errors.Is(err, ErrInvalidCost) || !errors.As(err, &ce) || ce.Cost != c.cost || d.Allowed || st[0] != t0 {
			t.Errorf("%s cost %d: %v, %+v; want a *CostError and nothing written", c.a.Name(), c.cost, err, d)
		}
	}
	if _, _, err := Reserve(s, nil, t0, 11); err != nil {
		t.Errorf("cost 11 fits in MaxQueue exactly: %v", err)
	}
	if _, _, err := Reserve(g, nil, t0/(t0-t0), 1); !errors.Is(err, ErrInvalidTime) {
		t.Errorf("NaN now: %v", err)
	}
}
