package transport_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
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
