package otelshaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	otelapi "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	itrace "github.com/throttlekit/throttlekit-go/internal/trace"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/throttlekit/throttlekit-go/otelshaper"

// The instruments Wrap records; see docs/OTEL.md.
const (
	// MetricReservations counts Reserve and Wait calls by outcome.
	MetricReservations = "throttlekit.reservations"
	// MetricDelay is the wait granted to accepted calls, in seconds.
	MetricDelay = "throttlekit.delay"
	// MetricWaiting is the number of callers inside Wait now.
	MetricWaiting = "throttlekit.waiting"
	// MetricStoreDuration is the latency of each store operation, in seconds.
	MetricStoreDuration = "throttlekit.store.duration"
	// MetricDegraded counts operations served by the Redis store's failure
	// policy because Redis could not serve them.
	MetricDegraded = "throttlekit.degraded"
	// MetricPauses counts Pause calls (a partner's Retry-After, say).
	MetricPauses = "throttlekit.pauses"
	// MetricInFlight is the number of in-flight permits held by this
	// process's calls now (shaper.Dimension.InFlight): up when a call takes
	// one, down when it is released.
	MetricInFlight = "throttlekit.inflight"
	// MetricPermitWait is how long calls waited for an in-flight permit,
	// in seconds (0 when one was free).
	MetricPermitWait = "throttlekit.permit.wait"
	// MetricLearnedRate is a learning shaper's rate for a key (requests
	// per second; see shaper.WithLearning), recorded when the partner's
	// feedback changes it, with the event that did (AttrEvent).
	MetricLearnedRate = "throttlekit.learned.rate"
	// MetricLearnedChanges counts those changes, by event.
	MetricLearnedChanges = "throttlekit.learned.changes"
)

// The attributes Wrap sets.
const (
	// AttrLimiter is the limiter's name (WithName).
	AttrLimiter = attribute.Key("throttlekit.limiter")
	// AttrOutcome is one of the Outcome values.
	AttrOutcome = attribute.Key("throttlekit.outcome")
	// AttrOperation is a store operation: reserve, cancel, pause, reset or
	// pause_left.
	AttrOperation = attribute.Key("throttlekit.operation")
	// AttrKey is the caller's key, set only with WithKeyAttribute(true).
	AttrKey = attribute.Key("throttlekit.key")
	// AttrDelay is a span event's delay in seconds.
	AttrDelay = attribute.Key("throttlekit.delay")
	// AttrEvent is what changed a learned rate: "refused", "advertised",
	// "remaining", "paused" or "started" (see shaper.Learned).
	AttrEvent = attribute.Key("throttlekit.event")
	// AttrRate is a span event's learned rate, in requests per second.
	AttrRate = attribute.Key("throttlekit.rate")
)

// The values of AttrOutcome.
const (
	OutcomeAccepted  = "accepted"   // a slot was granted (Wait: the caller departed)
	OutcomeQueueFull = "queue_full" // refused: the wait would exceed MaxQueue (shaper.ErrQueueFull)
	OutcomeDeadline  = "deadline"   // the slot falls after the ctx deadline, or the deadline passed while waiting
	OutcomeCanceled  = "canceled"   // the ctx was canceled
	OutcomeError     = "error"      // any other error: a bad key or cost, the store failing
)

// Outcome classifies the error of a Reserve or Wait call as one of the
// Outcome values.
func Outcome(err error) string {
	switch {
	case err == nil:
		return OutcomeAccepted
	case errors.Is(err, shaper.ErrQueueFull):
		return OutcomeQueueFull
	case errors.Is(err, context.DeadlineExceeded):
		return OutcomeDeadline
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	}
	return OutcomeError
}

var outcomes = [...]string{OutcomeAccepted, OutcomeQueueFull, OutcomeDeadline, OutcomeCanceled, OutcomeError}

// DelayBuckets are the delay histogram's bucket boundaries, in seconds: from
// 100 µs to an hour.
var DelayBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
}

// StoreBuckets are the store latency histogram's bucket boundaries, in
// seconds: from 10 µs (the memory store) to 2.5 s.
var StoreBuckets = []float64{
	0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
	0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
}

// Option configures Wrap.
type Option func(*config)

type config struct {
	mp      metric.MeterProvider
	tp      trace.TracerProvider
	name    string
	withKey bool
}

// WithMeterProvider sets the meter provider; the default is the global one
// (go.opentelemetry.io/otel.GetMeterProvider) at the time of Wrap.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets the tracer provider for Wait's child spans; the
// default is the global one at the time of Wrap.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithName sets the limiter name recorded as AttrLimiter. The default is the
// wrapped Reserver's Name() (shaper.WithName) when it has one, else
// "throttlekit".
func WithName(name string) Option {
	return func(c *config) { c.name = name }
}

// WithKeyAttribute records the caller's key as AttrKey on the reservation
// counter, the delay histogram and the span events. It is off by default: one
// metric stream per key can overwhelm a metrics backend when keys are user
// or tenant IDs. Turn it on only for a small, fixed set of keys.
func WithKeyAttribute(on bool) Option {
	return func(c *config) { c.withKey = on }
}

// Reserver is the shaper.Reserver that Wrap returns.
type Reserver struct {
	inner   shaper.Reserver
	name    string
	withKey bool
	tracer  trace.Tracer
	trace   *itrace.Hooks

	reservations metric.Int64Counter
	delay        metric.Float64Histogram
	waiting      metric.Int64UpDownCounter
	storeLat     metric.Float64Histogram
	degraded     metric.Int64Counter
	pauses       metric.Int64Counter
	inflight     metric.Int64UpDownCounter
	permitWait   metric.Float64Histogram
	learnedRate  metric.Float64Gauge
	learned      metric.Int64Counter

	limiter   attribute.KeyValue
	byOutcome map[string]metric.MeasurementOption // limiter + outcome, built once
	limOnly   metric.MeasurementOption
	byOp      map[string]metric.MeasurementOption // limiter + store operation
}

var (
	_ shaper.Reserver     = (*Reserver)(nil)
	_ shaper.Acquirer     = (*Reserver)(nil)
	_ shaper.StatusReader = (*Reserver)(nil)
	_ shaper.Clamper      = (*Reserver)(nil)
	_ shaper.PermitHolder = (*Reserver)(nil)
	_ shaper.TurnTaker    = (*Reserver)(nil)
	_ shaper.Learner      = (*Reserver)(nil)
	_ shaper.Spacer       = (*Reserver)(nil)
)

// Wrap returns a Reserver that records OpenTelemetry metrics and span events
// for every call to r and delegates the call to r unchanged. It composes with
// everything that takes a shaper.Reserver (transport.New, queue.New).
//
// The metrics (docs/OTEL.md) carry the limiter name and, where it applies, the
// outcome or store operation, so that their stream count is bounded by
// outcomes x limiter names whatever the number of keys, unless
// WithKeyAttribute is on. Store latency, the failure policy's use and the
// in-flight permits taken and released (MetricInFlight, MetricPermitWait)
// are observed through hooks in the call's context, so they are recorded
// when r is a *shaper.Shaper or decorates one. A permit is counted down
// when its reservation is released, from whatever context: the hooks
// travel with the reservation.
//
// Wrap returns a *Reserver. An instrument the meter provider fails to create
// is reported to otel.Handle and replaced by a no-op one, as OpenTelemetry
// instrumentation does. A nil r gives a Reserver whose every call fails with
// a *shaper.ConfigError.
func Wrap(r shaper.Reserver, opts ...Option) shaper.Reserver {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.mp == nil {
		c.mp = otelapi.GetMeterProvider()
	}
	if c.tp == nil {
		c.tp = otelapi.GetTracerProvider()
	}
	if c.name == "" && r != nil {
		if n, ok := r.(interface{ Name() string }); ok {
			c.name = n.Name()
		}
	}
	if c.name == "" {
		c.name = "throttlekit"
	}
	w := &Reserver{inner: r, name: c.name, withKey: c.withKey, tracer: c.tp.Tracer(ScopeName)}
	m := c.mp.Meter(ScopeName)
	var errs [10]error
	w.reservations, errs[0] = m.Int64Counter(MetricReservations,
		metric.WithDescription("Reserve and Wait calls, by outcome."), metric.WithUnit("{reservation}"))
	w.delay, errs[1] = m.Float64Histogram(MetricDelay,
		metric.WithDescription("How long accepted calls wait before departing: Reserve's granted delay, Wait's time to departure."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(DelayBuckets...))
	w.waiting, errs[2] = m.Int64UpDownCounter(MetricWaiting,
		metric.WithDescription("Callers inside Wait now."), metric.WithUnit("{request}"))
	w.storeLat, errs[3] = m.Float64Histogram(MetricStoreDuration,
		metric.WithDescription("Latency of each store operation."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(StoreBuckets...))
	w.degraded, errs[4] = m.Int64Counter(MetricDegraded,
		metric.WithDescription("Store operations served by the failure policy because Redis could not serve them."),
		metric.WithUnit("{operation}"))
	w.pauses, errs[5] = m.Int64Counter(MetricPauses,
		metric.WithDescription("Pause calls that succeeded."), metric.WithUnit("{pause}"))
	w.inflight, errs[6] = m.Int64UpDownCounter(MetricInFlight,
		metric.WithDescription("In-flight permits held by this process's calls now."), metric.WithUnit("{permit}"))
	w.permitWait, errs[7] = m.Float64Histogram(MetricPermitWait,
		metric.WithDescription("How long calls waited for an in-flight permit."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(DelayBuckets...))
	w.learnedRate, errs[8] = m.Float64Gauge(MetricLearnedRate,
		metric.WithDescription("A learning shaper's rate for a key, when the partner's feedback changes it."), metric.WithUnit("{request}/s"))
	w.learned, errs[9] = m.Int64Counter(MetricLearnedChanges,
		metric.WithDescription("Changes of a learning shaper's rate, by the event that made them."), metric.WithUnit("{change}"))
	if err := errors.Join(errs[:]...); err != nil {
		otelapi.Handle(err) // and record nothing where the meter gave no instrument
		orNoop(&w.reservations, metric.Int64Counter(noop.Int64Counter{}))
		orNoop(&w.delay, metric.Float64Histogram(noop.Float64Histogram{}))
		orNoop(&w.waiting, metric.Int64UpDownCounter(noop.Int64UpDownCounter{}))
		orNoop(&w.storeLat, metric.Float64Histogram(noop.Float64Histogram{}))
		orNoop(&w.degraded, metric.Int64Counter(noop.Int64Counter{}))
		orNoop(&w.pauses, metric.Int64Counter(noop.Int64Counter{}))
		orNoop(&w.inflight, metric.Int64UpDownCounter(noop.Int64UpDownCounter{}))
		orNoop(&w.permitWait, metric.Float64Histogram(noop.Float64Histogram{}))
		orNoop(&w.learnedRate, metric.Float64Gauge(noop.Float64Gauge{}))
		orNoop(&w.learned, metric.Int64Counter(noop.Int64Counter{}))
	}
	w.limiter = AttrLimiter.String(c.name)
	w.limOnly = metric.WithAttributeSet(attribute.NewSet(w.limiter))
	w.byOutcome = make(map[string]metric.MeasurementOption, len(outcomes))
	for _, o := range outcomes {
		w.byOutcome[o] = metric.WithAttributeSet(attribute.NewSet(w.limiter, AttrOutcome.String(o)))
	}
	w.byOp = map[string]metric.MeasurementOption{}
	for _, op := range []string{"reserve", "cancel", "settle", "pause", "reset", "pause_left"} {
		w.byOp[op] = metric.WithAttributeSet(attribute.NewSet(w.limiter, AttrOperation.String(op)))
	}
	w.trace = &itrace.Hooks{
		StoreDone: func(ctx context.Context, op string, took time.Duration, _ error) {
			w.storeLat.Record(ctx, took.Seconds(), w.opAttrs(op))
		},
		Degraded: func(ctx context.Context, op string) {
			w.degraded.Add(ctx, 1, w.opAttrs(op))
		},
		PermitTaken: func(ctx context.Context, waited time.Duration) {
			w.inflight.Add(ctx, 1, w.limOnly)
			w.permitWait.Record(ctx, waited.Seconds(), w.limOnly)
		},
		PermitReleased: func(ctx context.Context) {
			w.inflight.Add(ctx, -1, w.limOnly)
		},
		Learned: func(ctx context.Context, key string, rate float64, event string) {
			kv := []attribute.KeyValue{w.limiter, AttrEvent.String(event)}
			if w.withKey {
				kv = append(kv, AttrKey.String(key))
			}
			attrs := metric.WithAttributeSet(attribute.NewSet(kv...))
			w.learnedRate.Record(ctx, rate, attrs)
			w.learned.Add(ctx, 1, attrs)
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				span.AddEvent("throttlekit.learned", trace.WithAttributes(w.limiter, AttrEvent.String(event), AttrRate.Float64(rate)))
			}
		},
	}
	return w
}

// errNil is what every call of a Reserver wrapping nil returns.
var errNil = &shaper.ConfigError{Algorithm: "otelshaper", Field: "Reserver", Value: nil, Reason: "Wrap was given a nil Reserver"}

// Unwrap returns the wrapped Reserver.
func (w *Reserver) Unwrap() shaper.Reserver { return w.inner }

// Name returns the limiter name recorded on every measurement.
func (w *Reserver) Name() string { return w.name }

func (w *Reserver) opAttrs(op string) metric.MeasurementOption {
	if a, ok := w.byOp[op]; ok {
		return a
	}
	return metric.WithAttributeSet(attribute.NewSet(w.limiter, AttrOperation.String(op)))
}

// attrs returns the measurement attributes for an outcome (or the limiter
// alone for outcome ""), with the key when WithKeyAttribute is on.
func (w *Reserver) attrs(outcome, key string) metric.MeasurementOption {
	if !w.withKey {
		if outcome == "" {
			return w.limOnly
		}
		return w.byOutcome[outcome]
	}
	if outcome == "" {
		return metric.WithAttributeSet(attribute.NewSet(w.limiter, AttrKey.String(key)))
	}
	return metric.WithAttributeSet(attribute.NewSet(w.limiter, AttrOutcome.String(outcome), AttrKey.String(key)))
}

// record counts one call and adds the event to the caller's span.
func (w *Reserver) record(ctx context.Context, span trace.Span, event, key string, delay time.Duration, err error) string {
	outcome := Outcome(err)
	w.reservations.Add(ctx, 1, w.attrs(outcome, key))
	if err == nil {
		w.delay.Record(ctx, delay.Seconds(), w.attrs("", key))
	}
	if span.IsRecording() {
		attrs := []attribute.KeyValue{w.limiter, AttrOutcome.String(outcome), AttrDelay.Float64(delay.Seconds())}
		if w.withKey {
			attrs = append(attrs, AttrKey.String(key))
		}
		span.AddEvent(event, trace.WithAttributes(attrs...))
	}
	return outcome
}

// Reserve delegates to the wrapped Reserver's Reserve and records its outcome
// and granted delay; the caller's span gets a "throttlekit.reserve" event.
// The reservation's in-flight permit, if it holds one, is counted in
// MetricInFlight until it is released.
func (w *Reserver) Reserve(ctx context.Context, key string, cost int64) (shaper.Reservation, error) {
	if w.inner == nil {
		w.record(ctx, trace.SpanFromContext(ctx), "throttlekit.reserve", key, 0, errNil)
		return shaper.Reservation{}, errNil
	}
	res, err := w.inner.Reserve(itrace.With(ctx, w.trace), key, cost)
	w.record(ctx, trace.SpanFromContext(ctx), "throttlekit.reserve", key, res.Delay, err)
	return res, err
}

// Wait delegates to the wrapped Reserver's Wait, counting the caller in
// MetricWaiting meanwhile, and records its outcome and the time from the call
// to departure. The caller's span gets a "throttlekit.wait" event; when that
// span is recording, Wait also runs in a child span "throttlekit.Wait" (no
// root spans are made for calls outside a trace). A wrapped Reserver that
// holds in-flight permits for key (see HoldsPermits) refuses it, as a
// *shaper.Shaper does: its caller could not release.
func (w *Reserver) Wait(ctx context.Context, key string, cost int64) error {
	_, err := w.wait(ctx, key, cost, !w.HoldsPermits(key))
	return err
}

// Acquire is Wait that returns the reservation the request departs on (see
// shaper.Shaper.Acquire), recorded as Wait is. A wrapped Reserver without an
// Acquire method waits, and the zero Reservation is returned: no shaper
// granted it, so it settles nothing (transport.Settle fails on it with a
// *shaper.ConfigError). The reservation's in-flight permit, if it holds
// one, is counted in MetricInFlight until it is released, and the wait for
// it recorded in MetricPermitWait.
func (w *Reserver) Acquire(ctx context.Context, key string, cost int64) (shaper.Reservation, error) {
	return w.wait(ctx, key, cost, true)
}

// AwaitTurn delegates to the wrapped Reserver's AwaitTurn (see
// shaper.Shaper.AwaitTurn), its store calls recorded as the shaper's
// always are; a wrapped Reserver without the method reserves at once
// (Reserve). The request's departure is its caller's: no wait is recorded.
func (w *Reserver) AwaitTurn(ctx context.Context, key string, cost int64) (shaper.Reservation, error) {
	if w.inner == nil {
		return shaper.Reservation{}, errNil
	}
	if t, ok := w.inner.(shaper.TurnTaker); ok {
		return t.AwaitTurn(itrace.With(ctx, w.trace), key, cost)
	}
	return w.inner.Reserve(itrace.With(ctx, w.trace), key, cost)
}

// HoldsPermits reports whether the wrapped Reserver's reservations of key
// hold an in-flight permit (see shaper.Shaper.HoldsPermits); one without
// the method holds none.
func (w *Reserver) HoldsPermits(key string) bool {
	h, ok := w.inner.(shaper.PermitHolder)
	return ok && h.HoldsPermits(key)
}

// wait is Acquire, and Wait with acquire false (the wrapped Reserver's
// Wait is called then, not its Acquire).
func (w *Reserver) wait(ctx context.Context, key string, cost int64, acquire bool) (shaper.Reservation, error) {
	parent := trace.SpanFromContext(ctx)
	if w.inner == nil {
		w.record(ctx, parent, "throttlekit.wait", key, 0, errNil)
		return shaper.Reservation{}, errNil
	}
	var child trace.Span
	inner := ctx
	if parent.IsRecording() {
		inner, child = w.tracer.Start(ctx, "throttlekit.Wait", trace.WithAttributes(w.limiter))
	}
	w.waiting.Add(ctx, 1, w.limOnly)
	start := time.Now()
	var res shaper.Reservation
	var err error
	if a, ok := w.inner.(shaper.Acquirer); ok && acquire {
		res, err = a.Acquire(itrace.With(inner, w.trace), key, cost)
	} else {
		err = w.inner.Wait(itrace.With(inner, w.trace), key, cost)
	}
	took := time.Since(start)
	w.waiting.Add(ctx, -1, w.limOnly)
	outcome := w.record(ctx, parent, "throttlekit.wait", key, took, err)
	if child != nil {
		child.SetAttributes(AttrOutcome.String(outcome), AttrDelay.Float64(took.Seconds()))
		if err != nil {
			child.SetStatus(codes.Error, outcome)
			if outcome == OutcomeError {
				child.RecordError(err)
			}
		}
		child.End()
	}
	return res, err
}

// Pause delegates to the wrapped Reserver's Pause, counts a successful pause
// in MetricPauses and adds a "throttlekit.pause" event to the caller's span.
func (w *Reserver) Pause(ctx context.Context, key string, d time.Duration) error {
	if w.inner == nil {
		return errNil
	}
	err := w.inner.Pause(itrace.With(ctx, w.trace), key, d)
	if err == nil && d > 0 {
		w.pauses.Add(ctx, 1, w.limOnly)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("throttlekit.pause", trace.WithAttributes(w.limiter, AttrDelay.Float64(d.Seconds()), attribute.Bool("throttlekit.error", err != nil)))
	}
	return err
}

// Learn delegates the partner's feedback to the wrapped Reserver (see
// shaper.Shaper.Learn), recording a learned rate it changes
// (MetricLearnedRate, MetricLearnedChanges, and a "throttlekit.learned"
// span event). A wrapped Reserver that does not learn is paused for
// fb.Pause, or clamped to the remaining count when it can be.
func (w *Reserver) Learn(ctx context.Context, key string, fb shaper.Feedback) error {
	if w.inner == nil {
		return errNil
	}
	tctx := itrace.With(ctx, w.trace)
	if l, ok := w.inner.(shaper.Learner); ok {
		err := l.Learn(tctx, key, fb)
		if err == nil && fb.Pause > 0 {
			w.pauses.Add(ctx, 1, w.limOnly)
		}
		return err
	}
	if fb.Pause > 0 {
		return w.Pause(ctx, key, min(fb.Pause, shaper.MaxPause))
	}
	if c, ok := w.inner.(shaper.Clamper); ok && fb.HasRemaining {
		return c.Clamp(tctx, key, fb.Remaining, min(fb.Reset, shaper.MaxPause))
	}
	return nil
}

// Space delegates to the wrapped Reserver's Space (see
// shaper.Shaper.Space), its store call recorded; one without the method
// keeps no margin.
func (w *Reserver) Space(ctx context.Context, key string, margin time.Duration) error {
	if w.inner == nil {
		return errNil
	}
	if sp, ok := w.inner.(shaper.Spacer); ok {
		return sp.Space(itrace.With(ctx, w.trace), key, margin)
	}
	return nil
}

// orNoop sets *inst to none, a no-op instrument, when the meter returned
// no instrument (with an error).
func orNoop[T comparable](inst *T, none T) {
	var zero T
	if *inst == zero {
		*inst = none
	}
}

// Status delegates to the wrapped Reserver's Status (see
// shaper.Shaper.Status), with the store's own trace; it records no metric
// (it decides nothing). A wrapped Reserver without a Status method fails
// with a *shaper.ConfigError.
func (w *Reserver) Status(ctx context.Context, key string, cost int64) (shaper.Status, error) {
	if w.inner == nil {
		return shaper.Status{}, errNil
	}
	st, ok := w.inner.(shaper.StatusReader)
	if !ok {
		return shaper.Status{}, &shaper.ConfigError{Algorithm: "otelshaper", Field: "Reserver", Value: fmt.Sprintf("%T", w.inner), Reason: "the wrapped Reserver has no Status method"}
	}
	return st.Status(itrace.With(ctx, w.trace), key, cost)
}

// Clamp delegates to the wrapped Reserver's Clamp (see
// shaper.Shaper.Clamp), with the store's own trace. A wrapped Reserver
// without a Clamp method fails with a *shaper.ConfigError.
func (w *Reserver) Clamp(ctx context.Context, key string, remaining int64, reset time.Duration) error {
	if w.inner == nil {
		return errNil
	}
	c, ok := w.inner.(shaper.Clamper)
	if !ok {
		return &shaper.ConfigError{Algorithm: "otelshaper", Field: "Reserver", Value: fmt.Sprintf("%T", w.inner), Reason: "the wrapped Reserver has no Clamp method"}
	}
	return c.Clamp(itrace.With(ctx, w.trace), key, remaining, reset)
}
