package otelshaper_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type harness struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	h.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.spans))
	t.Cleanup(func() {
		_ = h.mp.Shutdown(context.Background())
		_ = h.tp.Shutdown(context.Background())
	})
	return h
}

func (h *harness) wrap(r shaper.Reserver, opts ...otelshaper.Option) shaper.Reserver {
	return otelshaper.Wrap(r, append([]otelshaper.Option{otelshaper.WithMeterProvider(h.mp), otelshaper.WithTracerProvider(h.tp)}, opts...)...)
}

// collect returns the metrics by name.
func (h *harness) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelshaper.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, otelshaper.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// attrString renders an attribute set as "k=v,k=v" in key order.
func attrString(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, fmt.Sprintf("%s=%s", kv.Key, kv.Value.String()))
	}
	sort.Strings(parts)
	return fmt.Sprint(parts)
}

// counts returns an int64 sum's points as attribute string -> value.
func counts(t *testing.T, m metricdata.Metrics) map[string]int64 {
	t.Helper()
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is %T, want an int64 sum", m.Name, m.Data)
	}
	out := map[string]int64{}
	for _, dp := range sum.DataPoints {
		out[attrString(dp.Attributes)] += dp.Value
	}
	return out
}

func outcomeAttrs(limiter, outcome string) string {
	return attrString(attribute.NewSet(otelshaper.AttrLimiter.String(limiter), otelshaper.AttrOutcome.String(outcome)))
}

func newShaper(t *testing.T, rate shaper.Rate, opts ...shaper.Option) (*shaper.Shaper, *timer.Fake) {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { _ = store.Close() })
	clock := timer.NewFake(time.Unix(1_700_000_000, 0))
	s, err := shaper.New(store, rate, append([]shaper.Option{shaper.WithClock(clock)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s, clock
}

// TestEveryOutcomeCountedOnce drives one call of each outcome through the
// wrapper and checks the counter, the delay histogram and the span events.
func TestEveryOutcomeCountedOnce(t *testing.T) {
	h := newHarness(t)
	s, clock := newShaper(t, shaper.PerSecond(10), shaper.WithName("partner"), shaper.WithMaxQueue(time.Second))
	r := h.wrap(s)
	ctx, span := h.tp.Tracer("test").Start(context.Background(), "caller")

	// accepted x3: delays 0, 100 ms, 200 ms.
	for i, want := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond} {
		res, err := r.Reserve(ctx, "k", 1)
		if err != nil || res.Delay != want {
			t.Fatalf("reserve %d: %v, %v; want %v", i, res.Delay, err, want)
		}
	}
	// queue_full: 8 more slots fit within MaxQueue 1 s, the next does not.
	for range 8 {
		if _, err := r.Reserve(ctx, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Reserve(ctx, "k", 1); !errors.Is(err, shaper.ErrQueueFull) {
		t.Fatalf("got %v, want queue full", err)
	}
	// deadline: Wait whose slot falls after the ctx deadline fails at once.
	dctx, cancelD := context.WithDeadline(ctx, time.Now().Add(50*time.Millisecond))
	defer cancelD()
	if err := r.Wait(dctx, "k2-busy", 1); err != nil { // first on a fresh key: no wait
		t.Fatal(err)
	}
	if err := r.Wait(dctx, "k2-busy", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want deadline", err)
	}
	// canceled: a Wait canceled while asleep.
	if _, err := r.Reserve(ctx, "k3", 1); err != nil {
		t.Fatal(err)
	}
	cctx, cancelC := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Wait(cctx, "k3", 1) }()
	if err := clock.WaitForTimers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	cancelC()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want canceled", err)
	}
	// error: a cost below 1.
	if _, err := r.Reserve(ctx, "k", 0); !errors.Is(err, shaper.ErrInvalidCost) {
		t.Fatalf("got %v, want invalid cost", err)
	}
	span.End()

	m := h.collect(t)
	got := counts(t, m[otelshaper.MetricReservations])
	want := map[string]int64{
		outcomeAttrs("partner", otelshaper.OutcomeAccepted):  3 + 8 + 1 + 1, // Reserves on k, the Wait on k2, the Reserve on k3
		outcomeAttrs("partner", otelshaper.OutcomeQueueFull): 1,
		outcomeAttrs("partner", otelshaper.OutcomeDeadline):  1,
		outcomeAttrs("partner", otelshaper.OutcomeCanceled):  1,
		outcomeAttrs("partner", otelshaper.OutcomeError):     1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("reservations\n got %v\nwant %v", got, want)
	}

	hist, ok := m[otelshaper.MetricDelay].Data.(metricdata.Histogram[float64])
	if !ok || len(hist.DataPoints) != 1 {
		t.Fatalf("delay: %#v", m[otelshaper.MetricDelay].Data)
	}
	dp := hist.DataPoints[0]
	if dp.Count != 13 {
		t.Errorf("delay count %d, want 13 accepted", dp.Count)
	}
	// Reserve delays 0, 0.1, ..., 1.0 s (11 of them) sum to 5.5 s; the first
	// Reserve on k3 and the Wait that did not sleep add 0.
	if dp.Sum < 5.5 || dp.Sum > 5.6 {
		t.Errorf("delay sum %v, want 5.5 s", dp.Sum)
	}
	if fmt.Sprint(dp.Bounds) != fmt.Sprint(otelshaper.DelayBuckets) || dp.Bounds[0] != 0.0001 || dp.Bounds[len(dp.Bounds)-1] != 3600 {
		t.Errorf("bounds %v", dp.Bounds)
	}
	// 0.1 s lands in the (0.05, 0.1] bucket: one Reserve delay.
	for i, b := range dp.Bounds {
		if b == 0.1 && dp.BucketCounts[i] != 1 {
			t.Errorf("bucket (0.05,0.1] holds %d, want 1", dp.BucketCounts[i])
		}
	}
	if attrString(dp.Attributes) != attrString(attribute.NewSet(otelshaper.AttrLimiter.String("partner"))) {
		t.Errorf("delay attributes %s", attrString(dp.Attributes))
	}

	// Store latency: one point per operation that ran (reserve, cancel).
	lat := m[otelshaper.MetricStoreDuration].Data.(metricdata.Histogram[float64])
	ops := map[string]uint64{}
	for _, dp := range lat.DataPoints {
		v, _ := dp.Attributes.Value(otelshaper.AttrOperation)
		ops[v.AsString()] += dp.Count
	}
	// 13 Reserves and 3 Waits reached the store (the bad cost did not); the
	// store refused the deadline Wait's slot itself (it took none), and the
	// canceled Wait gave its slot back.
	if ops["reserve"] != 16 || ops["cancel"] != 1 {
		t.Errorf("store operations %v, want reserve:16 cancel:1", ops)
	}
	if w := counts(t, m[otelshaper.MetricWaiting]); w[attrString(attribute.NewSet(otelshaper.AttrLimiter.String("partner")))] != 0 {
		t.Errorf("waiting %v, want 0 after every Wait returned", w)
	}

	// Spans: the caller's span has one event per call; each Wait ran in a
	// child span of it.
	var caller sdktrace.ReadOnlySpan
	var waits []sdktrace.ReadOnlySpan
	for _, sp := range h.spans.Ended() {
		switch sp.Name() {
		case "caller":
			caller = sp
		case "throttlekit.Wait":
			waits = append(waits, sp)
		}
	}
	if caller == nil {
		t.Fatal("caller span not recorded")
	}
	events := map[string]int{}
	for _, ev := range caller.Events() {
		set := attribute.NewSet(ev.Attributes...)
		o, _ := set.Value(otelshaper.AttrOutcome)
		if _, ok := set.Value(otelshaper.AttrDelay); !ok {
			t.Errorf("event %s without a delay", ev.Name)
		}
		events[ev.Name+"/"+o.AsString()]++
	}
	wantEvents := map[string]int{
		"throttlekit.reserve/accepted": 12, "throttlekit.reserve/queue_full": 1, "throttlekit.reserve/error": 1,
		"throttlekit.wait/accepted": 1, "throttlekit.wait/deadline": 1, "throttlekit.wait/canceled": 1,
	}
	if fmt.Sprint(events) != fmt.Sprint(wantEvents) {
		t.Errorf("events\n got %v\nwant %v", events, wantEvents)
	}
	if len(waits) != 3 {
		t.Fatalf("%d Wait spans, want 3", len(waits))
	}
	for _, w := range waits {
		if w.Parent().SpanID() != caller.SpanContext().SpanID() {
			t.Errorf("Wait span's parent %v, want the caller %v", w.Parent().SpanID(), caller.SpanContext().SpanID())
		}
	}
}

// TestKeysDoNotMultiplyStreams: 10,000 keys over two limiters, every outcome
// seen, make at most outcomes x limiters streams in each instrument.
func TestKeysDoNotMultiplyStreams(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var rs []shaper.Reserver
	for _, name := range []string{"a", "b"} {
		s, _ := newShaper(t, shaper.PerSecond(1), shaper.WithName(name), shaper.WithMaxQueue(time.Second))
		rs = append(rs, h.wrap(s))
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	dl, cancelDL := context.WithDeadline(ctx, time.Now().Add(time.Hour))
	defer cancelDL()
	for i := range 10_000 {
		r := rs[i%2]
		key := fmt.Sprintf("user-%d", i)
		for range 3 { // accepted, accepted (1 s), queue_full
			_, _ = r.Reserve(ctx, key, 1)
		}
		_, _ = r.Reserve(canceled, key, 1)
		_, _ = r.Reserve(ctx, key, -1)
		if i%100 == 0 {
			_ = r.Wait(dl, key, 1) // queue_full through Wait
		}
	}
	m := h.collect(t)
	for name, metric := range m {
		var n int
		switch d := metric.Data.(type) {
		case metricdata.Sum[int64]:
			n = len(d.DataPoints)
		case metricdata.Histogram[float64]:
			n = len(d.DataPoints)
		default:
			t.Fatalf("%s: %T", name, d)
		}
		if n > 5*2 {
			t.Errorf("%s has %d streams for 10,000 keys, want <= outcomes x limiters = 10", name, n)
		}
	}
	got := counts(t, m[otelshaper.MetricReservations])
	if len(got) != 8 { // per limiter: accepted, queue_full, canceled, error
		t.Errorf("streams %v", got)
	}
	if a := got[outcomeAttrs("a", otelshaper.OutcomeAccepted)]; a != 10_000 {
		t.Errorf("a accepted %d, want 10,000", a)
	}
}

// TestKeyAttribute: when asked for, the key is recorded.
func TestKeyAttribute(t *testing.T) {
	h := newHarness(t)
	s, _ := newShaper(t, shaper.PerSecond(10))
	r := h.wrap(s, otelshaper.WithKeyAttribute(true), otelshaper.WithName("named"))
	for _, k := range []string{"x", "y", "y"} {
		if _, err := r.Reserve(context.Background(), k, 1); err != nil {
			t.Fatal(err)
		}
	}
	got := counts(t, h.collect(t)[otelshaper.MetricReservations])
	key := func(k string) string {
		return attrString(attribute.NewSet(otelshaper.AttrLimiter.String("named"), otelshaper.AttrOutcome.String("accepted"), otelshaper.AttrKey.String(k)))
	}
	if got[key("x")] != 1 || got[key("y")] != 2 || len(got) != 2 {
		t.Errorf("got %v", got)
	}
}

// TestWaitingNow: a caller asleep in Wait is counted while it sleeps.
func TestWaitingNow(t *testing.T) {
	h := newHarness(t)
	s, clock := newShaper(t, shaper.PerSecond(1))
	r := h.wrap(s)
	if err := r.Wait(context.Background(), "k", 1); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- r.Wait(context.Background(), "k", 1) }()
	}
	if err := clock.WaitForTimers(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	lim := attrString(attribute.NewSet(otelshaper.AttrLimiter.String("throttlekit")))
	if w := counts(t, h.collect(t)[otelshaper.MetricWaiting])[lim]; w != 2 {
		t.Errorf("waiting %d, want 2", w)
	}
	for range 2 {
		clock.Advance(time.Second)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if w := counts(t, h.collect(t)[otelshaper.MetricWaiting])[lim]; w != 0 {
		t.Errorf("waiting %d after, want 0", w)
	}
}

// TestNoSpanOutsideATrace: a Wait without a recording parent makes no span.
func TestNoSpanOutsideATrace(t *testing.T) {
	h := newHarness(t)
	s, _ := newShaper(t, shaper.PerSecond(10))
	r := h.wrap(s)
	if err := r.Wait(context.Background(), "k", 1); err != nil {
		t.Fatal(err)
	}
	if n := len(h.spans.Ended()) + len(h.spans.Started()); n != 0 {
		t.Errorf("%d spans, want none", n)
	}
}

// TestPauseCounted: pauses are counted and reach the wrapped shaper.
func TestPauseCounted(t *testing.T) {
	h := newHarness(t)
	s, _ := newShaper(t, shaper.PerSecond(10))
	r := h.wrap(s)
	ctx := context.Background()
	if err := r.Pause(ctx, "k", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := r.Pause(ctx, "k", 0); err != nil { // a no-op, not counted
		t.Fatal(err)
	}
	res, err := r.Reserve(ctx, "k", 1)
	if err != nil || res.Delay != 5*time.Second {
		t.Fatalf("after pause: %v %v", res.Delay, err)
	}
	m := h.collect(t)
	if n := counts(t, m[otelshaper.MetricPauses]); fmt.Sprint(n) != "map[[throttlekit.limiter=throttlekit]:1]" {
		t.Errorf("pauses %v", n)
	}
}

// TestNilReserver: Wrap(nil) fails every call with a typed error.
func TestNilReserver(t *testing.T) {
	h := newHarness(t)
	r := h.wrap(nil)
	var ce *shaper.ConfigError
	if _, err := r.Reserve(context.Background(), "k", 1); !errors.As(err, &ce) {
		t.Errorf("Reserve: %v", err)
	}
	if err := r.Wait(context.Background(), "k", 1); !errors.As(err, &ce) {
		t.Errorf("Wait: %v", err)
	}
	if err := r.Pause(context.Background(), "k", time.Second); !errors.As(err, &ce) {
		t.Errorf("Pause: %v", err)
	}
	if _, err := r.(*otelshaper.Reserver).Status(context.Background(), "k", 1); !errors.As(err, &ce) {
		t.Errorf("Status: %v", err)
	}
}

// TestStatusForwarded: a wrapped shaper reports its status through the
// wrapper, and a wrapped Reserver without Status says so with a typed error.
func TestStatusForwarded(t *testing.T) {
	h := newHarness(t)
	s, _ := newShaper(t, shaper.PerSecond(10).WithBurst(5))
	r := h.wrap(s).(*otelshaper.Reserver)
	ctx := context.Background()
	if _, err := r.Reserve(ctx, "k", 2); err != nil {
		t.Fatal(err)
	}
	st, err := r.Status(ctx, "k", 1)
	if err != nil || st.Remaining != 3 {
		t.Fatalf("Status through otelshaper.Wrap: %+v %v, want 3 remaining", st, err)
	}
	var ce *shaper.ConfigError
	if _, err := h.wrap(h.wrap(waitOnly{s})).(*otelshaper.Reserver).Status(ctx, "k", 1); !errors.As(err, &ce) {
		t.Fatalf("a Reserver without Status: %v", err)
	}
}

// waitOnly hides every method of a Reserver but the interface's.
type waitOnly struct{ shaper.Reserver }

// TestDegradedCounted: a Redis store that cannot reach Redis serves by its
// failure policy, and each such call is counted; store latency is recorded
// for the Redis round trips.
func TestDegradedCounted(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	defer client.Close()
	store := redisstore.New(client, redisstore.WithFailurePolicy(redisstore.FailOpen), redisstore.WithTimeout(100*time.Millisecond))
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(100), shaper.WithName("fleet"))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	r := h.wrap(s)
	ctx := context.Background()
	if _, err := r.Reserve(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for range 3 {
		if _, err := r.Reserve(ctx, "k", 1); err != nil {
			t.Fatalf("FailOpen returned %v", err)
		}
	}
	m := h.collect(t)
	deg := counts(t, m[otelshaper.MetricDegraded])
	want := attrString(attribute.NewSet(otelshaper.AttrLimiter.String("fleet"), otelshaper.AttrOperation.String("reserve")))
	if deg[want] != 3 || len(deg) != 1 {
		t.Errorf("degraded %v, want 3 under %s", deg, want)
	}
	if got := store.Degraded(); got != 3 {
		t.Errorf("store.Degraded() = %d, want 3", got)
	}
	lat := m[otelshaper.MetricStoreDuration].Data.(metricdata.Histogram[float64])
	if len(lat.DataPoints) != 1 || lat.DataPoints[0].Count != 4 {
		t.Errorf("store latency points %+v, want 4 reserve operations", lat.DataPoints)
	}
}

// TestClampForwarded: a clamp through the wrapper reaches the shaper, and a
// wrapped Reserver without Clamp says so with a typed error.
func TestClampForwarded(t *testing.T) {
	h := newHarness(t)
	s, clock := newShaper(t, shaper.PerSecond(10))
	r := h.wrap(s).(*otelshaper.Reserver)
	ctx := context.Background()
	if err := r.Clamp(ctx, "k", 2, 10*time.Second); err != nil { // 5 s apart, slower than 10/s
		t.Fatal(err)
	}
	if _, err := r.Reserve(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Status(ctx, "k", 1); err != nil || st.Next.Sub(clock.Now()) != 5*time.Second {
		t.Fatalf("after a clamp of 2 in 10 s through otelshaper.Wrap: %+v %v, want the next in 5 s", st, err)
	}
	var ce *shaper.ConfigError
	if err := h.wrap(waitOnly{s}).(*otelshaper.Reserver).Clamp(ctx, "k", 1, time.Second); !errors.As(err, &ce) {
		t.Fatalf("a Reserver without Clamp: %v", err)
	}
	if err := h.wrap(nil).(*otelshaper.Reserver).Clamp(ctx, "k", 1, time.Second); !errors.As(err, &ce) {
		t.Fatalf("a nil Reserver: %v", err)
	}
}
