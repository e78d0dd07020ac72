// Package otelshaper records OpenTelemetry metrics and span events for any
// shaper.Reserver: a *shaper.Shaper, or the transport's or the queue's.
//
//	s, _ := shaper.New(store, shaper.PerSecond(25), shaper.WithName("partner-api"))
//	r := otelshaper.Wrap(s) // global meter and tracer providers
//	client := &http.Client{Transport: transport.New(r)}
//
// Every Reserve and Wait is counted by outcome (accepted, queue_full,
// deadline, canceled, error) in throttlekit.reservations; accepted calls
// record their delay in seconds in throttlekit.delay; throttlekit.waiting is
// the number of callers asleep in Wait; throttlekit.store.duration is the
// latency of every store operation and throttlekit.degraded counts those the
// Redis store's failure policy served. On a shaper with an in-flight
// dimension, throttlekit.inflight is the number of permits this process's
// calls hold now, and throttlekit.permit.wait records in seconds how long
// each waited for its permit. Attributes are the limiter name and
// the outcome or store operation, never the key unless WithKeyAttribute is
// on, so that a million keys still make a handful of metric streams.
//
// The caller's span, when recording, gets a throttlekit.reserve,
// throttlekit.wait or throttlekit.pause event with the outcome and delay, and
// Wait runs in a child span throttlekit.Wait. docs/OTEL.md lists every
// instrument and attribute.
//
// It is named as otelhttp and otelgrpc are: the OpenTelemetry API's
// package otel and this one can be imported side by side.
package otelshaper
