package shaper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// redisClient returns a client on a fresh redis-server that honours context
// deadlines on the socket.
// slowMachine is the store timeout of tests that check correctness, not
// timeouts: under -race on two busy cores hundreds of concurrent calls queue
// for the pool far longer than DefaultRedisTimeout, which would turn a
// correctness check into a flaky timeout check.
const slowMachine = 30 * time.Second

func redisClient(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 })
}

// scenario is one shaper configuration of the cross-store conformance run.
type scenario struct {
	name string
	make func(store Store, clock Clock, prefix string) (*Shaper, error)
}

func scenarios() []scenario {
	with := func(alg Algorithm, rate Rate, extra ...Option) func(Store, Clock, string) (*Shaper, error) {
		return func(store Store, clock Clock, prefix string) (*Shaper, error) {
			return New(store, rate, append([]Option{WithClock(clock), WithAlgorithm(alg), WithPrefix(prefix)}, extra...)...)
		}
	}
	account := func(key string) string { return "acct:" + key[:min(1, len(key))] }
	return []scenario{
		{"leaky 7/3s", with(LeakyBucket, Rate{Count: 7, Period: 3 * time.Second}, WithMaxQueue(5*time.Second))},
		{"leaky 10/s burst 3", with(LeakyBucket, PerSecond(10).WithBurst(3), WithMaxQueue(2*time.Second))},
		{"gcra", with(GCRA, PerSecond(5).WithBurst(5))},
		{"token", with(TokenBucket, PerSecond(4).WithBurst(6))},
		{"fixed", with(FixedWindow, PerSecond(6))},
		{"sliding", with(SlidingWindow, Rate{Count: 9, Period: 2 * time.Second})},
		{"log", with(SlidingWindowLog, PerSecond(5))},
		{"quota", with(Quota(Daily(14*time.Hour)), PerSecond(30))},
		{"multi", func(store Store, clock Clock, prefix string) (*Shaper, error) {
			return All(store, []Dimension{
				{Name: "account", Rate: PerSecond(8), Key: account, Cost: func(int64) int64 { return 1 }},
				{Name: "tokens", Rate: PerSecond(100).WithBurst(40)},
			}, WithClock(clock), WithMaxQueue(3*time.Second), WithPrefix(prefix))
		}},
		{"any", func(store Store, clock Clock, prefix string) (*Shaper, error) {
			return Any(store, []Dimension{
				{Name: "own", Rate: PerSecond(3).WithBurst(2)},
				{Name: "pool", Rate: PerSecond(4).WithBurst(3), Key: account, Slot: true},
				{Name: "tokens", Rate: PerSecond(20).WithBurst(4), Cost: func(c int64) int64 { return 2 * c }},
			}, WithClock(clock), WithMaxQueue(2*time.Second), WithPrefix(prefix))
		}},
		{"any gcra", func(store Store, clock Clock, prefix string) (*Shaper, error) {
			return Any(store, []Dimension{
				{Name: "own", Rate: PerSecond(2).WithBurst(2)},
				{Name: "pool", Rate: PerSecond(5).WithBurst(2), Key: account},
			}, WithClock(clock), WithAlgorithm(GCRA), WithPrefix(prefix))
		}},
	}
}

var oddKeys = []string{"a", "b{x}", "c}", "{d", "e f", "ключ", `g\h`, "a"}

// runScenario drives one shaper through a seeded sequence of operations and
// returns the transcript of every outcome.
// after, if not nil, runs after every operation.
func runScenario(t *testing.T, s *Shaper, clock *timer.Fake, seed uint64, after func()) []string {
	t.Helper()
	return runScenarioKeys(t, s, clock, seed, oddKeys, after, true)
}

// runScenarioKeys is runScenario over the given keys. With probe, every
// reservation is preceded by a Status of its key and cost, whose figures
// join the transcript (as lines starting "status") and must predict the
// reservation (checkStatus); the other lines do not depend on probe.
func runScenarioKeys(t *testing.T, s *Shaper, clock *timer.Fake, seed uint64, oddKeys []string, after func(), probe bool) []string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 3))
	var out []string
	var held []Reservation
	for i := range 300 {
		key := oddKeys[rng.IntN(len(oddKeys))]
		switch op := rng.IntN(21); {
		case op < 10:
			cost := int64(1 + rng.IntN(3))
			var st Status
			var stErr error
			if probe {
				st, stErr = probeStatus(t, s, clock, key, cost)
				out = append(out, fmt.Sprintf("status %d %q: %s %v", i, key, statusText(st, clock.Now()), errText(stErr)))
			}
			r, err := s.Reserve(bg, key, cost)
			if err == nil {
				held = append(held, r)
			}
			if probe {
				checkStatus(t, s, clock, st, stErr, r, err)
				out = append(out, fmt.Sprintf("status %d remaining %d", i, r.Remaining()))
			}
			out = append(out, fmt.Sprintf("%d reserve %q: %v %v", i, key, r.Delay, errText(err)))
		case op < 13:
			ok, err := s.Allow(bg, key, 1)
			out = append(out, fmt.Sprintf("%d allow %q: %v %v", i, key, ok, errText(err)))
		case op < 15 && len(held) > 0:
			j := rng.IntN(len(held))
			err := held[j].Cancel(bg)
			out = append(out, fmt.Sprintf("%d cancel %d: %v", i, j, errText(err)))
		case op < 16:
			err := s.Pause(bg, key, time.Duration(rng.IntN(1500))*time.Millisecond)
			out = append(out, fmt.Sprintf("%d pause %q: %v", i, key, errText(err)))
		case op < 17:
			n, reset := int64(rng.IntN(6)), time.Duration(rng.IntN(3000))*time.Millisecond
			err := s.Clamp(bg, key, n, reset)
			out = append(out, fmt.Sprintf("%d clamp %q %d in %v: %v", i, key, n, reset, errText(err)))
		case op < 18:
			out = append(out, fmt.Sprintf("%d reset %q: %v", i, key, errText(s.Reset(bg, key))))
		default:
			clock.Advance(time.Duration(rng.IntN(700)) * time.Millisecond)
		}
		if after != nil {
			after()
		}
	}
	return out
}

// sameTranscript fails t at the first step where got differs from want,
// the transcript of the reference (ref), or when their lengths differ.
func sameTranscript(t *testing.T, what, ref string, want, got []string) {
	t.Helper()
	for j := range min(len(want), len(got)) {
		if got[j] != want[j] {
			t.Fatalf("%s: step %d\n %s: %s\n      got: %s", what, j, ref, want[j], got[j])
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d steps, %s %d", what, len(got), ref, len(want))
	}
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	var qf *QueueFullError
	if errors.As(err, &qf) {
		return fmt.Sprintf("queue-full(%v, %v, %s)", qf.Delay, qf.MaxQueue, qf.Dimension)
	}
	return err.Error()
}

// The Redis store (client clock) and the memory store give the same outcome
// for every operation of every scenario: same delays, same refusals, same
// errors; keys with braces, spaces, backslashes and non-ASCII included.
//
// With batched, every reservation goes through the batch script
// (script.ReserveBatch) as a batch of one, as coalesced reservations do;
// TestRedisBatchesDecideAsOneCallEach covers batches of many.
func conformance(t *testing.T, client redis.UniversalClient, batched bool) {
	timeless(client)
	for i, sc := range scenarios() {
		memClock, redisClock := timer.NewFake(t0), timer.NewFake(t0)
		mem := NewMemoryStore(WithSweepInterval(0))
		prefix := fmt.Sprintf("conf%d-%v:", i, batched) // scenarios must not share keys on the one server
		ms, err := sc.make(mem, memClock, prefix)
		if err != nil {
			t.Fatal(err)
		}
		store := NewRedisStore(client, WithClientClock(), WithRedisTimeout(5*time.Second))
		store.lanes.batched = batched
		rs, err := sc.make(store, redisClock, prefix)
		if err != nil {
			t.Fatal(err)
		}
		want := runScenario(t, ms, memClock, uint64(i), nil)
		got := runScenario(t, rs, redisClock, uint64(i), nil)
		sameTranscript(t, sc.name, "memory", want, got)
	}
}

// nodeAndCluster starts a Redis node and a 3-master cluster for a test on
// a simulated clock, and returns a timeless client of each.
func nodeAndCluster(t *testing.T) (single, cluster redis.UniversalClient) {
	t.Helper()
	_, node := redisClient(t)
	return timeless(node), timeless(redistest.StartCluster(t).Client(t))
}

// timeless makes every script call on client drop, in the same MULTI,
// the TTL of each key it names and of those keys' Ledger keys. Tests on a
// simulated clock need it: the store sets TTLs in simulated milliseconds
// (a pause of 3 ms, a window 1 ms from its end), and Redis expires keys on
// its own clock, so on a loaded machine a key could expire in real time
// before the next operation at the same simulated instant reads it, while
// the memory store keeps it, and the two would differ for a reason that
// is not the math. Persisting in a later call leaves that window open; in
// the same transaction there is none. TestRedisKeysExpireWhenIdle covers
// the TTLs themselves.
func timeless(client redis.UniversalClient) redis.UniversalClient {
	client.AddHook(timelessHook{client})
	return client
}

type timelessHook struct{ c redis.UniversalClient }

func (timelessHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (timelessHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h timelessHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if name := cmd.Name(); (name != "evalsha" && name != "eval") || len(args) < 3 {
			return next(ctx, cmd)
		}
		n, _ := args[2].(int)
		_, _ = h.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			_ = p.Process(ctx, cmd)
			for _, k := range args[3 : 3+n] {
				key := fmt.Sprint(k)
				p.Persist(ctx, key)
				if !strings.Contains(key, "{") { // a contract record: no TTL, no derived keys, no hash tag
					continue
				}
				for _, suffix := range derivedSuffixes {
					p.Persist(ctx, key+suffix)
				}
			}
			return nil
		})
		return cmd.Err()
	}
}

func TestRedisStoreMatchesMemoryStore(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	conformance(t, c, false)
	conformance(t, c, true)
}

func TestRedisClusterMatchesMemoryStore(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	c := cl.Client(t)
	conformance(t, c, false)
	conformance(t, c, true)
}

// Keys never choose their slot: braces in keys and prefixes are escaped, so a
// key's own text decides nothing, and a multi-dimension reservation's keys
// share the slot of its first dimension's key.
func TestRedisKeysAreEscaped(t *testing.T) {
	t.Parallel()
	d := &dim{base: "tk:{evil}:", name: "tokens"}
	keys := redisKeys(keyset{dims: []*dim{{base: "tk:{evil}:"}, d}, keys: []string{"{slot}x", "y}"}, slot: "{slot}x"})
	for _, k := range keys {
		open := strings.Index(k, "{")
		closing := strings.Index(k[open+1:], "}")
		if tag := k[open+1 : open+1+closing]; tag != `\(slot\)x` {
			t.Fatalf("key %q hashes on %q, want the escaped first key", k, tag)
		}
	}
	if escape(`a\(`) == escape(`a{`) {
		t.Fatal("escaping is not one to one")
	}
}

// collidingKeys are keys built to collide under a careless encoding: the
// pause suffix, the separators, braces that would choose a slot, escapes,
// and the empty key (an empty hash tag is ignored by Redis Cluster).
var collidingKeys = []string{"x", "x:p", `x\;p`, ":p", "p", "", "{", "}", "{x}", `\(x\)`, "a:b", `a\:b`, "x\\"}

// edgeRun drives s through edge inputs and returns the transcript: every
// cost from 1 to the largest admissible + 2 (or its neighbourhood when that
// is large), first on a cold key, then on the same key again (now at or
// past its MaxQueue boundary), then with Allow; and one reservation on each
// of the colliding keys, which must all behave as distinct cold keys.
func edgeRun(s *Shaper, clock interface{ Advance(time.Duration) }) []string {
	maxCost := int64(1 << 53)
	for _, d := range s.cur.Load().dims {
		if d.cost == nil {
			maxCost = min(maxCost, algorithms.MaxCost(d.alg))
		}
	}
	var costs []int64
	for c := int64(1); c <= min(maxCost+2, 24); c++ {
		costs = append(costs, c)
	}
	for c := max(maxCost-2, 25); c <= maxCost+2; c++ {
		costs = append(costs, c)
	}
	var out []string
	for _, c := range costs {
		key := fmt.Sprintf("cost%d", c)
		for try := range 2 {
			r, err := s.Reserve(bg, key, c)
			out = append(out, fmt.Sprintf("reserve %s #%d (max %d): %v %v", key, try, maxCost, r.Delay, errText(err)))
		}
		ok, err := s.Allow(bg, "allow"+key, c)
		out = append(out, fmt.Sprintf("allow %d: %v %v", c, ok, errText(err)))
		clock.Advance(7 * time.Millisecond)
	}
	for _, key := range collidingKeys {
		r, err := s.Reserve(bg, key, 1)
		out = append(out, fmt.Sprintf("reserve %q: %v %v", key, r.Delay, errText(err)))
	}
	return out
}

// The memory store, a single node and the cluster give the same outcome for
// edge inputs: costs at and past every algorithm's admissibility boundary,
// keys at the MaxQueue boundary, and keys built to collide.
func TestEdgeInputsAreTheSameOnEveryStore(t *testing.T) {
	t.Parallel()
	single, cluster := nodeAndCluster(t)
	for i, sc := range scenarios() {
		prefix := fmt.Sprintf("edge%d:", i)
		memClock := timer.NewFake(t0)
		ms, err := sc.make(NewMemoryStore(WithSweepInterval(0)), memClock, prefix)
		if err != nil {
			t.Fatal(err)
		}
		want := edgeRun(ms, memClock)
		for _, client := range []redis.UniversalClient{single, cluster} {
			clock := timer.NewFake(t0)
			rs, err := sc.make(NewRedisStore(client, WithClientClock(), WithRedisTimeout(slowMachine)), clock, prefix)
			if err != nil {
				t.Fatal(err)
			}
			got := edgeRun(rs, clock)
			sameTranscript(t, fmt.Sprintf("%s on %T", sc.name, client), "memory", want, got)
		}
	}
}

// timeless does what the tests on a simulated clock rely on: every key a
// script wrote, its Ledger's included, has no TTL once the call returns.
func TestTimelessClientsKeepEveryKeyTheScriptsWrite(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	timeless(c)
	clock := timer.NewFake(t0)
	s, err := New(NewRedisStore(c, WithClientClock(), WithRedisTimeout(slowMachine)), PerSecond(10).WithBurst(3), WithClock(clock), WithPrefix("tl:"))
	if err != nil {
		t.Fatal(err)
	}
	r := mustReserve(t, s, "k", 2)
	if err := r.Settle(bg, 1); err != nil { // writes the key's Ledger
		t.Fatal(err)
	}
	if err := s.Pause(bg, "k", time.Second); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(bg, "tl:*").Result()
	if err != nil || len(keys) < 3 {
		t.Fatalf("keys %v (%v): want the state, its Ledger and the pause", keys, err)
	}
	for _, k := range keys {
		if ttl := c.PTTL(bg, k).Val(); ttl != -1*time.Nanosecond && ttl != -1*time.Millisecond {
			t.Fatalf("%s keeps a TTL of %v", k, ttl)
		}
	}
}
