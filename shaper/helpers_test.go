package shaper

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var bg = context.Background()

// newTest returns a shaper on a fresh memory store (no background sweeper)
// and a fake clock at t0.
func newTest(t testing.TB, rate Rate, opts ...Option) (*Shaper, *memstore.Store, *timer.Fake) {
	t.Helper()
	clock := timer.NewFake(t0)
	store := memstore.New(memstore.WithSweepInterval(0))
	s, err := New(store, rate, append([]Option{WithClock(clock)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s, store, clock
}

// waitAsync runs Wait in a goroutine.
func waitAsync(ctx context.Context, s Reserver, key string, cost int64) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- s.Wait(ctx, key, cost) }()
	return ch
}

func armed(t *testing.T, clock *timer.Fake, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if err := clock.WaitForTimers(ctx, n); err != nil {
		t.Fatalf("no sleeper armed a timer: %v", err)
	}
}

func result(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
		return nil
	}
}

func mustReserve(t *testing.T, s *Shaper, key string, cost int64) Reservation {
	t.Helper()
	r, err := s.Reserve(bg, key, cost)
	if err != nil {
		t.Fatalf("Reserve(%q, %d): %v", key, cost, err)
	}
	return r
}

func newFakeAt(t time.Time) *timer.Fake { return timer.NewFake(t) }

// about reports whether a refusal's reported delay d is want, up to the 2 ns
// its two parts (the wait past the deadline and the deadline's distance)
// may add: each is rounded up to the nanosecond, never down.
func about(d, want time.Duration) bool { return d >= want && d <= want+2 }
