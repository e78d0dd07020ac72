package redisstore

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
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
// the leases this process holds are renewed in the background (leases), every
// fifth of their lease and again promptly after a renewal fails, so that only
// those of a process that died, or stalled or lost Redis for most of a lease,
// expire. A take whose reply its caller never read (a deadline, a timeout, an
// outage) is given back by a release that leaves a tombstone (tombKey) if it
// arrives first, retried until Redis answers. A release is published on its
// prefix's channel (freedChannel), to which each backend subscribes once it
// has a waiter (Freed).

// permitState is a backend's in-flight state in this process: the leases it
// holds and renews, and the waiters it tells of releases.
type permitState struct {
	leases  leases
	notices notices
}

// ErrClosed is the cause of the *Error a closed Store answers an in-flight
// take with: its leases would never be renewed (Store.Close). It matches
// shaper.ErrStoreUnavailable too, and no failure policy serves it.
var ErrClosed = errors.New("throttlekit: the redis store is closed")

// freedChannel is the pub/sub channel on which the releases of the in-flight
// keys of the shapers under prefix base are published, each with its key as
// the payload: one channel per prefix, covered by the prefix's ACL pattern.
func freedChannel(base string) string { return escape(base) + "freed" }

// tombKey is the Redis key of the tombstones of p's key (permitKey + ":t",
// in its hash slot): the ids whose clean-up release came before their take
// (lua.PermitRelease), each for a lease.
func tombKey(key string) string { return key + ":t" }

// permitSet names p's key and dimension in an error (a *StateError).
func permitSet(p *store.Permit) store.KeySet {
	return store.KeySet{Dims: []*store.Dim{p.Dim}, Keys: []string{p.Key}, Slot: p.Slot}
}

// TakePermit takes a lease with id on p's key if fewer than p.Limit are held
// (lua.PermitTake, one call), and renews it until it is released or Close.
// A take that fails once its call may have reached Redis (a deadline, a
// timeout, an outage: the script may have run, or may yet run) leaves its id
// to the clean-up (leases.orphan): a release ordered after the take by its
// tombstone, retried until Redis answers. A closed store refuses (ErrClosed).
func (r *backend) TakePermit(ctx context.Context, p *store.Permit, id string, now float64) (store.Taken, error) {
	r.permits.leases.begin(p, false)
	return r.take(ctx, p, id, now)
}

// take is TakePermit once the take is counted on its way (leases.begin): it
// ends it, and holds the lease it was granted in the same step (leases.end).
func (r *backend) take(ctx context.Context, p *store.Permit, id string, now float64) (store.Taken, error) {
	ended := false
	defer func() {
		if !ended {
			r.permits.leases.end(r, p, "", false)
		}
	}()
	if err := ctx.Err(); err != nil {
		return store.Taken{}, err
	}
	if r.err != nil {
		return store.Taken{}, r.err
	}
	if r.permits.leases.isClosed() {
		return store.Taken{}, &Error{Op: "take_permit", Err: ErrClosed}
	}
	key := permitKey(p)
	var (
		v    any
		mu   sync.Mutex // v and sent
		sent bool       // the call went to the client: the script may run
		left bool       // the caller has left: v is not read
	)
	err := r.do(ctx, "take_permit", permitSet(p), nil, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error {
			mu.Lock()
			sent = true
			mu.Unlock()
			res, err := script.PermitTake.Run(ctx, r.client, []string{key, tombKey(key)}, r.now(now), p.Limit, script.Float(p.Lease), id).Result()
			mu.Lock()
			defer mu.Unlock()
			if !left {
				v = res
			}
			return err
		})
	})
	mu.Lock()
	left, mayHaveRun := true, sent
	mu.Unlock()
	if err != nil {
		if mayHaveRun && !errors.Is(err, store.ErrInvalidState) { // a *StateError: the script refused, nothing was taken
			r.permits.leases.orphan(r, p, id)
		}
		return store.Taken{}, err
	}
	rep, err := script.ParseTake(v)
	if err != nil {
		r.permits.leases.orphan(r, p, id)
		return store.Taken{}, &Error{Op: "take_permit", Err: err}
	}
	t := store.Taken{OK: rep.OK, InUse: rep.InUse, Expiry: max(rep.Expiry, 0)}
	if t.OK {
		t.Lease, t.Expiry = store.Lease{ID: id}, math.Inf(1)
		ended = true
		if !r.permits.leases.end(r, p, id, true) { // closed meanwhile: nobody would renew it
			r.releaseNow(p, id)
			return store.Taken{}, &Error{Op: "take_permit", Err: ErrClosed}
		}
	}
	return t, nil
}

// releaseNow gives back the lease id on p's key at once, within the store's
// timeout, when the store closed while its take ran: the clean-up no longer
// runs.
func (r *backend) releaseNow(p *store.Permit, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	key := permitKey(p)
	_ = script.PermitRelease.Run(ctx, r.client, []string{key, tombKey(key)}, freedChannel(p.Dim.Base), "1", r.now(algorithms.Millis(clockOf(p).Now())), script.Float(p.Lease), id).Err()
}

// ReleasePermit gives back l (lua.PermitRelease), which publishes the
// release if the key still held it. The lease is forgotten first (no longer
// renewed); if the call fails when it may not have reached Redis (an outage,
// a timeout), the release is left to the clean-up, retried until Redis
// answers (or the lease expires). A lease a failure policy granted (Open,
// Local) is in Redis only once registered there (leases.hold with adopt):
// it is released there then, and is nothing to Redis before.
func (r *backend) ReleasePermit(ctx context.Context, p *store.Permit, l store.Lease) error {
	if r.err != nil {
		return r.err
	}
	key := permitKey(p)
	h := r.permits.leases.forget(p.Dim, key, l.ID)
	if (l.Open || l.Local) && (!h.held || h.adopt && !h.calling) {
		return nil // never registered in Redis, nor on its way there
	}
	tomb := "0"
	if h.calling { // a renewal of it is on its way: it must not add it back after this
		tomb = "1"
	}
	now := r.now(algorithms.Millis(clockOf(p).Now()))
	err := r.run(ctx, "release_permit", permitSet(p), func(ctx context.Context) error {
		return script.PermitRelease.Run(ctx, r.client, []string{key, tombKey(key)}, freedChannel(p.Dim.Base), tomb, now, script.Float(p.Lease), l.ID).Err()
	})
	if err != nil && !errors.Is(err, store.ErrInvalidState) { // it may not have reached Redis
		r.permits.leases.orphan(r, p, l.ID)
	}
	return err
}

// clockOf is the clock p's shaper reads (the real one if none).
func clockOf(p *store.Permit) timer.Clock {
	if p.Dim.Clock != nil {
		return p.Dim.Clock
	}
	return timer.Real()
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

// leases are what this backend keeps in Redis for its process, per in-flight
// dimension: the leases it holds, which it renews every fifth of their lease
// (period) until they are released or the backend closes, and the releases
// left to do (orphans). A lease a failure policy granted while Redis was down
// is held too, to be registered (adopt) when Redis answers again. Each
// dimension's are served by one goroutine (a loop), running while it has any,
// on the clock the scripts decide on: the shaper's under WithClientClock,
// else the real one. After a failed call the loop tries again within retry,
// not a period later: a lease outlives any break in reaching Redis shorter
// than its lease less a period, a retry and the call's timeout.
type leases struct {
	mu   sync.Mutex
	dims map[*store.Dim]*dimLeases
	// taking counts, by in-flight key, the takes of this process on their
	// way to Redis (begin to end): a failure policy's share counts them as
	// held (share), since Redis may grant each of them.
	taking map[string]int64
	closed bool // Close: nothing is renewed or cleaned up any more
	ctx    context.Context
	cancel context.CancelFunc // stops the loops and their calls
	wg     sync.WaitGroup
	lost   atomic.Uint64 // leases this process held that Redis no longer had room for
	rounds atomic.Uint64 // rounds the loops have run (tests wait for them)
}

// dimLeases are one dimension's leases and orphans, by in-flight key.
type dimLeases struct {
	held    map[string]map[string]*heldLease // key -> id -> lease
	orphans map[leaseKey]*orphan
	clock   timer.Clock   // the loop's
	calls   sync.Mutex    // held by a round: one at a time
	running bool          // its loop runs
	wake    chan struct{} // something new is due: the loop looks again
}

// leaseKey names one lease: its in-flight key and its id.
type leaseKey struct{ key, id string }

// heldLease is a lease held: its permit (lease, limit, dimension), when it is
// next renewed, and whether it is still to be registered regardless of the
// limit (adopt: a failure policy's grant; adopted is called once it is).
type heldLease struct {
	p       store.Permit
	due     time.Time // on the loop's clock
	adopt   bool
	adopted func()
	calling bool // a renewal of it is in flight: its release must leave a tombstone
}

// orphan is a release to make: a take whose reply its caller did not read,
// or a release that did not reach Redis.
type orphan struct {
	p   store.Permit
	due time.Time
}

// maxReleaseIDs bounds the ids of one clean-up call (lua.PermitRelease):
// a burst of clean-ups on one key goes in calls of at most this many, each
// a short script.
const maxReleaseIDs = 256

// period is how often a lease of ms is renewed: every fifth of it (at
// most every ms: a lease too short to renew does not spin the loop).
func period(ms float64) time.Duration { return max(algorithms.Duration(ms/5), time.Millisecond) }

// retry is how soon a call that failed is tried again: a quarter of a
// period, at most 50 ms, at least 1 ms.
func retry(ms float64) time.Duration {
	return max(min(period(ms)/4, 50*time.Millisecond), time.Millisecond)
}

// isClosed reports whether Close has run.
func (l *leases) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// dim returns d's entry, creating it and starting its loop if it has none;
// the caller holds l.mu and has checked l.closed. clientClock: the loop runs
// on d's clock (the scripts decide on it), else on the real one.
func (l *leases) dim(r *backend, d *store.Dim) *dimLeases {
	if l.dims == nil {
		l.dims = map[*store.Dim]*dimLeases{}
		l.ctx, l.cancel = context.WithCancel(context.Background())
	}
	dl := l.dims[d]
	if dl == nil {
		clock := timer.Real()
		if r.clientClock && d.Clock != nil {
			clock = d.Clock
		}
		dl = &dimLeases{held: map[string]map[string]*heldLease{}, orphans: map[leaseKey]*orphan{}, clock: clock, wake: make(chan struct{}, 1)}
		l.dims[d] = dl
	}
	if !dl.running {
		dl.running = true
		l.wg.Add(1)
		go l.loop(r, d, dl)
	} else {
		dl.poke()
	}
	return dl
}

// poke makes dl's loop look again at what it has (something new is due, or
// nothing is left: it exits).
func (dl *dimLeases) poke() {
	select {
	case dl.wake <- struct{}{}:
	default:
	}
}

// hold remembers the lease id on p's key and renews it from a period on;
// with adopt (a failure policy's grant, not yet in Redis) it is registered
// at once, whatever the key holds, and adopted is called once it is. It
// reports false after Close: nothing would renew it.
func (l *leases) hold(r *backend, p *store.Permit, id string, adopt bool, adopted func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holdLocked(r, p, id, adopt, adopted)
}

// holdLocked is hold with l.mu held.
func (l *leases) holdLocked(r *backend, p *store.Permit, id string, adopt bool, adopted func()) bool {
	if l.closed {
		return false
	}
	dl := l.dim(r, p.Dim)
	key := permitKey(p)
	ids := dl.held[key]
	if ids == nil {
		ids = map[string]*heldLease{}
		dl.held[key] = ids
	}
	due := dl.clock.Now().Add(period(p.Lease))
	if adopt {
		due = dl.clock.Now()
	}
	ids[id] = &heldLease{p: *p, due: due, adopt: adopt, adopted: adopted}
	return true
}

// orphan leaves the release of id on p's key to d's loop, at once and then
// every retry until Redis answers. After Close it is dropped: the lease, if
// the take made one, expires.
func (l *leases) orphan(r *backend, p *store.Permit, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	dl := l.dim(r, p.Dim)
	dl.orphans[leaseKey{permitKey(p), id}] = &orphan{p: *p, due: dl.clock.Now()}
}

// forgotten is what forget found of a lease, read under the lock (the
// renewal loop writes calling).
type forgotten struct {
	held    bool // it was held: renewed, or to be registered
	adopt   bool // a failure policy's grant, still to be registered
	calling bool // a renewal or registration of it is in flight
}

// forget stops renewing the lease id on key and says what it was.
func (l *leases) forget(d *store.Dim, key, id string) forgotten {
	l.mu.Lock()
	defer l.mu.Unlock()
	dl := l.dims[d]
	if dl == nil {
		return forgotten{}
	}
	h := dl.held[key][id]
	if h == nil {
		return forgotten{}
	}
	delete(dl.held[key], id)
	if len(dl.held[key]) == 0 {
		delete(dl.held, key)
		dl.poke()
	}
	return forgotten{held: true, adopt: h.adopt, calling: h.calling}
}

// begin counts a take of p's key on its way to Redis, until end: a failure
// policy's share counts it as held meanwhile (share). With check, if a grant
// of the policy on the key is still to be registered, it counts nothing and
// reports pending: the take must wait for the registration (the handoff
// back), or be served by the policy. Checking and counting in one step under
// the lock that share holds, a take and a policy's grant never miss each
// other: whichever comes second counts the first.
func (l *leases) begin(p *store.Permit, check bool) (pending bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if check {
		if _, pending = l.countLocked(p); pending {
			return true
		}
	}
	if l.taking == nil {
		l.taking = map[string]int64{}
	}
	l.taking[permitKey(p)]++
	return false
}

// end ends a take begun on p's key; granted, the lease id is held from now
// on (hold), in the same step, so that a policy's share counting this
// process's leases sees the take either on its way or held. It reports
// false if a granted lease could not be held (Close).
func (l *leases) end(r *backend, p *store.Permit, id string, granted bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := permitKey(p)
	if l.taking[key]--; l.taking[key] <= 0 {
		delete(l.taking, key)
	}
	if !granted {
		return true
	}
	return l.holdLocked(r, p, id, false, nil)
}

// share serves a failure policy's take of p's key (FailLocal) under the
// lock begin and end take: take is given own, the leases of the key this
// process holds in Redis and its takes on their way there (any may be
// granted), and a grant it makes is held at once, to be registered in
// Redis (hold with adopt; adopted is called once it is). No take of this
// process can be granted by Redis, nor begin, between the count and the
// hold: the process never holds more than the policy's share on both sides
// together by a race between an answer from Redis and an outage.
func (l *leases) share(r *backend, p *store.Permit, id string, adopted func(), take func(own int64) (store.Taken, error)) (store.Taken, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	own, _ := l.countLocked(p)
	t, err := take(own + l.taking[permitKey(p)])
	if err == nil && t.OK {
		l.holdLocked(r, p, id, true, adopted)
	}
	return t, err
}

// count returns how many leases of p's key this process holds in Redis
// (those still to be registered aside), and whether any is still to be.
func (l *leases) count(p *store.Permit) (n int64, pending bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.countLocked(p)
}

// countLocked is count with l.mu held.
func (l *leases) countLocked(p *store.Permit) (n int64, pending bool) {
	dl := l.dims[p.Dim]
	if dl == nil {
		return 0, false
	}
	for _, h := range dl.held[permitKey(p)] {
		if h.adopt {
			pending = true
		} else {
			n++
		}
	}
	return n, pending
}

// close stops the loops and waits for them to exit: the leases still held
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

// loop serves d's leases and orphans as they fall due, and exits when it has
// none, or on close.
func (l *leases) loop(r *backend, d *store.Dim, dl *dimLeases) {
	defer l.wg.Done()
	for {
		l.mu.Lock()
		if l.closed || len(dl.held) == 0 && len(dl.orphans) == 0 {
			dl.running = false
			if !l.closed {
				delete(l.dims, d)
			}
			l.mu.Unlock()
			return
		}
		var next time.Time
		for _, o := range dl.orphans {
			if next.IsZero() || o.due.Before(next) {
				next = o.due
			}
		}
		for _, ids := range dl.held {
			for _, h := range ids {
				if next.IsZero() || h.due.Before(next) {
					next = h.due
				}
			}
		}
		l.mu.Unlock()
		if wait := next.Sub(dl.clock.Now()); wait > 0 {
			t := dl.clock.NewTimer(wait)
			select {
			case <-t.C():
			case <-dl.wake:
				t.Stop()
				continue
			case <-l.ctx.Done():
				t.Stop()
				continue
			}
		}
		l.round(r, dl, "")
	}
}

// round makes the calls due on dl (only key's with key set): the orphans'
// releases first, then per key the registrations of the policy's grants
// (no limit), then the renewals, one call per key and kind; a lease due
// within half a period is renewed with them, so that the leases of a key go
// together whenever they were taken. After a call that finds Redis down,
// nothing more is tried this round: everything due is tried again within
// retry. A lease Redis no longer had room for is forgotten and counted lost.
// It returns the first outage met, if any.
func (l *leases) round(r *backend, dl *dimLeases, only string) error {
	dl.calls.Lock()
	defer dl.calls.Unlock()
	defer l.rounds.Add(1)
	type batch struct {
		key    string
		p      store.Permit
		adopt  bool
		ids    []string
		leases []*heldLease
	}
	l.mu.Lock()
	now := dl.clock.Now()
	// The clean-ups due, by key, in chunks of at most maxReleaseIDs: one
	// call gives back a key's, however many takes a burst of deadlines cut
	// short (one call each would keep their permits held for as many round
	// trips).
	byKey := map[string][]leaseKey{}
	for k, o := range dl.orphans {
		if !o.due.After(now) && (only == "" || k.key == only) {
			byKey[k.key] = append(byKey[k.key], k)
		}
	}
	var orphans [][]leaseKey
	for _, ks := range byKey {
		slices.SortFunc(ks, func(a, b leaseKey) int { return strings.Compare(a.id, b.id) })
		for len(ks) > 0 {
			n := min(len(ks), maxReleaseIDs)
			orphans = append(orphans, ks[:n])
			ks = ks[n:]
		}
	}
	var batches []*batch
	for key, ids := range dl.held {
		if only != "" && key != only {
			continue
		}
		var adopt, renew *batch
		for id, h := range ids {
			if h.calling || (!h.adopt && h.due.Sub(now) > period(h.p.Lease)/2) || (h.adopt && h.due.After(now) && only == "") {
				continue
			}
			b := &renew
			if h.adopt {
				b = &adopt
			}
			if *b == nil {
				*b = &batch{key: key, p: h.p, adopt: h.adopt}
			}
			(*b).ids = append((*b).ids, id)
			(*b).leases = append((*b).leases, h)
			h.calling = true
		}
		for _, b := range []*batch{adopt, renew} {
			if b != nil {
				batches = append(batches, b)
			}
		}
	}
	slices.SortFunc(batches, func(a, b *batch) int { // registrations first
		if a.adopt != b.adopt {
			if a.adopt {
				return -1
			}
			return 1
		}
		return strings.Compare(a.key, b.key)
	})
	l.mu.Unlock()

	var down error // an outage met: the rest waits for retry
	for _, ks := range orphans {
		l.mu.Lock()
		due := make([]*orphan, len(ks))
		var p *store.Permit
		args := make([]any, 4, 4+len(ks))
		for i, k := range ks {
			if due[i] = dl.orphans[k]; due[i] != nil {
				if p == nil || due[i].p.Lease > p.Lease { // the longest lease: every tombstone outlives its take
					p = &due[i].p
				}
				args = append(args, k.id)
			}
		}
		l.mu.Unlock()
		if p == nil {
			continue
		}
		var err error
		if down == nil {
			key := ks[0].key
			args[0], args[1], args[2], args[3] = freedChannel(p.Dim.Base), "1", r.now(algorithms.Millis(dl.clock.Now())), script.Float(p.Lease)
			err = r.direct(l.ctx, "release_permit", permitSet(p), func(ctx context.Context) error {
				return script.PermitRelease.Run(ctx, r.client, []string{key, tombKey(key)}, args...).Err()
			})
			if err != nil && l.ctx.Err() == nil && (outage(err) || errors.As(err, new(*Error))) {
				down = err
			}
		}
		l.mu.Lock()
		for i, k := range ks {
			o := due[i]
			if o == nil || dl.orphans[k] != o {
				continue
			}
			if down != nil {
				o.due = dl.clock.Now().Add(retry(o.p.Lease))
			} else { // answered (a *StateError too: nothing of ours is there)
				delete(dl.orphans, k)
			}
		}
		l.mu.Unlock()
	}
	for _, b := range batches {
		start := dl.clock.Now()
		var lost []string
		var err error
		if down == nil {
			lost, err = r.renew(l.ctx, b.key, &b.p, b.adopt, start, b.ids)
		}
		var adopted []func()
		l.mu.Lock()
		for i, id := range b.ids {
			h := b.leases[i]
			h.calling = false
			if dl.held[b.key][id] != h { // released meanwhile
				continue
			}
			switch {
			case down != nil || err != nil && (outage(err) || errors.As(err, new(*Error))):
				h.due = start.Add(retry(h.p.Lease))
			case err != nil: // the key holds foreign data: its *StateError is the takers'; try again a period on
				h.due = start.Add(period(h.p.Lease))
			case slices.Contains(lost, id):
				delete(dl.held[b.key], id)
				if len(dl.held[b.key]) == 0 {
					delete(dl.held, b.key)
					dl.poke()
				}
				l.lost.Add(1)
			default:
				h.due = start.Add(period(h.p.Lease))
				if h.adopt {
					h.adopt = false
					if h.adopted != nil {
						adopted = append(adopted, h.adopted)
					}
				}
			}
		}
		if down == nil && err != nil && l.ctx.Err() == nil && (outage(err) || errors.As(err, new(*Error))) {
			down = err
		}
		l.mu.Unlock()
		for _, f := range adopted {
			f()
		}
	}
	return down
}

// adoptNow registers at once, in the caller's call, the failure policy's
// grants on p's key still to be registered, so that none is granted again
// before they are counted (the handoff back to Redis); a registration the
// loop has on its way is waited for (one round at a time). An error is the
// outage that kept them from Redis.
func (l *leases) adoptNow(r *backend, p *store.Permit) error {
	l.mu.Lock()
	dl := l.dims[p.Dim]
	l.mu.Unlock()
	if dl == nil {
		return nil
	}
	return l.round(r, dl, permitKey(p))
}

// direct is do for the loop's calls: it goes to Redis even while Redis is
// judged down (it is a probe of its own, at most one per dimension every
// retry), so that a lease is renewed as soon as Redis answers again, not
// when the health tracker next tries it; its answer judges Redis up for
// every caller.
func (r *backend) direct(ctx context.Context, op string, ks store.KeySet, f func(context.Context) error) error {
	if err := r.call(ctx, true, f); err != nil {
		return r.fail(ctx, op, ks, nil, err)
	}
	return nil
}

// renew renews the leases ids of p's key from now (lua.PermitRenew): it
// adds back those Redis no longer holds while it has room (all of them with
// adopt), and returns those it had no room for.
func (r *backend) renew(ctx context.Context, key string, p *store.Permit, adopt bool, now time.Time, ids []string) ([]string, error) {
	limit := strconv.FormatInt(p.Limit, 10)
	if adopt {
		limit = ""
	}
	args := make([]any, 0, 3+len(ids))
	args = append(args, r.now(algorithms.Millis(now)), script.Float(p.Lease), limit)
	for _, id := range ids {
		args = append(args, id)
	}
	var lost []string
	err := r.direct(ctx, "renew_permit", permitSet(p), func(ctx context.Context) error {
		var err error
		lost, err = script.PermitRenew.Run(ctx, r.client, []string{key, tombKey(key)}, args...).StringSlice()
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
