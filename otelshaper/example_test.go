package otelshaper_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// Wrap a shaper and read what it recorded. A real program passes its own
// meter provider (or sets the global one) and exports on a schedule.
func ExampleWrap() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	store := memstore.New()
	defer store.Close()
	s, _ := shaper.New(store, shaper.PerSecond(2), shaper.WithName("partner-api"))
	r := otelshaper.Wrap(s, otelshaper.WithMeterProvider(mp))

	ctx := context.Background()
	for range 3 {
		res, err := r.Reserve(ctx, "tenant-7", 1)
		fmt.Println(res.Delay.Round(100*time.Millisecond), err) // real clock: about 0, 500 ms, 1 s
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == otelshaper.MetricReservations {
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				outcome, _ := dp.Attributes.Value(otelshaper.AttrOutcome)
				limiter, _ := dp.Attributes.Value(otelshaper.AttrLimiter)
				fmt.Println(m.Name, limiter.AsString(), outcome.AsString(), dp.Value)
			}
		}
	}
	// Output:
	// 0s <nil>
	// 500ms <nil>
	// 1s <nil>
	// throttlekit.reservations partner-api accepted 3
}
