package algorithms

import (
	"testing"
	"time"
)

func TestTokenBucket(t *testing.T) {
	t.Parallel()
	// Capacity 3, refill 10 per second (one token per 100 ms).
	b := must(NewTokenBucket(Rate{Count: 10, Period: time.Second, Burst: 3}))
	run(t, b, []step{
		{"t0 cold key starts full", 0, 1, true, 0, 0, 2},
		{"t0 cost 2 empties it", 0, 2, true, 0, 0, 0},
		{"t0 empty: retry after one token", 0, 1, false, 0, 100, 0},
		{"t1=50ms half a token", 50, 1, false, 0, 50, 0},
		{"t2=100ms one token", 100, 1, true, 0, 0, 0},
		{"t3=150ms cost 2 needs 1.5 more tokens", 150, 2, false, 0, 150, 0},
		{"t4=300ms two tokens back", 300, 2, true, 0, 0, 0},
		{"t5=1h idle: refills to capacity, not more", 1 * hour, 3, true, 0, 0, 0},
		{"t5 nothing beyond capacity", 1 * hour, 1, false, 0, 100, 0},
	})
}

func TestTokenBucketBackwardClockNeverOverAdmits(t *testing.T) {
	t.Parallel()
	b := must(NewTokenBucket(Rate{Count: 10, Period: time.Second, Burst: 1}))
	st := run(t, b, []step{
		{"t0", 10 * second, 1, true, 0, 0, 0},
		{"t-1: clock steps back 5 s: no refill", 5 * second, 1, false, 0, 100, 0},
		{"t-2: the clock moves forward again but is still behind the last update", 9 * second, 1, false, 0, 100, 0},
		{"t1: 100 ms after the last update", 10*second + 100, 1, true, 0, 0, 0},
	})
	if st[1] != t0+10*second+100 {
		t.Fatalf("last update = %v, want t0+10.1s", st[1]-t0)
	}
}
