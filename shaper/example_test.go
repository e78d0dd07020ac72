package shaper_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/shaper/shapertest"
)

// Wait paces calls to a partner that allows 20 per second: each call leaves
// 50 ms after the previous one.
func ExampleShaper_Wait() {
	store := memstore.New()
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(20))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	start := time.Now()
	for range 5 {
		if err := s.Wait(ctx, "partner-api", 1); err != nil {
			panic(err)
		}
		// call the partner here
	}
	fmt.Println("5 calls took at least 200ms:", time.Since(start) >= 200*time.Millisecond)
	// Output: 5 calls took at least 200ms: true
}

// Reserve tells the caller when to go without sleeping; a caller that decides
// not to go cancels, and the slot goes to the next caller.
func ExampleShaper_Reserve() {
	store := memstore.New()
	defer store.Close()
	s, _ := shaper.New(store, shaper.PerSecond(10), shaper.WithMaxQueue(time.Second))
	ctx := context.Background()

	// Slots are absolute instants; print them relative to the first.
	first, _ := s.Reserve(ctx, "k", 1)
	second, _ := s.Reserve(ctx, "k", 1)
	fmt.Println("second leaves", second.Time().Sub(first.Time()).Round(time.Millisecond), "after the first")

	_ = second.Cancel(ctx) // the caller gave up: its slot is free again
	third, _ := s.Reserve(ctx, "k", 1)
	fmt.Println("third leaves", third.Time().Sub(first.Time()).Round(time.Millisecond), "after the first")

	_, err := s.Reserve(ctx, "k", 15) // 15 units need 1.4 s: more than MaxQueue
	fmt.Println(errors.Is(err, shaper.ErrInvalidCost))
	for range 10 { // slots at 200ms ... 1s fit; the tenth would wait 1.1s
		_, err = s.Reserve(ctx, "k", 1)
	}
	var qf *shaper.QueueFullError
	fmt.Println(errors.As(err, &qf), qf.MaxQueue)
	// Output:
	// second leaves 100ms after the first
	// third leaves 100ms after the first
	// true
	// true 1s
}

// An LLM API allows 3,500 requests and 90,000 tokens per minute per account.
// Each call reserves its token count; it departs when both limits allow it.
func ExampleAll() {
	store := memstore.New()
	defer store.Close()
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "requests", Rate: shaper.PerMinute(3500), Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: shaper.PerMinute(90000).WithBurst(20000)},
	}, shaper.WithName("llm"))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	var first time.Time
	for i, tokens := range []int64{12000, 9000, 6000} {
		r, err := s.Reserve(ctx, "account-7", tokens)
		if err != nil {
			panic(err)
		}
		if i == 0 {
			first = r.Time()
		}
		fmt.Printf("%5d tokens: leave %v after the first\n", tokens, r.Time().Sub(first).Round(time.Millisecond))
	}
	// Output:
	// 12000 tokens: leave 0s after the first
	//  9000 tokens: leave 667ms after the first
	//  6000 tokens: leave 4.667s after the first
}

// ParseRate reads contracts as people write them.
func ExampleParseRate() {
	for _, text := range []string{"10/s", "600/minute burst 20", "7/3s", "1000000/month", "10/fortnight"} {
		r, err := shaper.ParseRate(text)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%-22q -> %v (%d per %v)\n", text, r, r.Count, r.Period)
	}
	// Output:
	// "10/s"                 -> 10/s (10 per 1s)
	// "600/minute burst 20"  -> 600/min burst 20 (600 per 1m0s)
	// "7/3s"                 -> 7/3s (7 per 3s)
	// "1000000/month"        -> 1000000/month (1000000 per 720h0m0s)
	// throttlekit: cannot parse rate "10/fortnight": unknown unit "fortnight"; expected one of ns, us, ms, s, min, h, day, week, month
}

// Route puts several contracts behind one Reserver, here one per partner
// host, so that one transport (or queue) paces each host at its own rate.
func ExampleRoute() {
	store := memstore.New()
	defer store.Close()
	hosts := map[string]shaper.Reserver{}
	for host, rate := range map[string]shaper.Rate{"api.maps.example": shaper.PerSecond(50), "api.mail.example": shaper.PerSecond(2)} {
		s, err := shaper.New(store, rate, shaper.WithName(host))
		if err != nil {
			panic(err)
		}
		hosts[host] = s
	}
	r := shaper.Route(func(host string) shaper.Reserver { return hosts[host] })
	// transport.New(r, transport.WithKey(func(req *http.Request) string { return req.URL.Host }))
	for _, host := range []string{"api.maps.example", "api.mail.example"} {
		r.Reserve(context.Background(), host, 1)
		res, _ := r.Reserve(context.Background(), host, 1)
		fmt.Printf("%s: second slot in %v\n", host, res.Delay.Round(time.Millisecond))
	}
	_, err := r.Reserve(context.Background(), "api.unknown.example", 1)
	fmt.Println(errors.Is(err, shaper.ErrInvalidKey))
	// Output:
	// api.maps.example: second slot in 20ms
	// api.mail.example: second slot in 500ms
	// true
}

// An LLM call reserves its max_tokens, then settles with the tokens it
// used: the rest goes back to the account, and the next call need not wait
// for tokens nobody used.
func ExampleReservation_Settle() {
	store := memstore.New()
	defer store.Close()
	// 1,000 tokens per second, at most 1,000 at once.
	s, _ := shaper.New(store, shaper.PerSecond(1000).WithBurst(1000))
	ctx := context.Background()

	r, _ := s.Acquire(ctx, "account-1", 800) // the estimate: max_tokens
	// ... call the API; its response says it used 200 tokens ...
	_ = r.Settle(ctx, 200)

	next, _ := s.Reserve(ctx, "account-1", 800)
	fmt.Println("the next 800 wait:", next.Delay) // without Settle: 600ms
	// Output: the next 800 wait: 0s
}

// Status reads a key's standing without consuming anything: what to put in
// RateLimit-Remaining and RateLimit-Reset headers, per dimension and with
// the one that binds named.
func ExampleShaper_Status() {
	store := memstore.New()
	defer store.Close()
	clock := shapertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "requests", Rate: shaper.PerMinute(60).WithBurst(50), Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: shaper.PerMinute(60000).WithBurst(4000)},
	}, shaper.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if _, err := s.Reserve(ctx, "account-7", 2500); err != nil {
		panic(err)
	}
	for _, tokens := range []int64{10, 1000, 3000} {
		st, err := s.Status(ctx, "account-7", tokens)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%4d tokens: bound by %s, %d left, could leave in %v, all back in %v\n",
			tokens, st.Binding, st.Remaining, st.Next.Sub(clock.Now()), st.ResetAt.Sub(clock.Now()))
	}
	// Output:
	//   10 tokens: bound by requests, 49 left, could leave in 0s, all back in 2.5s
	// 1000 tokens: bound by tokens, 1500 left, could leave in 0s, all back in 2.5s
	// 3000 tokens: bound by tokens, 1500 left, could leave in 1.5s, all back in 2.5s
}

// Any admits a request when any one of its contracts does: each account
// has its own 1 per second and may draw on a pool of 3 per minute shared by
// every account. Only the contracts that admit a request consume.
func ExampleAny() {
	store := memstore.New()
	defer store.Close()
	clock := shapertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := shaper.Any(store, []shaper.Dimension{
		{Name: "own", Rate: shaper.PerSecond(1)},
		{Name: "pool", Rate: shaper.PerMinute(3).WithBurst(3), Key: func(string) string { return "pool" }},
	}, shaper.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 5 {
		r, err := s.Reserve(ctx, "account-7", 1)
		if err != nil {
			panic(err)
		}
		st, _ := s.Status(ctx, "account-7", 1)
		fmt.Printf("leave in %v; pool left: %d\n", r.Delay, st.Dimensions[1].Remaining)
	}
	// Output:
	// leave in 0s; pool left: 2
	// leave in 0s; pool left: 1
	// leave in 0s; pool left: 0
	// leave in 1s; pool left: 0
	// leave in 2s; pool left: 0
}

// SetRate changes a running shaper's contract: the partner has cut its
// limit from 10 to 2 per second. The slots already granted keep their
// times, and the next request leaves when 10/s would have sent it (300
// ms), then one every 500 ms. On a redisstore.Store every process sharing the
// budget follows the change within its refresh interval.
func ExampleShaper_SetRate() {
	store := memstore.New()
	defer store.Close()
	clock := shapertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 3 {
		r, _ := s.Reserve(ctx, "partner", 1)
		fmt.Println("10/s: leave in", r.Delay)
	}
	if err := s.SetRate(ctx, "", shaper.PerSecond(2)); err != nil {
		panic(err)
	}
	for range 3 {
		r, _ := s.Reserve(ctx, "partner", 1)
		fmt.Println(" 2/s: leave in", r.Delay)
	}
	// Output:
	// 10/s: leave in 0s
	// 10/s: leave in 100ms
	// 10/s: leave in 200ms
	//  2/s: leave in 300ms
	//  2/s: leave in 800ms
	//  2/s: leave in 1.3s
}

// Clamp spreads what a partner says it has left: 3 calls until its reset in
// 6 seconds, where the contract alone would send 10 a second. The calls
// leave 2 s apart, and once the 3 are taken the next waits for the reset.
// On a redisstore.Store every process sharing the key slows at once.
func ExampleShaper_Clamp() {
	store := memstore.New()
	defer store.Close()
	clock := shapertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := s.Clamp(ctx, "partner", 3, 6*time.Second); err != nil {
		panic(err)
	}
	for range 5 {
		r, _ := s.Reserve(ctx, "partner", 1)
		fmt.Println("leave in", r.Delay)
	}
	// Output:
	// leave in 0s
	// leave in 2s
	// leave in 4s
	// leave in 6s
	// leave in 6.1s
}

// An in-flight dimension beside a rate: at most 2 calls open at once, 100
// starting per second. A third Reserve finds every permit held and is
// refused at once (Acquire would wait for a release); releasing one lets
// the next request in.
func ExampleReservation_Release() {
	store := memstore.New()
	defer store.Close()
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "rate", Rate: shaper.PerSecond(100).WithBurst(10)},
		{Name: "open", InFlight: 2},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	a, _ := s.Acquire(ctx, "account-42", 1)
	b, _ := s.Acquire(ctx, "account-42", 1)
	_, err = s.Reserve(ctx, "account-42", 1)
	var full *shaper.QueueFullError
	fmt.Println(errors.As(err, &full) && full.InFlight, full.Dimension)

	_ = a.Release(ctx) // the call a paced has ended
	_ = a.Release(ctx) // releasing again does nothing
	c, err := s.Reserve(ctx, "account-42", 1)
	fmt.Println(err)
	st, _ := s.Status(ctx, "account-42", 1)
	fmt.Println(st.Dimensions[0].Name, st.Dimensions[0].InFlight, "in flight")
	_, _ = b.Release(ctx), c.Release(ctx)
	// Output:
	// true open
	// <nil>
	// open 2 in flight
}

// WithCosts reserves each part of a call on the dimension that counts it: a
// partner limiting input and output tokens per minute apart admits a
// call's prompt and its max_tokens, and is settled with the output tokens
// the call used.
func ExampleWithCosts() {
	store := memstore.New()
	defer store.Close()
	// A clock that stands still, so that the figures below do not move
	// with the buckets' refill (one input token every 1.5 ms).
	clock := shapertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "input-tokens", Rate: shaper.PerMinute(40000).WithBurst(40000)},
		{Name: "output-tokens", Rate: shaper.PerMinute(8000).WithBurst(8000)},
	}, shaper.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	prompt, maxTokens := int64(1200), int64(1000)
	r, err := s.Reserve(shaper.WithCosts(ctx, shaper.Costs{"output-tokens": maxTokens}), "claude", prompt)
	if err != nil {
		panic(err)
	}
	// call the partner here: it reports 1,200 input and 150 output tokens
	if err := r.Settle(shaper.WithCosts(ctx, shaper.Costs{"output-tokens": 150}), prompt); err != nil {
		panic(err)
	}
	st, _ := s.Status(ctx, "claude", 1)
	for _, d := range st.Dimensions {
		fmt.Println(d.Name, "left:", d.Remaining)
	}
	// Output:
	// input-tokens left: 38800
	// output-tokens left: 7850
}
