package shaper

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
)

// hiddenPartner is a partner whose limit nobody is told: a token bucket of
// rate per second holding burst, which refuses what finds it empty.
type hiddenPartner struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func (p *hiddenPartner) admit(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.last.IsZero() {
		p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	} else {
		p.tokens = p.burst
	}
	p.last = now
	if p.tokens >= 1 {
		p.tokens--
		return true
	}
	return false
}

func (p *hiddenPartner) setRate(r float64) {
	p.mu.Lock()
	p.rate = r
	p.mu.Unlock()
}

type outcome struct {
	at time.Time
	ok bool
}

func TestLearningTracksAHiddenLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		defer st.Close()
		s, err := New(st, PerSecond(200), WithLearning(Learning{Start: PerSecond(10)}), WithMaxQueue(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		partner := &hiddenPartner{rate: 40, burst: 5}
		start := time.Now()
		phase := 20 * time.Second
		limits := []float64{40, 20, 60}
		ctx, cancel := context.WithTimeout(context.Background(), 3*phase)
		defer cancel()
		var mu sync.Mutex
		var log []outcome
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				for ctx.Err() == nil {
					if err := s.Wait(ctx, "p", 1); err != nil {
						return
					}
					dep := time.Now()
					ok := partner.admit(dep)
					mu.Lock()
					log = append(log, outcome{dep, ok})
					mu.Unlock()
					time.Sleep(20 * time.Millisecond) // the response's way back
					_ = s.Learn(context.Background(), "p", Feedback{Departed: dep, Refused: !ok})
				}
			})
		}
		wg.Go(func() {
			for i := 1; i < len(limits); i++ {
				time.Sleep(time.Until(start.Add(time.Duration(i) * phase)))
				partner.setRate(limits[i])
			}
		})
		wg.Wait()
		secs := int(3 * phase / time.Second)
		okN, refN := make([]int, secs), make([]int, secs)
		for _, o := range log {
			i := int(o.at.Sub(start) / time.Second)
			if i >= secs {
				continue
			}
			if o.ok {
				okN[i]++
			} else {
				refN[i]++
			}
		}
		for i := range secs {
			t.Logf("second %2d: limit %2.0f accepted %3d refused %3d", i, limits[i/20], okN[i], refN[i])
		}
		per := int(phase / time.Second)
		for ph, limit := range limits {
			conv := -1
			for i := ph * per; i < (ph+1)*per; i++ {
				if float64(okN[i]) >= 0.9*limit && refN[i] == 0 {
					conv = i - ph*per
					break
				}
			}
			if conv < 0 || conv > 10 {
				t.Errorf("phase %d (limit %v): converged after %d s, want within 10 s", ph, limit, conv)
				continue
			}
			ok, ref := 0, 0
			for i := ph*per + conv; i < (ph+1)*per; i++ {
				ok += okN[i]
				ref += refN[i]
			}
			share := float64(ref) / float64(ok+ref)
			through := float64(ok) / (limit * float64(per-conv))
			t.Logf("phase %d: limit %v/s, converged in %d s, then %.2f %% refused, %.1f %% of the limit delivered", ph, limit, conv, 100*share, 100*through)
			if share >= 0.01 || through < 0.9 {
				t.Errorf("phase %d: %.2f %% refused (want < 1 %%), %.1f %% delivered (want >= 90 %%)", ph, 100*share, 100*through)
			}
		}
	})
}
