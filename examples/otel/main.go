// Command otel shows ThrottleKit's OpenTelemetry wrapper composed with
// otelhttp: each request gets an otelhttp client span, the shaper's wait runs
// in a child span throttlekit.Wait with an event carrying the delay and the
// outcome, and the metrics (reservations by outcome, delay, waiting, store
// latency) go to a stdout exporter when the program ends.
//
// It is a module of its own so that the SDK, the stdout exporters and otelhttp
// never enter the library's go.mod:
//
//	cd examples/otel && go run . [-short]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

func main() {
	short := flag.Bool("short", false, "send fewer requests (CI)")
	flag.Parse()
	n := 12
	if *short {
		n = 4
	}
	if err := run(os.Stdout, n); err != nil {
		fmt.Fprintln(os.Stderr, "otel:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, n int) error {
	ctx := context.Background()
	traceExp, err := stdouttrace.New(stdouttrace.WithWriter(w))
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(traceExp))
	metricExp, err := stdoutmetric.New(stdoutmetric.WithWriter(w))
	if err != nil {
		return err
	}
	// A reader that exports once, when the provider shuts down.
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metricExp, sdkmetric.WithInterval(time.Hour))))

	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	}))
	defer partner.Close()

	store := memstore.New()
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithName("partner-api"), shaper.WithMaxQueue(time.Second))
	if err != nil {
		return err
	}
	// The order matters: otelhttp outermost, so that its client span is the
	// parent of the shaper's wait; ThrottleKit's transport inside it.
	r := otelshaper.Wrap(s, otelshaper.WithMeterProvider(mp), otelshaper.WithTracerProvider(tp))
	client := &http.Client{Transport: otelhttp.NewTransport(
		transport.New(r, transport.WithBase(partner.Client().Transport)),
		otelhttp.WithTracerProvider(tp), otelhttp.WithMeterProvider(mp))}
	defer client.CloseIdleConnections()

	// n requests at once against 10/s with MaxQueue 1 s: the first 11 get a
	// slot within a second, the rest are refused at once (queue_full).
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, partner.URL, nil)
			resp, err := client.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			mu.Lock()
			outcomes[otelshaper.Outcome(err)]++
			mu.Unlock()
		})
	}
	wg.Wait()
	fmt.Fprintf(w, "\noutcomes: %v\n", outcomes)
	err = errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx)) // flushes the metrics to w
	if outcomes[otelshaper.OutcomeAccepted] == 0 {
		return errors.Join(err, errors.New("no request was accepted"))
	}
	return err
}
