package transport

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	partnerpkg "github.com/throttlekit/throttlekit-go/partner"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// tokensLeft is what key k has left of its tokens.
func tokensLeft(t *testing.T, s *shaper.Shaper) int64 {
	t.Helper()
	st, err := s.Status(context.Background(), "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	return st.Remaining
}

// A call settles with the usage its body reports (WithUsage), once the
// body is read; a refused call (429, or 503 with Retry-After) is settled
// at nothing, whatever its body says; a body that reports nothing keeps
// the estimate.
func TestUsageSettlesAndRefusalsCountNothing(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/refused":
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		case "/unavailable":
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/silent":
			_, _ = io.WriteString(w, "{}")
		default:
			_ = json.NewEncoder(w).Encode(map[string]any{"usage": map[string]int64{"total_tokens": 120}})
		}
	}))
	defer srv.Close()
	store := memstore.New()
	defer store.Close()
	s, err := partnerpkg.New(store, []partnerpkg.Limit{partnerpkg.TrailingWindow("tokens", 100000, time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	usage := func(_ *http.Response, body []byte) (int64, bool) {
		var v struct {
			Usage *struct {
				Total int64 `json:"total_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(body, &v) != nil || v.Usage == nil {
			return 0, false
		}
		return v.Usage.Total, true
	}
	client := &http.Client{Transport: New(s, WithKey(func(*http.Request) string { return "k" }),
		WithCost(func(r *http.Request) int64 { n, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64); return n }),
		WithUsage(usage), WithFeedback(false))}
	call := func(path string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, nil)
		req.Header.Set("X-Max-Tokens", "300")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		path string
		left int64
	}{{"/refused", 100000}, {"/unavailable", 100000}, {"/ok", 99880}, {"/silent", 99580}} {
		resp := call(c.path)
		if got := tokensLeft(t, s); got != c.left {
			t.Fatalf("after %s: %d tokens left, want %d", c.path, got, c.left)
		}
		if err := Settle(context.Background(), resp, 1); c.path != "/silent" && !errors.Is(err, shaper.ErrSettled) {
			t.Fatalf("%s: Settle after the transport settled: %v, want ErrSettled", c.path, err)
		}
	}
}

// A partner counting input and output tokens apart (Anthropic): the
// request reserves its output at its most with shaper.WithCosts on its
// context, and WithUsageCosts settles each part at what the body says it
// used; WithUsage settles the named part at its reservation.
func TestUsageCostsSettleEachPart(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"usage": map[string]int64{"input_tokens": 250, "output_tokens": 40}})
	}))
	defer srv.Close()
	usage := func(_ *http.Response, body []byte) (int64, shaper.Costs, bool) {
		var v struct {
			Usage *struct {
				In  int64 `json:"input_tokens"`
				Out int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(body, &v) != nil || v.Usage == nil {
			return 0, nil, false
		}
		return v.Usage.In, shaper.Costs{"output-tokens": v.Usage.Out}, true
	}
	for _, c := range []struct {
		name    string
		opt     Option
		in, out int64 // left after the call
	}{
		// The buckets' schedules hold their capacity less what refills
		// during the 5 ms spread: 9,999 and 1,999.
		{"WithUsageCosts", WithUsageCosts(usage), 9999 - 250, 1999 - 40},
		{"WithUsage", WithUsage(func(r *http.Response, b []byte) (int64, bool) { n, _, ok := usage(r, b); return n, ok }), 9999 - 250, 1999 - 500},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := memstore.New()
			defer store.Close()
			s, err := partnerpkg.New(store, []partnerpkg.Limit{
				partnerpkg.Bucket("input-tokens", 10000, shaper.PerMinute(10000)),
				partnerpkg.Bucket("output-tokens", 2000, shaper.PerMinute(2000)),
			}, partnerpkg.WithShaper(shaper.WithClock(timer.NewFake(time.Now())))) // no refill between the settle and Status
			if err != nil {
				t.Fatal(err)
			}
			client := &http.Client{Transport: New(s, WithKey(func(*http.Request) string { return "k" }),
				WithCost(func(*http.Request) int64 { return 300 }), c.opt, WithFeedback(false))}
			req, _ := http.NewRequestWithContext(shaper.WithCosts(context.Background(), shaper.Costs{"output-tokens": 500}), http.MethodPost, srv.URL, nil)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			st, err := s.Status(context.Background(), "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			left := map[string]int64{}
			for _, d := range st.Dimensions {
				left[d.Name] = d.Remaining
			}
			if left["input-tokens"] != c.in || left["output-tokens"] != c.out {
				t.Fatalf("left %v, want input %d, output %d", left, c.in, c.out)
			}
		})
	}
}
