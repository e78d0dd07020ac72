package timer

import (
	"sync"
	"testing"
	"time"
)

// The real clock's Now agrees with time.Now: its wall reading lies between
// two time.Now readings taken around it (to within a microsecond, the gap
// between the wall and monotonic reads inside one time.Now), and its
// monotonic readings never go back, from many goroutines at once.
func TestRealNowAgreesWithTimeNow(t *testing.T) {
	c := Real()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			prev := c.Now()
			for range 20000 {
				before := time.Now()
				n := c.Now()
				after := time.Now()
				if n.Before(prev) {
					t.Errorf("monotonic reading went back: %v after %v", n, prev)
					return
				}
				wall := n.Round(0) // strip the monotonic reading: compare walls
				if wall.Before(before.Round(0).Add(-time.Microsecond)) || wall.After(after.Round(0).Add(time.Microsecond)) {
					t.Errorf("wall %v outside [%v, %v]", wall, before.Round(0), after.Round(0))
					return
				}
				prev = n
			}
		})
	}
	wg.Wait()
}

// An anchor older than ReanchorEvery (or a stepped wall clock, which an
// anchor from elsewhere models) is replaced on the next reading: the clock
// follows time.Now again, not the stale anchor.
func TestRealNowReanchors(t *testing.T) {
	stale := time.Now().Add(-2 * ReanchorEvery).Add(-time.Hour) // wall an hour off
	anchor.Store(&stale)
	n := Real().Now()
	if d := time.Since(n); d < 0 || d > time.Second {
		t.Fatalf("Now after a stale anchor is %v off time.Now", d)
	}
	if a := anchor.Load(); a == &stale || time.Since(*a) > time.Second {
		t.Fatal("the stale anchor was kept")
	}
}
