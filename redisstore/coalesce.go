package redisstore

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/redisstore/internal/coalesce"
	"github.com/throttlekit/throttlekit-go/redisstore/internal/health"
)

// Coalescing (see package coalesce for the lanes): the reservations a
// process makes on one hash slot while its calls for that slot are in
// flight are decided together by a later call, one script execution
// (script.ReserveBatch) that runs each reservation's own script in turn.
// Each reservation's slot is the one its own call would have had at its
// place in the batch; nothing is reserved for anyone in advance.

// lanes is the store's lanes of waiters.
type lanes = coalesce.Lanes[*waiter]

// lane is one hash slot's.
type lane = coalesce.Lane[*waiter]

// waiter states.
const (
	waiting   int32 = iota
	claimed         // its batch's reply is being read into its request
	abandoned       // its caller left: the reply, if a grant, is given back
)

// waiter is one queued reservation.
type waiter struct {
	req         *store.Request
	call        reserveCall
	replies     uint64 // the server's reply count when it queued (see timedOut)
	clientClock bool   // the store decides on the client clock (see restamp)
	state       atomic.Int32
	done        chan struct{}
	reply       any // its script's reply, once done (or err)
	err         error
	inputs      *store.Request // a copy of req's inputs: for restamp (client clock) and the give-back of a caller that left
	clock       timer.Clock    // its shaper's clock: when its batch is sent (on Redis TIME, see skew.go)
}

// newLanes returns the lanes for client, or nil when its calls are not
// coalesced: a Ring (which places keys by their hash tag, not their slot)
// or a client of an unknown type.
func newLanes(client redis.UniversalClient) *lanes {
	switch client.(type) {
	case *redis.Client:
		return coalesce.Single[*waiter]()
	case *redis.ClusterClient:
		return coalesce.PerSlot[*waiter]()
	}
	return nil
}

// coalesce decides req through its lane: at once, alone, or queued for
// the next batch.
func (r *backend) coalesce(ctx context.Context, req *store.Request) error {
	w := &waiter{req: req, replies: r.health.Replies(), clientClock: r.clientClock, clock: req.Dims[0].Clock}
	r.prepare(&w.call, req) // before the lock: building the args runs beside the call in flight
	ln := r.lanes.Of(escapeTag(req.Slot))
	if ln.Join(w, queued) {
		err := r.callAlone(ctx, false, &w.call, req)
		if batch := ln.Done(); batch != nil {
			go r.flush(ln, batch)
		}
		return err
	}
	return r.await(ctx, w)
}

// queued readies w to wait in its lane's queue (under the lane's lock).
func queued(w *waiter) {
	w.done = make(chan struct{})
	if w.clientClock { // restamp reads them once w is queued
		w.inputs = w.req.Inputs()
	}
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

// flush sends batches until the lane is idle.
func (r *backend) flush(ln *lane, batch []*waiter) {
	var b script.Batch
	for batch != nil {
		r.send(&b, batch)
		batch = ln.Next(batch)
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
		} else {
			w.call.sent = w.clock.Now()
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
