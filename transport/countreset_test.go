package transport

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// countingPartner answers every request 200 with X-RateLimit headers: of
// left requests until reset (an instant), what remains after this one.
type countingPartner struct {
	mu    sync.Mutex
	left  int
	reset time.Time
	at    []time.Time
}

func (p *countingPartner) RoundTrip(req *http.Request) (*http.Response, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.at = append(p.at, now)
	if p.left > 0 {
		p.left--
	}
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "100")
	h.Set("X-RateLimit-Remaining", strconv.Itoa(p.left))
	h.Set("X-RateLimit-Reset", strconv.Itoa(int(p.reset.Sub(now).Seconds())))
	return &http.Response{StatusCode: 200, Header: h, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

// A remaining count whose reset lies past the transport's MaxPause (15
// min by default) is spread until its reset, not over MaxPause: 100 left
// until a reset an hour away leave at least 36 s apart, on a plain shaper
// (Clamp) and on a learning one (issue 37, defect 22: 9.2 s apart, the
// reset cut to MaxPause before it reached the shaper).
func TestARemainingCountPastMaxPauseIsSpreadUntilItsReset(t *testing.T) {
	for _, learning := range []bool{false, true} {
		t.Run("learning="+strconv.FormatBool(learning), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New(memstore.WithSweepInterval(0))
				defer st.Close()
				opts := []shaper.Option{shaper.WithMaxQueue(time.Hour)}
				if learning {
					opts = append(opts, shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10)}))
				}
				s, err := shaper.New(st, shaper.PerSecond(10), opts...)
				if err != nil {
					t.Fatal(err)
				}
				partner := &countingPartner{left: 101, reset: time.Now().Add(time.Hour)}
				client := &http.Client{Transport: New(s, WithBase(partner), WithSpacingMargin(0))}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for ctx.Err() == nil {
							req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://partner.test/", nil)
							resp, err := client.Do(req)
							if err != nil {
								return
							}
							_ = resp.Body.Close()
						}
					})
				}
				wg.Wait()
				partner.mu.Lock()
				defer partner.mu.Unlock()
				// The first response told of 100 left; each request the
				// shaper let go after it left at least 36 s after the one
				// before: the four reserved before any answer and the
				// first one after aside (granted slots keep their times).
				first := partner.at[0]
				n := 0
				for i := 5; i < len(partner.at); i++ {
					n++
					if gap := partner.at[i].Sub(partner.at[i-1]); gap < 36*time.Second-time.Millisecond {
						t.Fatalf("request %d left %v after the one before, with %d left until a reset %v away", i, gap, 101-i, time.Hour-partner.at[i-1].Sub(first))
					}
				}
				if n > 17 {
					t.Fatalf("%d requests in 10 min with 100 left for an hour", n)
				}
			})
		})
	}
}
