package transport

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/shaper/shapertest"
)

// waitOnly is a minimal custom Reserver: Reserve, Wait and Pause, forwarded
// to a shaper, and no Acquire. It counts its Waits.
type waitOnly struct {
	s     *shaper.Shaper
	waits atomic.Int64
}

func (w *waitOnly) Reserve(ctx context.Context, key string, cost int64) (shaper.Reservation, error) {
	return w.s.Reserve(ctx, key, cost)
}

func (w *waitOnly) Wait(ctx context.Context, key string, cost int64) error {
	w.waits.Add(1)
	return w.s.Wait(ctx, key, cost)
}

func (w *waitOnly) Pause(ctx context.Context, key string, d time.Duration) error {
	return w.s.Pause(ctx, key, d)
}

// chains are the decorator chains a Transport may be given, innermost last.
var chains = []struct {
	name string
	wrap func(shaper.Reserver) shaper.Reserver
}{
	{"bare", func(r shaper.Reserver) shaper.Reserver { return r }},
	{"Route", route},
	{"otelshaper.Wrap", wrapOtel},
	{"Route/Route", func(r shaper.Reserver) shaper.Reserver { return route(route(r)) }},
	{"otelshaper.Wrap/otelshaper.Wrap", func(r shaper.Reserver) shaper.Reserver { return wrapOtel(wrapOtel(r)) }},
	{"Route/otelshaper.Wrap", func(r shaper.Reserver) shaper.Reserver { return route(wrapOtel(r)) }},
	{"otelshaper.Wrap/Route", func(r shaper.Reserver) shaper.Reserver { return wrapOtel(route(r)) }},
	{"Route/otelshaper.Wrap/Route", func(r shaper.Reserver) shaper.Reserver { return route(wrapOtel(route(r))) }},
	{"otelshaper.Wrap/Route/otelshaper.Wrap", func(r shaper.Reserver) shaper.Reserver { return wrapOtel(route(wrapOtel(r))) }},
}

func route(r shaper.Reserver) shaper.Reserver {
	return shaper.Route(func(string) shaper.Reserver { return r })
}

func wrapOtel(r shaper.Reserver) shaper.Reserver { return otelshaper.Wrap(r) }

// tokensAPI answers every call with 200 OK.
func tokensAPI(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(srv.Close)
	return srv
}

// chainShaper is a shaper of 1,000 tokens/s, burst 1,000, on a memory store
// and a fake clock that never moves: a delay is the schedule's, not time's.
func chainShaper(t *testing.T) *shaper.Shaper {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { _ = store.Close() })
	clock := shapertest.NewClock(time.Unix(1_800_000_000, 0))
	s, err := shaper.New(store, shaper.PerSecond(1000).WithBurst(1000), shaper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// send sends one call reserving cost tokens on key "account" through a
// Transport over r.
func send(t *testing.T, r shaper.Reserver, url string, cost int64) *http.Response {
	t.Helper()
	client := &http.Client{Transport: New(r,
		WithKey(func(*http.Request) string { return "account" }),
		WithCost(func(req *http.Request) int64 {
			n, _ := strconv.ParseInt(req.Header.Get("X-Max-Tokens"), 10, 64)
			return n
		}))}
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Max-Tokens", strconv.FormatInt(cost, 10))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp
}

// next is the delay of the next reservation of cost on "account".
func next(t *testing.T, s *shaper.Shaper, cost int64) time.Duration {
	t.Helper()
	r, err := s.Reserve(context.Background(), "account", cost)
	if err != nil {
		t.Fatal(err)
	}
	return r.Delay
}

// Settle through any chain of Route and otelshaper.Wrap over a *shaper.Shaper
// settles the shaper's reservation: less gives the rest back, more is
// charged. Over a Reserver without Acquire, the chain only waits: Settle
// fails with a *shaper.ConfigError and the schedule is untouched.
func TestSettleThroughEveryDecoratorChain(t *testing.T) {
	t.Parallel()
	srv := tokensAPI(t)
	for _, c := range chains {
		t.Run(c.name+"/shaper/less", func(t *testing.T) {
			s := chainShaper(t)
			resp := send(t, c.wrap(s), srv.URL, 800)
			if err := Settle(context.Background(), resp, 200); err != nil {
				t.Fatalf("Settle: %v", err)
			}
			// 200 used + 800 fit the burst; unsettled, 800 + 800 would wait 600ms.
			if d := next(t, s, 800); d != 0 {
				t.Fatalf("after settling 200 of 800 the next 800 waits %v, want 0", d)
			}
		})
		t.Run(c.name+"/shaper/more", func(t *testing.T) {
			s := chainShaper(t)
			resp := send(t, c.wrap(s), srv.URL, 800)
			if err := Settle(context.Background(), resp, 1500); err != nil {
				t.Fatalf("Settle: %v", err)
			}
			// 1,500 used: 500 past the burst, then 1 more; unsettled, 801
			// fit the burst and the next token would not wait.
			if d := next(t, s, 1); d != 501*time.Millisecond {
				t.Fatalf("after settling 1500 of 800 the next token waits %v, want 501ms", d)
			}
		})
		t.Run(c.name+"/without Acquire", func(t *testing.T) {
			s := chainShaper(t)
			inner := &waitOnly{s: s}
			resp := send(t, c.wrap(inner), srv.URL, 800)
			if n := inner.waits.Load(); n != 1 {
				t.Fatalf("the call waited %d times on the inner Reserver, want 1", n)
			}
			err := Settle(context.Background(), resp, 200)
			var ce *shaper.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, shaper.ErrInvalidConfig) {
				t.Fatalf("Settle: %v, want a *shaper.ConfigError", err)
			}
			if ce.Algorithm != "transport" || ce.Field != "Settle" {
				t.Fatalf("Settle: %+v, want the transport's Settle named", ce)
			}
			// Nothing was settled: 800 + 800 wait 600ms.
			if d := next(t, s, 800); d != 600*time.Millisecond {
				t.Fatalf("after a failed Settle the next 800 waits %v, want 600ms", d)
			}
		})
	}
}
