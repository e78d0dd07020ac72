package bench

import (
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// inflight measures what an in-flight dimension costs on Redis beside a
// rate-only request (script calls and server CPU per request), and how
// soon a process waiting for a permit learns that another process freed
// one (the release's notice, from Release's call to the waiter's grant).
func (r *report) inflight(t *testing.T) {
	srv := redistest.Start(t)
	c := client(srv)
	store := func(c *redis.Client) *redisstore.Store {
		st := redisstore.New(c)
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	rate, err := shaper.New(store(c), open, shaper.WithPrefix("rate:"))
	if err != nil {
		t.Fatal(err)
	}
	both, err := shaper.All(store(c), []shaper.Dimension{{Name: "rate", Rate: open}, {Name: "open", InFlight: shaper.MaxInFlight}}, shaper.WithPrefix("both:"))
	if err != nil {
		t.Fatal(err)
	}
	alone, err := shaper.All(store(c), []shaper.Dimension{{Name: "open", InFlight: shaper.MaxInFlight}}, shaper.WithPrefix("alone:"))
	if err != nil {
		t.Fatal(err)
	}
	names := keyNames(keys)
	held := func(s *shaper.Shaper) func(i int) error {
		return func(i int) error {
			res, err := s.Reserve(ctx, names[i%keys], 1)
			if err != nil {
				return err
			}
			return res.Release(ctx)
		}
	}
	ops := []redisOp{
		{"rate only: Reserve", func(i int) error { _, err := rate.Reserve(ctx, names[i%keys], 1); return err }},
		{"rate + in-flight: Reserve, Release", held(both)},
		{"in-flight alone: Reserve, Release", held(alone)},
	}
	r.printf("## In-flight on Redis\n\nThe same redis-server setup as above, %d keys, limits no call reaches (an in-flight limit of %d). A request with an in-flight dimension takes its permit (one script), then its rate slot (the coalesced reservation), and releases the permit (one script); Redis calls and server µs per request count every script call, EVALSHA and EVAL.\n\n", keys, shaper.MaxInFlight)
	r.printf("| goroutines | request | requests/s | p50 | p99 | server µs per request | Redis calls per request |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, g := range []int{1, 64} {
		res := r.redisRuns(t, c, g, ops)
		for _, o := range ops {
			v := res[o.name]
			r.printf("| %d | %s | %.0f | %v | %v | %.2f | %.2f |\n", g, o.name, v.tp,
				time.Duration(v.p50).Round(time.Microsecond), time.Duration(v.p99).Round(time.Microsecond), v.usec, 1/v.perCall)
		}
	}
	// The notice: store A holds the one permit, store B (another client,
	// as another process) waits in Acquire; A releases, B is granted.
	one := func(prefix string) *shaper.Shaper {
		s, err := shaper.All(store(client(srv)), []shaper.Dimension{{Name: "open", InFlight: 1}}, shaper.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := one("wake:"), one("wake:")
	var lat []time.Duration
	for range 100 * r.sc.runs {
		held, err := a.Acquire(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			res, err := b.Acquire(ctx, "k", 1)
			if err != nil {
				t.Error(err)
			}
			got <- time.Now()
			_ = res.Release(ctx)
		}()
		for waiting(t, b) == 0 {
			time.Sleep(50 * time.Microsecond)
		}
		time.Sleep(time.Millisecond) // B is past its ask, waiting for the notice
		start := time.Now()
		_ = held.Release(ctx)
		lat = append(lat, (<-got).Sub(start))
	}
	slices.Sort(lat)
	r.printf("\nA permit freed by one process reaches a waiter in another (two stores on two clients, one permit; from Release's call to the waiter's grant, %d handoffs): p50 **%v**, p99 **%v**, max %v. The release publishes the key on the prefix's channel; the waiting store's subscription wakes the first waiter of the key, which asks again. No waiter polls; a lost notice is covered by asking again when the earliest lease would expire, and at least every second.\n\n",
		len(lat), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))
}

// waiting returns how many requests of s's process wait for key k's permit.
func waiting(t *testing.T, s *shaper.Shaper) int {
	st, err := s.Status(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	return st.Dimensions[0].Waiting
}
