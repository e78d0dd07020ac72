package shaper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/conform"
	"github.com/throttlekit/throttlekit-go/memstore"
)

// fairDep is one departure of a fair test: its flow and instant.
type fairDep struct {
	flow string
	at   time.Time
}

// fairLog records the departures of a fair test.
type fairLog struct {
	mu   sync.Mutex
	deps []fairDep
	wg   sync.WaitGroup
}

// submit starts n requests of f on key after delay, each waiting with ctx;
// a request refused or cancelled is not recorded (a refusal other than
// ctx's end fails the test).
func (l *fairLog) submit(t *testing.T, ctx context.Context, s *Shaper, key string, f Flow, n int, delay time.Duration) {
	t.Helper()
	l.wg.Go(func() {
		time.Sleep(delay)
		fctx := WithFlow(ctx, f)
		var inner sync.WaitGroup
		for range n {
			inner.Go(func() {
				if err := s.Wait(fctx, key, 1); err != nil {
					if ctx.Err() == nil {
						t.Errorf("flow %q: %v", f.Name, err)
					}
					return
				}
				l.mu.Lock()
				l.deps = append(l.deps, fairDep{f.Name, time.Now()})
				l.mu.Unlock()
			})

		}
		inner.Wait()
	})
}

// sorted returns the departures in time order.
func (l *fairLog) sorted() []fairDep {
	l.wg.Wait()
	deps := slices.Clone(l.deps)
	slices.SortStableFunc(deps, func(a, b fairDep) int { return a.at.Compare(b.at) })
	return deps
}

// conforms replays deps through the contract (interval ms, no burst).
func conforms(t *testing.T, deps []fairDep, interval float64) {
	t.Helper()
	cd := make([]conform.Departure, len(deps))
	for i, d := range deps {
		cd[i] = conform.Departure{At: algorithms.Millis(d.at), Cost: 1}
	}
	if d, ok := conform.Check(interval, 0, cd); !ok {
		t.Fatalf("departure at %v breaks the contract", d.At)
	}
}

// noGap fails if two consecutive departures are more than interval apart:
// no slot was wasted while requests waited.
func noGap(t *testing.T, deps []fairDep, interval time.Duration) {
	t.Helper()
	for i := 1; i < len(deps); i++ {
		if gap := deps[i].at.Sub(deps[i-1].at); gap > interval {
			t.Fatalf("a gap of %v between departures %d and %d: a slot was lost while flows waited", gap, i-1, i)
		}
	}
}

func newFairShaper(t *testing.T, opts ...Option) *Shaper {
	t.Helper()
	opts = append([]Option{WithMaxQueue(1000 * time.Second)}, opts...)
	s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(10), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A backlogged with 1,000 at 10/s; B arrives 10 s in with 10 at weight 1:1:
// B's 10 depart within 2 s, alternating with A, and no slot is lost.
func TestFairALateFlowIsNotQueuedBehindABacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFairShaper(t)
		ctx, cancel := context.WithCancel(bg)
		start := time.Now()
		var l fairLog
		l.submit(t, ctx, s, "k", Flow{Name: "A"}, 1000, 0)
		l.submit(t, ctx, s, "k", Flow{Name: "B"}, 10, 10*time.Second)
		time.Sleep(15 * time.Second)
		cancel()
		deps := l.sorted()
		conforms(t, deps, 100)
		noGap(t, deps, 100*time.Millisecond)
		var bs []int
		for i, d := range deps {
			if d.flow == "B" {
				bs = append(bs, i)
			}
		}
		if len(bs) != 10 {
			t.Fatalf("%d of B's 10 departed", len(bs))
		}
		arrived := start.Add(10 * time.Second)
		if last := deps[bs[9]].at.Sub(arrived); last > 2*time.Second {
			t.Fatalf("B's last request departed %v after B arrived, want at most 2 s", last)
		}
		for i := 1; i < len(bs); i++ {
			if bs[i]-bs[i-1] != 2 {
				t.Fatalf("B's departures at positions %v: not alternating with A", bs)
			}
		}
		if n := len(deps); n < 149 {
			t.Fatalf("%d departures in 15 s at 10/s", n)
		}
	})
}

// shares counts each flow's departures in [from, to).
func shares(deps []fairDep, from, to time.Time) map[string]int {
	n := map[string]int{}
	for _, d := range deps {
		if !d.at.Before(from) && d.at.Before(to) {
			n[d.flow]++
		}
	}
	return n
}

// Weights 3:1, both backlogged: 75 % and 25 % of the departures, within
// 2 %; the same with the flows in two shapers sharing one store, as two
// processes share Redis.
func TestFairWeightsGiveTheirShares(t *testing.T) {
	for _, procs := range []int{1, 2} {
		t.Run(map[int]string{1: "one-shaper", 2: "two-shapers"}[procs], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := memstore.New(memstore.WithSweepInterval(0))
				var sh [2]*Shaper
				for i := range procs {
					s, err := New(st, PerSecond(10), WithMaxQueue(1000*time.Second))
					if err != nil {
						t.Fatal(err)
					}
					sh[i] = s
				}
				if procs == 1 {
					sh[1] = sh[0]
				}
				ctx, cancel := context.WithCancel(bg)
				start := time.Now()
				var l fairLog
				l.submit(t, ctx, sh[0], "k", Flow{Name: "A", Weight: 3}, 500, 0)
				l.submit(t, ctx, sh[1], "k", Flow{Name: "B", Weight: 1}, 500, 0)
				time.Sleep(40 * time.Second)
				cancel()
				deps := l.sorted()
				conforms(t, deps, 100)
				noGap(t, deps, 100*time.Millisecond)
				n := shares(deps, start, start.Add(40*time.Second))
				total := float64(n["A"] + n["B"])
				if a := float64(n["A"]) / total; math.Abs(a-0.75) > 0.02 {
					t.Fatalf("A %d, B %d: A's share %.3f, want 0.75 ± 0.02", n["A"], n["B"], a)
				}
				if total < 395 {
					t.Fatalf("%v departures in 40 s at 10/s", total)
				}
				t.Logf("A %d, B %d of %v", n["A"], n["B"], total)
			})
		})
	}
}

// An interactive request arriving while a batch flow saturates the key
// departs at the first slot the dispatcher does not already hold: at most
// one slot behind. And while interactive requests saturate it, the batch
// flow keeps one turn in DefaultMaxPriorityRun + 1.
func TestFairInteractiveBeforeBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFairShaper(t)
		ctx, cancel := context.WithCancel(bg)
		var l fairLog
		l.submit(t, ctx, s, "k", Flow{Name: "backfill", Priority: Batch}, 500, 0)
		for i := range 20 {
			arrive := time.Duration(i)*time.Second + 1234*time.Millisecond
			l.wg.Go(func() {
				time.Sleep(arrive)
				at := time.Now()
				if err := s.Wait(WithFlow(ctx, Flow{Name: "user", Priority: Interactive}), "k", 1); err != nil {
					t.Error(err)
					return
				}
				if w := time.Since(at); w > 200*time.Millisecond {
					t.Errorf("an interactive request waited %v behind the batch flow, more than one slot (100 ms) behind the next", w)
				}
			})
		}
		time.Sleep(21 * time.Second)
		// Interactive requests saturate the key for 20 s: the batch flow
		// keeps a tenth of the turns.
		start := time.Now()
		l.submit(t, ctx, s, "k", Flow{Name: "chat", Priority: Interactive}, 400, 0)
		time.Sleep(20 * time.Second)
		cancel()
		deps := l.sorted()
		conforms(t, deps, 100)
		n := shares(deps, start.Add(time.Second), start.Add(20*time.Second))
		if got, want := n["backfill"], 19; got < want-1 || got > want+1 {
			t.Fatalf("batch %d, interactive %d in 19 s: want the batch flow about one turn in %d (%d)", n["backfill"], n["chat"], DefaultMaxPriorityRun+1, want)
		}
	})
}

// With WithMaxPriorityRun(0) priority is strict: the batch flow waits
// while an interactive one has requests waiting.
func TestFairStrictPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFairShaper(t, WithMaxPriorityRun(0))
		ctx, cancel := context.WithCancel(bg)
		var l fairLog
		l.submit(t, ctx, s, "k", Flow{Name: "chat", Priority: Interactive}, 100, 0)
		synctest.Wait()
		l.submit(t, ctx, s, "k", Flow{Name: "backfill", Priority: Batch}, 100, 0)
		time.Sleep(15 * time.Second)
		cancel()
		deps := l.sorted()
		for i, d := range deps {
			if d.flow == "backfill" && i < 99 { // the first chat request departed alone
				t.Fatalf("a batch request departed %d-th, while interactive ones waited", i)
			}
		}
	})
}

// A request whose turn, as the process sees it, comes past its deadline or
// MaxQueue is refused at once, and takes nothing: the others depart as if
// it never came. A new flow's turn comes at once, so it is not refused.
func TestFairRefusesAtOnceWhatItsTurnCannotMeet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(10), WithMaxQueue(10050*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		var l fairLog
		l.submit(t, ctx, s, "k", Flow{Name: "A"}, 101, 0) // the last of them 10 s away
		synctest.Wait()
		dctx, dcancel := context.WithTimeout(WithFlow(bg, Flow{Name: "A"}), time.Second)
		defer dcancel()
		at := time.Now()
		var de *DeadlineError
		if err := s.Wait(dctx, "k", 1); !errors.As(err, &de) || time.Since(at) != 0 {
			t.Fatalf("A's 102nd request with 1 s to live: %v after %v, want a *DeadlineError at once", err, time.Since(at))
		}
		var qf *QueueFullError
		if err := s.Wait(WithFlow(bg, Flow{Name: "A"}), "k", 1); !errors.As(err, &qf) || !errors.Is(err, ErrQueueFull) {
			t.Fatalf("A's 102nd request, 10.1 s away, past MaxQueue: %v, want a *QueueFullError", err)
		}
		bctx, bcancel := context.WithTimeout(WithFlow(bg, Flow{Name: "B"}), time.Second)
		defer bcancel()
		if err := s.Wait(bctx, "k", 1); err != nil {
			t.Fatalf("B, a new flow, with 1 s to live: %v", err)
		}
		time.Sleep(12 * time.Second)
		cancel()
		deps := l.sorted()
		if len(deps) != 101 {
			t.Fatalf("%d of A's 101 departed", len(deps))
		}
		noGap(t, deps, 200*time.Millisecond) // B's one slot among them
		conforms(t, deps, 100)
	})
}

// A bad flow is refused at the boundary with a *FlowError, and nothing is
// reserved.
func TestFairRefusesABadFlow(t *testing.T) {
	s := newFairShaper(t)
	for _, f := range []Flow{
		{Name: strings.Repeat("x", MaxFlowName+1)},
		{Weight: -1},
		{Weight: math.NaN()},
		{Weight: math.Inf(1)},
		{Weight: MaxWeight * 2},
		{Priority: MaxPriority + 1},
		{Priority: MinPriority - 1},
	} {
		var fe *FlowError
		err := s.Wait(WithFlow(bg, f), "k", 1)
		if !errors.As(err, &fe) || !errors.Is(err, ErrInvalidFlow) {
			t.Fatalf("flow %+v: %v, want a *FlowError", f, err)
		}
	}
	st, err := s.Status(bg, "k", 1)
	if err != nil || st.Remaining != 1 {
		t.Fatalf("after refusals: %+v, %v: want nothing taken", st, err)
	}
	// On a shaper with permits too, whether one is free or not: no permit
	// is taken, and nothing reaches the store.
	fs := newFlightShaper(t, Dimension{Name: "open", InFlight: 1}, Dimension{Name: "rate", Rate: PerSecond(10)})
	bad := WithFlow(bg, Flow{Weight: math.NaN()})
	if _, err := fs.AwaitTurn(bad, "k", 1); !errors.Is(err, ErrInvalidFlow) {
		t.Fatalf("AwaitTurn with a permit free, a bad flow: %v", err)
	}
	if _, err := fs.Acquire(bad, "k", 1); !errors.Is(err, ErrInvalidFlow) {
		t.Fatalf("Acquire with a permit free, a bad flow: %v", err)
	}
	if held, _ := inFlight(t, fs, "k"); held != 0 {
		t.Fatalf("%d permits held after bad flows", held)
	}
	if _, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(1), WithMaxPriorityRun(-1)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("WithMaxPriorityRun(-1): %v", err)
	}
}

// Requests that give up while they wait take nothing, and the flows left
// keep the key busy: no slot lost, the contract kept.
func TestFairCancelledWaitersLoseNoSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFairShaper(t)
		ctx, cancel := context.WithCancel(bg)
		short, cancelShort := context.WithCancel(ctx)
		var l fairLog
		l.submit(t, short, s, "k", Flow{Name: "A"}, 100, 0)
		l.submit(t, ctx, s, "k", Flow{Name: "B"}, 100, 0)
		l.submit(t, short, s, "k", Flow{Name: "C", Weight: 2}, 100, 0)
		time.Sleep(3050 * time.Millisecond)
		cancelShort()
		time.Sleep(5 * time.Second)
		cancel()
		deps := l.sorted()
		conforms(t, deps, 100)
		noGap(t, deps, 100*time.Millisecond)
		if len(deps) < 80 {
			t.Fatalf("%d departures in 8 s", len(deps))
		}
	})
}

// Fair turns beside a pause, an in-flight limit and a live rate change:
// the requests held by the pause leave paced after it, in turn; the
// permits bound what is open; the new rate applies to the turns after it.
func TestFairWithPauseInFlightAndLiveChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := All(memstore.New(memstore.WithSweepInterval(0)), []Dimension{
			{Name: "rate", Rate: PerSecond(10)},
			{Name: "open", InFlight: 3},
		}, WithMaxQueue(1000*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		start := time.Now()
		var mu sync.Mutex
		var deps []fairDep
		var open, most int
		var wg sync.WaitGroup
		for _, f := range []Flow{{Name: "A"}, {Name: "B"}} {
			for range 60 {
				wg.Go(func() {
					r, err := s.Acquire(WithFlow(ctx, f), "k", 1)
					if err != nil {
						if ctx.Err() == nil {
							t.Error(err)
						}
						return
					}
					mu.Lock()
					deps = append(deps, fairDep{f.Name, time.Now()})
					open++
					most = max(most, open)
					mu.Unlock()
					time.Sleep(150 * time.Millisecond)
					mu.Lock()
					open--
					mu.Unlock()
					_ = r.Release(bg)
				})
			}
		}
		time.Sleep(2 * time.Second)
		if err := s.Pause(bg, "k", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		if err := s.SetRate(bg, "rate", PerSecond(5)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		cancel()
		wg.Wait()
		slices.SortFunc(deps, func(a, b fairDep) int { return a.at.Compare(b.at) })
		if most > 3 {
			t.Fatalf("%d open at once, limit 3", most)
		}
		var before, during, after []fairDep
		for _, d := range deps {
			switch el := d.at.Sub(start); {
			case el < 2*time.Second:
				before = append(before, d)
			case el < 4*time.Second:
				during = append(during, d)
			case el >= 5*time.Second+200*time.Millisecond: // past the change, and the slot held before it
				after = append(after, d)
			}
		}
		if len(during) > 1 { // a slot granted before the pause may still leave at its instant
			t.Fatalf("%d departures during the pause", len(during))
		}
		conforms(t, before, 100)
		conforms(t, after, 200)
		n := shares(after, start, start.Add(time.Hour))
		if d := n["A"] - n["B"]; d < -1 || d > 1 {
			t.Fatalf("after the change A %d, B %d: not taking turns", n["A"], n["B"])
		}
	})
}

// Requests that arrive one at a time, each after the one before was
// served (as queue.Submit's goroutines do), still wait in the key's room
// rather than each reserving the next free slot: a flow arriving later
// goes at most two slots after it arrives, not behind the backlog.
func TestFairALateFlowIsNotQueuedBehindATrickle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(20), WithMaxQueue(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		a := WithFlow(ctx, Flow{Name: "A"})
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() { _ = s.Wait(a, "k", 1) })
			synctest.Wait() // served, or waiting in the room
		}
		time.Sleep(time.Second)
		at := time.Now()
		if err := s.Wait(WithFlow(ctx, Flow{Name: "B"}), "k", 1); err != nil {
			t.Fatal(err)
		}
		if w := time.Since(at); w > 100*time.Millisecond {
			t.Fatalf("B waited %v behind A's requests, more than two slots (100 ms)", w)
		}
		cancel()
		wg.Wait()
	})
}

// The sweep of idle rooms (every 256th room opened) never takes the room
// it is opening: a second request of the key joins the first's room and
// waits behind its slot, rather than opening a room of its own whose
// dispatcher would reserve at once (two slots ahead instead of one).
func TestFairTheSweepKeepsTheRoomItOpens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFairShaper(t)
		if _, err := s.Reserve(bg, "k", 1); err != nil { // the key is busy: the first turn waits
			t.Fatal(err)
		}
		s.fairRooms.mu.Lock()
		s.fairRooms.opened = 255 // the next room opened sweeps
		s.fairRooms.mu.Unlock()
		var wg sync.WaitGroup
		for _, f := range []string{"A", "B"} {
			wg.Go(func() { _ = s.Wait(WithFlow(bg, Flow{Name: f}), "k", 1) })
			synctest.Wait()
		}
		s.fairRooms.mu.Lock()
		rm := s.fairRooms.rooms["k"]
		waiting := -1
		if rm != nil {
			waiting = rm.waiting
		}
		s.fairRooms.mu.Unlock()
		if waiting != 1 {
			t.Fatalf("the key's room holds %d waiting, want B behind A's slot", waiting)
		}
		wg.Wait()
	})
}

// A Batch request behind 28 s of Interactive requests, with 3 s to live,
// is not refused: the rule against starvation gives it a turn within
// DefaultMaxPriorityRun + 1 turns (issue 37: "would wait 28s", refused at
// once, as if every higher-class request went first).
func TestFairALowerClassIsNotRefusedBehindAHigherBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(10)) // MaxQueue 30 s
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		var wg sync.WaitGroup
		chat := WithFlow(ctx, Flow{Name: "chat", Priority: Interactive})
		for range 280 {
			wg.Go(func() { _ = s.Wait(chat, "k", 1) })
		}
		synctest.Wait()
		bctx, bcancel := context.WithTimeout(WithFlow(bg, Flow{Name: "backfill", Priority: Batch}), 3*time.Second)
		defer bcancel()
		at := time.Now()
		if err := s.Wait(bctx, "k", 1); err != nil {
			t.Fatalf("a Batch request with 3 s to live behind 28 s of Interactive ones: %v", err)
		}
		if w, most := time.Since(at), time.Duration(DefaultMaxPriorityRun+2)*100*time.Millisecond; w > most {
			t.Fatalf("the Batch request waited %v, more than the rule's %v", w, most)
		}
		cancel()
		wg.Wait()
	})
}

// While the Interactive backlog sits at MaxQueue, Batch requests with 10 s
// timeouts depart as the rule allows, one turn in n + 1: the k-th (from 0)
// at about (k+1)(n+1) slots; for every n, the ones whose turn the rule
// gives before their deadline depart, the others are refused (at once or
// at their turn) and take nothing; with n = 0 (strict priority) every one
// is refused at once. Issue 37: 0 of 20 departed with the default n.
func TestFairLowerClassesDepartAsTheRuleAllows(t *testing.T) {
	for _, n := range []int{0, 1, 4, DefaultMaxPriorityRun} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(10), WithMaxPriorityRun(n)) // MaxQueue 30 s
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(bg)
				var wg sync.WaitGroup
				chat := WithFlow(ctx, Flow{Name: "chat", Priority: Interactive})
				full := 0
				var mu sync.Mutex
				for range 320 {
					wg.Go(func() {
						if err := s.Wait(chat, "k", 1); errors.Is(err, ErrQueueFull) {
							mu.Lock()
							full++
							mu.Unlock()
						}
					})
				}
				synctest.Wait()
				if full == 0 {
					t.Fatal("the Interactive backlog did not reach MaxQueue")
				}
				start := time.Now()
				var departed, atOnce, atTurn int
				for range 20 {
					wg.Go(func() {
						bctx, bcancel := context.WithTimeout(WithFlow(ctx, Flow{Name: "backfill", Priority: Batch}), 10*time.Second)
						defer bcancel()
						err := s.Wait(bctx, "k", 1)
						mu.Lock()
						defer mu.Unlock()
						var de *DeadlineError
						switch {
						case err == nil:
							departed++
							if time.Since(start) > 10*time.Second {
								t.Errorf("a Batch request departed %v after it came, past its deadline", time.Since(start))
							}
						case errors.As(err, &de) && time.Since(start) == 0:
							atOnce++
						case errors.As(err, &de) || errors.Is(err, context.DeadlineExceeded):
							atTurn++
						default:
							t.Errorf("a Batch request: %v", err)
						}
					})
				}
				time.Sleep(11 * time.Second)
				mu.Lock()
				got := departed
				mu.Unlock()
				cancel()
				wg.Wait()
				t.Logf("n=%d: %d departed, %d refused at once, %d at their turn", n, departed, atOnce, atTurn)
				if n == 0 {
					if departed != 0 || atOnce != 20 {
						t.Fatalf("strict priority: %d departed, %d refused at once of 20, want none and all", departed, atOnce)
					}
					return
				}
				// The k-th Batch turn comes after about (k+1)(n+1) slots of
				// 100 ms, within one slot.
				want := 100/(n+1) - 1
				if want > 20 {
					want = 20
				}
				if got < want {
					t.Fatalf("%d Batch requests departed within their 10 s, want at least %d by the rule (one turn in %d)", got, want, n+1)
				}
			})
		})
	}
}

// A lone process with more flows than it once put forward (16) and a
// Batch class waiting loses no slot: 30 tenants and 3 Batch flows at
// 100/s give 2,000 departures in 20 s, back to back (issue 37: 1,641, the
// store owing the lower class's turn to a flow the process had not put
// forward, and telling it another process had the turn).
func TestFairALoneProcessLosesNoSlotWithManyFlows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(100)) // defaults
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		start := time.Now()
		var l fairLog
		for i := range 30 {
			l.submit(t, ctx, s, "k", Flow{Name: fmt.Sprint("tenant", i)}, 70, 0)
		}
		for i := range 3 {
			l.submit(t, ctx, s, "k", Flow{Name: fmt.Sprint("batch", i), Priority: Batch}, 70, 0)
		}
		time.Sleep(20 * time.Second)
		cancel()
		deps := l.sorted()
		var in []fairDep
		for _, d := range deps {
			if d.at.Sub(start) < 20*time.Second {
				in = append(in, d)
			}
		}
		conforms(t, deps, 10)
		if len(in) < 2000 {
			t.Fatalf("%d departures in 20 s at 100/s, want 2,000", len(in))
		}
		noGap(t, in, 10*time.Millisecond)
	})
}

// One tenant's Interactive and Batch requests are two flows: its
// Interactive request departs within two slots, not behind its own Batch
// backlog, and that backlog is not promoted: another tenant's Normal flow
// keeps nine turns in ten against it (issue 37: merged into one FIFO flow
// taking the latest request's class, the Interactive call waited 10.65 s
// and the promoted backlog took 45 of 49 turns).
func TestFairOneTenantsClassesAreSeparateFlows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFairShaper(t)
		ctx, cancel := context.WithCancel(bg)
		start := time.Now()
		var l fairLog
		l.submit(t, ctx, s, "k", Flow{Name: "acme", Priority: Batch}, 100, 0)
		l.submit(t, ctx, s, "k", Flow{Name: "globex"}, 100, 0)
		time.Sleep(2050 * time.Millisecond)
		at := time.Now()
		if err := s.Wait(WithFlow(ctx, Flow{Name: "acme", Priority: Interactive}), "k", 1); err != nil {
			t.Fatal(err)
		}
		if w := time.Since(at); w > 200*time.Millisecond {
			t.Fatalf("acme's Interactive request waited %v behind its own Batch backlog", w)
		}
		time.Sleep(8 * time.Second)
		cancel()
		deps := l.sorted()
		conforms(t, deps, 100)
		n := shares(deps, start, start.Add(10*time.Second))
		if n["globex"] < 80 || n["acme"] > 15 {
			t.Fatalf("in 10 s: globex (Normal) %d, acme (Batch) %d: want about 9 in 10 turns to the Normal flow", n["globex"], n["acme"])
		}
	})
}

// Weights 1e6 and 1e5 split 10:1 after a MinWeight flow of cost 10,000
// moved the key's virtual time to 1e10: within SFQ's bound (11 turns) and
// the slot the dispatcher holds. Issue 37: 183:37 (float64 tags lost the
// 1e-6 steps).
func TestFairExtremeWeightsKeepTheirShares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(1000), WithMaxQueue(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		var wg sync.WaitGroup
		// A Batch flow keeps the key busy (the turns would start over
		// once nobody waits); min's requests take 10 s of the key each:
		// its first turn starts at 0, its second at 1e10, where V goes.
		keeper := WithFlow(ctx, Flow{Name: "keeper", Priority: Batch})
		for range 3000 {
			wg.Go(func() { _ = s.Wait(keeper, "k", 1) })
		}
		synctest.Wait()
		heavy := WithFlow(ctx, Flow{Name: "min", Weight: MinWeight})
		for range 3 {
			wg.Go(func() { _ = s.Wait(heavy, "k", 10000) })
		}
		time.Sleep(11 * time.Second) // min's second turn has been granted
		var l fairLog
		l.submit(t, ctx, s, "k", Flow{Name: "big", Weight: 1e6}, 1300, 0)
		l.submit(t, ctx, s, "k", Flow{Name: "small", Weight: 1e5}, 1300, 0)
		time.Sleep(12 * time.Second)
		cancel()
		wg.Wait()
		deps := l.sorted()
		if len(deps) < 1100 {
			t.Fatalf("%d departures of big and small", len(deps))
		}
		n := shares(deps[:1100], deps[0].at, deps[1099].at.Add(time.Nanosecond))
		t.Logf("big %d, small %d", n["big"], n["small"])
		if d := n["big"] - 10*n["small"]; d < -13 || d > 13 {
			t.Fatalf("big %d, small %d: want 10:1 within SFQ's bound (11) and a slot", n["big"], n["small"])
		}
	})
}

// A turn's work does not grow with the flows waiting: the bytes allocated
// per departure with 10,000 tenants waiting stay within 3 times those
// with 10 (issue 37: the dispatcher sorted every flow at each turn, under
// the shaper's lock, and a 1,000/s key delivered 79-87 % of its rate with
// 1,000 or 10,000 tenants; BenchmarkFairManyFlows measures the time).
func TestFairATurnsWorkDoesNotGrowWithTheFlows(t *testing.T) {
	perTurn := func(tenants int) float64 {
		var per float64
		synctest.Test(t, func(t *testing.T) {
			s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(1000), WithMaxQueue(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(bg)
			var wg sync.WaitGroup
			for i := range tenants {
				fctx := WithFlow(ctx, Flow{Name: fmt.Sprint("tenant", i)})
				for range max(2, 2000/tenants) { // 2 s of the key at least
					wg.Go(func() { _ = s.Wait(fctx, "k", 1) })
				}
			}
			synctest.Wait()
			time.Sleep(time.Second) // the first registrations
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			time.Sleep(500 * time.Millisecond)
			synctest.Wait()
			runtime.ReadMemStats(&after)
			per = float64(after.TotalAlloc-before.TotalAlloc) / 500
			cancel()
			wg.Wait()
		})
		return per
	}
	few, many := perTurn(10), perTurn(10000)
	t.Logf("bytes allocated per departure: %.0f with 10 tenants waiting, %.0f with 10,000", few, many)
	if many > 3*few {
		t.Fatalf("a turn allocates %.0f bytes with 10,000 tenants waiting, %.0f with 10: its work grows with the flows", many, few)
	}
}

// BenchmarkFairManyFlows: a fair Wait on one key in memory, at a rate no
// call reaches, with n flows waiting (one goroutine per flow, each
// waiting again as soon as it departs): the cost of a turn (the room, the
// dispatcher, the store's turn) and its reservation, per departure.
func BenchmarkFairManyFlows(b *testing.B) {
	for _, n := range []int{16, 1000, 10000} {
		b.Run(fmt.Sprint("flows=", n), func(b *testing.B) {
			s, err := New(memstore.New(memstore.WithSweepInterval(0)), PerSecond(100_000).WithBurst(10_000_000), WithMaxQueue(time.Hour))
			if err != nil {
				b.Fatal(err)
			}
			benchFlows(b, s, n)
		})
	}
}

// benchFlows makes b.N fair Waits on s's key "k" from n goroutines, one
// flow each.
func benchFlows(b *testing.B, s *Shaper, n int) {
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := range n {
		ctx := WithFlow(bg, Flow{Name: fmt.Sprint("tenant-", i)})
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := s.Wait(ctx, "k", 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
