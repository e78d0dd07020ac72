package transport

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// sentAt is a base RoundTripper that answers at once and records which
// tenant's request it sent, in order.
type sentAt struct {
	mu   sync.Mutex
	sent []string
}

func (s *sentAt) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.sent = append(s.sent, req.Header.Get("X-Tenant"))
	s.mu.Unlock()
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

// WithFlow names each request's flow from the request: a tenant's 5
// requests sent after another's 100 leave alternating with them, not
// behind them.
func TestWithFlowTakesTurnsPerTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.WithSweepInterval(0))
		defer store.Close()
		s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithMaxQueue(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		base := &sentAt{}
		client := &http.Client{Transport: New(s, WithBase(base), WithKey(func(*http.Request) string { return "partner" }),
			WithFlow(func(r *http.Request) (shaper.Flow, bool) {
				name := r.Header.Get("X-Tenant")
				return shaper.Flow{Name: name}, name != ""
			}))}
		send := func(tenant string, n int, wg *sync.WaitGroup) {
			for range n {
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodGet, "http://partner.test/", nil)
					req.Header.Set("X-Tenant", tenant)
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					_ = resp.Body.Close()
				})
			}
		}
		var wg sync.WaitGroup
		send("A", 100, &wg)
		time.Sleep(time.Second)
		send("B", 5, &wg)
		time.Sleep(time.Second + 50*time.Millisecond)
		base.mu.Lock()
		sent := strings.Join(base.sent, "")
		base.mu.Unlock()
		wg.Wait()
		// 11 of A's left by B's arrival at 1 s, and one more holds the next
		// slot; then the tenants take turns.
		if i := strings.IndexByte(sent, 'B'); i > 12 || !strings.HasPrefix(sent[i:], "BABABABAB") {
			t.Fatalf("sent %s: B's requests do not alternate with A's from the first free slot after B arrived", sent)
		}
	})
}
