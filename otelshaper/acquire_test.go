package otelshaper_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// Wrap's Acquire returns the shaper's reservation, which settles, through any
// depth of wrapping; over a Reserver without Acquire it waits on it and
// returns the zero Reservation, which no shaper granted (transport.Settle
// tells them apart by it).
func TestAcquireReturnsTheZeroReservationOnlyWhenItCannotAcquire(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	s, _ := newShaper(t, shaper.PerSecond(10).WithBurst(10))
	next := func(key string) time.Duration {
		t.Helper()
		r, err := s.Reserve(ctx, key, 8)
		if err != nil {
			t.Fatal(err)
		}
		return r.Delay
	}
	for i, w := range []shaper.Reserver{h.wrap(s), h.wrap(h.wrap(s))} {
		key := "shaper" + strconv.Itoa(i)
		res, err := w.(shaper.Acquirer).Acquire(ctx, key, 8)
		if err != nil {
			t.Fatal(err)
		}
		if res == (shaper.Reservation{}) {
			t.Fatal("Wrap over a *shaper.Shaper returned the zero Reservation")
		}
		if err := res.Settle(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if d := next(key); d != 0 {
			t.Fatalf("after settling 2 of 8 through Wrap the next 8 wait %v, want 0", d)
		}
	}
	for i, w := range []shaper.Reserver{h.wrap(waitOnly{s}), h.wrap(h.wrap(waitOnly{s}))} {
		key := "bare" + strconv.Itoa(i)
		res, err := w.(shaper.Acquirer).Acquire(ctx, key, 8)
		if err != nil {
			t.Fatal(err)
		}
		if res != (shaper.Reservation{}) {
			t.Fatalf("Wrap over a Reserver without Acquire returned %+v, want the zero Reservation", res)
		}
		// It waited on the Reserver: the 8 are taken, the next 8 wait 0.6s.
		if d := next(key); d != 600*time.Millisecond {
			t.Fatalf("after Acquire through a bare Reserver the next 8 wait %v, want 600ms", d)
		}
	}
}
