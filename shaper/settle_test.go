package shaper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/conform"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// segment is the departures of the reservations granted under one
// contract, per dimension, with that contract's rates.
type segment struct {
	rates [2]Rate
	deps  [2][]conform.Departure
}

// settleRun drives one seed of random reserve / wait / pause / cancel /
// settle calls (a third of the settles for more than reserved; copies of
// reservations cancelled and settled again,
// cancels after the slot) on a shaper of one contract, or of two
// dimensions (requests cost 1, tokens cost the request's cost); with live,
// the rates change now and then (SetRate) while reservations granted
// before are cancelled and settled after. It returns, per contract in
// force, the departures of the reservations granted under it with their
// actual costs, the transcript of decisions, and how many reservations
// departed before a slot granted earlier (a hole or a refund used).
func settleRun(t *testing.T, store Store, name string, seed uint64, multi, live bool) (segs []segment, transcript []string, reused int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 16))
	burst := int64(1 + rng.IntN(5))
	clock := timer.NewFake(t0)
	var s *Shaper
	var err error
	rates := [2]Rate{PerSecond(10).WithBurst(burst), PerSecond(40).WithBurst(4 * burst)}
	names := []string{""}
	if multi {
		names = []string{"req", "tok"}
		s, err = All(store, []Dimension{
			{Name: "req", Rate: rates[0], Cost: func(int64) int64 { return 1 }},
			{Name: "tok", Rate: rates[1]},
		}, WithClock(clock), WithMaxQueue(time.Hour), WithName(name))
	} else {
		s, err = New(store, rates[0], WithClock(clock), WithMaxQueue(time.Hour), WithName(name))
	}
	if err != nil {
		t.Fatal(err)
	}
	type held struct {
		r         Reservation
		seg       int
		cancelled bool  // before its time, first: its caller never departs
		actual    int64 // -1 until settled first
		// granted and settled are the steps that granted it and settled it
		// first: a departure is judged with the overruns settled before
		// its grant (conform.Check).
		granted, settled int
	}
	segs = []segment{{rates: rates}}
	var all []*held
	latest := time.Time{}
	for step := range 250 {
		if live && rng.IntN(25) == 0 { // a live change: another rate and burst for one dimension
			// Intervals of whole or dyadic ms, as the fixed rates have, so
			// that conform.Check's 100 ns holds: an interval like 66.67 ms
			// rounds each step of a TAT near 1.8e12 ms by up to an eighth
			// of a µs.
			i := rng.IntN(len(names))
			counts := []int64{5, 8, 10, 20, 25, 40, 50}
			r := Rate{Count: counts[rng.IntN(len(counts))] * int64(1+3*i), Period: time.Second, Burst: int64(1+rng.IntN(5)) * int64(1+3*i)}
			if err := s.SetRate(bg, names[i], r); err != nil {
				t.Fatal(err)
			}
			rates[i] = r
			segs = append(segs, segment{rates: rates})
			transcript = append(transcript, fmt.Sprintf("%d set %q to %v", step, names[i], r))
		}
		switch op := rng.IntN(20); {
		case op < 8:
			cost := int64(1 + rng.IntN(int(burst)+2))
			r, err := s.Reserve(bg, "k", cost)
			if err != nil {
				transcript = append(transcript, fmt.Sprintf("%d reserve %d: %v", step, cost, errText(err)))
				continue
			}
			transcript = append(transcript, fmt.Sprintf("%d reserve %d: %v", step, cost, r.Time().Sub(t0)))
			if r.Time().Before(latest) {
				reused++
			}
			if r.Time().After(latest) {
				latest = r.Time()
			}
			all = append(all, &held{r: r, seg: len(segs) - 1, actual: -1, granted: step})
		case op < 11 && len(all) > 0:
			h := all[rng.IntN(len(all))]
			c := h.r // a copy, as a caller passing it by value holds it
			if !h.cancelled && h.actual < 0 && !clock.Now().After(h.r.Time()) {
				h.cancelled = true
			}
			if err := c.Cancel(bg); err != nil {
				t.Fatal(err)
			}
			transcript = append(transcript, fmt.Sprintf("%d cancel the one at %v", step, h.r.Time().Sub(t0)))
		case op < 15 && len(all) > 0:
			h := all[rng.IntN(len(all))]
			c := h.r
			actual := rng.Int64N(h.r.cost + 1)
			if rng.IntN(3) == 0 { // an overrun, now and then: charged, never refused
				actual = h.r.cost + rng.Int64N(3)
			}
			if !h.cancelled && h.actual < 0 {
				h.actual, h.settled = actual, step
			}
			if err := c.Settle(bg, actual); err != nil {
				t.Fatal(err)
			}
			transcript = append(transcript, fmt.Sprintf("%d settle the one at %v: %d of %d", step, h.r.Time().Sub(t0), actual, h.r.cost))
		case op == 15:
			if err := s.Pause(bg, "k", time.Duration(rng.IntN(400))*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		default:
			d := time.Duration(rng.IntN(250)) * time.Millisecond
			clock.Advance(d)
			transcript = append(transcript, fmt.Sprintf("%d now %v", step, clock.Now().Sub(t0)))
		}
	}
	for _, h := range all {
		if h.cancelled {
			continue
		}
		d := conform.Departure{At: float64(h.r.Time().Sub(t0)) / 1e6, Cost: h.r.cost, Granted: h.granted}
		if h.actual >= 0 {
			d.Cost = h.actual
			if h.actual > h.r.cost {
				d.Reserved, d.Settled = h.r.cost, h.settled
			}
		}
		deps := &segs[h.seg].deps
		if multi { // requests cost 1 (one settled at 0 is judged at 0), tokens the cost
			deps[0] = append(deps[0], conform.Departure{At: d.At, Cost: min(d.Cost, 1), Granted: d.Granted})
			deps[1] = append(deps[1], d)
		} else {
			deps[0] = append(deps[0], d)
		}
	}
	return segs, transcript, reused
}

// checkSegments fails t when the departures granted under a contract do
// not conform to it, in any dimension.
func checkSegments(t *testing.T, what string, segs []segment) {
	t.Helper()
	for k, seg := range segs {
		for d, deps := range seg.deps {
			interval := float64(seg.rates[d].Period) / 1e6 / float64(seg.rates[d].Count)
			tau := interval * float64(seg.rates[d].burst())
			if dep, ok := conform.Check(interval, tau, deps); !ok {
				t.Fatalf("%s, contract %d (%v), dimension %d: the departure %+v breaks it", what, k, seg.rates[d], d, dep)
			}
		}
	}
}

// The guarantee, with settling and cancelling, on every store: whatever
// callers cancel and settle (for less than they reserved, or for more),
// copies and late calls included, the departures they make, each with its
// actual cost, conform to the contract in every dimension, each judged
// with the overruns settled before its grant (an overrun is charged, never
// refused: a slot granted after it, a hole's included, makes room for it);
// and Redis (a node and the 3-master cluster) decides exactly as memory
// does.
func TestSettledAndCancelledSlotsKeepTheContract(t *testing.T) {
	t.Parallel()
	crossStoreSettling(t, settleStores(t), false)
}

// The guarantee across live changes (issue 17): rates changed now and
// then while reservations granted before are cancelled and settled after,
// on every store. The reservations granted under each contract conform to
// it, whatever the give-backs of those granted under another did (a
// Ledger made under one contract gives nothing back under another), and
// Redis decides exactly as memory does.
func TestLiveChangesKeepEachContract(t *testing.T) {
	t.Parallel()
	crossStoreSettling(t, settleStores(t), true)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// settleStores returns a fresh memory store, and stores on a Redis node and
// on the 3-master cluster, on the shaper's clock.
func settleStores(t *testing.T) map[string]func() Store {
	t.Helper()
	_, node := redisClient(t)
	cl := redistest.StartCluster(t)
	// No retries: a script retried after its reply was lost (a timeout
	// under load) would run twice, and the transcripts would differ for
	// that reason alone.
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
	t.Cleanup(func() { _ = cluster.Close() })
	// Every other store sends each reservation through the batch script, as
	// coalesced reservations go (redisstore's tests cover batches of many):
	// the stores of one client are used one after another, so its hook
	// is switched as each is made.
	batched := map[redis.UniversalClient]*batchOfOne{node: newBatchOfOne(node), cluster: newBatchOfOne(cluster)}
	t.Cleanup(func() {
		if batched[node].sent.Load()+batched[cluster].sent.Load() == 0 && !t.Failed() {
			t.Error("no reservation went through the batch script")
		}
	})
	timeless(node)
	timeless(cluster)
	var made atomic.Int32
	onRedis := func(c redis.UniversalClient) Store {
		rs := redisstore.New(c, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
		batched[c].on.Store(made.Add(1)%2 == 0)
		return rs
	}
	stores := map[string]func() Store{
		"memory":  func() Store { return memstore.New(memstore.WithSweepInterval(0)) },
		"redis":   func() Store { return onRedis(node) },
		"cluster": func() Store { return onRedis(cluster) },
	}
	return stores
}

// crossStoreSettling runs settleRun's seeds on every store, checks each
// contract's departures and that the stores decide alike.
func crossStoreSettling(t *testing.T, stores map[string]func() Store, live bool) {
	t.Helper()
	for _, multi := range []bool{false, true} {
		reused := 0
		for seed := range uint64(40) {
			var want []string
			for _, st := range []string{"memory", "redis", "cluster"} {
				store := stores[st]()
				name := fmt.Sprintf("settle-%v-%v-%d", live, multi, seed)
				segs, transcript, n := settleRun(t, store, name, seed, multi, live)
				_ = store.(interface{ Close() error }).Close()
				if live && len(segs) < 2 && seed < 5 {
					t.Fatalf("seed %d: no live change", seed)
				}
				checkSegments(t, fmt.Sprintf("%s, multi %v, seed %d", st, multi, seed), segs)
				if st == "memory" {
					want, reused = transcript, reused+n
				} else if !slices.Equal(transcript, want) {
					for i := range min(len(want), len(transcript)) {
						if want[i] != transcript[i] {
							t.Fatalf("%s, multi %v, seed %d: step %q, memory %q, after:\n%s", st, multi, seed, transcript[i], want[i], strings.Join(want[:i], "\n"))
						}
					}
					t.Fatalf("%s, multi %v, seed %d: %d steps, memory %d", st, multi, seed, len(transcript), len(want))
				}
			}
		}
		// Across live changes fewer slots come back: a reservation settled
		// after its contract changed gives nothing back (charges its extra).
		if least := 20 - 5*btoi(live); reused < least {
			t.Fatalf("multi %v: only %d reservations used a slot given back: the property is not exercised", multi, reused)
		}
	}
}

// A Wait whose slot would fall past its context's deadline is refused by
// the store before anything is written, with a *DeadlineError, on every
// store and in several dimensions: concurrent callers refused so cannot
// push the schedule away (a cancelled slot in the middle of the queue is
// not always given back).
func TestADeadlineRefusalHoldsNothing(t *testing.T) {
	t.Parallel()
	_, node := redisClient(t)
	for name, mk := range memoryAndNode(node) {
		for _, multi := range []bool{false, true} {
			clock := timer.NewFake(time.Now())
			s := reqAndAcct(t, mk(), clock, multi, fmt.Sprintf("dl-%s-%v", name, multi))
			for range 10 { // the next slot is 1 s away
				mustReserve(t, s, "k", 1)
			}
			for range 5 {
				ctx, cancel := context.WithTimeout(bg, 500*time.Millisecond)
				err := s.Wait(ctx, "k", 1)
				cancel()
				var de *DeadlineError
				if !errors.As(err, &de) || !errors.Is(err, context.DeadlineExceeded) || !about(de.Delay, time.Second) {
					t.Fatalf("%s, multi %v: %v, want a *DeadlineError for a 1s wait", name, multi, err)
				}
			}
			if r := mustReserve(t, s, "k", 1); r.Delay != time.Second {
				t.Fatalf("%s, multi %v: after 5 refusals the next slot is %v away, want 1s: they held budget", name, multi, r.Delay)
			}
		}
	}
}

// A key's Ledger keys holding what the library did not write fail that
// key's calls alone, with a *redisstore.StateError, and are not overwritten: on a
// shaper of one contract and on two dimensions, for Reserve and Settle.
func TestRedisACorruptLedgerFailsThatCallAlone(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	store := redisstore.New(c, redisstore.WithFailurePolicy(redisstore.FailOpen))
	t.Cleanup(func() { _ = store.Close() })
	one, err := New(store, PerSecond(10), WithName("ledger-one"))
	if err != nil {
		t.Fatal(err)
	}
	multi, err := All(store, []Dimension{
		{Name: "requests", Rate: PerSecond(10), Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: PerSecond(1000).WithBurst(1000)},
	}, WithName("ledger-all"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Shaper{one, multi} {
		r := mustReserve(t, s, "k", 10)
		ledger := stateKey(s, "k") + ":l"
		if err := c.Set(bg, ledger, "not a ledger", 0).Err(); err != nil {
			t.Fatal(err)
		}
		var se *redisstore.StateError
		if _, err := s.Reserve(bg, "k", 1); !errors.As(err, &se) || !errors.Is(err, ErrInvalidState) {
			t.Fatalf("Reserve over a corrupt ledger: %v, want a *redisstore.StateError", err)
		}
		if err := r.Settle(bg, 1); !errors.Is(err, ErrInvalidState) {
			t.Fatalf("Settle over a corrupt ledger: %v, want ErrInvalidState", err)
		}
		if got, _ := c.Get(bg, ledger).Result(); got != "not a ledger" {
			t.Fatalf("the corrupt ledger was overwritten with %q", got)
		}
		if _, err := s.Reserve(bg, "innocent", 1); err != nil {
			t.Fatalf("another key: %v", err)
		}
		if store.Degraded() != 0 {
			t.Fatal("a data error was served by FailOpen")
		}
	}
}

// For the algorithms other than the GCRA family, Settle charges the extra
// of a call that cost more than it reserved, at once; for less, the sliding
// log gives the unused units back off the call's entry, the cost bucket
// puts them back in the bucket, and the others give nothing back: the same
// on memory and Redis.
func TestSettlingMoreChargesEveryAlgorithm(t *testing.T) {
	t.Parallel()
	_, node := redisClient(t)
	for _, alg := range []Algorithm{TokenBucket, FixedWindow, SlidingWindow, SlidingWindowLog, CostBucket, Quota(Daily(0))} {
		var want []string
		for _, st := range []string{"memory", "redis"} {
			var store Store = memstore.New(memstore.WithSweepInterval(0))
			if st == "redis" {
				store = redisstore.New(node, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
			}
			clock := timer.NewFake(t0.Add(time.Hour))
			rate := PerSecond(10).WithBurst(10)
			if alg.String() == Quota(Daily(0)).String() {
				rate = PerDay(10)
			}
			s, err := New(store, rate, WithAlgorithm(alg), WithClock(clock), WithName("overrun-"+alg.String()))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for i, actual := range []int64{6, 0} { // one call costs 6 for 1 reserved; another 0 for 1
				r, err := s.Reserve(bg, fmt.Sprint("k", i), 1)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Settle(bg, actual); err != nil {
					t.Fatal(err)
				}
				n := 0
				for range 12 {
					if ok, _ := s.Allow(bg, fmt.Sprint("k", i), 1); ok {
						n++
					}
				}
				got = append(got, fmt.Sprintf("%s: after settling 1 as %d, %d more admitted", alg, actual, n))
			}
			back := 9 // nothing given back
			if alg == SlidingWindowLog || alg == CostBucket {
				back = 10 // the log gives the unused unit back off its entry; the bucket takes it back
			}
			if got[0] != fmt.Sprintf("%s: after settling 1 as 6, 4 more admitted", alg) || got[1] != fmt.Sprintf("%s: after settling 1 as 0, %d more admitted", alg, back) {
				t.Fatalf("%s: %q, want the extra 5 charged, and %d more after the settle for less", st, got, back)
			}
			if st == "memory" {
				want = got
			} else if !slices.Equal(got, want) {
				t.Fatalf("redis %q, memory %q", got, want)
			}
			_ = store.(interface{ Close() error }).Close()
		}
	}
}

// A live change that leaves a reservation's rates as they were (MaxQueue,
// another dimension's rate, a rate set to what it was) changes nothing of
// how it settles: a settle for less gives back as it would have, and a
// copy settled after another copy was cancelled charges nothing (the
// model test found this one: after SetRate to the same rate, the settle
// charged its overrun on a cancelled slot). On memory and a Redis node, on
// one dimension and two.
func TestAChangeThatKeepsTheRatesKeepsTheSettle(t *testing.T) {
	t.Parallel()
	_, node := redisClient(t)
	changes := map[string]func(s *Shaper, multi bool) error{
		"none":     func(*Shaper, bool) error { return nil },
		"MaxQueue": func(s *Shaper, _ bool) error { return s.SetMaxQueue(bg, 20*time.Second) },
		"same rate": func(s *Shaper, multi bool) error {
			if multi {
				return s.SetRate(bg, "req", PerSecond(10))
			}
			return s.SetRate(bg, "", PerSecond(10))
		},
	}
	for store, mk := range memoryAndNode(node) {
		for _, multi := range []bool{false, true} {
			want := map[string][2]time.Duration{}
			for _, change := range []string{"none", "MaxQueue", "same rate"} {
				name := fmt.Sprintf("keep-%s-%v-%s", store, multi, strings.ReplaceAll(change, " ", ""))
				clock := timer.NewFake(time.Now())
				s := reqAndAcct(t, mk(), clock, multi, name)
				if multi && change != "none" { // another dimension's rate changes too
					if err := s.SetRate(bg, "acct", PerSecond(2000)); err != nil {
						t.Fatal(err)
					}
				}
				mustReserve(t, s, "k", 1)
				less := mustReserve(t, s, "k", 3) // at 100 ms, holds to 400 ms
				over := mustReserve(t, s, "k", 1) // at 400 ms
				copyOf := over
				if err := copyOf.Cancel(bg); err != nil {
					t.Fatal(err)
				}
				if err := changes[change](s, multi); err != nil {
					t.Fatal(err)
				}
				if err := less.Settle(bg, 1); err != nil { // gives 2 back
					t.Fatal(err)
				}
				err := over.Settle(bg, 5) // the cancelled slot: no overrun to charge
				if err != nil && !errors.Is(err, ErrSettled) {
					t.Fatal(err)
				}
				a := mustReserve(t, s, "k", 1)
				b := mustReserve(t, s, "k", 1)
				got := [2]time.Duration{a.Delay, b.Delay}
				if change == "none" {
					want[store] = got
					continue
				}
				if got != want[store] {
					t.Errorf("%s, multi %v, after a change of %s: the next slots are %v, %v without it", store, multi, change, got, want[store])
				}
			}
		}
	}
}

// memoryAndNode returns the makers of a memory store and of a Redis store
// on node (on the shaper's clock).
func memoryAndNode(node redis.UniversalClient) map[string]func() Store {
	return map[string]func() Store{
		"memory": func() Store { return memstore.New(memstore.WithSweepInterval(0)) },
		"redis": func() Store {
			return redisstore.New(node, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
		},
	}
}

// reqAndAcct returns a shaper of 10/s per key on st, with multi a second
// dimension beside it: 1000/s on one account key shared by every key.
func reqAndAcct(t *testing.T, st Store, clock *timer.Fake, multi bool, name string) *Shaper {
	t.Helper()
	var s *Shaper
	var err error
	if multi {
		s, err = All(st, []Dimension{
			{Name: "req", Rate: PerSecond(10)},
			{Name: "acct", Rate: PerSecond(1000), Key: func(string) string { return "acct" }},
		}, WithClock(clock), WithName(name))
	} else {
		s, err = New(st, PerSecond(10), WithClock(clock), WithName(name))
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}
