package storetest

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// Learned drives a learning shaper (shaper.WithLearning) on c's store and
// on a memory store, on a fake clock each (c's store must decide on the
// client clock), through the same seeded feedback — refusals, stated
// policies, remaining counts, pauses, margins (Space), the user's Clamp,
// Reset — interleaved with reservations, cancels and Status reads on OddKeys, and a plain shaper
// keeping a margin under partners' clamps beside them, and fails t at the first step where they
// differ: the delays granted (the learned rate's clamp), the errors, and
// the learned rate and event Status reports. Two shapers share each store,
// as two processes of a fleet: what one learns paces the other.
func Learned(t *testing.T, c Candidate) {
	t.Helper()
	run := func(st shaper.Store, seed uint64) []string {
		clk := timer.NewFake(T0)
		prefix := fmt.Sprintf("learn%d-%s:", seed, c.Name)
		var fleet [2]*shaper.Shaper
		for i := range fleet {
			s, err := shaper.New(st, shaper.PerSecond(100), shaper.WithClock(clk), shaper.WithPrefix(prefix),
				shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10), Floor: shaper.PerSecond(2)}))
			if err != nil {
				t.Fatal(err)
			}
			fleet[i] = s
		}
		// A plain shaper beside them, keeping a margin (Space) under
		// partners' clamps, with cancels giving slots back.
		plain, err := shaper.New(st, shaper.PerSecond(20), shaper.WithClock(clk), shaper.WithPrefix(prefix+"plain:"))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 11))
		var out []string
		for step := range 300 {
			clk.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
			s := fleet[rng.IntN(2)]
			key := OddKeys[rng.IntN(len(OddKeys))*rng.IntN(2)]
			line := fmt.Sprintf("%d %q: ", step, key)
			switch rng.IntN(11) {
			case 9:
				err := s.Reset(bg, key) // the learned clamp stays, renewed in the same call
				st, serr := s.Status(bg, key, 1)
				line += "reset " + ErrText(err) + fmt.Sprintf(" next %v %s", st.Next.Sub(clk.Now()), ErrText(serr))
			case 10:
				// The user's clamp on a learning key caps its learned rate.
				err := s.Clamp(bg, key, int64(rng.IntN(6)), time.Duration(rng.IntN(20_000))*time.Millisecond)
				st, serr := s.Status(bg, key, 1)
				line += "clamp " + ErrText(err) + fmt.Sprintf(" next %v %s", st.Next.Sub(clk.Now()), ErrText(serr))
			case 0, 1:
				r, err := s.Reserve(bg, key, 1)
				line += fmt.Sprintf("reserve %v %s", r.Delay, ErrText(err))
				if err == nil && rng.IntN(3) == 0 {
					line += " cancel " + ErrText(r.Cancel(bg))
				}
			case 6:
				err := s.Space(bg, key, time.Duration(rng.IntN(3))*time.Millisecond)
				line += "space " + ErrText(err)
			case 7:
				r, err := plain.Reserve(bg, key, 1)
				line += fmt.Sprintf("plain reserve %v %s", r.Delay, ErrText(err))
				if err == nil && rng.IntN(3) == 0 {
					line += " cancel " + ErrText(r.Cancel(bg))
				}
			case 8:
				var err error
				if rng.IntN(2) == 0 {
					err = plain.Space(bg, key, time.Duration(rng.IntN(8))*time.Millisecond)
					line += "plain space "
				} else {
					err = plain.Clamp(bg, key, int64(rng.IntN(6)), time.Duration(rng.IntN(3000))*time.Millisecond)
					line += "plain clamp "
				}
				st, serr := plain.Status(bg, key, 1)
				line += ErrText(err) + fmt.Sprintf(" next %v %s", st.Next.Sub(clk.Now()), ErrText(serr))
			case 2:
				// A burst of answers across the last second and a half,
				// so that a refusal finds the fleet's tallies to measure
				// by (at least learn.MinSample answers).
				line += "learn"
				for j := range 1 + rng.IntN(12) {
					fb := shaper.Feedback{Departed: clk.Now().Add(-time.Duration(rng.IntN(1500)) * time.Millisecond), Refused: rng.IntN(3) == 0}
					if j == 0 {
						fb.Departed = clk.Now()
					}
					err := fleet[rng.IntN(2)].Learn(bg, key, fb)
					line += fmt.Sprintf(" %v:%s", fb.Refused, ErrText(err))
				}
			case 3:
				fb := shaper.Feedback{Policy: shaper.Rate{Count: int64(1 + rng.IntN(60)), Period: time.Duration(1+rng.IntN(3)) * time.Second}}
				err := s.Learn(bg, key, fb)
				line += fmt.Sprintf("policy %v %s", fb.Policy, ErrText(err))
			case 4:
				fb := shaper.Feedback{HasRemaining: true, Remaining: int64(rng.IntN(10)), Reset: time.Duration(rng.IntN(5000)) * time.Millisecond}
				if rng.IntN(4) == 0 {
					fb.Pause = time.Duration(rng.IntN(2000)) * time.Millisecond
				}
				err := s.Learn(bg, key, fb)
				line += fmt.Sprintf("remaining %d %v pause %v %s", fb.Remaining, fb.Reset, fb.Pause, ErrText(err))
			case 5:
				st, err := s.Status(bg, key, 1)
				line += "status " + ErrText(err)
				if err == nil {
					line += fmt.Sprintf(" next %v learned %.9g %s at %v found %.9g policy %.9g", st.Next.Sub(clk.Now()),
						st.Learned.Rate, st.Learned.Event, st.Learned.Changed.Sub(T0), st.Learned.Found, st.Learned.Policy)
				}
			}
			out = append(out, line)
		}
		return out
	}
	for seed := range uint64(3) {
		want := run(memory(), seed)
		events := map[string]bool{}
		for _, l := range want {
			for _, e := range []string{"refused", "advertised", "remaining", "paused"} {
				if strings.Contains(l, "learned") && strings.Contains(l, " "+e+" ") {
					events[e] = true
				}
			}
		}
		if len(events) < 3 {
			t.Fatalf("seed %d: Status saw only the events %v: the sequence does not exercise learning", seed, events)
		}
		Same(t, fmt.Sprintf("learning on %s, seed %d", c.Name, seed), "memory", want, run(c.New(), seed))
	}
}
