package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// InFlight runs the in-flight scenario on c's store and on a memory store,
// each on a fake clock, and fails t at the first step where their
// transcripts differ: permits taken up to the limit and refused past it,
// released once by a reservation and its copies, given back by a cancel
// before the slot and by a rate refusal, counted by Status beside the
// rate, and waiters served in arrival order as permits are released, on
// the odd keys. The keys are under the prefix "inflight-<c.Name>:".
func InFlight(t *testing.T, c Candidate) {
	t.Helper()
	run := func(st shaper.Store) []string {
		clock := timer.NewFake(T0)
		s, err := shaper.All(st, []shaper.Dimension{
			{Name: "open", InFlight: 3, Lease: time.Minute},
			{Name: "rate", Rate: shaper.PerSecond(10).WithBurst(4)},
		}, shaper.WithClock(clock), shaper.WithPrefix("inflight-"+c.Name+":"), shaper.WithMaxQueue(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, key := range OddKeys[:len(OddKeys)-1] {
			out = append(out, inFlightRun(t, s, clock, key)...)
		}
		return out
	}
	Same(t, "in-flight on "+c.Name, "memory", run(memory()), run(c.New()))
}

// inFlightRun is InFlight on one key; clock moves only where it says.
func inFlightRun(t *testing.T, s *shaper.Shaper, clock *timer.Fake, key string) []string {
	var out []string
	say := func(f string, a ...any) { out = append(out, key+": "+fmt.Sprintf(f, a...)) }
	status := func(what string) {
		st, err := s.Status(bg, key, 1)
		if err != nil {
			say("%s: status: %s", what, ErrText(err))
			return
		}
		line := fmt.Sprintf("%s: binding %q remaining %d", what, st.Binding, st.Remaining)
		for _, d := range st.Dimensions {
			line += fmt.Sprintf(" | %s remaining %d inflight %d waiting %d", d.Name, d.Remaining, d.InFlight, d.Waiting)
		}
		say("%s", line)
	}
	var held []shaper.Reservation
	for i := range 4 {
		r, err := s.Reserve(bg, key, 1)
		say("reserve %d: delay %v %s", i, r.Delay, ErrText(err))
		if err == nil {
			held = append(held, r)
		}
	}
	status("three held")
	cp := held[0]
	for range 2 {
		say("release: %s; its copy: %s", ErrText(held[0].Release(bg)), ErrText(cp.Release(bg)))
	}
	status("one released by it and its copy")
	r, err := s.Reserve(bg, key, 1) // a slot in the future: the burst is spent
	say("reserve: delay %v %s", r.Delay, ErrText(err))
	say("cancel before its slot: %s", ErrText(r.Cancel(bg)))
	_, err = s.Reserve(bg, key, 14) // a wait past the rate's MaxQueue: refused, its permit back
	say("reserve past MaxQueue: %s", ErrText(err))
	status("after a cancel and a refusal")
	// Waiters, in arrival order, each woken by a release.
	type got struct {
		i   int
		r   shaper.Reservation
		err error
	}
	r, err = s.Reserve(bg, key, 1)
	say("reserve: delay %v %s", r.Delay, ErrText(err))
	held = append(held[1:], r)
	ch := make(chan got, 3)
	ctx, cancel := context.WithTimeout(bg, 30*time.Second) // the real time a shared store's notice may take, on a loaded host
	defer cancel()
	for i := range 3 {
		go func() {
			r, err := s.Acquire(ctx, key, 1)
			ch <- got{i, r, err}
		}()
		waitFor(t, func() bool { return waiting(s, key) == i+1 })
	}
	status("three waiting")
	for range 3 {
		_ = held[0].Release(bg)
		held = held[1:]
		clock.Advance(time.Second) // their rate slots come: Acquire sleeps to them on the fake clock
		g := <-ch
		say("waiter %d: %s", g.i, ErrText(g.err))
		if g.err == nil {
			held = append(held, g.r)
		}
	}
	for _, r := range held {
		_ = r.Release(bg)
	}
	// A waiter reserves its rate slot once its permit is taken: before or
	// after the Advance that follows the release, depending on how fast
	// the notice came. A second later the rate is whole again either way.
	clock.Advance(time.Second)
	status("all released")
	return out
}

// waiting reads how many requests of this process wait for key's permits.
func waiting(s *shaper.Shaper, key string) int {
	st, err := s.Status(bg, key, 1)
	if err != nil {
		return -1
	}
	for _, d := range st.Dimensions {
		if d.Name == "open" {
			return d.Waiting
		}
	}
	return -1
}

// waitFor polls cond for up to 10 s of real time (goroutines reaching a
// wait on a loaded host), failing t if it never holds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for a goroutine")
		}
	}
}

// InFlightKeysApart checks on c's store that shapers whose prefix, in-flight
// dimension name and key differ never share a permit, whatever ":" the
// parts hold: each pair below takes its one permit on each side. Before
// issue 37 the memory store named a key's permits prefix + name + ":" and
// key, so that shaper "a" with dimension "b:c" and shaper "a:b" with
// dimension "c" shared one budget (apart on Redis).
func InFlightKeysApart(t *testing.T, c Candidate) {
	t.Helper()
	st := c.New()
	type side struct{ name, dim, key string }
	pairs := [][2]side{
		{{"a", "b:c", "k"}, {"a:b", "c", "k"}},
		{{"x", "open", "a:b"}, {"x", "open:a", "b"}},
		{{"y:", "z", "k"}, {"y", ":z", "k"}},
		{{"w", "v", ""}, {"w:v", "", ""}}, // "" dimension name: a shaper of one in-flight dimension
	}
	for i, pair := range pairs {
		for _, sd := range pair {
			s, err := shaper.All(st, []shaper.Dimension{{Name: sd.dim, InFlight: 1, Lease: time.Minute}},
				shaper.WithName(fmt.Sprintf("apart-%s-%d-%s", c.Name, i, sd.name)), shaper.WithPrefix(fmt.Sprintf("apart-%s-%d:%s:", c.Name, i, sd.name)))
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.Reserve(bg, sd.key, 1)
			if err != nil {
				t.Fatalf("%s: pair %d: shaper %q, dimension %q, key %q: %v: it shares the permit of %+v", c.Name, i, sd.name, sd.dim, sd.key, err, pair[0])
			}
			defer func() { _ = r.Release(bg) }()
		}
	}
}

// InFlightDeadlines checks on c's store that takes cut short by their
// deadline leave no permit behind: n Reserves on a shaper of InFlight 100
// (and a 10 s lease), from 32 goroutines, each with a deadline drawn
// between a quarter of and twice the store's round trip (measured first),
// each grant released; within 2 s of the last (a fifth of the lease) no
// permit is held. Before issue 37 the Redis store's clean-up release of a
// take whose reply the deadline cut went out on another connection,
// unordered with the take: 8,000 Reserves left a few leases held by
// nobody for the whole lease.
func InFlightDeadlines(t *testing.T, c Candidate, n int) {
	t.Helper()
	s, err := shaper.All(c.New(), []shaper.Dimension{{Name: "open", InFlight: 100}}, shaper.WithName("deadlines-"+c.Name))
	if err != nil {
		t.Fatal(err)
	}
	held := func() int64 {
		st, err := s.Status(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		return st.Dimensions[0].InFlight
	}
	// The round trip a Reserve takes, with its release, at this
	// concurrency: the median of 20 per goroutine.
	var mu sync.Mutex
	var rtt []time.Duration
	run := func(n int, deadline func(i int) time.Duration, each func(time.Duration, error)) {
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for range 32 {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
					ctx, cancel := context.WithTimeout(bg, deadline(int(i)))
					start := time.Now()
					r, err := s.Reserve(ctx, "k", 1)
					took := time.Since(start)
					cancel()
					if err == nil {
						_ = r.Release(bg)
					}
					each(took, err)
				}
			})
		}
		wg.Wait()
	}
	run(32*20, func(int) time.Duration { return time.Minute }, func(d time.Duration, err error) {
		if err != nil {
			t.Errorf("%s: Reserve: %v", c.Name, err)
		}
		mu.Lock()
		rtt = append(rtt, d)
		mu.Unlock()
	})
	slices.Sort(rtt)
	median := rtt[len(rtt)/2]
	rng := rand.New(rand.NewPCG(uint64(n), 37))
	deadlines := make([]time.Duration, n)
	for i := range deadlines {
		deadlines[i] = median/4 + time.Duration(rng.Int64N(int64(median*7/4)+1))
	}
	var granted, cut atomic.Int64
	run(n, func(i int) time.Duration { return deadlines[i] }, func(_ time.Duration, err error) {
		if err == nil {
			granted.Add(1)
		} else {
			cut.Add(1)
		}
	})
	start := time.Now()
	for h := held(); h != 0; h = held() {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("%s: %d permits held 2 s after %d Reserves (round trip %v; %d granted and released, %d cut short) returned", c.Name, h, n, median, granted.Load(), cut.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s: %d Reserves, deadlines around a %v round trip: %d granted and released, %d cut short, none left held %v after the last returned", c.Name, n, median, granted.Load(), cut.Load(), time.Since(start).Round(time.Millisecond))
}
