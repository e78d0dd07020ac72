package shaper_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// The model test's time: one simulated clock, discrete-event, that every
// world reads (the shapers through WithClock; the Redis stores through
// WithClientClock, so every script decides on it; the Redis keys expire on
// it, see model_redis_test.go). No reading of it has a real-time
// component, so a seed replays the same instants on an idle machine and on
// one saturated by other test binaries.
//
//   - Time moves only when the runner moves it: an Advance op, or a
//     blocking call (Wait, Acquire, AwaitTurn, a permit's wait) that the
//     runner drives to completion.
//   - A timer fires only when the clock reaches its instant, one timer at a
//     time in (instant, arming order), and before the next one fires the
//     runner waits until the world is quiescent (settle): every goroutine
//     it woke has acted and blocked again (on a channel, a select, a timer
//     of this clock, a mutex its holder will release), and on Redis every
//     command sent has been answered and every byte on the loopback
//     sockets to the servers read. So a background loop (the fair
//     dispatcher's pauseDispatch, a permit waiter's re-ask, the learning
//     sync on its 250 ms cadence, a lease renewal, a live-contract refresh)
//     runs exactly when the time passes its timer, in the order a real
//     host would run it, and never runs time away: nothing warps forward
//     but the runner.
//   - A blocking call is driven by advancing to the earliest pending timer
//     (whosever it is: background timers fire as time passes them),
//     settling, and again, until the call returns; past a horizon of
//     simulated time its ctx is cancelled (a hang is a finding).
//
// Quiescence is read from the goroutines' states (runtime.Stack: none
// running, runnable or in a system call but the runner), and on Redis also
// from the store clients' commands in flight (a go-redis hook counts them).
// A store that subscribes (permits' release notices, on a connection no
// hook sees) adds: the bytes received and not yet read on this process's
// sockets (FIONREAD), and two PINGs to every master after an idle reading
// (Redis answers a PING after it wrote what it owed every client when it
// read it, a release notice included), then an idle reading again.
//
// testing/synctest would give the memory world the same discrete-event
// time with an exact quiescence test (synctest.Wait). It cannot host the
// Redis worlds: a goroutine blocked on a socket (go-redis's pub/sub reader
// for permit notices, any reply in flight) is not durably blocked, so the
// bubble's time would never advance while a store subscription is open.
// One clock for every world keeps a seed's memory and Redis runs on the same
// instants, and the stack reading is exact without network I/O (every
// goroutine blocked on a channel, a select or a mutex is a fixpoint: the
// memory world arms no real-time timer), so the memory world uses it too.
//
// What stays on real time, and why it cannot reach a verdict: the Redis
// store's per-call timeout (10 s here, never reached) and its health
// tracker (no failure is injected); the renewal of in-flight leases
// (redisstore renews every third of a lease on the real clock, and the
// model's leases last an hour, so no renewal happens within a run: every
// lease expires on the simulated clock at its take plus its lease, the
// documented exception of a holder that stopped renewing; if renewal moves
// onto the shaper's clock it runs here as any background timer does);
// and Wait's retry jitter of the algorithms that do not queue
// (math/rand), which moves a retry but no verdict. Goroutine scheduling
// decides the order of the calls of one concurrent burst, as it would in a
// real process; the oracle judges the set.

// modelEpoch is where every run's clock starts: a fixed instant, so that a
// seed's float64 milliseconds are the same in every run.
var modelEpoch = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// simClock is the discrete-event clock.
type simClock struct {
	mu     sync.Mutex
	start  time.Time
	now    time.Time
	seq    uint64
	timers []*simTimer // pending, unordered

	// settle waits until the world is quiescent; onMove runs whenever the
	// time moves to a new instant, before anything acts at it (the Redis
	// key expiry).
	settle func()
	onMove func(t time.Time)

	// While rec is set, the readings and timer targets of goroutine recG.
	rec    atomic.Bool
	recG   atomic.Int64
	events []clockEvent
}

func newSimClock(settle func()) *simClock {
	return &simClock{start: modelEpoch, now: modelEpoch, settle: settle, onMove: func(time.Time) {}}
}

var _ shaper.Clock = (*simClock)(nil)

// clockEvent is a reading handed out, or a timer armed (timer: at is its
// target, the reading plus its duration).
type clockEvent struct {
	at    time.Time
	timer bool
}

// Now returns the simulated time.
func (c *simClock) Now() time.Time {
	c.mu.Lock()
	t := c.now
	c.mu.Unlock()
	if c.rec.Load() && goid() == c.recG.Load() {
		c.mu.Lock()
		c.events = append(c.events, clockEvent{at: t})
		c.mu.Unlock()
	}
	return t
}

// NewTimer arms a timer that fires when the runner moves the clock to
// now + d; d <= 0 has fired already.
func (c *simClock) NewTimer(d time.Duration) shaper.Timer {
	t := &simTimer{c: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	t.at = c.now.Add(d)
	if d <= 0 {
		t.ch <- c.now
		c.mu.Unlock()
		return t
	}
	c.seq++
	t.seq = c.seq
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	if c.rec.Load() && goid() == c.recG.Load() {
		c.mu.Lock()
		c.events = append(c.events, clockEvent{at: t.at, timer: true})
		c.mu.Unlock()
	}
	return t
}

type simTimer struct {
	c   *simClock
	at  time.Time
	seq uint64
	ch  chan time.Time
}

func (t *simTimer) C() <-chan time.Time { return t.ch }

func (t *simTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.timers, t); i >= 0 {
		c.timers = slices.Delete(c.timers, i, i+1)
		return true
	}
	return false
}

// earliestLocked returns the pending timer that fires first.
func (c *simClock) earliestLocked() *simTimer {
	var best *simTimer
	for _, t := range c.timers {
		if best == nil || t.at.Before(best.at) || t.at.Equal(best.at) && t.seq < best.seq {
			best = t
		}
	}
	return best
}

// next returns the instant of the earliest pending timer.
func (c *simClock) next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.earliestLocked(); t != nil {
		return t.at, true
	}
	return time.Time{}, false
}

// Advance moves the clock forward by d (see advanceTo).
func (c *simClock) Advance(d time.Duration) {
	if d > 0 {
		c.mu.Lock()
		t := c.now.Add(d)
		c.mu.Unlock()
		c.advanceTo(t)
		return
	}
	c.settle()
}

// advanceTo moves the clock to t: it fires every timer due by then, one at
// a time in order, each at its own instant and after the world settled
// from the one before; then, if it fired any, it settles once more (moving
// the time alone wakes nobody: a key's expiry is a store call the runner
// makes). The runner alone calls it (never a goroutine the clock may wake).
func (c *simClock) advanceTo(t time.Time) {
	fired := false
	for {
		c.settle()
		c.mu.Lock()
		tm := c.earliestLocked()
		if tm == nil || tm.at.After(t) {
			c.mu.Unlock()
			break
		}
		c.timers = slices.DeleteFunc(c.timers, func(x *simTimer) bool { return x == tm })
		moved := tm.at.After(c.now)
		if moved {
			c.now = tm.at
		}
		c.mu.Unlock()
		if moved {
			c.onMove(tm.at)
		}
		tm.ch <- tm.at
		fired = true
	}
	c.mu.Lock()
	moved := t.After(c.now)
	if moved {
		c.now = t
	}
	c.mu.Unlock()
	if moved {
		c.onMove(t)
	}
	if fired {
		c.settle()
	}
}

// drive runs the world until done is closed, advancing the clock to each
// next timer in turn; it gives up (false) when the next timer lies past
// horizon, or there is none and done is still open.
func (c *simClock) drive(done <-chan struct{}, horizon time.Time) bool {
	for {
		c.settle()
		select {
		case <-done:
			return true
		default:
		}
		at, ok := c.next()
		if !ok || at.After(horizon) {
			return false
		}
		c.advanceTo(at)
	}
}

// record starts keeping the readings and timer targets of goroutine g.
func (c *simClock) record(g int64) {
	c.mu.Lock()
	c.events = nil
	c.mu.Unlock()
	c.recG.Store(g)
	c.rec.Store(true)
}

// stopRecording returns what was kept, in order.
func (c *simClock) stopRecording() []clockEvent {
	c.rec.Store(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	ev := c.events
	c.events = nil
	return ev
}

// goid returns the calling goroutine's id, from its stack header.
func goid() int64 {
	var b [64]byte
	n := runtime.Stack(b[:], false)
	s := strings.TrimPrefix(string(b[:n]), "goroutine ")
	if i := strings.IndexByte(s, ' '); i > 0 {
		id, _ := strconv.ParseInt(s[:i], 10, 64)
		return id
	}
	return -1
}

// ---- quiescence ----

// quiet tells when the world is quiescent (see the comment at the top).
type quiet struct {
	// Redis worlds: the stores' commands in flight and started (the hook
	// counts them), and a PING to each master.
	active  *atomic.Int64
	started *atomic.Int64
	ping    func() error

	stuck   atomic.Value // a string: why the last settle gave up
	buf     []byte
	samples [1]metrics.Sample
}

func newQuiet() *quiet {
	q := &quiet{}
	q.samples[0].Name = "/sched/goroutines/runnable:goroutines"
	return q
}

// settleLimit is how long, in real time, settle waits for the world to
// become quiescent before it reports the world stuck (a goroutine spinning,
// a Redis call that never returns). It only bounds a hang: under any load a
// world settles in milliseconds.
const settleLimit = 60 * time.Second

func (q *quiet) settle() {
	me := goid()
	deadline := time.Now().Add(settleLimit)
	pings := 0
	for spins := 0; ; spins++ {
		why := q.busy(me)
		if why == "" {
			if q.ping == nil || pings == 1 {
				return
			}
			// Flush what the servers owe this process (see
			// modelWorld.quiet), then look again.
			if err := q.ping(); err != nil {
				q.stuck.Store("ping: " + err.Error())
				return
			}
			pings++
			continue
		}
		pings = 0
		if time.Now().After(deadline) {
			q.stuck.Store(why)
			return
		}
		if spins < 50 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// busy says why the world is not quiescent now ("" when it is).
func (q *quiet) busy(me int64) string {
	var s0 int64
	if q.active != nil {
		if n := q.active.Load(); n > 0 {
			return fmt.Sprintf("%d Redis commands in flight", n)
		}
		s0 = q.started.Load()
	}
	if why := q.goroutinesBusy(me); why != "" {
		return why
	}
	if q.ping != nil {
		if why := socketsUnread(); why != "" {
			return why
		}
	}
	if q.active != nil && (q.active.Load() > 0 || q.started.Load() != s0) {
		return "a Redis command started meanwhile"
	}
	return ""
}

// goroutinesBusy reads every goroutine's state: one running (but me),
// runnable or in a system call is busy. The runtime's approximate counts
// come first: they cost no stop of the world, and a busy reading there
// saves a stack dump.
func (q *quiet) goroutinesBusy(me int64) string {
	metrics.Read(q.samples[:])
	if n := q.samples[0].Value.Uint64(); n > 0 {
		return fmt.Sprintf("%d goroutines runnable", n)
	}
	if q.buf == nil {
		q.buf = make([]byte, 1<<16)
	}
	for {
		n := runtime.Stack(q.buf, true)
		if n < len(q.buf) {
			q.buf = q.buf[:cap(q.buf)]
			return busyIn(q.buf[:n], me)
		}
		q.buf = make([]byte, 2*len(q.buf))
	}
}

func busyIn(dump []byte, me int64) string {
	for len(dump) > 0 {
		line := dump
		if i := bytes.IndexByte(dump, '\n'); i >= 0 {
			line, dump = dump[:i], dump[i+1:]
		} else {
			dump = nil
		}
		if !bytes.HasPrefix(line, []byte("goroutine ")) {
			continue
		}
		// goroutine 18 [chan receive, 2 minutes, locked to thread]:
		rest := line[len("goroutine "):]
		sp := bytes.IndexByte(rest, ' ')
		lb, rb := bytes.IndexByte(rest, '['), bytes.LastIndexByte(rest, ']')
		if sp < 0 || lb < 0 || rb < lb {
			continue
		}
		id, _ := strconv.ParseInt(string(rest[:sp]), 10, 64)
		state := string(rest[lb+1 : rb])
		if i := strings.IndexByte(state, ','); i >= 0 {
			state = state[:i]
		}
		if id == me {
			continue
		}
		switch state {
		case "running", "runnable", "syscall":
			// what it runs: the first frame after the header
			frame := ""
			if i := bytes.IndexByte(dump, '\n'); i >= 0 {
				frame = string(dump[:i])
			}
			return fmt.Sprintf("goroutine %d is %s in %s", id, state, frame)
		}
	}
	return ""
}

// ---- calls the runner drives ----

// opHorizon is how much simulated time a blocking call may take before the
// runner cancels its ctx: past any MaxQueue the model sets (30 s) and a
// permit wait's re-asks.
const opHorizon = 10 * time.Minute

// call runs f, which may block on the clock (Wait, Acquire, AwaitTurn), in
// its own goroutine and drives the clock until it returns; past opHorizon
// it cancels cancel (f's ctx) and drives again. It reports false when f
// still did not return (a hang: f's goroutine is left behind).
func (c *simClock) call(cancel context.CancelFunc, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	c.mu.Lock()
	horizon := c.now.Add(opHorizon)
	c.mu.Unlock()
	if c.drive(done, horizon) {
		return true
	}
	cancel()
	c.mu.Lock()
	horizon = c.now.Add(opHorizon)
	c.mu.Unlock()
	return c.drive(done, horizon)
}
