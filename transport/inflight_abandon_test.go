package transport

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// slowPartner serves each request after work, counting the requests it is
// serving at once (from arrival to its answer) and the most it ever served
// at once. With notices it stops early, without answering, when the
// client's connection goes; without, it works on, as many partners do.
type slowPartner struct {
	work                 time.Duration
	notices              bool
	open, most, answered atomic.Int64
}

func (p *slowPartner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.open.Add(1)
	defer p.open.Add(-1)
	for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
	}
	t := time.NewTimer(p.work)
	defer t.Stop()
	gone := r.Context().Done()
	if !p.notices {
		gone = nil
	}
	select {
	case <-t.C:
		p.answered.Add(1)
		_, _ = w.Write([]byte("done"))
	case <-gone:
	}
}

// waitHeld polls (up to 5 s) until key holds want permits.
func waitHeld(t *testing.T, s shaper.Reserver, key string, want int64, when string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, _ := held(t, s, key)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d permits held, want %d", when, n, want)
		}
	}
}

// Defect 17. A client timeout does not free the permit while the partner
// still works on the request: against a partner that takes 80 ms, clients
// that give up after 20 ms, 20 at once, 5 requests each, through a
// transport on InFlight 2, the partner never serves more than 2 at once;
// every abandoned request's permit comes back once the partner answered
// it. Before the fix the transport released when the round trip failed,
// and the partner saw 18 to 23 open.
func TestAnAbandonedRequestKeepsItsPermitWhileThePartnerWorks(t *testing.T) {
	t.Parallel()
	p := &slowPartner{work: 80 * time.Millisecond}
	srv := httptest.NewServer(p)
	defer srv.Close()
	s := permitShaper(t, 2)
	client := &http.Client{Timeout: 20 * time.Millisecond, Transport: New(s, WithBase(srv.Client().Transport))}
	var wg sync.WaitGroup
	var timedOut atomic.Int64
	for range 20 {
		wg.Go(func() {
			for range 5 {
				resp, err := client.Get(srv.URL)
				if err == nil {
					_ = resp.Body.Close()
					continue
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					var ue interface{ Timeout() bool }
					if !errors.As(err, &ue) || !ue.Timeout() {
						t.Errorf("a request failed with %v, want a timeout", err)
					}
				}
				timedOut.Add(1)
			}
		})
	}
	wg.Wait()
	waitHeld(t, s, hostKey(srv), 0, "once the partner answered every abandoned request")
	if most := p.most.Load(); most > 2 {
		t.Fatalf("the partner served %d at once, limit 2", most)
	}
	if p.answered.Load() == 0 || timedOut.Load() == 0 {
		t.Fatalf("%d answered by the partner, %d timed out: the scenario did not run", p.answered.Load(), timedOut.Load())
	}
	t.Logf("100 requests: %d timed out, the partner answered %d, at most %d at once", timedOut.Load(), p.answered.Load(), p.most.Load())
}

// The grace bounds the hold: against a partner that never answers in time,
// a request abandoned after 20 ms keeps its permit (checked at once; the
// grace is 1 s, the tolerance for this host's scheduling), and gives it
// back once the grace ends (the call cut, the partner's connection
// closed), well before the partner's 10 s. With WithAbandonGrace(0) the
// permit comes back at once, as before issue 37.
func TestTheAbandonGraceBoundsTheHold(t *testing.T) {
	t.Parallel()
	p := &slowPartner{work: 10 * time.Second, notices: true}
	srv := httptest.NewServer(p)
	defer srv.Close()
	for _, grace := range []time.Duration{time.Second, 0} {
		s := permitShaper(t, 1)
		client := &http.Client{Timeout: 20 * time.Millisecond, Transport: New(s, WithBase(srv.Client().Transport), WithAbandonGrace(grace))}
		start := time.Now()
		if resp, err := client.Get(srv.URL); err == nil {
			_ = resp.Body.Close()
			t.Fatal("a partner that never answers answered")
		}
		n, _ := held(t, s, hostKey(srv))
		if grace == 0 {
			if n != 0 {
				t.Fatalf("WithAbandonGrace(0): %d permits held after the client gave up, want 0", n)
			}
			continue
		}
		if n != 1 && time.Since(start) < grace {
			t.Fatalf("%d permits held %v after the request, within its grace of %v: want 1", n, time.Since(start), grace)
		}
		waitHeld(t, s, hostKey(srv), 0, "after the grace")
		if took := time.Since(start); took < grace {
			t.Fatalf("the permit came back %v after the request, before its grace of %v", took, grace)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); p.open.Load() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the partner still serves %d: the cut call's connection was not closed", p.open.Load())
		}
	}
}
