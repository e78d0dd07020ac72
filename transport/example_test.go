package transport_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/partner"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

// An http.Client whose requests leave at their slots: three requests to a
// partner allowing 50 per second are 20 ms apart, and a request whose slot
// would come after its context's deadline is not sent at all.
func Example() {
	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	defer partner.Close()

	store := memstore.New()
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(50))
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: transport.New(s)} // keyed by host, cost 1

	start := time.Now()
	for range 3 {
		resp, err := client.Get(partner.URL)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body))
	}
	fmt.Println("40 ms or more for three:", time.Since(start) >= 40*time.Millisecond)

	// A contract of one request a minute: the second request's slot is a
	// minute away, within MaxQueue but past its one-second deadline, so it
	// fails at once and takes no slot.
	slow, _ := shaper.New(store, shaper.PerMinute(1), shaper.WithName("slow"), shaper.WithMaxQueue(time.Hour))
	slowClient := &http.Client{Transport: transport.New(slow)}
	resp, err := slowClient.Get(partner.URL)
	if err == nil {
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, partner.URL, nil)
	_, err = slowClient.Do(req)
	fmt.Println("refused before its deadline:", errors.Is(err, context.DeadlineExceeded))
	// Output:
	// 200 ok
	// 200 ok
	// 200 ok
	// 40 ms or more for three: true
	// refused before its deadline: true
}

// A partner that allows two calls open at once: on a shaper with an
// in-flight dimension the transport holds one of the key's permits from
// departure until the response body is read to its end or closed, so the
// partner never sees a third.
func ExampleNew_inFlight() {
	partner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "report")
	}))
	defer partner.Close()

	store := memstore.New()
	defer store.Close()
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "rate", Rate: shaper.PerSecond(50)},
		{Name: "open", InFlight: 2},
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: transport.New(s)} // keyed by host
	open := func() int64 {
		st, _ := s.Status(context.Background(), partner.Listener.Addr().String(), 1)
		return st.Dimensions[0].InFlight // "open" sorts before "rate"
	}

	resp, err := client.Get(partner.URL)
	if err != nil {
		panic(err)
	}
	fmt.Println("open while the body is unread:", open())
	body, _ := io.ReadAll(resp.Body) // read to its end: the permit is back
	fmt.Println(string(body), "- open once it was read:", open())
	resp.Body.Close() // closes the body; the permit was released once already
	// Output:
	// open while the body is unread: 1
	// report - open once it was read: 0
}

// A partner that limits input and output tokens per minute apart
// (Anthropic's ITPM and OTPM): each request reserves its prompt on the
// input limit and its max_tokens on the output limit (shaper.WithCosts on
// its context), and WithUsageCosts settles both from the usage the
// response body reports, giving back the output tokens it did not use.
func ExampleWithUsageCosts() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"usage": {"input_tokens": 1200, "output_tokens": 150}}`)
	}))
	defer api.Close()

	store := memstore.New()
	defer store.Close()
	s, err := partner.New(store, []partner.Limit{
		partner.Bucket("requests", 50, shaper.PerMinute(50)).PerRequest(),
		partner.Bucket("input-tokens", 40000, shaper.PerMinute(40000)),
		partner.Bucket("output-tokens", 8000, shaper.PerMinute(8000)),
	})
	if err != nil {
		panic(err)
	}
	usage := func(_ *http.Response, body []byte) (int64, shaper.Costs, bool) {
		var v struct {
			Usage *struct {
				Input  int64 `json:"input_tokens"`
				Output int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(body, &v) != nil || v.Usage == nil {
			return 0, nil, false
		}
		return v.Usage.Input, shaper.Costs{"output-tokens": v.Usage.Output}, true
	}
	client := &http.Client{Transport: transport.New(s,
		transport.WithKey(func(*http.Request) string { return "claude" }),
		transport.WithCost(func(r *http.Request) int64 { return 1200 }), // the prompt's tokens
		transport.WithUsageCosts(usage))}

	ctx := shaper.WithCosts(context.Background(), shaper.Costs{"output-tokens": 1000}) // max_tokens
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close() // the transport settles here

	// The buckets refill as time passes: to the nearest thousand, what the
	// call left of each (40,000 less 1,200; 8,000 less 150).
	st, _ := s.Status(context.Background(), "claude", 1)
	for _, d := range st.Dimensions {
		if d.Name != "requests" {
			fmt.Println(d.Name, "left, about:", (d.Remaining+500)/1000*1000)
		}
	}
	// Output:
	// input-tokens left, about: 39000
	// output-tokens left, about: 8000
}
