package shaper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// Issue 26: edges of the contract around settling, cancelling, live
// changes and pauses, pinned on every store they concern.

// edgeStore is one kind of store a test of this file runs on: memory
// (client nil), a Redis node or the 3-master cluster (a timeless client:
// keys expire only when a test deletes them, see timeless; with a gate
// that can hold its script calls, see heldBatch).
type edgeStore struct {
	name   string
	client redis.UniversalClient
	gate   *gate
}

// edgeStores starts the servers the named kinds ("memory", "redis",
// "cluster") need, for the whole of t.
func edgeStores(t *testing.T, kinds ...string) []edgeStore {
	t.Helper()
	var out []edgeStore
	for _, k := range kinds {
		switch k {
		case "memory":
			out = append(out, edgeStore{name: k})
		case "redis":
			_, node := redisClient(t)
			g := newGate(node)
			out = append(out, edgeStore{name: k, client: timeless(node), gate: g})
		case "cluster":
			cluster := redistest.StartCluster(t).Client(t)
			g := newGate(cluster)
			out = append(out, edgeStore{name: k, client: timeless(cluster), gate: g})
		default:
			t.Fatalf("unknown store kind %q", k)
		}
	}
	return out
}

// store returns a fresh store of e's kind, closed when t ends: a memory
// store without a sweeper, or a redisstore.Store on the test's clock with a store
// timeout a loaded machine cannot trip.
func (e edgeStore) store(t *testing.T) Store {
	t.Helper()
	if e.client == nil {
		m := memstore.New(memstore.WithSweepInterval(0))
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	rs := redisstore.New(e.client, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
	t.Cleanup(func() { _ = rs.Close() })
	return rs
}

// edgeStateKeys returns key's Redis state key in every dimension of s, in
// name order.
func edgeStateKeys(s *Shaper, key string) []string {
	dims := s.cur.Load().sdims
	keys := make([]string, len(dims))
	for i := range keys {
		keys[i] = key
	}
	all := redisKeysOf(store.KeySet{Dims: dims, Keys: keys, Slot: key})
	var out []string
	for i := 0; i < len(all); i += 2 {
		out = append(out, all[i])
	}
	return out
}

// edgeExpire models the expiry of idle keys: on Redis it deletes each
// key's state keys and the keys derived from them (as their TTLs would);
// on memory a call on another key at the clock's now tells the store the
// time, and Sweep must then evict exactly the keys named.
func edgeExpire(t *testing.T, e edgeStore, s *Shaper, store Store, keys ...string) {
	t.Helper()
	if e.client != nil {
		for _, k := range keys {
			for _, sk := range edgeStateKeys(s, k) {
				for _, suf := range append([]string{""}, derivedSuffixes[:]...) {
					if err := e.client.Del(bg, sk+suf).Err(); err != nil {
						t.Fatal(err)
					}
				}
				if n, err := e.client.Exists(bg, sk).Result(); err != nil || n != 0 {
					t.Fatalf("%s still exists after DEL (%v)", sk, err)
				}
			}
		}
		return
	}
	m := store.(*memstore.Store)
	mustReserve(t, s, "expire-bump", 1) // busy: the store's now is the clock's, and this key is not idle
	held := m.Len()
	if n := m.Sweep(); n != len(keys)*len(s.cur.Load().dims) {
		t.Fatalf("the memory store evicted %d entries of %d held, want the %d idle keys %q", n, held, len(keys), keys)
	}
	if got, want := m.Len(), held-len(keys)*len(s.cur.Load().dims); got != want {
		t.Fatalf("the memory store holds %d entries after the sweep, want %d", got, want)
	}
}

// edgeDump returns, for each of key's state keys on Redis and the keys
// derived from them, its type and its DUMP: equal dumps, equal values.
func edgeDump(t *testing.T, c redis.UniversalClient, stateKeys ...string) string {
	t.Helper()
	var b strings.Builder
	for _, sk := range stateKeys {
		for _, suf := range append([]string{""}, derivedSuffixes[:]...) {
			k := sk + suf
			typ, err := c.Type(bg, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			dump, err := c.Dump(bg, k).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %s %q\n", k, typ, dump)
		}
	}
	return b.String()
}

// edgeSnapshot is what a store holds for key, as far as a test can read
// it without consuming: its Status (every dimension's figures) and, on
// Redis, every key the scripts keep for it.
func edgeSnapshot(t *testing.T, e edgeStore, s *Shaper, key string) string {
	t.Helper()
	st, err := s.Status(bg, key, 1)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "remaining %d next %v reset %v paused %v binding %q\n", st.Remaining, st.Next.Sub(t0), st.ResetAt.Sub(t0), st.PausedUntil, st.Binding)
	for _, d := range st.Dimensions {
		fmt.Fprintf(&b, "  %q %q: remaining %d next %v reset %v\n", d.Name, d.Key, d.Remaining, d.Next.Sub(t0), d.ResetAt.Sub(t0))
	}
	if e.client != nil {
		b.WriteString(edgeDump(t, e.client, edgeStateKeys(s, key)...))
	}
	return b.String()
}

// edgeList replaces key with a list: a value of another type than the
// scripts keep there.
func edgeList(c redis.UniversalClient, key string) error {
	if err := c.Del(bg, key).Err(); err != nil {
		return err
	}
	return c.RPush(bg, key, "x").Err()
}

// edgeDep is one departure: its instant after t0 and its actual cost.
type edgeDep struct {
	at   time.Duration
	cost int64
}

// edgeConforms replays deps in time order through GCRA of interval T and
// tolerance tau, exactly, in integer nanoseconds: R = max(R, t - ex) +
// T*c, with ex = max(0, T*c - tau) (a cost above the burst is spread over
// the time before its departure); the departures conform when no step
// leaves R above t + tau. It returns the index (in time order) of the first
// departure that breaks the contract, or -1.
func edgeConforms(interval, tau time.Duration, deps []edgeDep) int {
	sorted := slices.Clone(deps)
	slices.SortStableFunc(sorted, func(a, b edgeDep) int { return int(a.at - b.at) })
	var r int64
	for i, d := range sorted {
		tc := int64(interval) * d.cost
		ex := max(0, tc-int64(tau))
		if t := int64(d.at) - ex; i == 0 || t > r {
			r = t
		}
		r += tc
		if r > int64(d.at)+int64(tau) {
			return i
		}
	}
	return -1
}

// Issue 26, item 1: an overrun settled once its key went idle (its Redis
// keys expired, its memory entry evicted) is charged, so that the
// departures with their actual costs still conform, for the leaky bucket
// and the token bucket.
func TestEdgeAnOverrunIsChargedOnceTheKeyWentIdle(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory", "redis", "cluster") {
		for _, alg := range []Algorithm{LeakyBucket, TokenBucket} {
			t.Run(e.name+"/"+alg.String(), func(t *testing.T) {
				clock := timer.NewFake(t0)
				store := e.store(t)
				s, err := New(store, PerSecond(10).WithBurst(10), WithAlgorithm(alg), WithClock(clock), WithName("edge-idle-"+e.name+"-"+alg.String()))
				if err != nil {
					t.Fatal(err)
				}
				r := mustReserve(t, s, "k", 1)
				clock.Advance(250 * time.Millisecond) // the key is idle: its TAT (100 ms) has passed, the bucket is full again
				edgeExpire(t, e, s, store, "k")
				if err := r.Settle(bg, 10); err != nil {
					t.Fatalf("Settle(10) on an expired key: %v", err)
				}
				deps := []edgeDep{{at: r.Time().Sub(t0), cost: 10}}
				n := 0
				for range 12 {
					ok, err := s.Allow(bg, "k", 1)
					if err != nil {
						t.Fatal(err)
					}
					if ok {
						n++
						deps = append(deps, edgeDep{at: clock.Now().Sub(t0), cost: 1})
					}
				}
				// T = 100 ms, tau = 1 s: the departure of cost 10 at 0 leaves
				// R = 1 s, and at 250 ms R may grow to 1.25 s: 2 units at most.
				if i := edgeConforms(100*time.Millisecond, time.Second, deps); i >= 0 || n > 2 {
					t.Fatalf("after settling 1 as 10 on the expired key, %d unit requests were admitted at once at 250 ms (departure %d of %+v breaks 10/s burst 10): the overrun was not charged", n, i, deps)
				}
				if alg == TokenBucket && n != 1 {
					t.Fatalf("token bucket: %d admitted after the settle, want burst - extra = 10 - 9 = 1", n)
				}
			})
		}
	}
}

// Issue 26, item 2: SetRate after the contract record was deleted by hand
// holds at once for the shaper that made it, and the fleet follows it,
// although the new record's version is the one the deleted record had.
func TestEdgeSetRateAfterTheRecordWasDeleted(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "redis", "cluster") {
		t.Run(e.name, func(t *testing.T) {
			clock := timer.NewFake(t0)
			name := "edge-deleted-record-" + e.name
			process := func() *Shaper {
				s, err := New(e.store(t), PerSecond(10), WithClock(clock), WithName(name), WithContractRefresh(time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			a, b := process(), process()
			// follow makes b call past its refresh interval until it reads
			// the record and adopts want (it reads in the background).
			follow := func(want Rate) {
				t.Helper()
				for start := time.Now(); ; time.Sleep(time.Millisecond) {
					if r, _ := b.Rate(""); r == want {
						return
					}
					if time.Since(start) > 5*time.Second {
						r, _ := b.Rate("")
						t.Fatalf("b's rate is %v after 5 s of calls past its refresh interval, want %v", r, want)
					}
					clock.Advance(2 * time.Millisecond)
					if _, err := b.Status(bg, "poll", 1); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := a.SetRate(bg, "", PerSecond(50)); err != nil {
				t.Fatal(err)
			}
			if r, _ := a.Rate(""); r != PerSecond(50) {
				t.Fatalf("a's rate is %v after SetRate(50/s)", r)
			}
			follow(PerSecond(50))
			record := contractKey(a.cfg.prefix)
			if n, err := e.client.Del(bg, record).Result(); err != nil || n != 1 {
				t.Fatalf("DEL %s: %d %v, want the record deleted", record, n, err)
			}
			if err := a.SetRate(bg, "", PerSecond(2)); err != nil {
				t.Fatal(err)
			}
			if r, _ := a.Rate(""); r != PerSecond(2) {
				t.Fatalf("a's rate is %v right after SetRate(2/s) on a deleted record, want 2/s", r)
			}
			follow(PerSecond(2))
			// Both pace k at 2/s together.
			da, db := mustReserve(t, a, "k", 1).Delay, mustReserve(t, b, "k", 1).Delay
			if da != 0 || db != 500*time.Millisecond {
				t.Fatalf("a then b on k wait %v and %v, want 0 and 500ms (2/s)", da, db)
			}
		})
	}
}

// Issue 26, item 5: All of 65 dimensions is refused with a *ConfigError,
// and 64 work, the 64th dimension paced as the others are.
func TestEdgeSixtyFourDimensionsAndNoMore(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory") {
		t.Run(e.name, func(t *testing.T) {
			dims := func(n int) []Dimension {
				out := make([]Dimension, n)
				for i := range out {
					out[i] = Dimension{Name: fmt.Sprintf("d%02d", i), Rate: PerSecond(1000).WithBurst(1000)}
				}
				out[n-1].Rate = PerSecond(1) // the last, given and in name order, binds
				return out
			}
			for _, combine := range []func(Store, []Dimension, ...Option) (*Shaper, error){All, Any} {
				_, err := combine(e.store(t), dims(65), WithName("edge-65"))
				var ce *ConfigError
				if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) || ce.Field != "Dimensions" {
					t.Fatalf("65 dimensions: %v (%T), want a *ConfigError on Dimensions matching ErrInvalidConfig", err, err)
				}
			}
			clock := timer.NewFake(t0)
			s, err := All(e.store(t), dims(64), WithClock(clock), WithName("edge-64"))
			if err != nil {
				t.Fatalf("64 dimensions: %v", err)
			}
			if r := mustReserve(t, s, "k", 1); r.Delay != 0 {
				t.Fatalf("the first request waits %v", r.Delay)
			}
			r := mustReserve(t, s, "k", 1)
			if r.Delay != time.Second {
				t.Fatalf("the second request waits %v, want 1s: the 64th dimension (1/s) is not enforced", r.Delay)
			}
			if ok, err := s.Allow(bg, "k", 1); ok || err != nil {
				t.Fatalf("Allow with the 64th dimension's next slot 2 s away: %v %v", ok, err)
			}
			st, err := s.Status(bg, "k", 1)
			if err != nil || st.Binding != "d63" {
				t.Fatalf("Status names %q as binding (%v), want d63", st.Binding, err)
			}
			if err := r.Cancel(bg); err != nil {
				t.Fatal(err)
			}
			if r := mustReserve(t, s, "k", 1); r.Delay != time.Second {
				t.Fatalf("after cancelling the tail the next request waits %v, want 1s: the 64th dimension got nothing back", r.Delay)
			}
		})
	}
}

// Issue 26, item 6: an overrun settled after more than SeqWindow (4,096)
// later grants on its key is still charged in full.
func TestEdgeAnOverrunPastTheSeqWindowIsCharged(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory", "redis", "cluster") {
		t.Run(e.name, func(t *testing.T) {
			clock := timer.NewFake(t0)
			s, err := New(e.store(t), PerSecond(1000), WithClock(clock), WithName("edge-window-"+e.name))
			if err != nil {
				t.Fatal(err)
			}
			keys := []string{"k", "twin"} // the twin does the same without the settle
			var rs [2]Reservation
			for i, k := range keys {
				x := mustReserve(t, s, k, 1)
				if err := x.Cancel(bg); err != nil { // the tail comes back, and the key gets a Ledger
					t.Fatal(err)
				}
				rs[i] = mustReserve(t, s, k, 1)
				if rs[i].g.Seq == 0 {
					t.Fatalf("%s: the reservation after a cancel has no sequence number: the key has no Ledger", k)
				}
			}
			for range 4100 { // the key stays busy: a backlog of about 2 s, within MaxQueue
				clock.Advance(500 * time.Microsecond)
				for _, k := range keys {
					mustReserve(t, s, k, 1)
				}
			}
			if err := rs[0].Settle(bg, 1001); err != nil {
				t.Fatal(err)
			}
			nk, nt := mustReserve(t, s, "k", 1), mustReserve(t, s, "twin", 1)
			if d := nk.Time().Sub(nt.Time()); d != time.Second {
				t.Fatalf("after settling 1 as 1001 past 4,100 later grants the next slot is %v later than the twin's, want 1s (1,000 intervals)", d)
			}
		})
	}
}

// Issue 26, item 7: a reservation that fails on a corrupt Ledger consumes
// nothing, alone or in a batch, and fails alike both ways with a
// *redisstore.StateError.
func TestEdgeACorruptLedgerReservationConsumesNothing(t *testing.T) {
	t.Parallel()
	corruptions := []struct {
		name string
		do   func(c redis.UniversalClient, sk string, now float64) error
	}{
		{"ledger garbage", func(c redis.UniversalClient, sk string, _ float64) error {
			return c.Set(bg, sk+":l", "not a ledger", 0).Err()
		}},
		{"ledger inf", func(c redis.UniversalClient, sk string, _ float64) error { return c.Set(bg, sk+":l", "inf", 0).Err() }},
		{"ledger with an inf mark", func(c redis.UniversalClient, sk string, _ float64) error {
			return c.Set(bg, sk+":l", "0 0 1 inf 5", 0).Err()
		}},
		{"bits a list", func(c redis.UniversalClient, sk string, _ float64) error { return edgeList(c, sk+":b") }},
		{"holes a list", func(c redis.UniversalClient, sk string, _ float64) error { return edgeList(c, sk+":h") }},
		{"claims a list", func(c redis.UniversalClient, sk string, _ float64) error { return edgeList(c, sk+":c") }},
		{"a malformed hole ahead", func(c redis.UniversalClient, sk string, now float64) error {
			return c.ZAdd(bg, sk+":h", redis.Z{Score: now + 150, Member: "x"}).Err()
		}},
	}
	for _, e := range edgeStores(t, "redis", "cluster") {
		for i, corrupt := range corruptions {
			t.Run(e.name+"/"+corrupt.name, func(t *testing.T) {
				clock := timer.NewFake(t0)
				s, err := New(e.store(t), PerSecond(10), WithClock(clock), WithName(fmt.Sprintf("edge-corrupt-%s-%d", e.name, i)))
				if err != nil {
					t.Fatal(err)
				}
				mustReserve(t, s, "k", 1)
				mustReserve(t, s, "k", 1)
				r3 := mustReserve(t, s, "k", 1)          // slots 0, 100, 200 ms: the TAT is 300 ms
				if err := r3.Settle(bg, 1); err != nil { // the tail, at its cost: the key gets a Ledger
					t.Fatal(err)
				}
				sk := stateKey(s, "k")
				if n, err := e.client.Exists(bg, sk+":l").Result(); err != nil || n != 1 {
					t.Fatalf("the key has no Ledger after a settle (%v)", err)
				}
				if err := corrupt.do(e.client, sk, algorithms.Millis(clock.Now())); err != nil {
					t.Fatal(err)
				}
				state, err := e.client.Get(bg, sk).Result()
				if err != nil {
					t.Fatal(err)
				}
				dump := edgeDump(t, e.client, sk)
				unchanged := func(how string) {
					t.Helper()
					if got, err := e.client.Get(bg, sk).Result(); err != nil || got != state {
						t.Fatalf("%s: the state key holds %q (%v), was %q: a failed reservation consumed", how, got, err, state)
					}
					if got := edgeDump(t, e.client, sk); got != dump {
						t.Fatalf("%s: the key's Ledger changed:\n%s\nwas\n%s", how, got, dump)
					}
				}
				check := func(how string, err error) string {
					t.Helper()
					var se *redisstore.StateError
					if !errors.As(err, &se) || !errors.Is(err, ErrInvalidState) || se.Key != "k" {
						t.Fatalf("%s: %v (%T), want a *redisstore.StateError naming k", how, err, err)
					}
					return se.Error()
				}
				var want string
				for j := range 4 {
					_, err := s.Reserve(bg, "k", 1)
					got := check(fmt.Sprintf("alone, reservation %d", j), err)
					if j == 0 {
						want = got
					} else if got != want {
						t.Fatalf("alone, reservation %d: %q, the first %q", j, got, want)
					}
				}
				unchanged("alone")
				// 4 queued behind the calls held in flight (alone too, and
				// checked alike), then decided by one call.
				errs := make([]error, 16)
				n := heldBatch(t, e.gate, 4, len(errs), func(j int) { _, errs[j] = s.Reserve(bg, "k", 1) })
				if l := e.gate.largest.Load(); l < 4 {
					t.Fatalf("the largest call decided %d reservations: the 4 were not batched", l)
				}
				for j, err := range errs[:n] {
					if got := check(fmt.Sprintf("batched, reservation %d", j), err); got != want {
						t.Fatalf("batched, reservation %d: %q, alone %q", j, got, want)
					}
				}
				unchanged("batched")
			})
		}
	}
}

// Issue 26, item 8: a Settle with a done ctx returns its error and records
// nothing, on every store, and a retry with a live ctx then charges the
// extra.
func TestEdgeASettleWithADoneContextRecordsNothing(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory", "redis", "cluster") {
		for _, multi := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/multi=%v", e.name, multi), func(t *testing.T) {
				clock := timer.NewFake(t0)
				name := fmt.Sprintf("edge-done-%s-%v", e.name, multi)
				var s *Shaper
				var err error
				if multi {
					s, err = All(e.store(t), []Dimension{{Name: "a", Rate: PerSecond(10)}, {Name: "b", Rate: PerSecond(10)}}, WithClock(clock), WithName(name))
				} else {
					s, err = New(e.store(t), PerSecond(10), WithClock(clock), WithName(name))
				}
				if err != nil {
					t.Fatal(err)
				}
				r := mustReserve(t, s, "k", 1)
				mustReserve(t, s, "twin", 1)
				clock.Advance(10 * time.Millisecond)
				before := edgeSnapshot(t, e, s, "k")
				ctx, cancel := context.WithCancel(bg)
				cancel()
				for range 2 {
					if err := r.Settle(ctx, 6); !errors.Is(err, context.Canceled) {
						t.Fatalf("Settle with a cancelled ctx: %v, want context.Canceled", err)
					}
				}
				if after := edgeSnapshot(t, e, s, "k"); after != before {
					t.Fatalf("a Settle with a done ctx recorded something:\n%s\nwas\n%s", after, before)
				}
				if err := r.Settle(bg, 6); err != nil {
					t.Fatalf("the retry with a live ctx: %v", err)
				}
				nk, nt := mustReserve(t, s, "k", 1), mustReserve(t, s, "twin", 1)
				if d := nk.Time().Sub(nt.Time()); d != 500*time.Millisecond {
					t.Fatalf("after the retry settled 1 as 6 the next slot is %v later than the twin's, want 500ms", d)
				}
			})
		}
	}
}

// Issue 26, item 9: a two-dimension settle whose second dimension's Ledger
// is corrupt fails with a *redisstore.StateError naming that dimension, and writes
// nothing to the first.
func TestEdgeASettleFailingOnOneDimensionNamesItAndWritesNothing(t *testing.T) {
	t.Parallel()
	corruptions := map[string]func(c redis.UniversalClient, sk string) error{
		"ledger garbage": func(c redis.UniversalClient, sk string) error { return c.Set(bg, sk+":l", "not a ledger", 0).Err() },
		"bits a list":    func(c redis.UniversalClient, sk string) error { return edgeList(c, sk+":b") },
		"holes a list":   func(c redis.UniversalClient, sk string) error { return edgeList(c, sk+":h") },
	}
	for _, e := range edgeStores(t, "redis", "cluster") {
		for what, corrupt := range corruptions {
			t.Run(e.name+"/"+what, func(t *testing.T) {
				clock := timer.NewFake(t0)
				s, err := All(e.store(t), []Dimension{
					{Name: "a", Rate: PerSecond(10)},
					{Name: "b", Rate: PerSecond(10)},
				}, WithClock(clock), WithName("edge-dims-"+e.name+"-"+strings.ReplaceAll(what, " ", "-")))
				if err != nil {
					t.Fatal(err)
				}
				r1 := mustReserve(t, s, "k", 1)
				if err := r1.Settle(bg, 1); err != nil { // both keys get a Ledger
					t.Fatal(err)
				}
				r2 := mustReserve(t, s, "k", 1)
				sks := edgeStateKeys(s, "k")
				if dims := s.cur.Load().dims; len(sks) != 2 || dims[0].Name != "a" || dims[1].Name != "b" {
					t.Fatalf("state keys %q", sks)
				}
				for _, sk := range sks {
					if n, err := e.client.Exists(bg, sk+":l").Result(); err != nil || n != 1 {
						t.Fatalf("%s has no Ledger after a settle (%v)", sk, err)
					}
				}
				if err := corrupt(e.client, sks[1]); err != nil {
					t.Fatal(err)
				}
				a := edgeDump(t, e.client, sks[0])
				b, err := e.client.Get(bg, sks[1]).Result()
				if err != nil {
					t.Fatal(err)
				}
				err = r2.Settle(bg, 5)
				var se *redisstore.StateError
				if !errors.As(err, &se) || !errors.Is(err, ErrInvalidState) || se.Dimension != "b" || se.Key != "k" || se.Op != "settle" {
					t.Fatalf("Settle with b's Ledger corrupt: %v (%T), want a *redisstore.StateError of settle naming k and dimension b", err, err)
				}
				if got := edgeDump(t, e.client, sks[0]); got != a {
					t.Fatalf("dimension a changed although the settle failed:\n%s\nwas\n%s", got, a)
				}
				if got, err := e.client.Get(bg, sks[1]).Result(); err != nil || got != b {
					t.Fatalf("dimension b's state is %q (%v), was %q", got, err, b)
				}
			})
		}
	}
}

// Issue 26, item 10: two copies of one reservation settled for 5 of 1
// after its slot passed charge the extra once: busy, idle, expired, and
// granted under a Ledger.
func TestEdgeCopiesSettledLateChargeOnce(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory", "redis", "cluster") {
		for _, c := range []struct {
			name    string
			after   time.Duration
			expired bool
			ledger  bool
		}{
			{"busy", 50 * time.Millisecond, false, false},
			{"idle", 250 * time.Millisecond, false, false},
			{"expired", 250 * time.Millisecond, true, false},
			{"ledger", 50 * time.Millisecond, false, true},
		} {
			t.Run(e.name+"/"+c.name, func(t *testing.T) {
				clock := timer.NewFake(t0)
				store := e.store(t)
				s, err := New(store, PerSecond(10), WithClock(clock), WithName("edge-copies-"+e.name+"-"+c.name))
				if err != nil {
					t.Fatal(err)
				}
				keys := []string{"k", "twin"} // the twin's reservation is settled once
				var rs [2]Reservation
				for i, k := range keys {
					if c.ledger {
						x := mustReserve(t, s, k, 1)
						if err := x.Cancel(bg); err != nil { // the tail comes back, and the key gets a Ledger
							t.Fatal(err)
						}
					}
					rs[i] = mustReserve(t, s, k, 1)
					if c.ledger && rs[i].g.Seq == 0 {
						t.Fatalf("%s: no sequence number: the key has no Ledger", k)
					}
				}
				clock.Advance(c.after)
				if c.expired {
					edgeExpire(t, e, s, store, keys...)
				}
				c1, c2 := rs[0], rs[0]
				for _, r := range []*Reservation{&c1, &c2, &rs[1]} {
					if err := r.Settle(bg, 5); err != nil {
						t.Fatal(err)
					}
				}
				nk, nt := mustReserve(t, s, "k", 1), mustReserve(t, s, "twin", 1)
				if nt.Delay <= 0 {
					t.Fatalf("the twin's next request departs at once: the extra was not charged")
				}
				if d := nk.Time().Sub(nt.Time()); d != 0 {
					t.Fatalf("two copies settled for 5 of 1: the next slot is %v later than after one settle, want the same", d)
				}
			})
		}
	}
}

// Issue 26, item 11: a Cancel after the slot returns nil and does nothing,
// and a Settle after it still charges the extra.
func TestEdgeACancelAfterTheSlotLeavesTheSettle(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory", "redis", "cluster") {
		t.Run(e.name, func(t *testing.T) {
			clock := timer.NewFake(t0)
			s, err := New(e.store(t), PerSecond(10), WithClock(clock), WithName("edge-late-cancel-"+e.name))
			if err != nil {
				t.Fatal(err)
			}
			r := mustReserve(t, s, "k", 1) // slot 0, TAT 100 ms: the tail, all of which a cancel could give back
			mustReserve(t, s, "twin", 1)
			clock.Advance(50 * time.Millisecond)
			before := edgeSnapshot(t, e, s, "k")
			if err := r.Cancel(bg); err != nil {
				t.Fatalf("Cancel after the slot: %v, want nil", err)
			}
			if after := edgeSnapshot(t, e, s, "k"); after != before {
				t.Fatalf("a Cancel after the slot changed the key:\n%s\nwas\n%s", after, before)
			}
			if err := r.Settle(bg, 6); err != nil {
				t.Fatal(err)
			}
			nk, nt := mustReserve(t, s, "k", 1), mustReserve(t, s, "twin", 1)
			if d := nk.Time().Sub(nt.Time()); d != 500*time.Millisecond {
				t.Fatalf("after a late Cancel, settling 1 as 6 moved the next slot by %v, want 500ms", d)
			}
		})
	}
}

// Issue 26, item 12: a settle whose extra would hold a key back past
// MaxOverrun is a *CostError that writes nothing, and one of a day's extra
// is charged, on every store.
func TestEdgeAnOverrunPastMaxOverrunIsRefused(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory", "redis", "cluster") {
		t.Run(e.name, func(t *testing.T) {
			clock := timer.NewFake(t0)
			s, err := New(e.store(t), PerSecond(10), WithClock(clock), WithName("edge-max-overrun-"+e.name))
			if err != nil {
				t.Fatal(err)
			}
			r := mustReserve(t, s, "k", 1)
			mustReserve(t, s, "twin", 1)
			before := edgeSnapshot(t, e, s, "k")
			for _, actual := range []int64{1e15, math.MaxInt64} {
				err := r.Settle(bg, actual)
				var ce *CostError
				if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidCost) {
					t.Fatalf("Settle(%d) at 10/s: %v (%T), want a *CostError", actual, err, err)
				}
				if after := edgeSnapshot(t, e, s, "k"); after != before {
					t.Fatalf("the refused Settle(%d) wrote:\n%s\nwas\n%s", actual, after, before)
				}
			}
			if err := r.Settle(bg, 1e6); err != nil { // 99,999.9 s of extra: more than a day, less than MaxOverrun
				t.Fatalf("Settle(1e6) at 10/s: %v", err)
			}
			twin := mustReserve(t, s, "twin", 1)
			_, err = s.Reserve(bg, "k", 1)
			var qf *QueueFullError
			if !errors.As(err, &qf) {
				t.Fatalf("the next request after a day's extra: %v, want a *QueueFullError", err)
			}
			if want := twin.Delay + 999_999*100*time.Millisecond; qf.Delay != want {
				t.Fatalf("the next request after settling 1 as 1e6 would wait %v, want %v", qf.Delay, want)
			}
		})
	}
}

// Issue 26, item 16: a waiter in Acquire never departs inside a pause,
// however often pauses come while it sleeps.
func TestEdgeNoDepartureInsideAPause(t *testing.T) {
	t.Parallel()
	for _, e := range edgeStores(t, "memory") {
		t.Run(e.name, func(t *testing.T) {
			clock := timer.NewFake(t0)
			s, err := New(e.store(t), PerSecond(10), WithClock(clock), WithName("edge-pauses-"+e.name))
			if err != nil {
				t.Fatal(err)
			}
			mustReserve(t, s, "k", 1) // the waiter's slot is 100 ms away
			type outcome struct {
				r   Reservation
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				r, err := s.Acquire(bg, "k", 1)
				done <- outcome{r, err}
			}()
			var end time.Time // the end of the last pause
			// asleep waits until the waiter sleeps, and returns its slot (the
			// key's TAT less its one interval: it reserved last, at burst 1).
			asleep := func() time.Time {
				t.Helper()
				for start := time.Now(); clock.Pending() < 1; time.Sleep(50 * time.Microsecond) {
					select {
					case o := <-done:
						t.Fatalf("Acquire returned (%v) with its departure at %v, inside the pause ending at %v", o.err, o.r.Time().Sub(t0), end.Sub(t0))
					default:
					}
					if time.Since(start) > 10*time.Second {
						t.Fatal("the waiter never slept")
					}
				}
				st, err := s.Status(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				return st.Dimensions[0].Next.Add(-100 * time.Millisecond)
			}
			for range 10 {
				slot := asleep()
				end = slot.Add(time.Second)
				if err := s.Pause(bg, "k", end.Sub(clock.Now())); err != nil {
					t.Fatal(err)
				}
				clock.Advance(slot.Sub(clock.Now())) // the waiter wakes at its slot, inside the pause
			}
			slot := asleep()
			clock.Advance(slot.Sub(clock.Now()))
			select {
			case o := <-done:
				if o.err != nil {
					t.Fatalf("Acquire: %v", o.err)
				}
				if o.r.Time().Before(end) {
					t.Fatalf("the waiter departs at %v, inside the last pause (until %v)", o.r.Time().Sub(t0), end.Sub(t0))
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Acquire did not return after the last pause")
			}
		})
	}
}
