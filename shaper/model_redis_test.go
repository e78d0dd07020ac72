package shaper_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
)

// ---- where the state lives ----

// modelWorld is a store kind, with the Redis servers it runs on.
//
// Key expiry on Redis lives on the simulated clock. Every script the
// stores send runs in a form whose every TTL write is absolute and far
// away: the hook (simHook) runs, in place of the library's script, the
// same text with redis.call and redis.pcall wrapped so that `SET ... PX n`
// becomes `PXAT BIG+n` and `PEXPIRE k n` becomes `PEXPIREAT k BIG+n`
// (exactly n, whatever the server's clock or its load), and in the same
// MULTI a conversion script rewrites each such expiry to
// `SIMBASE + ceil(now + n)`, now being the simulated instant of the call
// (the clock does not move while a call is in flight). Redis never expires
// a key in real time (SIMBASE lies centuries ahead); whenever the clock
// moves past the soonest simulated expiry, expireScript deletes the keys
// whose simulated expiry has passed, before anything acts at the new
// instant: a key expires when the library asked, on the simulated clock,
// never under a call in flight, and the same in every run of a seed.
type modelWorld struct {
	kind    string // memory, node, node-nocoalesce, cluster
	node    *redis.Client
	cluster *redis.ClusterClient
	stores  redis.UniversalClient // what the shapers' stores use (hooked)
	hook    *simHook

	// A cluster's bus markers (flushBus): one subscription on each master,
	// and the last marker published.
	markMu   sync.Mutex
	markSubs []*redis.PubSub
	markSeq  int
}

// markerChannel carries the model's bus markers (flushBus), on no channel
// of the library.
const markerChannel = "throttlekit-model-bus-marker"

// flushBus returns once every release notice published on a cluster's
// master before it was called has reached every master's subscribers. A
// notice published on one master reaches the subscribers of another over
// the cluster bus, whose links may hold it back tens of milliseconds
// (Nagle's algorithm on a link with an unacknowledged message) while the
// PINGs on the clients' connections answer at once; a notice still on the
// bus is invisible to the quiescence test, so the simulated clock could
// run past a waiter's re-ask while its notice travels. Each master
// publishes a marker after the notices it owed; a link delivers in order,
// so when every master's subscriber has every marker, every notice ahead
// of them was written to its subscribers (the PINGs that follow flush
// what a node wrote after the marker).
func (w *modelWorld) flushBus(ctx context.Context) error {
	w.markMu.Lock()
	defer w.markMu.Unlock()
	if w.markSubs == nil {
		var mu sync.Mutex
		err := w.masters(ctx, func(ctx context.Context, c *redis.Client) error {
			ps := c.Subscribe(ctx, markerChannel)
			if _, err := ps.ReceiveTimeout(ctx, 10*time.Second); err != nil {
				_ = ps.Close()
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			w.markSubs = append(w.markSubs, ps)
			return nil
		})
		if err != nil {
			w.closeMarkers()
			return fmt.Errorf("subscribing to the bus markers: %w", err)
		}
	}
	first := w.markSeq + 1
	var mu sync.Mutex
	err := w.masters(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		w.markSeq++
		n := w.markSeq
		mu.Unlock()
		return c.Publish(ctx, markerChannel, strconv.Itoa(n)).Err()
	})
	if err != nil {
		return fmt.Errorf("publishing a bus marker: %w", err)
	}
	for _, ps := range w.markSubs {
		for got := 0; got < w.markSeq-first+1; {
			m, err := ps.ReceiveTimeout(ctx, 10*time.Second)
			if err != nil {
				return fmt.Errorf("waiting for a bus marker: %w", err)
			}
			if msg, ok := m.(*redis.Message); ok {
				if n, _ := strconv.Atoi(msg.Payload); n >= first {
					got++
				}
			}
		}
	}
	return nil
}

func (w *modelWorld) closeMarkers() {
	for _, ps := range w.markSubs {
		_ = ps.Close()
	}
	w.markSubs = nil
}

// The far expiries of the key-expiry model, in Unix ms: BIG (2096) holds a
// TTL n the library wrote as BIG+n, SIMBASE (2128) a simulated expiry e as
// SIMBASE+e. Both lie past any real now and below each other's range.
const (
	bigTTL  = 4e12
	simBase = 5e12
)

func (w *modelWorld) redis() bool { return w.kind != "memory" }

func (w *modelWorld) client() redis.UniversalClient {
	if w.cluster != nil {
		return w.cluster
	}
	return w.node
}

func (w *modelWorld) masters(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
	if w.cluster != nil {
		return w.cluster.ForEachMaster(ctx, fn)
	}
	return fn(ctx, w.node)
}

func (w *modelWorld) flush() error {
	return w.masters(context.Background(), func(ctx context.Context, c *redis.Client) error {
		return c.FlushAll(ctx).Err()
	})
}

// quiet returns the quiescence test of a run on w (model_clock_test.go);
// pubsub says whether the stores subscribe (permits: their release
// notices come on a connection no command hook sees).
func (w *modelWorld) quiet(pubsub bool) *quiet {
	q := newQuiet()
	if !w.redis() {
		return q
	}
	q.active, q.started = &w.hook.active, &w.hook.started
	if pubsub {
		// Redis answers a PING after it wrote what it owed every client
		// when it read it (a release notice, a subscription's
		// confirmation); the second PING after it wrote what it owed when
		// it answered the first. On a cluster a notice crosses the cluster
		// bus from the node that published it to the one the subscriber
		// reads: four rounds, one master after another, ping the publisher
		// twice and then the subscriber's node twice, whichever they are.
		var masters []*redis.Client
		var mu sync.Mutex
		_ = w.masters(context.Background(), func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			masters = append(masters, c)
			return nil
		})
		slices.SortFunc(masters, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
		rounds := 2
		if w.cluster != nil {
			rounds = 4
		}
		q.ping = func() error {
			ctx := context.Background()
			if w.cluster != nil && w.hook.published.Swap(false) {
				if err := w.flushBus(ctx); err != nil {
					return err
				}
			}
			for range rounds {
				for _, c := range masters {
					if err := c.Ping(ctx).Err(); err != nil {
						return err
					}
				}
			}
			return nil
		}
	}
	return q
}

// startWorld starts the servers of kind, stopped when t ends.
func startWorld(t testing.TB, kind string) *modelWorld {
	t.Helper()
	w := &modelWorld{kind: kind}
	// No retries: a script retried after a lost reply would run twice.
	switch kind {
	case "memory":
		return w
	case "node", "node-nocoalesce":
		srv := redistest.Start(t)
		opts := func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 }
		w.node = srv.Client(opts)
		c := srv.Client(opts)
		t.Cleanup(func() { _ = c.Close() })
		w.stores = c
	case "cluster":
		cl := redistest.StartCluster(t)
		mk := func() *redis.ClusterClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		w.cluster = mk()
		w.stores = mk()
	}
	w.hook = &simHook{w: w, c: w.stores}
	t.Cleanup(func() {
		w.markMu.Lock()
		defer w.markMu.Unlock()
		w.closeMarkers()
	})
	w.hook.soonest.Store(math.Float64bits(math.Inf(1)))
	w.stores.AddHook(w.hook)
	// The library's scripts must never run unwrapped: none is cached.
	if err := w.masters(context.Background(), func(ctx context.Context, c *redis.Client) error {
		return c.ScriptFlush(ctx).Err()
	}); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	return w
}

// simHook is the stores' client hook: it counts the commands in flight
// (the clock's quiescence test) and runs every script of the library in
// its wrapped form, followed in one MULTI by convertScript (see
// modelWorld).
type simHook struct {
	w       *modelWorld
	c       redis.UniversalClient
	clock   atomic.Pointer[simClock] // the current run's
	active  atomic.Int64
	started atomic.Int64
	soonest atomic.Uint64 // float64 bits: the soonest simulated expiry (ms) of any key, or less
	scripts sync.Map      // sha of a library script -> sha of its wrapped form
	// publishers are the library's scripts that PUBLISH (their shas);
	// published says one ran since the last quiescence test (flushBus).
	publishers sync.Map
	published  atomic.Bool
	loadMu     sync.Mutex
	err        atomic.Value // a string: the last failure of the model itself
}

func (*simHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *simHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.active.Add(1)
		h.started.Add(1)
		defer h.active.Add(-1)
		return next(ctx, cmds)
	}
}

func (h *simHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.active.Add(1)
		h.started.Add(1)
		defer h.active.Add(-1)
		args := cmd.Args()
		name := cmd.Name()
		if (name != "evalsha" && name != "eval") || len(args) < 4 {
			return next(ctx, cmd)
		}
		if n, _ := args[2].(int); n < 1 {
			return next(ctx, cmd)
		}
		switch name {
		case "eval":
			src, _ := args[1].(string)
			if strings.Contains(src, "'PUBLISH'") {
				h.publishers.Store(sha1Hex(src), true)
				h.published.Store(true)
			}
			wsha, err := h.wrapped(ctx, src)
			if err != nil {
				h.err.Store(fmt.Sprintf("loading a wrapped script: %v", err))
				return next(ctx, cmd)
			}
			args[0], args[1] = "evalsha", wsha
		case "evalsha":
			sha, _ := args[1].(string)
			if _, ok := h.publishers.Load(sha); ok {
				h.published.Store(true)
			}
			wsha, ok := h.scripts.Load(sha)
			if !ok {
				return next(ctx, cmd) // NOSCRIPT: the library sends its text (eval)
			}
			args[1] = wsha
		}
		now := algorithms.Millis(h.clock.Load().Now())
		var conv *redis.Cmd
		_, _ = h.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			_ = p.Process(ctx, cmd)
			conv = p.Eval(ctx, convertScript, []string{fmt.Sprint(args[3])}, strconv.FormatFloat(now, 'f', -1, 64), bigTTL, simBase)
			return nil
		})
		if err := conv.Err(); err != nil {
			if cmd.Err() == nil {
				h.err.Store(fmt.Sprintf("converting the TTLs of %v: %v", args[3], err))
			}
		} else if s, err := conv.Text(); err == nil {
			if e, err := strconv.ParseFloat(s, 64); err == nil && e >= 0 {
				h.lower(e)
			}
		}
		return cmd.Err()
	}
}

// lower makes e the soonest expiry if it is sooner.
func (h *simHook) lower(e float64) {
	for {
		old := h.soonest.Load()
		if math.Float64frombits(old) <= e || h.soonest.CompareAndSwap(old, math.Float64bits(e)) {
			return
		}
	}
}

// wrapped returns the sha of src's wrapped form, loaded on every master.
func (h *simHook) wrapped(ctx context.Context, src string) (string, error) {
	sha := sha1Hex(src)
	if w, ok := h.scripts.Load(sha); ok {
		return w.(string), nil
	}
	h.loadMu.Lock()
	defer h.loadMu.Unlock()
	if w, ok := h.scripts.Load(sha); ok {
		return w.(string), nil
	}
	text := wrapScript(src)
	err := h.w.masters(context.WithoutCancel(ctx), func(ctx context.Context, c *redis.Client) error {
		return c.ScriptLoad(ctx, text).Err()
	})
	if err != nil {
		return "", err
	}
	wsha := sha1Hex(text)
	h.scripts.Store(sha, wsha)
	return wsha, nil
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// wrapScript returns src with its TTL writes made absolute at BIG: the
// same commands otherwise, in the same order, with the same replies.
func wrapScript(src string) string {
	body := strings.ReplaceAll(src, "redis.call(", "__tk_call(")
	body = strings.ReplaceAll(body, "redis.pcall(", "__tk_pcall(")
	return wrapPrologue + "local function __tk_body()\n" + body + "\nend\nreturn __tk_body()\n"
}

const wrapPrologue = `
local __tk_rc, __tk_rp, __tk_big = redis.call, redis.pcall, 4e12
local function __tk_fix(cmd, a)
  local u = string.upper(cmd)
  if u == 'SET' then
    for i = 3, #a - 1 do
      if string.upper(tostring(a[i])) == 'PX' then
        local n = tonumber(a[i + 1])
        if n and n > 0 then a[i] = 'PXAT'; a[i + 1] = string.format('%.0f', __tk_big + n) end
        break
      end
    end
  elseif u == 'PEXPIRE' and #a == 2 then
    local n = tonumber(a[2])
    if n and n > 0 then cmd = 'PEXPIREAT'; a[2] = string.format('%.0f', __tk_big + n) end
  end
  return cmd, a
end
local function __tk_call(cmd, ...)
  local u = string.upper(cmd)
  if u ~= 'SET' and u ~= 'PEXPIRE' then return __tk_rc(cmd, ...) end
  local c, a = __tk_fix(cmd, {...})
  return __tk_rc(c, unpack(a))
end
local function __tk_pcall(cmd, ...)
  local u = string.upper(cmd)
  if u ~= 'SET' and u ~= 'PEXPIRE' then return __tk_rp(cmd, ...) end
  local c, a = __tk_fix(cmd, {...})
  return __tk_rp(c, unpack(a))
end
`

// convertScript turns every expiry at BIG+n on this node into the
// simulated expiry ceil(now+n), kept at SIMBASE+e, and returns the soonest
// it set (-1: none). ARGV: now (ms), BIG, SIMBASE. KEYS[1] only routes it.
var convertScript = `
local now, big, base = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local soonest = -1
for _, k in ipairs(redis.call('KEYS', '*')) do
  local at = redis.call('PEXPIRETIME', k)
  if at >= big and at < base then
    local e = math.ceil(now + (at - big))
    redis.call('PEXPIREAT', k, string.format('%.0f', base + e))
    if soonest < 0 or e < soonest then soonest = e end
  end
end
return string.format('%.0f', soonest)`

// expireScript deletes the keys of this node whose simulated expiry lies
// before ARGV[1] (ms; Redis expires a key once its time is past), and
// returns the soonest simulated expiry left (-1: none). ARGV[2]: SIMBASE.
var expireScript = redis.NewScript(`
local now, base = tonumber(ARGV[1]), tonumber(ARGV[2])
local soonest = -1
for _, k in ipairs(redis.call('KEYS', '*')) do
  local at = redis.call('PEXPIRETIME', k)
  if at >= base then
    local e = at - base
    if e < now then redis.call('DEL', k) elseif soonest < 0 or e < soonest then soonest = e end
  end
end
return string.format('%.0f', soonest)`)

// expire runs the key-expiry model at t: when a key's simulated expiry may
// have passed, expireScript on every master.
func (w *modelWorld) expire(t time.Time) error {
	h := w.hook
	now := algorithms.Millis(t)
	if math.Float64frombits(h.soonest.Load()) >= now {
		return nil
	}
	h.soonest.Store(math.Float64bits(math.Inf(1)))
	var mu sync.Mutex
	return w.masters(context.Background(), func(ctx context.Context, c *redis.Client) error {
		s, err := expireScript.Run(ctx, c, nil, strconv.FormatFloat(now, 'f', -1, 64), simBase).Text()
		if err != nil {
			return err
		}
		if e, err := strconv.ParseFloat(s, 64); err == nil && e >= 0 {
			mu.Lock()
			h.lower(e)
			mu.Unlock()
		}
		return nil
	})
}

// simExpiry reads a key's simulated expiry (for the debug dump): ms on the
// clock, -1 for none.
func simExpiry(ctx context.Context, c redis.Cmdable, key string) float64 {
	at, err := c.PExpireTime(ctx, key).Result()
	if err != nil || at < 0 {
		return -1
	}
	ms := float64(at / time.Millisecond)
	if ms >= simBase {
		return ms - simBase
	}
	return ms
}
