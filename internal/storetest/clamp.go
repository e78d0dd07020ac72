package storetest

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// PausesKeepThePartnersCount checks, on c's store, that the pace a key
// resumes at after a partner's pause (a burst contract departs paced for
// as long again: see Shaper.Learn) never loosens a count the partner
// stated before it (Clamp): with "1 left until 30 s" in force, a refusal
// with a 1 s pause let the next request go at 1.9 s (the model test found
// it, a Learn and a Clamp meeting). A count looser than the resumed pace
// gives way to it, so the burst still does not leave at once after the
// pause. On a plain shaper and on a learning one.
func PausesKeepThePartnersCount(t *testing.T, c Candidate) {
	t.Helper()
	for _, learning := range []bool{false, true} {
		t.Run(fmt.Sprintf("learning=%v", learning), func(t *testing.T) {
			clk := timer.NewFake(T0)
			opts := []shaper.Option{shaper.WithClock(clk), shaper.WithMaxQueue(time.Minute),
				shaper.WithPrefix(fmt.Sprintf("pausekeep-%s-%v:", c.Name, learning))}
			if learning {
				opts = append(opts, shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10)}))
			}
			s, err := shaper.New(c.New(), shaper.PerSecond(10).WithBurst(10), opts...)
			if err != nil {
				t.Fatal(err)
			}
			refusal := shaper.Feedback{Refused: true, Pause: time.Second}

			// A tighter count stays.
			if err := s.Clamp(bg, "tight", 1, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if r, err := s.Reserve(bg, "tight", 1); err != nil || r.Delay != 0 {
				t.Fatalf("the one request the count leaves: %v %v", r.Delay, err)
			}
			if err := s.Learn(bg, "tight", refusal); err != nil {
				t.Fatal(err)
			}
			clk.Advance(1900 * time.Millisecond)
			r, err := s.Reserve(bg, "tight", 1)
			if err == nil && r.Time().Before(T0.Add(30*time.Second)) {
				t.Fatalf("\"1 left until 30 s\", then a refusal pausing 1 s: the next request departs at +%v, before the count's reset", r.Time().Sub(T0))
			}

			// A looser count gives way to the resumed pace: no burst after
			// the pause.
			if err := s.Clamp(bg, "loose", 205, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := s.Learn(bg, "loose", refusal); err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			var prev time.Time
			for i := range 4 {
				r, err := s.Reserve(bg, "loose", 1)
				if err != nil {
					t.Fatal(err)
				}
				if i > 0 && r.Time().Sub(prev) < 100*time.Millisecond {
					t.Fatalf("after the pause, departures %v apart under a 10/s contract: the burst left (request %d)", r.Time().Sub(prev), i)
				}
				prev = r.Time()
			}
		})
	}
}

// ALearnedPaceOutlivesAShorterQueue checks, on c's store, that a learned
// pace keeps spacing from the last departure it granted when MaxQueue
// shrinks live: a slot granted 30 s ahead under a queue of a minute lies
// past the window the pace's next renewal sets under a queue of a second,
// and the renewal that dropped such a slot let the next request leave at
// once, two departures within a stated "1 per 30 s" (the model test found
// it: a Learn, a live SetMaxQueue and a flood meeting).
func ALearnedPaceOutlivesAShorterQueue(t *testing.T, c Candidate) {
	t.Helper()
	clk := timer.NewFake(T0)
	s, err := shaper.New(c.New(), shaper.PerSecond(10), shaper.WithClock(clk), shaper.WithMaxQueue(time.Minute),
		shaper.WithPrefix("pace-queue-"+c.Name+":"), shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10)}))
	if err != nil {
		t.Fatal(err)
	}
	const key = "k"
	if err := s.Learn(bg, key, shaper.Feedback{Policy: shaper.Rate{Count: 1, Period: 30 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	var slots []time.Time
	for range 2 {
		r, err := s.Reserve(bg, key, 1)
		if err != nil {
			t.Fatalf("a slot within the minute's queue: %v", err)
		}
		slots = append(slots, r.Time())
	}
	if err := s.SetMaxQueue(bg, time.Second); err != nil {
		t.Fatal(err)
	}
	// Renewed every 250 ms while requests come, up to and past the second
	// slot: the contract's own schedule (10/s) frees the key at 30.1 s,
	// and only the pace keeps the next departure from there to 60 s.
	for range 120 {
		clk.Advance(300 * time.Millisecond)
		if r, err := s.Reserve(bg, key, 1); err == nil {
			slots = append(slots, r.Time())
		}
	}
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap < 30*time.Second-time.Millisecond {
			t.Fatalf("\"1 per 30 s\": departures at +%v and +%v, %v apart, after MaxQueue shrank from a minute to a second",
				slots[i-1].Sub(T0), slots[i].Sub(T0), gap)
		}
	}
	if len(slots) != 2 {
		t.Fatalf("%d slots granted, want the first two alone within 36 s of a queue of a second", len(slots))
	}
}

// ALearnedCountOutlivesALiftedContract checks, on c's store, that a
// partner's remaining count holds until its reset on a learning shaper
// even when the contract did not let the key reach it when it was said:
// "10 left until the minute's reset" under 6 per minute, then a live
// SetRate to 100/s, and the next requests must still leave 6 s apart.
// The count was dropped as needless when said (the model test found it:
// a Learn and a SetRate meeting), and the key left 200 ms apart at its
// learned rate.
func ALearnedCountOutlivesALiftedContract(t *testing.T, c Candidate) {
	t.Helper()
	clk := timer.NewFake(T0)
	s, err := shaper.New(c.New(), shaper.PerMinute(6), shaper.WithClock(clk), shaper.WithMaxQueue(time.Minute),
		shaper.WithPrefix("count-lift-"+c.Name+":"), shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10)}))
	if err != nil {
		t.Fatal(err)
	}
	const key = "k"
	if err := s.Learn(bg, key, shaper.Feedback{HasRemaining: true, Remaining: 10, Reset: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRate(bg, "", shaper.PerSecond(100)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(500 * time.Millisecond) // the learned rate's slow start resumes under the new ceiling
	var prev time.Time
	for i := range 5 {
		r, err := s.Reserve(bg, key, 1)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if i > 0 && r.Time().Sub(prev) < 6*time.Second-time.Millisecond {
			t.Fatalf("\"10 left until the reset in a minute\", then the contract lifted to 100/s: requests %d and %d depart at +%v and +%v, %v apart (want 6 s)",
				i-1, i, prev.Sub(T0), r.Time().Sub(T0), r.Time().Sub(prev))
		}
		prev = r.Time()
	}
}

// PausesNeverShortenThePace checks, on c's store, the class of
// PausesKeepThePartnersCount for pauses alone: whatever pauses a partner
// asks for, at whatever times (each refusal's Retry-After, the later ones
// shorter as the partner's own pause runs out), every pause's pace holds
// for as long as that pause asked, however a later, shorter one ends:
// after a pause of d at t, no two departures within [t+d, t+d+max(d, 1 s))
// are closer than the contract's interval, and none departs inside a
// pause. A 429 with Retry-After 1 near the end of a 5 s pause replaced its
// 5 s pace with one of 2 s, and the burst left 1.5 s after the pause (in
// transport's TestAfterAPartnersPauseTheBusiestSecondIsWithinTheContract,
// on a loaded CI host: 20 in a second under 10/s). Every slot is the one
// the memory store grants (Go and Lua merge clamps alike). seeds
// sequences, on a plain shaper and on a learning one. Pauses are whole and
// half seconds of at least one, so that a Redis key's TTL (real
// milliseconds) outlives the fake clock's steps.
func PausesNeverShortenThePace(t *testing.T, c Candidate, seeds int) {
	t.Helper()
	const interval = 100 * time.Millisecond // the contract: 10/s, burst 10
	type pause struct{ at, d time.Duration }
	run := func(st shaper.Store, name string, learning bool, seed uint64) ([]pause, []time.Duration) {
		clk := timer.NewFake(T0)
		opts := []shaper.Option{shaper.WithClock(clk), shaper.WithMaxQueue(time.Minute),
			shaper.WithPrefix(fmt.Sprintf("pacekeep-%s-%v-%d:", name, learning, seed))}
		if learning {
			opts = append(opts, shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10)}))
		}
		s, err := shaper.New(st, shaper.PerSecond(10).WithBurst(10), opts...)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 41))
		var pauses []pause
		for range 1 + rng.IntN(5) {
			clk.Advance(time.Duration(rng.IntN(8)) * 500 * time.Millisecond)
			p := pause{clk.Now().Sub(T0), time.Duration(2+rng.IntN(9)) * 500 * time.Millisecond}
			pauses = append(pauses, p)
			if err := s.Learn(bg, "k", shaper.Feedback{Refused: true, Pause: p.d}); err != nil {
				t.Fatal(err)
			}
		}
		var slots []time.Duration
		for range 120 {
			r, err := s.Reserve(bg, "k", 1)
			if err != nil {
				break // the queue's minute is full
			}
			slots = append(slots, r.Time().Sub(T0))
		}
		return pauses, slots
	}
	for _, learning := range []bool{false, true} {
		for seed := range uint64(seeds) {
			pauses, slots := run(c.New(), c.Name, learning, seed)
			where := fmt.Sprintf("learning=%v seed %d (pauses %v)", learning, seed, pauses)
			if c.Name != "memory" {
				if _, want := run(memstore.New(memstore.WithSweepInterval(0)), "memory", learning, seed); fmt.Sprint(slots) != fmt.Sprint(want) {
					t.Fatalf("%s: slots %v, the memory store's %v", where, slots, want)
				}
			}
			for _, p := range pauses {
				from, to := p.at+p.d, p.at+p.d+max(p.d, time.Second)
				for i, at := range slots {
					if at > p.at && at < from {
						t.Fatalf("%s: a departure at +%v, inside the pause of %v at +%v", where, at, p.d, p.at)
					}
					if i > 0 && slots[i-1] >= from && at < to && at-slots[i-1] < interval-time.Millisecond {
						t.Fatalf("%s: departures at +%v and +%v, %v apart, within the pace after the pause of %v at +%v",
							where, slots[i-1], at, at-slots[i-1], p.d, p.at)
					}
				}
			}
		}
	}
}
