package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/storetest"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore/internal/coalesce"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// heldBatch makes the reservations of ops at once on the store sp spies
// on, queued in the order of ops while its lanes are held, so that each
// lane sends its share as one call (script.ReserveBatch); run(i) makes
// reservation i. A request that never reaches the store (refused by the
// shaper first) counts as queued once it returns.
func heldBatch(t *testing.T, sp *spy, n int, run func(i int)) {
	t.Helper()
	sp.hold()
	var finished atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(i)
			finished.Add(1)
		}()
		deadline := time.Now().Add(10 * time.Second)
		for sp.queued()+int(finished.Load()) < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("reservation %d of the batch never queued", i)
			}
			time.Sleep(50 * time.Microsecond) // a goroutine starting: how long does not matter
		}
	}
	sp.release()
	wg.Wait()
}

// batchRun drives s through seeded rounds: in each, a batch of 1 to 12
// reservations (Reserve or Allow, random keys and costs), then perhaps a
// cancel of an earlier one, then time passes. On a spied Redis store (sp)
// each round's batch is queued in order and sent at once; elsewhere it runs
// one reservation after another. It returns the transcript of every
// outcome.
func batchRun(t *testing.T, s *shaper.Shaper, clock *timer.Fake, sp *spy, seed uint64) []string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 11))
	var out []string
	var held []shaper.Reservation
	for round := range 40 {
		n := 1 + rng.IntN(12)
		keys, costs, allow := make([]string, n), make([]int64, n), make([]bool, n)
		for i := range n {
			keys[i], costs[i], allow[i] = storetest.OddKeys[rng.IntN(4)], int64(1+rng.IntN(3)), rng.IntN(4) == 0
		}
		lines := make([]string, n)
		granted := make([]*shaper.Reservation, n)
		run := func(i int) {
			if allow[i] {
				ok, err := s.Allow(bg, keys[i], costs[i])
				lines[i] = fmt.Sprintf("%d.%d allow %q %d: %v %s", round, i, keys[i], costs[i], ok, storetest.ErrText(err))
				return
			}
			r, err := s.Reserve(bg, keys[i], costs[i])
			lines[i] = fmt.Sprintf("%d.%d reserve %q %d: %v %d %s", round, i, keys[i], costs[i], r.Delay, r.Remaining(), storetest.ErrText(err))
			if err == nil {
				granted[i] = &r
			}
		}
		if sp != nil {
			heldBatch(t, sp, n, run)
		} else {
			for i := range n {
				run(i)
			}
		}
		out = append(out, lines...)
		for _, r := range granted {
			if r != nil {
				held = append(held, *r)
			}
		}
		if len(held) > 0 && rng.IntN(3) == 0 {
			j := rng.IntN(len(held))
			out = append(out, fmt.Sprintf("%d cancel %d: %s", round, j, storetest.ErrText(held[j].Cancel(bg))))
		}
		clock.Advance(time.Duration(rng.IntN(900)) * time.Millisecond)
	}
	return out
}

// Coalesced reservations are decided exactly as one call each, in the order
// they queued: for every algorithm, multi-dimension and Any shaper, batches
// of up to 12 on a node and on the 3-master cluster (where a batch holds one
// hash slot's share) give the memory store's transcript, delays, refusals
// and remaining figures alike; cancels between batches included.
func TestRedisBatchesDecideAsOneCallEach(t *testing.T) {
	t.Parallel()
	node, cluster := nodeAndCluster(t)
	checkClusterSlot(t, cluster)
	batches := watchBatches(node)
	for i, sc := range storetest.Scenarios() {
		memClock := timer.NewFake(storetest.T0)
		prefix := fmt.Sprintf("batch%d:", i)
		ms, err := sc.New(memstore.New(memstore.WithSweepInterval(0)), memClock, prefix)
		if err != nil {
			t.Fatal(err)
		}
		want := batchRun(t, ms, memClock, nil, uint64(i))
		for _, c := range []redis.UniversalClient{node, cluster} {
			clock := timer.NewFake(storetest.T0)
			rs, sp := newSpied(c, WithClientClock(), WithTimeout(slowMachine))
			s, err := sc.New(rs, clock, prefix)
			if err != nil {
				t.Fatal(err)
			}
			batches.largest.Store(0)
			got := batchRun(t, s, clock, sp, uint64(i))
			if l := batches.largest.Load(); l < 8 && c == node {
				t.Fatalf("%s: the largest batch on a node decided %d reservations; the rounds hold up to 12", sc.Name, l)
			}
			storetest.Same(t, fmt.Sprintf("%s on %T", sc.Name, c), "memory", want, got)
		}
	}
}

// A reservation whose key holds foreign or corrupt data fails alone, with a
// *StateError naming its key: the others of its batch are decided as if it
// had not been made, on a node and on the cluster.
func TestRedisABadReservationFailsAloneInItsBatch(t *testing.T) {
	t.Parallel()
	node, cluster := nodeAndCluster(t)
	for _, c := range []redis.UniversalClient{node, cluster} {
		clock := timer.NewFake(storetest.T0)
		rs, sp := newSpied(c, WithClientClock(), WithTimeout(slowMachine))
		s, err := shaper.New(rs, shaper.PerSecond(10), shaper.WithClock(clock), shaper.WithPrefix("bad:"), shaper.WithMaxQueue(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.LPush(bg, "bad:{b}", "x").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(bg, "bad:{c}", "not a number", 0).Err(); err != nil {
			t.Fatal(err)
		}
		keys := []string{"a", "b", "a", "c", "a", "b", "d"}
		delays := make([]time.Duration, len(keys))
		errs := make([]error, len(keys))
		heldBatch(t, sp, len(keys), func(i int) {
			r, err := s.Reserve(bg, keys[i], 1)
			delays[i], errs[i] = r.Delay, err
		})
		want := []time.Duration{0, 0, 100 * time.Millisecond, 0, 200 * time.Millisecond, 0, 0}
		for i, k := range keys {
			var se *StateError
			if bad := k == "b" || k == "c"; bad != errors.As(errs[i], &se) || bad && se.Key != k {
				t.Fatalf("%T: reservation %d on %q: %v", c, i, k, errs[i])
			}
			if delays[i] != want[i] {
				t.Fatalf("%T: reservation %d on %q departs in %v, want %v", c, i, k, delays[i], want[i])
			}
		}
		if typ := c.Type(bg, "bad:{b}").Val(); typ != "list" {
			t.Fatalf("%T: the foreign key is now a %s", c, typ)
		}
	}
}

// A reservation whose caller leaves while it is queued is still decided by
// its batch (nothing can take it out), and a slot it was granted goes back
// to its key: the next reservation departs where it would have.
func TestRedisAGrantNobodyWaitsForGoesBack(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	redistest.Timeless(c) // TTLs in simulated ms: no key may expire in real time meanwhile (a flake seen under load)
	clock := timer.NewFake(storetest.T0)
	rs, sp := newSpied(c, WithClientClock(), WithTimeout(slowMachine))
	s, err := shaper.New(rs, shaper.PerSecond(10), shaper.WithClock(clock), shaper.WithPrefix("left:"), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	first := mustReserve(t, s, "k", 1) // at once
	leaveQueued(t, sp, s, "k", nil)
	r := mustReserve(t, s, "k", 1)
	if first.Delay != 0 || r.Delay != 100*time.Millisecond {
		t.Fatalf("after a grant nobody took, the next slot is %v away, want 100ms", r.Delay)
	}
}

// leaveQueued queues a reservation on key and has its caller leave before
// its batch is sent; meanwhile (if not nil) runs before the batch goes.
// It returns once the batch and any give-back have ended.
func leaveQueued(t *testing.T, sp *spy, s *shaper.Shaper, key string, meanwhile func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(bg)
	var err error
	sp.hold()
	done := make(chan struct{})
	go func() { _, err = s.Reserve(ctx, key, 1); close(done) }()
	for sp.queued() == 0 {
		time.Sleep(50 * time.Microsecond) // a goroutine starting: how long does not matter
	}
	cancel()
	<-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller that left got %v", err)
	}
	if meanwhile != nil {
		meanwhile()
	}
	sp.release()
	sp.settled()
}

// The batch script's parts line up: its ARGV counts what Batch added, and a
// reply of the wrong length is an error, never a panic.
func TestBatchWire(t *testing.T) {
	var b script.Batch
	b.Add(true, []string{"k", "k:p"}, []any{"", "1", "2", "3", int64(1)})
	b.Add(false, []string{"x", "x:p"}, []any{"", "g"})
	argv := b.Argv()
	if b.Len() != 2 || len(b.Keys) != 4 || argv[0] != 2 || len(argv) != 1+3+5+3+2 {
		t.Fatalf("batch of 2: keys %v, argv %v", b.Keys, argv)
	}
	b.Reset()
	if b.Len() != 0 || len(b.Keys) != 0 || len(b.Argv()) != 0 {
		t.Fatalf("after Reset: %v %v", b.Keys, b.Argv())
	}
	for _, bad := range []any{[]any{"x"}, []any{"x", "1", "2"}, "x", []any{"x", "y"}, []any{"x", "-1"}, []any{"x", 1.5}} {
		if _, _, err := script.SplitBatch(bad, 1); err == nil {
			t.Fatalf("SplitBatch accepted %v for 1 reservation", bad)
		}
	}
	if items, took, err := script.SplitBatch([]any{"x", "y", "0.25"}, 2); err != nil || !slices.Equal(items, []any{"x", "y"}) || took != 0.25 {
		t.Fatalf("SplitBatch: %v %v %v", items, took, err)
	}
}

// coalesce.Slot is Redis Cluster's hash slot: the specification's example,
// and the server's own CLUSTER KEYSLOT for the escaped tags of odd keys
// and random ones.
func checkClusterSlot(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	if got := coalesce.Slot("123456789"); got != 0x31C3&16383 {
		t.Fatalf("coalesce.Slot(123456789) = %d", got)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tags := append([]string(nil), storetest.OddKeys...)
	for range 200 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		tags = append(tags, string(b))
	}
	for _, tag := range tags {
		want, err := c.ClusterKeySlot(bg, "p{"+escapeTag(tag)+"}x").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := coalesce.Slot(escapeTag(tag)); int64(got) != want {
			t.Fatalf("coalesce.Slot(%q) = %d, CLUSTER KEYSLOT %d", escapeTag(tag), got, want)
		}
	}
}

// A batch's run of reservations on one key without a Ledger or a clamp
// reads the key once and writes it twice (its first reservation, then its
// last TAT): the slots, the TAT and the TTL left are those of one call
// each.
func TestRedisARunOnOneKeyReadsOnceAndLeavesWhatEachCallWould(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	clock := timer.NewFake(storetest.T0)
	rs, sp := newSpied(c, WithClientClock(), WithTimeout(slowMachine))
	s, err := shaper.New(rs, shaper.PerSecond(10), shaper.WithClock(clock), shaper.WithPrefix("run:"), shaper.WithMaxQueue(time.Hour), shaper.WithContractRefresh(0))
	if err != nil {
		t.Fatal(err)
	}
	alone, err := shaper.New(New(c, WithClientClock(), WithCoalescing(false), WithTimeout(slowMachine)), shaper.PerSecond(10), shaper.WithClock(clock), shaper.WithPrefix("one:"), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(bg).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 6
	got := make([]time.Duration, n)
	heldBatch(t, sp, n, func(i int) {
		r, err := s.Reserve(bg, "k", 1)
		if err != nil {
			t.Error(err)
		}
		got[i] = r.Delay
	})
	stats := c.Info(bg, "commandstats").Val()
	for _, want := range []string{"cmdstat_mget:calls=1,", "cmdstat_set:calls=2,"} {
		if !strings.Contains(stats, want) {
			t.Fatalf("a run of %d on one key: want %s in\n%s", n, want, stats)
		}
	}
	for i := range n {
		r := mustReserve(t, alone, "k", 1)
		if r.Delay != got[i] || got[i] != time.Duration(i)*100*time.Millisecond {
			t.Fatalf("reservation %d: batched %v, one call each %v", i, got[i], r.Delay)
		}
	}
	if a, b := c.Get(bg, "run:{k}").Val(), c.Get(bg, "one:{k}").Val(); a != b || a == "" {
		t.Fatalf("stored TAT %q batched, %q one call each", a, b)
	}
	ta, tb := c.PTTL(bg, "run:{k}").Val(), c.PTTL(bg, "one:{k}").Val()
	// The TTLs were set from the same fake now, a few ms of real time apart.
	if d := ta - tb; d < -time.Second/4 || d > time.Second/4 || ta < 500*time.Millisecond {
		t.Fatalf("TTL left %v batched, %v one call each", ta, tb)
	}
}

// A node (or Sentinel) client has one lane for every key, a cluster client
// one per hash slot, and a Ring, which places keys by their hash tag and
// not their slot, none: its reservations make one call each.
func TestLanesFollowTheClient(t *testing.T) {
	t.Parallel()
	node := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _, _, _ = node.Close(), cluster.Close(), ring.Close() })
	if l := newLanes(node); l == nil || l.Of("a") != l.Of("b") {
		t.Fatal("a node client: want one lane for every key")
	}
	l := newLanes(cluster)
	if l == nil || l.Of("a") == l.Of("b") {
		t.Fatal("a cluster client: want a lane per hash slot")
	}
	if coalesce.Slot("a") == coalesce.Slot("b") {
		t.Fatal("the test's keys share a slot")
	}
	if newLanes(ring) != nil || New(ring).r.lanes != nil || New(node, WithCoalescing(false)).r.lanes != nil {
		t.Fatal("a Ring, or coalescing off: want no lanes")
	}
}

// As Cancel, a grant nobody waits for goes back only while its slot is
// still ahead: one whose slot has come when its batch returns is kept. (On
// the client clock a queued reservation is decided when its batch is sent:
// 150 ms here, where its slot is, since the key is free.)
func TestRedisAPassedGrantNobodyWaitsForIsKept(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	redistest.Timeless(c) // TTLs in simulated ms: no key may expire in real time meanwhile (a flake seen under load)
	clock := timer.NewFake(storetest.T0)
	rs, sp := newSpied(c, WithClientClock(), WithTimeout(slowMachine))
	s, err := shaper.New(rs, shaper.PerSecond(10), shaper.WithClock(clock), shaper.WithPrefix("passed:"), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, "k", 1)                                                    // at once; the next slot is 100 ms away
	leaveQueued(t, sp, s, "k", func() { clock.Advance(150 * time.Millisecond) }) // the batch decides at 150 ms: its slot is then
	if r := mustReserve(t, s, "k", 1); r.Delay != 100*time.Millisecond {
		t.Fatalf("after a grant nobody took whose slot had come, the next slot is %v away, want 100ms (at 250 ms)", r.Delay)
	}
}

// Callers that leave while queued never cost the contract: rounds of
// batches on one key where random callers leave before their batch returns
// and time passes meanwhile (so some grants given back are still ahead and
// some have passed), then reservations after them. Every slot a caller
// kept is at least one interval from every other, on a node and on the
// cluster.
func TestRedisCallersThatLeaveKeepTheContract(t *testing.T) {
	t.Parallel()
	node, cluster := nodeAndCluster(t)
	for ci, c := range []redis.UniversalClient{node, cluster} {
		for seed := range uint64(6) {
			rng := rand.New(rand.NewPCG(seed, 5))
			clock := timer.NewFake(storetest.T0)
			// A generous timeout and queue: the test is about the slots kept,
			// and on a loaded machine a call can take longer than the
			// default 250 ms, and the kept grants of 8 rounds (up to 80)
			// can pass a 3 s queue.
			rs, sp := newSpied(c, WithClientClock(), WithTimeout(slowMachine))
			s, err := shaper.New(rs, shaper.PerSecond(10), shaper.WithClock(clock), shaper.WithPrefix(fmt.Sprintf("leave%d-%d:", ci, seed)), shaper.WithMaxQueue(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			var kept []time.Time
			for range 8 {
				n := 2 + rng.IntN(8)
				ctxs := make([]context.Context, n)
				cancels := make([]context.CancelFunc, n)
				for i := range n {
					ctxs[i], cancels[i] = context.WithCancel(bg)
				}
				got := make([]shaper.Reservation, n)
				errs := make([]error, n)
				sp.hold()
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() { got[i], errs[i] = s.Reserve(ctxs[i], "k", 1) })
					for sp.queued() < i+1 {
						time.Sleep(50 * time.Microsecond) // a goroutine starting: how long does not matter
					}
				}
				for i := range n {
					if rng.IntN(3) == 0 {
						cancels[i]()
					}
				}
				clock.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
				sp.release()
				wg.Wait()
				sp.settled()
				for i := range n {
					cancels[i]()
					if errs[i] == nil {
						kept = append(kept, got[i].Time())
					} else if !errors.Is(errs[i], context.Canceled) {
						t.Fatalf("reservation %d: %v", i, errs[i])
					}
				}
				r := mustReserve(t, s, "k", 1)
				kept = append(kept, r.Time())
				clock.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
			}
			slices.SortFunc(kept, func(a, b time.Time) int { return a.Compare(b) })
			for i := 1; i < len(kept); i++ {
				if gap := kept[i].Sub(kept[i-1]); gap < 100*time.Millisecond-time.Microsecond { // ms floats to ns
					t.Fatalf("%T seed %d: two kept slots %v apart (interval 100ms): %v", c, seed, gap, kept)
				}
			}
		}
	}
}

// On the client clock a queued reservation is decided at the instant its
// batch is sent, never at the earlier instant it was made: by then another
// process may have decided later slots whose TTL lets the key expire, and
// at its own instant the expired key would look cold, granting a slot
// among the ones already given. Wall clock: Redis TTLs run on it. The
// timings (a 100 ms interval, 250 ms of waiting) leave 100 ms of margin for
// a loaded host; the assertion is on the slots, which do not depend on it.
func TestRedisAQueuedReservationDecidesWhenSent(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	one, sp := newSpied(c, WithClientClock(), WithTimeout(slowMachine))
	s1, err := shaper.New(one, shaper.PerSecond(10), shaper.WithPrefix("late:"), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := shaper.New(New(c, WithClientClock(), WithCoalescing(false), WithTimeout(slowMachine)), shaper.PerSecond(10), shaper.WithPrefix("late:"), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	first := mustReserve(t, s1, "k", 1)
	sp.hold()
	var queued shaper.Reservation
	var qerr error
	done := make(chan struct{})
	go func() { queued, qerr = s1.Reserve(bg, "k", 1); close(done) }()
	for sp.queued() == 0 {
		time.Sleep(50 * time.Microsecond) // a goroutine starting: how long does not matter
	}
	other := mustReserve(t, s2, "k", 1) // another process: the slot after first's
	time.Sleep(250 * time.Millisecond)  // other's slot passes; the key expires after it
	sp.release()
	<-done
	if qerr != nil {
		t.Fatal(qerr)
	}
	slots := []time.Time{first.Time(), other.Time(), queued.Time()}
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap < 100*time.Millisecond-time.Microsecond { // ms floats to ns
			t.Fatalf("slots %v apart (interval 100ms): first %v, the other process's %v, the queued one %v",
				gap, first.Time().Format("05.000"), other.Time().Format("05.000"), queued.Time().Format("05.000"))
		}
	}
}
