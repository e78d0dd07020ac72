package redisstore

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"maps"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// spy is the tests' hold on a Store: a decorator around the backend it
// runs on (the Redis backend, or the failover around it) that can hold
// the lanes, so that reservations queue and go as one batch (hold,
// release), send every coalesced reservation as a batch of its own
// (batched), and record what the store granted a reservation (withGrant).
// spyOn installs it; the store's production code knows nothing of it.
type spy struct {
	store.Backend // the store's own
	r             *backend

	// batched sends even a lone reservation through the batch script, as a
	// batch of one (see batchOfOne); under FailClosed only.
	batched bool

	mu      sync.Mutex
	holding bool
	held    map[*lane]int   // a held lane -> the places for calls it holds
	callers map[string]bool // the goroutines that reserved while it held
}

// spyOn installs a spy on s, before any shaper is bound to it.
func spyOn(s *Store) *spy {
	sp := &spy{Backend: store.Of(s), r: s.r, held: map[*lane]int{}, callers: map[string]bool{}}
	s.handle = store.NewHandle(sp)
	return sp
}

// newSpied returns a store on client and its spy.
func newSpied(client redis.UniversalClient, opts ...Option) (*Store, *spy) {
	s := New(client, opts...)
	return s, spyOn(s)
}

// Reserve holds the reservation's lane while the spy holds (see hold),
// sends it as a batch of one when batched, and records its grant.
func (sp *spy) Reserve(ctx context.Context, req *store.Request) error {
	if sp.r.lanes != nil {
		sp.mu.Lock()
		if sp.holding {
			sp.holdLane(sp.r.lanes.Of(escapeTag(req.Slot)))
			sp.callers[goid()] = true
		}
		sp.mu.Unlock()
	}
	var err error
	if sp.batched {
		err = sp.reserveBatched(ctx, req)
	} else {
		err = sp.Backend.Reserve(ctx, req)
	}
	if g, ok := ctx.Value(grantKey{}).(*grant); ok && err == nil {
		g.local = req.Local
		if len(req.Tags) > 0 {
			g.tag = req.Tags[0]
		}
	}
	return err
}

// hold makes every lane queue the reservations that reach it as if its
// calls in flight were at their limit, until release.
func (sp *spy) hold() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.holding, sp.callers = true, map[string]bool{}
}

// holdLane fills ln's places for calls in flight, once (sp.mu held): the
// reservations that reach it queue.
func (sp *spy) holdLane(ln *lane) {
	if _, ok := sp.held[ln]; ok {
		return
	}
	k := 0
	for ln.TryEnter() {
		k++
	}
	sp.held[ln] = k
}

// release ends hold: each held lane sends what queued meanwhile, as the
// end of its calls in flight would.
func (sp *spy) release() {
	sp.mu.Lock()
	held := sp.held
	sp.holding, sp.held = false, map[*lane]int{}
	sp.mu.Unlock()
	for ln, k := range held {
		for range k {
			if batch := ln.Done(); batch != nil {
				sp.r.flush(ln, batch) // here, not on a goroutine: once release returns, the queue is sent
			}
		}
	}
}

// queued is how many of the reservations made while the spy held wait in
// a queue: their goroutines await their batch.
func (sp *spy) queued() int {
	sp.mu.Lock()
	ids := maps.Clone(sp.callers)
	sp.mu.Unlock()
	count := 0
	for _, g := range stacks() {
		id, _, _ := bytes.Cut(bytes.TrimPrefix(g, []byte("goroutine ")), []byte(" "))
		if ids[string(id)] && bytes.Contains(g, []byte("redisstore.(*backend).await(")) {
			count++
		}
	}
	return count
}

// goid returns the calling goroutine's id, as its stack names it.
func goid() string {
	var buf [64]byte
	g := bytes.TrimPrefix(buf[:runtime.Stack(buf[:], false)], []byte("goroutine "))
	id, _, _ := bytes.Cut(g, []byte(" "))
	return string(id)
}

// settled waits until no call of any store of the process is in flight,
// queued or sending, and every give-back of a grant nobody waited for has
// ended.
func (sp *spy) settled() {
	// A goroutine not yet started shows only the function that made it
	// (coalesce's gowrap for a flush), and a give-back is deliver's closure.
	for goroutinesIn("redisstore.(*backend).coalesce", "redisstore.(*backend).flush(", "redisstore.(*backend).deliver") > 0 {
		time.Sleep(100 * time.Microsecond)
	}
}

// goroutinesIn counts the goroutines whose stack holds any of frames.
func goroutinesIn(frames ...string) int {
	count := 0
	for _, g := range stacks() {
		for _, f := range frames {
			if bytes.Contains(g, []byte(f)) {
				count++
				break
			}
		}
	}
	return count
}

// stacks returns every goroutine's stack.
func stacks() [][]byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Split(buf[:n], []byte("\n\n"))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// reserveBatched is the backend's Reserve, except that a reservation that
// would go alone, at once, goes as a batch of one (batchOfOne).
func (sp *spy) reserveBatched(ctx context.Context, req *store.Request) error {
	r := sp.r
	if sp.Backend != store.Backend(r) {
		panic("spy: batched applies to a store under FailClosed")
	}
	return r.do(ctx, "reserve", req.KeySet, req, func(ctx context.Context, probe bool) error {
		if r.lanes == nil || probe || req.Floor != 0 {
			return r.reserveRedis(ctx, probe, req)
		}
		return r.batchOfOne(ctx, req)
	})
}

// batchOfOne is coalesce, except that a reservation that finds its lane
// free goes through the batch script (script.ReserveBatch) as a batch of
// its own, as coalesced reservations do.
func (r *backend) batchOfOne(ctx context.Context, req *store.Request) error {
	ln := r.lanes.Of(escapeTag(req.Slot))
	if !ln.TryEnter() {
		return r.coalesce(ctx, req)
	}
	w := &waiter{req: req, replies: r.health.Replies(), clientClock: r.clientClock}
	r.prepare(&w.call, req)
	queued(w) // restamp reads its inputs: sent at once, it finds the instant the caller's
	r.flush(ln, []*waiter{w})
	return r.outcome(w)
}

// grant is what the store granted one reservation: the first number of
// its key's new state (the TAT of the GCRA family), and whether a failure
// policy granted it.
type grant struct {
	tag   float64
	local bool
}

type grantKey struct{}

// withGrant returns ctx, on which a spy records the grant of a reservation
// in g.
func withGrant(ctx context.Context, g *grant) context.Context {
	return context.WithValue(ctx, grantKey{}, g)
}

// reserveGrant is mustReserve on a spied store, returning the grant too.
func reserveGrant(t *testing.T, s *shaper.Shaper, key string, cost int64) (shaper.Reservation, grant) {
	t.Helper()
	var g grant
	r, err := s.Reserve(withGrant(bg, &g), key, cost)
	if err != nil {
		t.Fatalf("Reserve(%q, %d): %v", key, cost, err)
	}
	return r, g
}

// slotOf returns the slot the store granted r (a reservation of cost 1 at
// burst 1, on a shaper whose interval is interval ms): the TAT it stored,
// g.tag, less one interval, in ms on the store's clock; and how far r's
// departure instant lies before that slot.
func slotOf(r shaper.Reservation, g grant, interval float64) (float64, time.Duration) {
	slot := g.tag - interval
	return slot, algorithms.Time(slot).Sub(r.Time())
}

// batchHook records the largest batch a client sent: the most
// reservations one call of the batch script decided.
type batchHook struct{ largest atomic.Int64 }

// isBatch reports whether cmd runs the batch script (EVALSHA, or EVAL
// after a SCRIPT FLUSH).
func isBatch(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	switch cmd.Name() {
	case "evalsha":
		return args[1] == script.ReserveBatch.Hash()
	case "eval":
		src, _ := args[1].(string)
		sum := sha1.Sum([]byte(src))
		return hex.EncodeToString(sum[:]) == script.ReserveBatch.Hash()
	}
	return false
}

// watchBatches adds a batchHook to client.
func watchBatches(client redis.UniversalClient) *batchHook {
	h := &batchHook{}
	client.AddHook(h)
	return h
}

func (*batchHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook sees the calls a timeless client (see timeless) sends
// in a transaction.
func (h *batchHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.see(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *batchHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.see(cmd)
		return next(ctx, cmd)
	}
}

// see records cmd's batch size, if it runs the batch script: its ARGV
// starts with how many reservations it decides.
func (h *batchHook) see(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 4 || !isBatch(cmd) {
		return
	}
	if keys, ok := args[2].(int); ok && len(args) > 3+keys {
		if n, ok := args[3+keys].(int); ok && int64(n) > h.largest.Load() {
			h.largest.Store(int64(n)) // sequential tests: a lost race loses nothing
		}
	}
}
