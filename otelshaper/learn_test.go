package otelshaper_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// The partner's feedback reaches a learning shaper through the wrapper
// (and through Route under it), and every change of the learned rate is
// recorded: the rate as a gauge and a count of changes, by event. Space
// is forwarded too; over a Reserver that does not learn, a pause still
// pauses.
func TestLearnIsForwardedAndRecorded(t *testing.T) {
	h := newHarness(t)
	s, clock := newShaper(t, shaper.PerSecond(100), shaper.WithName("partner"), shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10)}))
	w := h.wrap(shaper.Route(func(string) shaper.Reserver { return s }))
	l, ok := w.(shaper.Learner)
	if !ok {
		t.Fatal("the wrapper is no shaper.Learner")
	}
	ctx := context.Background()
	if err := l.Learn(ctx, "k", shaper.Feedback{Policy: shaper.PerSecond(40)}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	if err := l.Learn(ctx, "k", shaper.Feedback{Refused: true, Departed: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	m := h.collect(t)
	changes := counts(t, m[otelshaper.MetricLearnedChanges])
	for _, ev := range []string{"advertised", "refused"} {
		key := attrString(attribute.NewSet(otelshaper.AttrLimiter.String("throttlekit"), otelshaper.AttrEvent.String(ev)))
		if changes[key] != 1 {
			t.Errorf("changes by %s: %v, want 1 (%v)", ev, changes[key], changes)
		}
	}
	g, ok := m[otelshaper.MetricLearnedRate].Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) != 2 {
		t.Fatalf("%s: %#v, want a gauge with a point per event", otelshaper.MetricLearnedRate, m[otelshaper.MetricLearnedRate].Data)
	}
	for _, dp := range g.DataPoints {
		ev, _ := dp.Attributes.Value(otelshaper.AttrEvent)
		want := map[string]float64{"advertised": 40, "refused": 40 / 2 * 0.9}[ev.AsString()] // unmeasured: halved, then 0.9 of it
		if dp.Value < want-1e-9 || dp.Value > want+1e-9 {
			t.Errorf("learned rate after %s: %v, want %v", ev.AsString(), dp.Value, want)
		}
	}
	if sp, ok := w.(shaper.Spacer); !ok || sp.Space(ctx, "k", time.Millisecond) != nil {
		t.Fatal("the wrapper does not forward Space")
	}
	// Over a Reserver that does not learn: the pause is the feedback.
	plain, _ := newShaper(t, shaper.PerSecond(10), shaper.WithName("plain"))
	pw := h.wrap(waitOnly{plain}).(shaper.Learner)
	if err := pw.Learn(ctx, "k", shaper.Feedback{Refused: true, Pause: time.Second}); err != nil {
		t.Fatal(err)
	}
	if st, err := plain.Status(ctx, "k", 1); err != nil || st.PausedUntil.IsZero() {
		t.Fatalf("feedback with a pause over a plain Reserver: %+v, %v; want the key paused", st, err)
	}
}
