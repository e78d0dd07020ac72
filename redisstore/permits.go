package redisstore

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// The in-flight dimension on Redis. A key's leases are a sorted set
// (permitKey): ids scored by their expiry, on the scripts' clock. Each
// operation is one script call (lua.PermitTake, PermitRelease, PermitCount);
// the leases this process holds are renewed in the background, every third
// of their lease, so that only those of a process that died (or stalled for a
// lease) expire. A release is published on its prefix's channel
// (freedChannel), to which each backend subscribes once it has a waiter
// (Freed).

// permitState is a backend's in-flight state in this process: the leases it
// holds and renews, and the waiters it tells of releases.
type permitState struct {
	leases  leases
	notices notices
}

// freedChannel is the pub/sub channel on which the releases of the in-flight
// keys of the shapers under prefix base are published, each with its key as
// the payload: one channel per prefix, covered by the prefix's ACL pattern.
func freedChannel(base string) string { return escape(base) + "freed" }

// permitSet names p's key and dimension in an error (a *StateError).
func permitSet(p *store.Permit) store.KeySet {
	return store.KeySet{Dims: []*store.Dim{p.Dim}, Keys: []string{p.Key}, Slot: p.Slot}
}

// TakePermit takes a lease with id on p's key if fewer than p.Limit are held
// (lua.PermitTake, one call), and renews it until it is released or Close.
func (r *backend) TakePermit(ctx context.Context, p *store.Permit, id string, now float64) (store.Taken, error) {
	if err := ctx.Err(); err != nil {
		return store.Taken{}, err
	}
	if r.err != nil {
		return store.Taken{}, r.err
	}
	key := permitKey(p)
	var (
		v         any
		mu        sync.Mutex // v and abandoned
		abandoned bool       // the caller left before the script answered
	)
	err := r.do(ctx, "take_permit", permitSet(p), nil, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error {
			res, err := script.PermitTake.Run(ctx, r.client, []string{key}, r.now(now), p.Limit, script.Float(p.Lease), id).Result()
			mu.Lock()
			defer mu.Unlock()
			if abandoned { // nobody will hold what the script may have taken
				r.releaseAbandoned(key, id, p)
				return err
			}
			v = res
			return err
		})
	})
	if err != nil {
		// f may still run (see call), and its script take the lease after
		// the caller has left: it gives the lease back itself then. If it
		// answered first, the shaper releases the id on this error.
		mu.Lock()
		abandoned = true
		mu.Unlock()
		return store.Taken{}, err
	}
	rep, err := script.ParseTake(v)
	if err != nil {
		return store.Taken{}, &Error{Op: "take_permit", Err: err}
	}
	t := store.Taken{OK: rep.OK, InUse: rep.InUse, Expiry: max(rep.Expiry, 0)}
	if t.OK {
		t.Lease, t.Expiry = store.Lease{ID: id}, math.Inf(1)
		r.permits.leases.hold(r, key, id, p)
	}
	return t, nil
}

// releaseAbandoned gives back the lease id a take's script took on key
// after its caller had left, from the goroutine that ran the script,
// within the store's timeout. It goes to Redis directly: that goroutine
// still holds its call slot.
func (r *backend) releaseAbandoned(key, id string, p *store.Permit) {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	_ = script.PermitRelease.Run(ctx, r.client, []string{key}, id, freedChannel(p.Dim.Base)).Err()
}

// ReleasePermit gives back l (lua.PermitRelease), which publishes the
// release if the key still held it. The lease is forgotten first: if the
// call fails, the lease expires after its Lease instead of being renewed.
// A lease a failure policy granted is not in Redis: nothing to do.
func (r *backend) ReleasePermit(ctx context.Context, p *store.Permit, l store.Lease) error {
	if l.Open || l.Local {
		return nil
	}
	if r.err != nil {
		return r.err
	}
	key := permitKey(p)
	r.permits.leases.forget(key, l.ID)
	return r.run(ctx, "release_permit", permitSet(p), func(ctx context.Context) error {
		return script.PermitRelease.Run(ctx, r.client, []string{key}, l.ID, freedChannel(p.Dim.Base)).Err()
	})
}

// PermitsInUse counts the leases p's key holds, expired ones aside
// (lua.PermitCount, read-only).
func (r *backend) PermitsInUse(ctx context.Context, p *store.Permit, now float64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if r.err != nil {
		return 0, r.err
	}
	key := permitKey(p)
	var v any
	err := r.do(ctx, "permits_in_use", permitSet(p), nil, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error {
			var err error
			v, err = script.PermitCount.Run(ctx, r.client, []string{key}, r.now(now)).Result()
			return err
		})
	})
	if err != nil { // f may still run (see call): do not read v
		return 0, err
	}
	n, err := script.ParseCount(v)
	if err != nil {
		return 0, &Error{Op: "permits_in_use", Err: err}
	}
	return n, nil
}

// Freed registers ch for the releases of p's key, in every process: the
// backend subscribes to p's prefix's channel (freedChannel) on its one
// connection for notices, and returns once Redis has confirmed the
// subscription, so that a release after Freed returns is announced to ch;
// while Redis is judged down it does not wait (the waiter's retry at
// Taken.Expiry covers a lost notice), and no wait exceeds the timeout.
func (r *backend) Freed(p *store.Permit, ch chan<- struct{}) (stop func()) {
	if r.err != nil {
		return func() {}
	}
	n := &r.permits.notices
	key, channel := permitKey(p), freedChannel(p.Dim.Base)
	ref := &ch
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return func() {}
	}
	if n.keys == nil {
		n.keys, n.channels = map[string]*listeners{}, map[string]chan struct{}{}
	}
	ls := n.keys[key]
	if ls == nil {
		ls = &listeners{channel: channel, chans: map[*chan<- struct{}]struct{}{}}
		n.keys[key] = ls
	}
	ls.chans[ref] = struct{}{}
	confirmed, known := n.channels[channel]
	if !known {
		confirmed = make(chan struct{})
		n.channels[channel] = confirmed
	}
	n.mu.Unlock()
	stop = func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if ls := n.keys[key]; ls != nil {
			delete(ls.chans, ref)
			if len(ls.chans) == 0 {
				delete(n.keys, key)
			}
		}
	}
	if !known {
		n.subscribe(r, channel, confirmed)
	}
	if r.health.IsUp() {
		t := time.NewTimer(r.timeout)
		defer t.Stop()
		select {
		case <-confirmed:
		case <-t.C:
		}
	}
	return stop
}

// leases are the leases this backend took and holds: it renews each every
// third of its lease (one renewer goroutine, running while any is held),
// until it is released or the backend closes.
type leases struct {
	mu      sync.Mutex
	held    map[leaseKey]*heldLease
	running bool          // the renewer runs
	closed  bool          // Close: no lease is renewed any more
	wake    chan struct{} // a lease was added: the renewer looks again when it is due
	ctx     context.Context
	cancel  context.CancelFunc // stops the renewer and its calls
	wg      sync.WaitGroup
	lost    atomic.Uint64 // leases that expired before they were renewed
}

// leaseKey names one lease: its in-flight key and its id.
type leaseKey struct{ key, id string }

// heldLease is a lease held: how long it lasts, the clock of its shaper (the
// renewal's now under WithClientClock), and when it is next renewed.
type heldLease struct {
	lease float64 // ms
	clock timer.Clock
	due   time.Time
}

// period is how often a lease of ms is renewed: every third of it (at
// most every ms: a lease too short to renew does not spin the renewer).
func period(ms float64) time.Duration { return max(algorithms.Duration(ms/3), time.Millisecond) }

// hold remembers the lease id on key, taken for p by r, and makes sure the
// renewer runs. After Close it is not renewed: it expires.
func (l *leases) hold(r *backend, key, id string, p *store.Permit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if l.held == nil {
		l.held, l.wake = map[leaseKey]*heldLease{}, make(chan struct{}, 1)
		l.ctx, l.cancel = context.WithCancel(context.Background())
	}
	clock := p.Dim.Clock
	if clock == nil {
		clock = timer.Real()
	}
	l.held[leaseKey{key, id}] = &heldLease{lease: p.Lease, clock: clock, due: time.Now().Add(period(p.Lease))}
	if !l.running {
		l.running = true
		l.wg.Add(1)
		go l.renewer(r)
		return
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// forget stops renewing the lease id on key.
func (l *leases) forget(key, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, leaseKey{key, id})
}

// close stops the renewer and waits for it to exit: the leases still held
// expire after their lease.
func (l *leases) close() {
	l.mu.Lock()
	l.closed = true
	if l.cancel != nil {
		l.cancel()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// renewer renews the leases as they fall due, and exits when none is held
// or on close.
func (l *leases) renewer(r *backend) {
	defer l.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		l.mu.Lock()
		if l.closed || len(l.held) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		var next time.Time
		for _, h := range l.held {
			if next.IsZero() || h.due.Before(next) {
				next = h.due
			}
		}
		l.mu.Unlock()
		t.Reset(time.Until(next))
		select {
		case <-t.C:
			l.renewDue(r)
		case <-l.wake:
		case <-l.ctx.Done():
		}
	}
}

// renewDue renews the leases due, with one call per key (and lease): a lease
// due within half a period is renewed with them, so that the leases of a key
// go together whenever they were taken. A lease reported lost is forgotten
// and counted; after a failed call the leases are tried again when next due.
func (l *leases) renewDue(r *backend) {
	type group struct {
		key   string
		lease float64
	}
	type batch struct {
		clock timer.Clock
		ids   []string
		held  map[string]*heldLease
	}
	now := time.Now()
	due := map[group]*batch{}
	l.mu.Lock()
	for k, h := range l.held {
		p := period(h.lease)
		if h.due.Sub(now) > p/2 {
			continue
		}
		h.due = now.Add(p)
		g := group{k.key, h.lease}
		b := due[g]
		if b == nil {
			b = &batch{clock: h.clock, held: map[string]*heldLease{}}
			due[g] = b
		}
		b.ids = append(b.ids, k.id)
		b.held[k.id] = h
	}
	l.mu.Unlock()
	for g, b := range due {
		lost, err := r.renew(l.ctx, g.key, g.lease, b.clock, b.ids)
		if err != nil {
			continue
		}
		l.mu.Lock()
		for _, id := range lost {
			k := leaseKey{g.key, id}
			if h, ok := l.held[k]; ok && h == b.held[id] { // not released, nor taken again, meanwhile
				delete(l.held, k)
				l.lost.Add(1)
			}
		}
		l.mu.Unlock()
	}
}

// renew renews the leases ids of lease ms on key (lua.PermitRenew) and
// returns those lost.
func (r *backend) renew(ctx context.Context, key string, lease float64, clock timer.Clock, ids []string) ([]string, error) {
	args := make([]any, 0, 2+len(ids))
	args = append(args, r.now(algorithms.Millis(clock.Now())), script.Float(lease))
	for _, id := range ids {
		args = append(args, id)
	}
	var lost []string
	err := r.run(ctx, "renew_permit", store.KeySet{}, func(ctx context.Context) error {
		var err error
		lost, err = script.PermitRenew.Run(ctx, r.client, []string{key}, args...).StringSlice()
		return err
	})
	if err != nil { // f may still run (see call): do not read lost
		return nil, err
	}
	return lost, nil
}

// notices are the waiters of this backend for releases (Freed), by
// in-flight key, and its one subscription to the release channels: a
// *redis.PubSub, made on the first Freed, read by one goroutine.
type notices struct {
	sub      sync.Mutex // held while subscribing, and by close
	mu       sync.Mutex // the fields below
	ps       *redis.PubSub
	channels map[string]chan struct{} // subscribed: closed once Redis confirmed
	keys     map[string]*listeners
	closed   bool
	done     chan struct{} // closed when the reading goroutine exits
}

// listeners are the channels registered for one in-flight key, and the
// release channel its notices come on.
type listeners struct {
	channel string
	chans   map[*chan<- struct{}]struct{}
}

// subscribe subscribes to channel: the first time it makes the PubSub,
// waits (at most the timeout) for the confirmation, then starts the reading
// goroutine; later, it sends SUBSCRIBE, which the reading goroutine sees
// confirmed. go-redis reconnects and subscribes again after a failure.
func (n *notices) subscribe(r *backend, channel string, confirmed chan struct{}) {
	n.sub.Lock()
	defer n.sub.Unlock()
	n.mu.Lock()
	ps, closed := n.ps, n.closed
	n.mu.Unlock()
	if closed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	if ps != nil {
		_ = ps.Subscribe(ctx, channel)
		return
	}
	ps = r.client.Subscribe(ctx, channel)
	msg, err := ps.Receive(ctx)
	n.mu.Lock()
	if s, ok := msg.(*redis.Subscription); err == nil && ok && s.Channel == channel {
		close(confirmed)
	}
	n.ps, n.done = ps, make(chan struct{})
	msgs := ps.ChannelWithSubscriptions()
	go n.listen(msgs, n.done)
	n.mu.Unlock()
}

// listen tells the listeners of each key released, and marks each
// subscription confirmed; a subscription confirmed again (go-redis
// reconnected) wakes every listener of its channel, whose notices may have
// been lost meanwhile. It exits when the PubSub closes.
func (n *notices) listen(msgs <-chan any, done chan struct{}) {
	defer close(done)
	for m := range msgs {
		switch m := m.(type) {
		case *redis.Message:
			n.mu.Lock()
			if ls := n.keys[m.Payload]; ls != nil {
				ls.notify()
			}
			n.mu.Unlock()
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			n.mu.Lock()
			if c := n.channels[m.Channel]; c != nil {
				select {
				case <-c: // again: wake the channel's listeners
					for _, ls := range n.keys {
						if ls.channel == m.Channel {
							ls.notify()
						}
					}
				default:
					close(c)
				}
			}
			n.mu.Unlock()
		}
	}
}

// notify sends to each listener without blocking.
func (ls *listeners) notify() {
	for ch := range ls.chans {
		select {
		case *ch <- struct{}{}:
		default:
		}
	}
}

// close closes the PubSub and waits for the reading goroutine to exit.
func (n *notices) close() {
	n.sub.Lock()
	defer n.sub.Unlock()
	n.mu.Lock()
	n.closed = true
	ps, done := n.ps, n.done
	n.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
		<-done
	}
}

// closePermits stops the renewer (the leases still held expire after their
// lease) and the subscription to release notices.
func (r *backend) closePermits() {
	r.permits.leases.close()
	r.permits.notices.close()
}
