package transport

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/partnertest"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// sendUntil makes requests to url through c from n goroutines until ctx ends.
func sendUntil(t *testing.T, ctx context.Context, c *http.Client, url string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := c.Do(req)
				if err != nil {
					return // ctx ended
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

// A partner that states its policy only in RateLimit-Policy, 20 a second
// (a token bucket of 5): a learning shaper with no contract of its own but
// a ceiling of 1000/s, two of them through one Redis as two processes,
// gets no 429 for any request sent after the first response, and
// delivers the policy's rate once the slots taken before it, at the start
// rate (1/s, one per process), have passed.
func TestAPolicyOnlyPartnerIsFollowedFromItsFirstResponse(t *testing.T) {
	partner := partnertest.New(t, partnertest.Options{Rate: 20, Burst: 5, Policy: true})
	srv := redistest.Start(t)
	var clients []*http.Client
	for range 2 {
		st := redisstore.New(srv.Client(), redisstore.WithTimeout(10*time.Second))
		t.Cleanup(func() { _ = st.Close() })
		s, err := shaper.New(st, shaper.PerSecond(1000), shaper.WithName("policy-only"), shaper.WithLearning(shaper.Learning{}))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, &http.Client{Transport: New(s, WithBase(policyOnly{http.DefaultTransport}))})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { sendUntil(t, ctx, c, partner.URL(), 16) })
	}
	wg.Wait()
	log := partner.Log()
	if len(log) == 0 {
		t.Fatal("the partner saw nothing")
	}
	// The first response: the first arrival's, answered at once.
	first := log[0].At
	refused, accepted := 0, 0
	for _, a := range log {
		switch {
		case a.Status == http.StatusTooManyRequests && a.At.After(first.Add(50*time.Millisecond)):
			refused++
			t.Logf("refused %v after the first", a.At.Sub(first))
		case a.Status == http.StatusOK && a.At.After(first.Add(2500*time.Millisecond)):
			accepted++
		}
	}
	rate := float64(accepted) / time.Since(first.Add(2500*time.Millisecond)).Seconds()
	t.Logf("%d requests, %d refused after the first response; from 2.5 s after it, %.1f/s accepted", len(log), refused, rate)
	if refused != 0 {
		t.Fatalf("%d requests sent after the first response were refused by a partner stating its policy", refused)
	}
	if rate < 16 {
		t.Fatalf("%.1f/s accepted of a stated 20/s: the policy was not adopted", rate)
	}
}

// policyOnly drops every rate-limit field of a response but
// RateLimit-Policy.
type policyOnly struct{ base http.RoundTripper }

func (p policyOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := p.base.RoundTrip(req)
	if resp != nil {
		resp.Header.Del("RateLimit")
	}
	return resp, err
}

// A partner that pauses everyone for 5 s (429 with Retry-After: 5): when
// the pause ends the key resumes paced, and its busiest second after it
// stays within the contract (10/s with a burst of 10), on one shaper of a
// pair sharing Redis, 32 callers waiting through the pause.
func TestAfterAPartnersPauseTheBusiestSecondIsWithinTheContract(t *testing.T) {
	partner := partnertest.New(t, partnertest.Options{Rate: 1000, Burst: 1000})
	srv := redistest.Start(t)
	var clients []*http.Client
	for range 2 {
		st := redisstore.New(srv.Client(), redisstore.WithTimeout(10*time.Second))
		t.Cleanup(func() { _ = st.Close() })
		s, err := shaper.New(st, shaper.PerSecond(10).WithBurst(10), shaper.WithName("paused"))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, &http.Client{Transport: New(s)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Second)
	defer cancel()
	time.AfterFunc(time.Second, func() { partner.PauseAll(5 * time.Second) })
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { sendUntil(t, ctx, c, partner.URL(), 16) })
	}
	wg.Wait()
	log := partner.Log()
	var paused, after []time.Time
	for _, a := range log {
		if a.Status == http.StatusTooManyRequests {
			paused = append(paused, a.At)
		} else if len(paused) > 0 {
			after = append(after, a.At)
		}
	}
	if len(paused) == 0 || len(after) == 0 {
		t.Fatalf("%d refused, %d accepted after: the pause did not happen as set up", len(paused), len(after))
	}
	most := 0
	for i := range after {
		n := 0
		for j := i; j < len(after) && after[j].Sub(after[i]) < time.Second; j++ {
			n++
		}
		most = max(most, n)
	}
	t.Logf("%d refused in the pause, %d accepted after it, the busiest second after it: %d", len(paused), len(after), most)
	if most > 11 {
		t.Fatalf("the busiest second after the pause sent %d, the contract allows 10 a second (11 with the window's edges)", most)
	}
}
