package shaper

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// The Redis helpers every store's tests share (internal/redistest).
const slowMachine = redistest.SlowMachine

var (
	redisClient    = redistest.DeadlineClient
	nodeAndCluster = redistest.NodeAndCluster
	timeless       = redistest.Timeless
)

// The Redis side of this package's tests: servers, the key layout as
// docs/REDIS.md documents it (the store's own code is in package
// redisstore, out of reach), and client hooks that make a run on a
// simulated clock comparable with memory, hold a store's script calls, or
// send each reservation through the batch script.

// The key layout (docs/REDIS.md, "Keys"): E escapes "\", "{" and "}"; T is
// E with the empty key written `\e`; P escapes ":" as well.
func keyE(s string) string {
	return strings.NewReplacer(`\`, `\\`, `{`, `\(`, `}`, `\)`).Replace(s)
}

func keyT(s string) string {
	if s == "" {
		return `\e`
	}
	return keyE(s)
}

func keyP(s string) string {
	return strings.NewReplacer(`\`, `\\`, `{`, `\(`, `}`, `\)`, `:`, `\;`).Replace(s)
}

// redisKeysOf returns, per dimension of ks, its Redis state key and pause
// key, as docs/REDIS.md lays them out.
func redisKeysOf(ks store.KeySet) []string {
	out := make([]string, 0, 2*len(ks.Dims))
	for i, d := range ks.Dims {
		var sk string
		if d.Name != "" {
			sk = keyE(d.Base) + "{" + keyT(ks.Slot) + "}" + keyP(d.Name) + ":" + keyP(ks.Keys[i])
		} else {
			sk = keyE(d.Base) + "{" + keyT(ks.Slot) + "}"
		}
		out = append(out, sk, sk+":p")
	}
	return out
}

// derivedSuffixes are the suffixes of the keys the scripts derive from a
// state key (docs/REDIS.md): its Ledger's and a partner's clamp.
var derivedSuffixes = [...]string{":l", ":h", ":b", ":c", ":k"}

// contractKey is the Redis key of prefix's live contract (docs/REDIS.md).
func contractKey(prefix string) string { return keyE(prefix) + "contract" }

// stateKey returns the Redis state key of key for s's first dimension.
func stateKey(s *Shaper, key string) string {
	d := s.cur.Load().dims[0]
	return redisKeysOf(store.KeySet{Dims: []*store.Dim{&d.Dim}, Keys: []string{key}, Slot: key})[0]
}

// isScript reports whether cmd runs sc (EVALSHA, or EVAL after NOSCRIPT).
func isScript(cmd redis.Cmder, sc *redis.Script) bool {
	args := cmd.Args()
	if len(args) < 3 {
		return false
	}
	switch cmd.Name() {
	case "evalsha":
		return fmt.Sprint(args[1]) == sc.Hash()
	case "eval":
		h := sha1.Sum([]byte(fmt.Sprint(args[1])))
		return hex.EncodeToString(h[:]) == sc.Hash()
	}
	return false
}

// gate is a client hook that can hold every script call at the client
// (hold, open), so that a coalescing store's calls stay in flight and the
// reservations made meanwhile queue into one batch; it records the most
// reservations one batch call (script.ReserveBatch) carried. Add it before
// timeless: timeless sends script calls through a MULTI, which a hook added
// after it does not see.
type gate struct {
	mu      sync.Mutex
	open    chan struct{} // nil: calls pass
	held    int           // calls held now
	largest atomic.Int64
}

func newGate(client redis.UniversalClient) *gate {
	g := &gate{}
	client.AddHook(g)
	return g
}

func (*gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (*gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name != "evalsha" && name != "eval" {
			return next(ctx, cmd)
		}
		if isScript(cmd, script.ReserveBatch) {
			args := cmd.Args()
			nk, _ := args[2].(int)
			if len(args) > 3+nk {
				if n, err := strconv.ParseInt(fmt.Sprint(args[3+nk]), 10, 64); err == nil && n > g.largest.Load() {
					g.largest.Store(n)
				}
			}
		}
		g.mu.Lock()
		open := g.open
		if open != nil {
			g.held++
		}
		g.mu.Unlock()
		if open != nil {
			<-open
			g.mu.Lock()
			g.held--
			g.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// hold makes every script call wait at the client until release.
func (g *gate) hold() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

// release lets the held calls, and every later one, through.
func (g *gate) release() {
	g.mu.Lock()
	if g.open != nil {
		close(g.open)
		g.open = nil
	}
	g.mu.Unlock()
}

// holding is how many calls wait at the gate now.
func (g *gate) holding() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// goid returns the calling goroutine's id.
func goid() string {
	var buf [64]byte
	s := strings.TrimPrefix(string(buf[:runtime.Stack(buf[:], false)]), "goroutine ")
	return s[:strings.IndexByte(s, ' ')]
}

// queuedIn counts the goroutines of ids that wait in a Redis store's lane
// for a batch to decide their reservation (redisstore's await).
func queuedIn(ids map[string]bool) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
		if ids[id] && strings.Contains(g, "redisstore.(*backend).await(") {
			count++
		}
	}
	return count
}

// heldBatch makes reservations on a coalescing Redis store whose client
// has gate g, one goroutine each (run(i) makes reservation i), while g
// holds every script call: the first ones go as calls of their own and
// are held, keeping the lane at its limit of calls in flight; the next
// queue, in order, until queue of them wait together. Then g lets
// everything through: the held calls decide theirs alone, and the queued
// ones go as one call (script.ReserveBatch). It returns how many
// reservations it made (fewer than most).
func heldBatch(t *testing.T, g *gate, queue, most int, run func(i int)) int {
	t.Helper()
	var mu sync.Mutex
	ids := map[string]bool{}
	var finished atomic.Int32
	var wg sync.WaitGroup
	g.largest.Store(0) // this batch's
	g.hold()
	defer func() { g.release(); wg.Wait() }()
	alone := 0 // calls of their own, held at the gate
	for i := 0; ; i++ {
		if i == most {
			mu.Lock()
			q := queuedIn(ids)
			mu.Unlock()
			t.Fatalf("%d reservations made, %d held alone, %d queued: the lane never queued %d", i, alone, q, queue)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			ids[goid()] = true
			mu.Unlock()
			run(i)
			finished.Add(1)
		}()
		// Reservation i is either held at the gate (a call of its own),
		// queued in the lane, or done (refused before reaching the store).
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			q := queuedIn(ids)
			mu.Unlock()
			if h := g.holding(); h+q+int(finished.Load()) >= i+1 {
				alone = h
				if q >= queue {
					return i + 1 // the deferred release sends them
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("reservation %d never reached the store", i)
			}
			time.Sleep(50 * time.Microsecond) // a goroutine starting: how long does not matter
		}
	}
}

// batchOfOne is a client hook that sends every reservation script call
// (script.Reserve and script.ReserveGCRA) through the batch script, as a
// batch of one, as a coalescing store sends the reservations it queued,
// and answers the call with that reservation's reply: the server decides
// each as batched reservations are decided. While on is false calls pass
// unchanged. Add it before timeless.
type batchOfOne struct {
	c    redis.UniversalClient
	on   atomic.Bool
	sent atomic.Int64 // reservations sent through the batch script
}

func newBatchOfOne(client redis.UniversalClient) *batchOfOne {
	b := &batchOfOne{c: client}
	client.AddHook(b)
	return b
}

func (*batchOfOne) DialHook(next redis.DialHook) redis.DialHook { return next }

func (*batchOfOne) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (b *batchOfOne) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !b.on.Load() {
			return next(ctx, cmd)
		}
		gcraCall := isScript(cmd, script.ReserveGCRA)
		if !gcraCall && !isScript(cmd, script.Reserve) {
			return next(ctx, cmd)
		}
		c, ok := cmd.(*redis.Cmd)
		if !ok {
			return next(ctx, cmd)
		}
		args := cmd.Args()
		nk, _ := args[2].(int)
		keys := make([]string, nk)
		for i, k := range args[3 : 3+nk] {
			keys[i] = fmt.Sprint(k)
		}
		var batch script.Batch
		batch.Add(gcraCall, keys, args[3+nk:])
		b.sent.Add(1)
		v, err := script.ReserveBatch.Run(ctx, b.c, batch.Keys, batch.Argv()...).Result()
		if err == nil {
			var items []any
			if items, _, err = script.SplitBatch(v, 1); err == nil {
				if e, isErr := items[0].(error); isErr {
					err = e
				} else {
					c.SetVal(items[0])
				}
			}
		}
		if err != nil {
			c.SetErr(err)
		}
		return err
	}
}

// errText renders an outcome for a transcript.
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

// runScenarioKeys drives one shaper through a seeded sequence of
// operations over the given keys and returns the transcript of every
// outcome; after, if not nil, runs after every operation. With probe,
// every reservation is preceded by a Status of its key and cost, whose
// figures join the transcript (as lines starting "status") and must
// predict the reservation (checkStatus); the other lines do not depend on
// probe.
func runScenarioKeys(t *testing.T, s *Shaper, clock *timer.Fake, seed uint64, oddKeys []string, after func(), probe bool) []string {
	t.Helper()
	watchClamps(s)
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
