package algorithms

import (
	"testing"
	"time"
)

// benchSubjects are warm keys advanced by step ms per call, so that most calls
// admit and commit (the expensive path).
func benchSubjects() []struct {
	name string
	alg  Algorithm
	step float64
} {
	r := Rate{Count: 1000, Period: time.Second, Burst: 10}
	return []struct {
		name string
		alg  Algorithm
		step float64
	}{
		{"gcra", must(NewGCRA(r)), 1},
		{"leaky-bucket", must(NewLeakyBucket(r, time.Second)), 1},
		{"token-bucket", must(NewTokenBucket(r)), 1},
		{"fixed-window", must(NewFixedWindow(1000, time.Second)), 1},
		{"sliding-window-S1", must(NewSlidingWindow(1000, time.Second, 1)), 1},
		{"sliding-window-S10", must(NewSlidingWindow(1000, time.Second, 10)), 1},
		{"sliding-log-100", must(NewSlidingLog(100, 100*time.Millisecond)), 1},
		{"quota-month", must(NewQuota(1e9, Monthly(2*time.Hour))), 1},
	}
}

// BenchmarkReserve: one transition on a warm key. Every algorithm is 0 allocs/op.
func BenchmarkReserve(b *testing.B) {
	for _, s := range benchSubjects() {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			var st State
			now := t0
			for range 1000 { // warm up: grow the state to its steady size
				st, _, _ = Reserve(s.alg, st, now, 1)
				now += s.step
			}
			admitted := 0
			b.ResetTimer()
			for range b.N {
				var d Decision
				st, d, _ = Reserve(s.alg, st, now, 1)
				if d.Allowed {
					admitted++
				}
				now += s.step
			}
			b.ReportMetric(float64(admitted)/float64(b.N), "admitted/op")
		})
	}
}

// BenchmarkAll: requests plus tokens on one account, both shaped.
func BenchmarkAll(b *testing.B) {
	b.ReportAllocs()
	req := must(NewLeakyBucket(Rate{Count: 3500, Period: time.Minute, Burst: 1}, time.Minute))
	tok := must(NewLeakyBucket(Rate{Count: 90000, Period: time.Minute, Burst: 1000}, time.Minute))
	dims := []Dim{{Alg: req, Cost: 1}, {Alg: tok, Cost: 20}}
	now := t0
	All(dims, now)
	b.ResetTimer()
	for range b.N {
		if _, err := All(dims, now); err != nil {
			b.Fatal(err)
		}
		now += 20
	}
}

// TestTransitionsDoNotAllocate pins the 0 allocs/op of the benchmarks in the
// ordinary test run.
func TestTransitionsDoNotAllocate(t *testing.T) {
	for _, s := range benchSubjects() {
		var st State
		now := t0
		for range 1000 {
			st, _, _ = Reserve(s.alg, st, now, 1)
			now += s.step
		}
		allocs := testing.AllocsPerRun(1000, func() {
			st, _, _ = Reserve(s.alg, st, now, 1)
			now += s.step
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs per transition, want 0", s.name, allocs)
		}
	}
	dims := []Dim{{Alg: must(NewGCRA(Rate{Count: 10, Period: time.Millisecond, Burst: 5})), Cost: 1}, {Alg: must(NewFixedWindow(1e6, time.Second)), Cost: 1}}
	now := t0
	All(dims, now)
	if allocs := testing.AllocsPerRun(1000, func() { All(dims, now); now += 1 }); allocs != 0 {
		t.Errorf("All: %v allocs per call, want 0", allocs)
	}
}
