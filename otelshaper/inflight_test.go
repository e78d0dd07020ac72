package otelshaper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// permitShaper returns a shaper named "partner" on a fresh memory store and
// a fake clock, with a rate and an in-flight dimension "open" of n permits.
func permitShaper(t *testing.T, n int64) (*shaper.Shaper, *timer.Fake) {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { _ = store.Close() })
	clock := timer.NewFake(time.Unix(1_700_000_000, 0))
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "rate", Rate: shaper.PerSecond(1000).WithBurst(10)},
		{Name: "open", InFlight: n},
	}, shaper.WithName("partner"), shaper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	return s, clock
}

// inFlight returns the in-flight gauge of limiter "partner".
func inFlight(t *testing.T, h *harness) int64 {
	t.Helper()
	m, ok := h.collect(t)[otelshaper.MetricInFlight]
	if !ok {
		t.Fatalf("no %s", otelshaper.MetricInFlight)
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok || sum.IsMonotonic {
		t.Fatalf("%s is %#v, want a non-monotonic int64 sum", otelshaper.MetricInFlight, m.Data)
	}
	return counts(t, m)[attrString(attribute.NewSet(otelshaper.AttrLimiter.String("partner")))]
}

func wantInFlight(t *testing.T, h *harness, want int64, when string) {
	t.Helper()
	if n := inFlight(t, h); n != want {
		t.Fatalf("%s: %s is %d, want %d", when, otelshaper.MetricInFlight, n, want)
	}
}

// The wrapper counts the permits its calls hold (Acquire and Reserve),
// down when they are released, from any context, and records how long each
// waited for its permit.
func TestInFlightAndPermitWaitAreRecorded(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	s, clock := permitShaper(t, 2)
	r := h.wrap(s)
	a := r.(shaper.Acquirer)

	r1, err := a.Acquire(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := r.Reserve(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	wantInFlight(t, h, 2, "with two permits taken")

	// A third waits for a permit: 250 ms on the shaper's clock.
	got := make(chan shaper.Reservation, 1)
	go func() {
		r3, err := a.Acquire(ctx, "k", 1)
		if err != nil {
			t.Error(err)
		}
		got <- r3
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := s.Status(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if st.Dimensions[0].Name != "open" {
			t.Fatalf("dimensions %+v", st.Dimensions)
		}
		if st.Dimensions[0].Waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the third Acquire never waited")
		}
		time.Sleep(time.Millisecond)
	}
	clock.Advance(250 * time.Millisecond)
	if err := r1.Release(context.Background()); err != nil { // not the acquiring ctx
		t.Fatal(err)
	}
	r3 := <-got
	wantInFlight(t, h, 2, "with the third holding the first's permit")

	m := h.collect(t)
	hist, ok := m[otelshaper.MetricPermitWait].Data.(metricdata.Histogram[float64])
	if !ok || len(hist.DataPoints) != 1 {
		t.Fatalf("permit wait: %#v", m[otelshaper.MetricPermitWait].Data)
	}
	dp := hist.DataPoints[0]
	if dp.Count != 3 || dp.Sum != 0.25 {
		t.Fatalf("permit wait: %d recorded summing %vs, want 3 summing 0.25s", dp.Count, dp.Sum)
	}
	if attrString(dp.Attributes) != attrString(attribute.NewSet(otelshaper.AttrLimiter.String("partner"))) {
		t.Fatalf("permit wait attributes %s", attrString(dp.Attributes))
	}
	if m[otelshaper.MetricPermitWait].Unit != "s" || m[otelshaper.MetricInFlight].Unit != "{permit}" {
		t.Fatalf("units %q and %q", m[otelshaper.MetricPermitWait].Unit, m[otelshaper.MetricInFlight].Unit)
	}

	for _, res := range []shaper.Reservation{r2, r3, r3} { // a second release counts nothing
		if err := res.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wantInFlight(t, h, 0, "after every release")

	// Cancel gives a reservation's permit back: counted down too.
	r4, err := r.Reserve(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	wantInFlight(t, h, 1, "after a Reserve")
	if err := r4.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	wantInFlight(t, h, 0, "after Cancel")

	// Wait cannot release: refused, as the shaper's own, and no permit is
	// left held.
	if err := r.Wait(ctx, "k", 1); !errors.Is(err, shaper.ErrInvalidConfig) {
		t.Fatalf("Wait on a shaper with permits: %v, want a *shaper.ConfigError", err)
	}
	wantInFlight(t, h, 0, "after the refused Wait")
	if st, err := s.Status(ctx, "k", 1); err != nil || st.Dimensions[0].InFlight != 0 {
		t.Fatalf("the store holds %+v permits (%v), want 0", st.Dimensions, err)
	}
}

// HoldsPermits is forwarded to the wrapped Reserver, through any nesting;
// one without the method, or nil, holds none.
func TestHoldsPermitsIsForwarded(t *testing.T) {
	h := newHarness(t)
	withPermits, _ := permitShaper(t, 1)
	plain, _ := newShaper(t, shaper.PerSecond(10))
	for _, c := range []struct {
		name string
		r    shaper.Reserver
		want bool
	}{
		{"over a shaper with permits", h.wrap(withPermits), true},
		{"nested", h.wrap(h.wrap(withPermits)), true},
		{"over Route", h.wrap(shaper.Route(func(string) shaper.Reserver { return withPermits })), true},
		{"over a shaper without", h.wrap(plain), false},
		{"over a Reserver without the method", h.wrap(waitOnly{withPermits}), false},
		{"over nil", h.wrap(nil), false},
	} {
		ph, ok := c.r.(shaper.PermitHolder)
		if !ok {
			t.Fatalf("%s: the wrapper is no shaper.PermitHolder", c.name)
		}
		if got := ph.HoldsPermits("k"); got != c.want {
			t.Fatalf("%s: HoldsPermits %v, want %v", c.name, got, c.want)
		}
	}
}

// AwaitTurn is forwarded to the wrapped Reserver, through any nesting and
// Route: a flow's turn, then the slot granted at it, not slept to; a
// Reserver without the method reserves at once.
func TestAwaitTurnIsForwarded(t *testing.T) {
	h := newHarness(t)
	ctx := shaper.WithFlow(context.Background(), shaper.Flow{Name: "tenant"})
	for _, c := range []struct {
		name string
		wrap func(shaper.Reserver) shaper.Reserver
	}{
		{"wrapped", func(r shaper.Reserver) shaper.Reserver { return h.wrap(r) }},
		{"nested", func(r shaper.Reserver) shaper.Reserver { return h.wrap(h.wrap(r)) }},
		{"over Route", func(r shaper.Reserver) shaper.Reserver {
			return h.wrap(shaper.Route(func(string) shaper.Reserver { return r }))
		}},
		{"over a Reserver without the method", func(r shaper.Reserver) shaper.Reserver { return h.wrap(waitOnly{r}) }},
	} {
		s, _ := newShaper(t, shaper.PerSecond(10))
		tt, ok := c.wrap(s).(shaper.TurnTaker)
		if !ok {
			t.Fatalf("%s: the wrapper is no shaper.TurnTaker", c.name)
		}
		for i, want := range []time.Duration{0, 100 * time.Millisecond} {
			r, err := tt.AwaitTurn(ctx, "k", 1)
			if err != nil || r.Delay != want {
				t.Fatalf("%s: AwaitTurn %d: delay %v, %v; want %v", c.name, i, r.Delay, err, want)
			}
		}
	}
	if _, err := h.wrap(nil).(shaper.TurnTaker).AwaitTurn(ctx, "k", 1); err == nil {
		t.Fatal("AwaitTurn over nil: no error")
	}
}
