package shapertest_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/shaper/shapertest"
)

// Advance returns once it has fired the timers that fell due; what the
// woken waiters do next runs concurrently. Two Advances in a row, with a
// waiter between them, place it only if the test waits for it to act
// first: synctest.Wait returns once every goroutine of the bubble is
// blocked again. Each of 200 runs must see the waiter leave at its slot,
// 500 ms, not at the second Advance's 1 s.
func TestTwoAdvancesInARowPlaceTheWaiterUnderSynctest(t *testing.T) {
	for range 200 {
		synctest.Test(t, func(t *testing.T) {
			ctx := context.Background()
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clock := shapertest.NewClock(start)
			store := memstore.New(memstore.WithSweepInterval(0))
			s, err := shaper.New(store, shaper.PerSecond(2), shaper.WithClock(clock))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Wait(ctx, "k", 1); err != nil {
				t.Fatal(err)
			}
			left := make(chan time.Duration, 1)
			go func() {
				if err := s.Wait(ctx, "k", 1); err != nil {
					t.Error(err)
				}
				left <- clock.Now().Sub(start)
			}()
			synctest.Wait() // the waiter is asleep
			clock.Advance(500 * time.Millisecond)
			synctest.Wait() // the waiter has left
			clock.Advance(500 * time.Millisecond)
			if got := <-left; got != 500*time.Millisecond {
				t.Fatalf("the waiter left at %v, want 500ms", got)
			}
		})
	}
}

// Inside a synctest bubble the system clock is fake too: a shaper on its
// default clock paces exactly, and time.Sleep moves the bubble's time.
func TestTheSystemClockPacesExactlyUnderSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		store := memstore.New(memstore.WithSweepInterval(0))
		s, err := shaper.New(store, shaper.PerSecond(4))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range 5 {
			if err := s.Wait(ctx, "k", 1); err != nil {
				t.Fatal(err)
			}
		}
		if got := time.Since(start); got != time.Second {
			t.Fatalf("5 calls at 4/s took %v, want exactly 1s", got)
		}
	})
}
