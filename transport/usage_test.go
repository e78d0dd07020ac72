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
