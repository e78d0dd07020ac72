package shaper

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Keys routed to different shapers keep different contracts; an unrouted key
// fails with a typed error on every method and reserves nothing.
func TestRouteKeepsEachContract(t *testing.T) {
	t.Parallel()
	fast, store, clock := newTest(t, PerSecond(10))
	slow, err := New(store, PerSecond(2), WithClock(clock), WithName("slow"))
	if err != nil {
		t.Fatal(err)
	}
	r := Route(func(key string) Reserver {
		switch key {
		case "api.fast.example":
			return fast
		case "api.slow.example":
			return slow
		}
		return nil
	})
	var fastDelays, slowDelays []time.Duration
	for range 3 {
		a, err := r.Reserve(bg, "api.fast.example", 1)
		if err != nil {
			t.Fatal(err)
		}
		b, err := r.Reserve(bg, "api.slow.example", 1)
		if err != nil {
			t.Fatal(err)
		}
		fastDelays, slowDelays = append(fastDelays, a.Delay), append(slowDelays, b.Delay)
	}
	want := func(got []time.Duration, step time.Duration) {
		t.Helper()
		for i, d := range got {
			if d != time.Duration(i)*step {
				t.Fatalf("delays %v, want multiples of %v", got, step)
			}
		}
	}
	want(fastDelays, 100*time.Millisecond)
	want(slowDelays, 500*time.Millisecond)

	if err := r.Pause(bg, "api.slow.example", time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, err := fast.Reserve(bg, "api.fast.example", 1); err != nil || res.Delay != 300*time.Millisecond {
		t.Fatalf("pausing the slow host touched the fast one: %v, %v", res.Delay, err)
	}
	before := store.Len()
	_, errR := r.Reserve(bg, "unknown.example", 1)
	errW := r.Wait(bg, "unknown.example", 1)
	errP := r.Pause(bg, "unknown.example", time.Second)
	for _, err := range []error{errR, errW, errP} {
		var ke *KeyError
		if !errors.As(err, &ke) || !errors.Is(err, ErrInvalidKey) || ke.Key != "unknown.example" {
			t.Fatalf("unrouted key: %v, want a *KeyError", err)
		}
	}
	if store.Len() != before {
		t.Fatal("an unrouted key wrote to the store")
	}
	var ce *ConfigError
	if _, err := Route(nil).Reserve(bg, "k", 1); !errors.As(err, &ce) {
		t.Fatalf("Route(nil): %v, want a *ConfigError", err)
	}
}

// Route forwards Clamp to the Reserver it picks; an unrouted key, or a
// Reserver without Clamp, fails with a typed error.
func TestRouteForwardsClamp(t *testing.T) {
	t.Parallel()
	s, _, _ := newTest(t, PerSecond(10))
	r := Route(func(key string) Reserver {
		switch key {
		case "shaper":
			return s
		case "bare":
			return bare{s}
		}
		return nil
	}).(interface {
		Clamp(ctx context.Context, key string, remaining int64, reset time.Duration) error
	})
	if err := r.Clamp(bg, "shaper", 2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, "shaper", 1)
	if d := mustReserve(t, s, "shaper", 1).Delay; d != 5*time.Second {
		t.Fatalf("after a clamp of 2 in 10 s through Route: %v, want 5s", d)
	}
	var ke *KeyError
	if err := r.Clamp(bg, "unknown", 1, time.Second); !errors.As(err, &ke) {
		t.Fatalf("an unrouted key: %v", err)
	}
	var ce *ConfigError
	if err := r.Clamp(bg, "bare", 1, time.Second); !errors.As(err, &ce) {
		t.Fatalf("a Reserver without Clamp: %v", err)
	}
}

// bare hides every method of a Reserver but the interface's.
type bare struct{ Reserver }

// Route's Acquire returns the shaper's reservation, which settles; over a
// Reserver without Acquire it waits on it and returns the zero Reservation,
// which no shaper granted (transport.Settle tells them apart by it).
func TestRouteAcquireReturnsTheZeroReservationOnlyWhenItCannotAcquire(t *testing.T) {
	t.Parallel()
	s, _, _ := newTest(t, PerSecond(10).WithBurst(10))
	r := Route(func(key string) Reserver {
		if key == "bare" {
			return bare{s}
		}
		return s
	}).(interface {
		Acquire(ctx context.Context, key string, cost int64) (Reservation, error)
	})
	res, err := r.Acquire(bg, "shaper", 8)
	if err != nil {
		t.Fatal(err)
	}
	if res == (Reservation{}) {
		t.Fatal("Route over a *Shaper returned the zero Reservation")
	}
	if err := res.Settle(bg, 2); err != nil {
		t.Fatal(err)
	}
	if d := mustReserve(t, s, "shaper", 8).Delay; d != 0 {
		t.Fatalf("after settling 2 of 8 through Route the next 8 wait %v, want 0", d)
	}

	res, err = r.Acquire(bg, "bare", 8)
	if err != nil {
		t.Fatal(err)
	}
	if res != (Reservation{}) {
		t.Fatalf("Route over a Reserver without Acquire returned %+v, want the zero Reservation", res)
	}
	// It waited on the Reserver: the 8 are taken, the next 8 wait 0.6s.
	if d := mustReserve(t, s, "bare", 8).Delay; d != 600*time.Millisecond {
		t.Fatalf("after Acquire through a bare Reserver the next 8 wait %v, want 600ms", d)
	}
}
