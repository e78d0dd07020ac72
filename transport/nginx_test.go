package transport

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/nginxtest"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/memstore"
	partnerpkg "github.com/throttlekit/throttlekit-go/partner"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// A strict partner (nginx's limit_req at 25r/s, no burst, on its own
// millisecond clock) refuses nothing of 100 requests sent at once through
// a Transport with the default options, paced by a shaper declared from
// the partner's limit with the default options (package partner): on a
// memory store, and by four shapers on four Redis clients sharing the
// rate (as four processes would, their transports' lateness unknown to
// each other; examples/adaptive runs four OS processes). A shaper at
// exactly the rate with no margin drew 10 to 28 refusals in 100; with the
// transport's margin of 4 ms, 1 in 104 in some loaded runs.
func TestAStrictPartnerRefusesNothing(t *testing.T) {
	srv := redistest.Start(t)
	for _, fleet := range []int{1, 4} {
		t.Run(fmt.Sprintf("shapers=%d", fleet), func(t *testing.T) {
			nginx := nginxtest.Start(t, nginxtest.Config{Rate: "25r/s"})
			var clients []*http.Client
			for range fleet {
				var store shaper.Store
				if fleet == 1 {
					store = memstore.New()
				} else {
					store = redisstore.New(srv.Client(), redisstore.WithTimeout(10*time.Second))
				}
				t.Cleanup(func() { _ = store.(interface{ Close() error }).Close() })
				s, err := partnerpkg.New(store, []partnerpkg.Limit{partnerpkg.NginxLimitReq(shaper.PerSecond(25), 0)}, partnerpkg.WithShaper(shaper.WithName("strict")))
				if err != nil {
					t.Fatal(err)
				}
				// Each its own connections, as a process has.
				base := &http.Transport{}
				t.Cleanup(base.CloseIdleConnections)
				clients = append(clients, &http.Client{Transport: New(s, WithBase(base))})
			}
			if fleet > 1 {
				// Each process has sent before: a process's first request
				// pays a cold start (its first dial and first-time code
				// paths, 5 to 7 ms under the race detector), which the
				// other processes' requests, already warm, do not know of
				// (one refusal in six runs without this). The warm-up
				// departs through the shapers too.
				for _, c := range clients {
					resp, err := c.Get(nginx.URL())
					if err != nil {
						t.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
			var wg sync.WaitGroup
			for i := range 100 {
				wg.Go(func() {
					resp, err := clients[i%fleet].Get(nginx.URL())
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				})
			}
			wg.Wait()
			refused := 0
			log := nginx.Log()
			for _, e := range log {
				if e.Status == http.StatusTooManyRequests {
					refused++
				}
			}
			for i, e := range log {
				if e.Status == http.StatusTooManyRequests && i > 0 {
					t.Logf("refused #%d: %v after the one before, %v after the first", i, e.At.Sub(log[i-1].At), e.At.Sub(log[0].At))
				}
			}
			if want := 100 + min(fleet-1, 1)*fleet; len(log) != want || refused != 0 {
				t.Fatalf("%d of %d requests refused by a strict partner at the shaper's exact rate (want %d requests)", refused, len(log), want)
			}
			span := log[len(log)-1].At.Sub(log[0].At)
			t.Logf("%d shaper(s): %d requests in %v (%.2f/s), none refused", fleet, len(log), span, float64(len(log)-1)/span.Seconds())
		})
	}
}
