package shaper

import (
	"context"
	"sync/atomic"
	"time"
)

// Trace holds hooks that observe what a Shaper does for the calls made with
// one context, in the manner of net/http/httptrace: attach it with WithTrace
// and pass the returned context to Reserve, Wait, Allow, Pause, Reset or
// Reservation.Cancel. The otel package uses it to measure store latency and
// the failure policy's use; most programs never touch it.
//
// Hooks run synchronously on the caller's goroutine, so they must be quick;
// a Trace shared by several goroutines must be safe for concurrent use. A nil
// hook is skipped.
type Trace struct {
	// StoreDone is called after each store operation with its name
	// ("reserve", "cancel", "pause", "reset" or "pause_left"), how long it
	// took on the real clock, and its error; ctx is the caller's.
	StoreDone func(ctx context.Context, op string, took time.Duration, err error)
	// Degraded is called when the RedisStore's failure policy served an
	// operation because Redis could not (see WithFailurePolicy); op is named
	// as for StoreDone.
	Degraded func(ctx context.Context, op string)
}

type traceKey struct{}

// tracing is set by the first WithTrace, so that programs that never trace
// pay one atomic load per call, not a context lookup.
var tracing atomic.Bool

// WithTrace returns a copy of ctx that carries t. A nil t returns ctx.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	if t == nil {
		return ctx
	}
	tracing.Store(true)
	return context.WithValue(ctx, traceKey{}, t)
}

// ContextTrace returns the Trace attached to ctx by WithTrace, or nil.
func ContextTrace(ctx context.Context) *Trace {
	if !tracing.Load() {
		return nil
	}
	t, _ := ctx.Value(traceKey{}).(*Trace)
	return t
}

// storeTimer starts timing one store operation for ctx's trace; done is a
// no-op when ctx carries none.
type storeTimer struct {
	ctx   context.Context
	t     *Trace
	start time.Time
}

func startStore(ctx context.Context) storeTimer {
	t := ContextTrace(ctx)
	if t == nil || t.StoreDone == nil {
		return storeTimer{}
	}
	return storeTimer{ctx: ctx, t: t, start: time.Now()}
}

func (st storeTimer) done(op string, err error) {
	if st.t != nil {
		st.t.StoreDone(st.ctx, op, time.Since(st.start), err)
	}
}

// traceDegraded reports one use of the failure policy to ctx's trace.
func traceDegraded(ctx context.Context, op string) {
	if t := ContextTrace(ctx); t != nil && t.Degraded != nil {
		t.Degraded(ctx, op)
	}
}
