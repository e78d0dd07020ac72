package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/redisstore/internal/health"
)

// Coalescing: the reservations a process makes on one hash slot while its
// calls for that slot are in flight are decided together by a later call,
// one script execution (script.ReserveBatch) that runs each reservation's
// own script in turn. A lane is one hash slot's queue (every key, on a
// single node, where scripts may span slots). A reservation that finds
// fewer than the lane's limit of calls in flight and nobody queued makes
// its call alone, at once, exactly as without coalescing; the ones that
// arrive while the limit is reached queue, and when a call returns one
// goroutine sends the queue (up to maxBatch) as one call, and again for
// those that arrived meanwhile, until the queue is empty. Each
// reservation's slot is the one its own call would have had at its place
// in the batch; nothing is reserved for anyone in advance.

// lane is one hash slot's queue.
type lane struct {
	mu       sync.Mutex
	inflight int       // calls in flight (or about to be), at most its limit
	wide     bool      // its batches are small: up to wideInflight calls go at once
	small    int       // consecutive batches below wideBelow
	queue    []*waiter // the reservations for the next call
	spare    []*waiter // a sent batch's array, for reuse
}

// A lane sends a reservation alone, at once, while fewer than its limit of
// calls are in flight: narrowInflight, so that under heavy load the
// reservations queue into large batches while the server decides one
// batch and the other's reply travels; or wideInflight once wideAfter
// batches in a row were small (below wideBelow), where queueing would only
// add a round trip to each reservation's wait. One large batch makes the
// lane narrow again. So a lane with a few concurrent callers runs like one
// call per reservation, and one with many coalesces.
const (
	narrowInflight = 2
	wideInflight   = 8
	wideBelow      = 4
	wideAfter      = 8
)

// limit is how many calls ln may have in flight (ln.mu held).
func (ln *lane) limit() int {
	if ln.wide {
		return wideInflight
	}
	return narrowInflight
}

// waiter states.
const (
	waiting   int32 = iota
	claimed         // its batch's reply is being read into its request
	abandoned       // its caller left: the reply, if a grant, is given back
)

// waiter is one queued reservation.
type waiter struct {
	req     *store.Request
	call    reserveCall
	replies uint64 // the server's reply count when it queued (see timedOut)
	state   atomic.Int32
	done    chan struct{}
	reply   any // its script's reply, once done (or err)
	err     error
	inputs  *store.Request // a copy of req's inputs: for restamp (client clock) and the give-back of a caller that left
}

// lanes maps hash slots to their lanes: one lane for a single node, one
// per hash slot on a cluster.
type lanes struct {
	one    *lane    // a single node: every key
	bySlot sync.Map // a cluster: uint16 hash slot -> *lane
}

// newLanes returns the lanes for client, or nil when its calls are not
// coalesced: a Ring (which places keys by their hash tag, not their slot)
// or a client of an unknown type.
func newLanes(client redis.UniversalClient) *lanes {
	switch client.(type) {
	case *redis.Client:
		return &lanes{one: &lane{}}
	case *redis.ClusterClient:
		return &lanes{}
	}
	return nil
}

// of returns the lane of the keys whose hash tag is tag.
func (l *lanes) of(tag string) *lane {
	if l.one != nil {
		return l.one
	}
	slot := clusterSlot(escapeTag(tag))
	if v, ok := l.bySlot.Load(slot); ok {
		return v.(*lane)
	}
	v, _ := l.bySlot.LoadOrStore(slot, &lane{})
	return v.(*lane)
}

// clusterSlot is Redis Cluster's hash slot of a hash tag: CRC16 (XMODEM)
// modulo 16384.
func clusterSlot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}

// coalesce decides req through its lane.
func (r *backend) coalesce(ctx context.Context, req *store.Request) error {
	w := &waiter{req: req, replies: r.health.Replies()}
	r.prepare(&w.call, req) // before the lock: building the args runs beside the call in flight
	ln := r.lanes.of(req.Slot)
	ln.mu.Lock()
	if ln.inflight < ln.limit() && len(ln.queue) == 0 { // this call goes at once, alone
		ln.inflight++
		ln.mu.Unlock()
		err := r.callAlone(ctx, false, &w.call, req)
		r.release(ln)
		return err
	}
	w.done = make(chan struct{})
	if r.clientClock { // restamp reads them once w is queued
		w.inputs = req.Inputs()
	}
	ln.queue = append(ln.queue, w)
	ln.mu.Unlock()
	return r.await(ctx, w)
}

// restamp makes a queued reservation's call decide at the instant its
// batch is sent, on the client clock (WithClientClock; on Redis TIME the
// batch reads TIME when it runs). Decided at the instant its caller made it,
// a reservation that queued would be decided earlier than what other
// callers decided since, and a key whose TTL their decisions set would
// look cold to it. Its caller's deadline counts from its own instant: the
// call waits that much less.
func (r *backend) restamp(w *waiter) {
	in := w.inputs
	late := algorithms.Millis(in.Dims[0].Clock.Now()) - in.Now
	if late <= 0 {
		return
	}
	at := *in
	at.Now += late
	if at.Limit < store.NoLimit {
		at.Limit -= late
	}
	r.prepare(&w.call, &at)
	w.call.late = late
}

// release ends a lane's call: the reservations queued meanwhile go as the
// next call, on a goroutine of their own.
func (r *backend) release(ln *lane) {
	ln.mu.Lock()
	if len(ln.queue) == 0 {
		ln.inflight--
		ln.mu.Unlock()
		return
	}
	batch := ln.take()
	ln.mu.Unlock()
	go r.flush(ln, batch)
}

// maxBatch is the most reservations one call decides. The replies of a
// call arrive together, after the server has run all of its reservations:
// the cap bounds how late the first of them learns its slot (about 128
// times a reservation's few µs of script), so that slots near now are not
// learnt after they passed, which would bunch their departures.
const maxBatch = 128

// take returns the next call's reservations: the queue's first maxBatch,
// in the order they queued (ln.mu held). The batch's size sets the lane's
// limit of calls in flight.
func (ln *lane) take() []*waiter {
	if len(ln.queue) < wideBelow {
		ln.small++
		ln.wide = ln.small >= wideAfter
	} else {
		ln.small, ln.wide = 0, false
	}
	if len(ln.queue) <= maxBatch {
		batch := ln.queue
		ln.queue, ln.spare = ln.spare[:0], nil
		return batch
	}
	batch := append(ln.spare[:0], ln.queue[:maxBatch]...)
	ln.spare = nil
	n := copy(ln.queue, ln.queue[maxBatch:])
	clear(ln.queue[n:])
	ln.queue = ln.queue[:n]
	return batch
}

// flush sends batches until the lane is idle.
func (r *backend) flush(ln *lane, batch []*waiter) {
	var b script.Batch
	for {
		r.send(&b, batch)
		clear(batch)
		ln.mu.Lock()
		ln.spare = batch[:0]
		if len(ln.queue) == 0 {
			ln.inflight--
			ln.mu.Unlock()
			return
		}
		batch = ln.take()
		ln.mu.Unlock()
	}
}

// send decides batch with one call and hands each waiter its outcome.
func (r *backend) send(b *script.Batch, batch []*waiter) {
	pass := r.health.Admit()
	defer r.health.Done(pass)
	if !pass.Try {
		for _, w := range batch {
			r.deliver(w, nil, health.ErrJudgedDown)
		}
		return
	}
	b.Reset()
	for _, w := range batch {
		if r.clientClock {
			r.restamp(w)
		}
		b.Add(w.call.gcra != nil, w.call.keys, w.call.args)
	}
	var v any
	err := r.call(context.Background(), pass.Probe, func(ctx context.Context) error {
		var err error
		v, err = script.ReserveBatch.Run(ctx, r.client, b.Keys, b.Argv()...).Result()
		return err
	})
	var items []any
	var took float64
	if err == nil {
		items, took, err = script.SplitBatch(v, len(batch))
	}
	for i, w := range batch {
		if err != nil {
			r.deliver(w, nil, err)
			continue
		}
		if !r.clientClock { // decided on the batch's TIME: its delay counts from the reply
			w.call.took = took
		}
		if e, ok := items[i].(error); ok {
			r.deliver(w, nil, e)
			continue
		}
		r.deliver(w, items[i], nil)
	}
}

// deliver hands w its reply v (or err). A waiter whose caller left gets
// nothing; a slot its reply granted goes back to the key.
func (r *backend) deliver(w *waiter, v any, err error) {
	if w.state.CompareAndSwap(waiting, claimed) { // its caller reads it (outcome), off this goroutine
		w.reply, w.err = v, err
		close(w.done)
		return
	}
	if err != nil {
		return
	}
	req := w.inputs
	if r.finish(&w.call, req, v) != nil || !req.Dec.Allowed {
		return
	}
	// As Cancel, only a slot still ahead goes back: its delay counts from
	// now (the reply) on Redis TIME, from its decision on the client clock.
	now := algorithms.Millis(req.Dims[0].Clock.Now())
	left := algorithms.DurationMillis(req.Dec.Delay)
	if r.clientClock {
		left = req.At - now
	}
	if left <= 0 {
		return
	}
	req.KeepTook()
	st := &store.Settlement{KeySet: req.KeySet, Tags: req.Tags, Seqs: req.Seqs, Costs: req.Costs, At: req.At,
		Now: now, Holes: len(req.Dims) == 1 && req.Dims[0].Name == ""}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		defer cancel()
		_ = r.Settle(ctx, st)
	}()
}

// await waits for w's outcome, or for its caller's ctx, or (when a failure
// policy can serve it before its deadline) for its budget (see budget) if
// the server has answered nobody meanwhile.
func (r *backend) await(ctx context.Context, w *waiter) error {
	var expired <-chan time.Time
	budget := r.timeout
	if _, ok := ctx.Deadline(); ok && r.served {
		budget = r.budget(ctx)
		t := time.NewTimer(budget)
		defer t.Stop()
		expired = t.C
	}
wait:
	for {
		select {
		case <-w.done:
			return r.outcome(w)
		case <-ctx.Done():
			break wait
		case <-expired:
			if !r.health.SilentSince(w.replies) {
				// The server answers: w waits behind calls in flight, as a
				// call waits for a connection, bounded by its ctx alone.
				expired = nil
				continue
			}
			break wait
		}
	}
	if w.inputs == nil { // restamp may be reading it: it is never replaced
		w.inputs = w.req.Inputs()
	}
	if !w.state.CompareAndSwap(waiting, abandoned) { // its reply is being handed over: take it
		<-w.done
		return r.outcome(w)
	}
	if err := callerDone(ctx); err != nil {
		return err
	}
	return r.health.TimedOut(w.replies, budget, false)
}

// outcome reads w's reply, delivered, into its request.
func (r *backend) outcome(w *waiter) error {
	if w.err != nil {
		return w.err
	}
	return r.finish(&w.call, w.req, w.reply)
}
