package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/shaper"
	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives its tests: a
// store's sweeper must stop on Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var bg = context.Background()

// newTest returns a shaper on a fresh store (no background sweeper) and a
// fake clock at t0.
func newTest(t testing.TB, rate shaper.Rate, opts ...shaper.Option) (*shaper.Shaper, *Store, *timer.Fake) {
	t.Helper()
	clock := timer.NewFake(t0)
	store := New(WithSweepInterval(0))
	s, err := shaper.New(store, rate, append([]shaper.Option{shaper.WithClock(clock)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s, store, clock
}

func mustReserve(t testing.TB, s *shaper.Shaper, key string, cost int64) shaper.Reservation {
	t.Helper()
	r, err := s.Reserve(bg, key, cost)
	if err != nil {
		t.Fatalf("Reserve(%q, %d): %v", key, cost, err)
	}
	return r
}

func newFakeAt(t time.Time) *timer.Fake { return timer.NewFake(t) }
