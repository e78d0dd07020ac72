package shaper

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// Issue 37, defect 30: on a strict contract the transport's spacing
// margin is a clamp; a partner's remaining count with a long reset
// replaced it and held the next slot a whole new interval (90 s) after the
// last departure, where a burst contract, with no clamp to replace,
// departed at once. A replaced clamp spreads the partner's count from the
// next slot on: the next departure waits for what the old clamp (the
// margin) asked, no more; then the new interval applies. On every store,
// on the fake clock.
func TestAPartnersClampAfterTheMarginSpreadsFromTheNextSlot(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory", "redis", "cluster") {
		t.Run(e.name, func(t *testing.T) {
			for _, c := range []struct {
				burst int64
				next  time.Duration // the second departure, from t0
			}{
				{1, 104 * time.Millisecond}, // the margin's own slot: the 100 ms interval plus 4 ms
				{2, 10 * time.Millisecond},  // at once: the burst allows it
			} {
				clock := timer.NewFake(t0)
				s, err := New(e.store(t), PerSecond(10).WithBurst(c.burst), WithClock(clock),
					WithName(fmt.Sprintf("margin-clamp-%d", c.burst)), WithMaxQueue(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Space(bg, "k", 4*time.Millisecond); err != nil {
					t.Fatal(err)
				}
				first := mustReserve(t, s, "k", 1)
				clock.Advance(10 * time.Millisecond) // the response: 10 left in 15 minutes, 90 s apart
				if err := s.Clamp(bg, "k", 10, 15*time.Minute); err != nil {
					t.Fatal(err)
				}
				second := mustReserve(t, s, "k", 1)
				if got := second.Time().Sub(first.Time()); got != c.next {
					t.Fatalf("burst %d: the first request after the partner's clamp departs %v after the one before, want %v", c.burst, got, c.next)
				}
				third := mustReserve(t, s, "k", 1)
				if got := third.Time().Sub(second.Time()); got != 90*time.Second {
					t.Fatalf("burst %d: then %v apart, want the partner's 90s", c.burst, got)
				}
				// With the default MaxQueue the first request is not refused.
				q, err := New(e.store(t), PerSecond(10).WithBurst(c.burst), WithClock(clock), WithName(fmt.Sprintf("margin-clamp-q-%d", c.burst)))
				if err != nil {
					t.Fatal(err)
				}
				if err := q.Space(bg, "k", 4*time.Millisecond); err != nil {
					t.Fatal(err)
				}
				mustReserve(t, q, "k", 1)
				clock.Advance(10 * time.Millisecond)
				if err := q.Clamp(bg, "k", 10, 15*time.Minute); err != nil {
					t.Fatal(err)
				}
				if _, err := q.Reserve(bg, "k", 1); err != nil {
					t.Fatalf("burst %d: the first request after the partner's clamp: %v", c.burst, err)
				}
			}
		})
	}
}

// clampSpan is one clamp the property below set: its interval and when
// it was set and ends, in ms on the fake clock, and the partner's count
// (0 for a margin).
type clampSpan struct {
	set, end, interval float64
	remaining          int64
}

// The class of defect 30: any sequence of partner clamps (Clamp), margins
// (Space) and reservations on a strict and on a burst contract, on every
// store, on the fake clock:
//
//   - a partner's count is kept: of the slots reserved from a Clamp(n, r)
//     at t until the next Clamp, at most n fall in [t, t+r);
//   - a clamp never delays the key's next slot: the first reservation
//     right after a Clamp departs no later than Status said the next
//     request would just before it;
//   - a partner's clamp replacing another keeps the spacing: two
//     consecutive slots reserved under the two clamps, while both were
//     in force and before both ends, are at least the smaller of the two
//     intervals apart (and under one clamp, its interval).
//
// A failure names its seed.
func TestClampReplacementsKeepTheirPromises(t *testing.T) {
	t.Parallel()
	seeds := 6
	if testing.Short() {
		seeds = 2
	}
	for _, e := range edgeStores(t, "memory", "redis", "cluster") {
		t.Run(e.name, func(t *testing.T) {
			for seed := range uint64(seeds) {
				for _, burst := range []int64{1, 3} {
					clampSequence(t, e, seed, burst)
				}
			}
		})
	}
}

func clampSequence(t *testing.T, e edgeStore, seed uint64, burst int64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, uint64(burst)))
	clock := timer.NewFake(t0)
	rate := PerSecond(10).WithBurst(burst) // 100 ms apart; margins 4 ms (strict only)
	s, err := New(e.store(t), rate, WithClock(clock), WithName(fmt.Sprintf("replace-%d-%d", seed, burst)), WithMaxQueue(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ms := func(tm time.Time) float64 { return float64(tm.Sub(t0)) / float64(time.Millisecond) }
	const key = "k"
	var (
		spans []clampSpan // every clamp set, in order
		cur   = -1        // the clamp in force as the shaper keeps it (index into spans)
		slots []float64   // every slot reserved, in order
		under []int       // the clamp in force when each was reserved (-1 none)
		where = func() string { return fmt.Sprintf("seed %d burst %d", seed, burst) }
	)
	inForce := func(i int, at float64) bool { return i >= 0 && at < spans[i].end }
	partnerFrom := -1 // the slot index from which the latest partner clamp counts
	checkCount := func() {
		if partnerFrom < 0 {
			return
		}
		c := spans[cur]
		n := int64(0)
		for _, sl := range slots[partnerFrom:] {
			if sl >= c.set && sl < c.end {
				n++
			}
		}
		if n > c.remaining {
			t.Fatalf("%s: %d slots within a partner's reset of %v with %d remaining", where(), n, time.Duration(c.end-c.set)*time.Millisecond, c.remaining)
		}
	}
	for step := 0; step < 60; step++ {
		now := ms(clock.Now())
		switch op := rng.IntN(10); {
		case op < 3: // a partner's remaining count
			checkCount()
			reset := time.Duration(1+rng.IntN(1200)) * 100 * time.Millisecond // 100 ms to 2 min
			allowance := float64(burst) + 10*reset.Seconds()
			n := int64(1 + rng.IntN(int(max(1, allowance-1))))
			if float64(n) >= allowance {
				n = int64(allowance) - 1
			}
			before, err := s.Status(bg, key, 1)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Clamp(bg, key, n, reset); err != nil {
				t.Fatal(err)
			}
			spans = append(spans, clampSpan{set: now, end: now + float64(reset)/float64(time.Millisecond), interval: float64(reset) / float64(time.Millisecond) / float64(n), remaining: n})
			cur, partnerFrom = len(spans)-1, len(slots)
			r := mustReserve(t, s, key, 1)
			if r.Time().After(before.Next) {
				t.Fatalf("%s: Clamp(%d, %v) moved the next slot from %v to %v", where(), n, reset, before.Next.Sub(clock.Now()), r.Time().Sub(clock.Now()))
			}
			slots, under = append(slots, ms(r.Time())), append(under, cur) // in force: just set
		case op < 4: // the transport's margin
			if err := s.Space(bg, key, 4*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if burst > 1 {
				continue // a burst contract takes no margin
			}
			const interval = 104
			if inForce(cur, now) && spans[cur].interval > interval {
				continue // a margin never loosens a clamp in force
			}
			checkCount()
			spans = append(spans, clampSpan{set: now, end: now + float64(MarginSpan/time.Millisecond), interval: interval})
			cur, partnerFrom = len(spans)-1, -1
		case op < 8:
			for range 1 + rng.IntN(3) {
				r := mustReserve(t, s, key, 1)
				c := cur
				if !inForce(c, now) {
					c = -1
				}
				slots, under = append(slots, ms(r.Time())), append(under, c)
			}
		default:
			clock.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		}
		// Spacing: the last two slots, each reserved under a clamp in force
		// and before its end, the later one's the same clamp or a partner's
		// that replaced the earlier one's while it was in force, and before
		// the end of both (one after the earlier clamp's end is its next
		// window's, which the earlier clamp allows as well).
		if k := len(slots) - 1; k >= 1 {
			a, b := under[k-1], under[k]
			if a >= 0 && b >= 0 && slots[k-1] < spans[a].end && slots[k] < spans[b].end &&
				(a == b || a == b-1 && spans[b].remaining > 0 && inForce(a, spans[b].set) && slots[k] < spans[a].end) {
				if gap, want := slots[k]-slots[k-1], min(spans[a].interval, spans[b].interval); gap < want-1 {
					t.Fatalf("%s: slots %v and %v ms are %v ms apart under clamps of %v and %v ms", where(), slots[k-1], slots[k], gap, spans[a].interval, spans[b].interval)
				}
			}
		}
	}
	checkCount()
	var qf *QueueFullError
	if _, err := s.Reserve(bg, key, 1); err != nil && !errors.As(err, &qf) {
		t.Fatal(err)
	}
}
