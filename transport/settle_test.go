package transport

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/shaper/shapertest"
)

// usageAPI answers every call with the tokens it used: a quarter of the
// X-Max-Tokens the caller reserved.
func usageAPI(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
		_ = json.NewEncoder(w).Encode(map[string]int64{"used": n / 4})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A caller reserves its estimate through WithCost, reads the usage from the
// body and settles: what it did not use goes back to the key, through
// Route and otelshaper.Wrap as well; a response that did not come through a
// Transport says so with a *shaper.ConfigError.
func TestSettleGivesBackWhatTheCallDidNotUse(t *testing.T) {
	srv := usageAPI(t)
	clock := shapertest.NewClock(time.Unix(1_800_000_000, 0))
	for name, wrap := range map[string]func(*shaper.Shaper) shaper.Reserver{
		"shaper":          func(s *shaper.Shaper) shaper.Reserver { return s },
		"route":           func(s *shaper.Shaper) shaper.Reserver { return shaper.Route(func(string) shaper.Reserver { return s }) },
		"otelshaper.Wrap": func(s *shaper.Shaper) shaper.Reserver { return otelshaper.Wrap(s) },
	} {
		store := memstore.New()
		t.Cleanup(func() { _ = store.Close() })
		// 1,000 tokens/s, burst 1,000: a call reserving 800 leaves room for
		// no second one, unless it settles.
		s, err := shaper.New(store, shaper.PerSecond(1000).WithBurst(1000), shaper.WithClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: New(wrap(s),
			WithKey(func(*http.Request) string { return "account" }),
			WithCost(func(r *http.Request) int64 { n, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64); return n }))}
		req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
		req.Header.Set("X-Max-Tokens", "800")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Used int64 }
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if err := Settle(context.Background(), resp, body.Used); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// 200 used + 800 reserved fits the burst: no wait.
		r, err := s.Reserve(context.Background(), "account", 800)
		if err != nil {
			t.Fatal(err)
		}
		if r.Delay != 0 {
			t.Fatalf("%s: after settling 200 of 800 the next 800 waits %v, want 0", name, r.Delay)
		}
		if err := Settle(context.Background(), resp, 0); !errors.Is(err, shaper.ErrSettled) { // a second settle records nothing
			t.Fatalf("%s: a second Settle returned %v, want shaper.ErrSettled", name, err)
		}
		if r2, _ := s.Reserve(context.Background(), "account", 1); r2.Delay != time.Millisecond {
			t.Fatalf("%s: a second Settle changed the schedule: the next unit waits %v, want 1ms", name, r2.Delay)
		}
	}

	plain, err := http.Post(srv.URL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = plain.Body.Close()
	var ce *shaper.ConfigError
	if err := Settle(context.Background(), plain, 1); !errors.As(err, &ce) || !errors.Is(err, shaper.ErrInvalidConfig) {
		t.Fatalf("Settle of a response no Transport sent: %v, want a *shaper.ConfigError", err)
	}
	if err := Settle(context.Background(), nil, 1); !errors.Is(err, shaper.ErrInvalidConfig) {
		t.Fatalf("Settle(nil): %v", err)
	}
}
