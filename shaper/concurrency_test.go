package shaper

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// 64 goroutines x 1,000 reservations on one key at 1,000/s, burst 1, on the
// fake clock: 64,000 distinct departure slots exactly T = 1 ms apart.
func TestConcurrentReservationsGetDistinctSlots(t *testing.T) {
	t.Parallel()
	s, _, _ := newTest(t, PerSecond(1000), WithMaxQueue(65*time.Second))
	const G, N = 64, 1000
	delays := make([][]time.Duration, G)
	var wg sync.WaitGroup
	for g := range G {
		wg.Go(func() {
			for range N {
				r, err := s.Reserve(bg, "hot", 1)
				if err != nil {
					t.Error(err)
					return
				}
				delays[g] = append(delays[g], r.Delay)
			}
		})
	}
	wg.Wait()
	all := slices.Concat(delays...)
	slices.Sort(all)
	if len(all) != G*N {
		t.Fatalf("%d reservations, want %d", len(all), G*N)
	}
	for i, d := range all {
		if d != time.Duration(i)*time.Millisecond {
			t.Fatalf("slot %d is %v, want exactly %v", i, d, time.Duration(i)*time.Millisecond)
		}
	}
}
