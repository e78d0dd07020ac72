package partner_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/partner"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// An OpenAI-style account: 500 requests and 90,000 tokens per trailing
// minute. Each call reserves its estimate (prompt plus max_tokens) and
// settles what it used, which the window frees when it leaves it.
func Example() {
	store := memstore.New()
	defer store.Close()
	s, err := partner.New(store, []partner.Limit{
		partner.TrailingWindow("requests", 500, time.Minute).PerRequest(),
		partner.TrailingWindow("tokens", 90000, time.Minute),
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	r, err := s.Acquire(ctx, "org-1", 1200) // the estimate: 200 prompt + 1,000 max_tokens
	if err != nil {
		panic(err)
	}
	// ... call the API, read its usage ...
	if err := r.Settle(ctx, 450); err != nil {
		panic(err)
	}
	st, _ := s.Status(ctx, "org-1", 1)
	for _, d := range st.Dimensions {
		fmt.Printf("%s: %d left in the window\n", d.Name, d.Remaining)
	}
	// Output:
	// requests: 499 left in the window
	// tokens: 89550 left in the window
}

// Anthropic-style token buckets, GitHub's hour and nginx's limit_req: each
// declared as its page states it.
func Example_declarations() {
	for _, limits := range [][]partner.Limit{
		{ // Anthropic: 50 RPM, 40,000 input tokens per minute, token buckets
			partner.Bucket("requests", 50, shaper.PerMinute(50)).PerRequest(),
			partner.Bucket("input-tokens", 40000, shaper.PerMinute(40000)),
		},
		{ // GitHub: 5,000 requests per hour, 100 at once
			partner.Window("requests", 5000, time.Hour).PerRequest(),
			partner.Concurrent("open", 100),
		},
		{ // nginx: limit_req zone=api rate=25r/s burst=5
			partner.NginxLimitReq(shaper.PerSecond(25), 5),
		},
	} {
		dims, err := partner.Dimensions(limits, partner.DefaultLateness+partner.DefaultJitter)
		if err != nil {
			panic(err)
		}
		for _, d := range dims {
			if d.InFlight > 0 {
				fmt.Printf("%s: %d open at once\n", d.Name, d.InFlight)
				continue
			}
			fmt.Printf("%s: %v, %v\n", d.Name, d.Rate, d.Algorithm)
		}
	}
	// Output:
	// requests: 50/min burst 49, leaky-bucket
	// input-tokens: 40000/min burst 39996, cost-bucket
	// requests: 5000/h, trailing-window(+5.001ms)
	// open: 100 open at once
	// requests: 25/s burst 5, leaky-bucket
}
