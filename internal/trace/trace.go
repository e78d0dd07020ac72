// Package trace carries hooks that observe what a shaper does for the calls
// made with one context, in the manner of net/http/httptrace: the otel
// package attaches them to measure store latency and the failure policy's
// use. It is internal: a seam between two of ThrottleKit's packages, not an
// API.
package trace

import (
	"context"
	"sync/atomic"
	"time"
)

// Hooks observe a shaper's store operations. Hooks run synchronously on the
// caller's goroutine, so they must be quick; a nil hook is skipped.
type Hooks struct {
	// StoreDone is called after each store operation with its name
	// ("reserve", "cancel", "pause", "reset" or "pause_left"), how long it
	// took on the real clock, and its error; ctx is the caller's.
	StoreDone func(ctx context.Context, op string, took time.Duration, err error)
	// Degraded is called when the Redis store's failure policy served an
	// operation because Redis could not; op is named as for StoreDone.
	Degraded func(ctx context.Context, op string)
	// PermitTaken is called when a request takes an in-flight permit,
	// with how long it waited for one (0 when one was free).
	PermitTaken func(ctx context.Context, waited time.Duration)
	// PermitReleased is called when that permit is released, with the ctx
	// of the call that took it (no longer cancelled with it).
	PermitReleased func(ctx context.Context)
	// Learned is called when a learning shaper's feedback call leaves a
	// key's learned rate (requests per second) changed, with the event that
	// changed it ("refused", "advertised", "remaining", "paused",
	// "started").
	Learned func(ctx context.Context, key string, rate float64, event string)
}

type key struct{}

// on is set by the first With, so that programs that never trace pay one
// atomic load per call, not a context lookup.
var on atomic.Bool

// On reports whether any context was ever given hooks.
func On() bool { return on.Load() }

// With returns a copy of ctx that carries h. A nil h returns ctx.
func With(ctx context.Context, h *Hooks) context.Context {
	if h == nil {
		return ctx
	}
	on.Store(true)
	return context.WithValue(ctx, key{}, h)
}

// From returns the hooks attached to ctx by With, or nil.
func From(ctx context.Context) *Hooks {
	if !on.Load() {
		return nil
	}
	h, _ := ctx.Value(key{}).(*Hooks)
	return h
}
