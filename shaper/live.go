package shaper

import (
	"context"
	"fmt"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/store"
)

// DefaultContractRefresh is how often a shaper on a Redis store reads the
// live contract its fleet shares, unless WithContractRefresh says otherwise.
const DefaultContractRefresh = time.Second

// WithContractRefresh sets how often a shaper on a Redis store reads the
// contract recorded by SetRate and SetMaxQueue in any process of its fleet
// (default DefaultContractRefresh; 0: never, the shaper follows only its own
// changes). The first call of each interval starts the read in the
// background; no caller waits for it. A shaper on a memory store follows a
// change at once.
func WithContractRefresh(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.err = &ConfigError{Algorithm: "shaper", Field: "ContractRefresh", Value: d, Reason: "must be >= 0"}
		}
		c.refresh, c.refreshSet = d, true
	}
}

// contract is what a live change swaps: a shaper's dimensions, in name
// order, and its MaxQueue. It is immutable once published; reservations
// keep the one they were granted under.
type contract struct {
	dims     []*dim
	sdims    []*store.Dim // what the store reads of dims, in their order
	maxQueue time.Duration
	version  uint64 // the version of the store's record it follows (0: the configured contract)
	fields   string // the record's fields, canonical (see store.Record.Print): a record deleted and made anew restarts its version
	// watch is the version in force: the store's record version (Backend.Watch), which
	// any shaper under the prefix may change; on a Redis store the version
	// this shaper adopted last (liveState.adopted). The contract is in
	// force while it equals version.
	watch *atomic.Uint64
	// gives: a dimension's store gives back units of an entry it keeps by
	// the reservation's time (algorithms.GiveBacker), and cannot tell a
	// reservation's copies apart: they share a flag (Reservation.once).
	gives bool
}

// index records what the store reads of c's dimensions (sdims).
func (c *contract) index() {
	c.sdims = make([]*store.Dim, len(c.dims))
	c.gives = false
	for i, d := range c.dims {
		c.sdims[i] = &d.Dim
		if _, ok := d.Alg.(algorithms.GiveBacker); ok {
			c.gives = true
		}
	}
}

// liveState is the Shaper's state for live changes.
type liveState struct {
	base     *contract // as configured
	identity string    // the configured contract, whole
	mu       sync.Mutex
	watch    *atomic.Uint64 // every contract's watch: the store's record version for the prefix (Backend.Watch), or &adopted
	follows  bool           // the store tells when its record changes (watch is its)
	adopted  atomic.Uint64  // a Redis store: the version of the contract in force
	refresh  int64          // ns between reads of a remote record (0: never)
	nextRead atomic.Int64   // a remote record is read at or after this instant (clock ns)
	reading  atomic.Bool    // a read of the remote record is in flight
	epoch    uint64         // under mu: grows with every contract adopted (see readRemote)
}

// startLive publishes the configured contract and arranges to follow the
// store's record.
func (s *Shaper) startLive(base *contract) {
	s.base = base
	var id strings.Builder
	for _, d := range base.dims {
		fmt.Fprintf(&id, "%s=%s;", d.Name, d.Identity)
	}
	s.identity = id.String()
	s.watch = s.store.Watch(s.cfg.prefix)
	s.follows = s.watch != nil
	if !s.follows { // the record is read in the background (refreshAt)
		s.watch = &s.adopted
		refresh := DefaultContractRefresh
		if s.cfg.refreshSet {
			refresh = s.cfg.refresh
		}
		s.refresh = int64(refresh)
	}
	base.watch = s.watch
	s.cur.Store(base)
}

// live returns the contract in force, having first followed a change
// recorded in a memory store (one atomic load per call). On a Redis store
// the record is read in the background (refreshAt); a contract adopted
// meanwhile is in force from the next call. The hot paths inline it as
//
//	c := s.cur.Load()
//	if c.stale() {
//		c = s.liveSlow()
//	}
func (s *Shaper) live() *contract {
	c := s.cur.Load()
	if c.stale() {
		c = s.liveSlow()
	}
	return c
}

// stale reports whether another contract than c may be in force.
func (c *contract) stale() bool { return c.watch.Load() != c.version }

// liveSlow is live past its inlined check.
func (s *Shaper) liveSlow() *contract {
	if s.follows {
		return s.follow()
	}
	return s.cur.Load()
}

// refreshAt starts a read of a Redis store's record in the background
// (readRemote) when the refresh interval has passed at now, the clock
// reading the call was decided at; no caller waits for it, so a Redis
// that does not answer delays nobody. One read is in flight at most.
func (s *Shaper) refreshAt(now time.Time) {
	ns, next := now.UnixNano(), s.nextRead.Load()
	if ns >= next && s.nextRead.CompareAndSwap(next, ns+s.refresh) && s.reading.CompareAndSwap(false, true) {
		s.mu.Lock()
		epoch := s.epoch
		s.mu.Unlock()
		go s.readRemote(epoch)
	}
}

// follow adopts the record of a store that watches it.
func (s *Shaper) follow() *contract {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watch.Load() == s.cur.Load().version { // another caller followed it
		return s.cur.Load()
	}
	if rec, err := s.store.ReadContract(context.Background(), s.cfg.prefix); err == nil {
		_ = s.adopt(rec)
	}
	return s.cur.Load()
}

// current returns the contract in force for Space: on a store whose
// record this shaper reads in the background (Redis), it reads the record
// first, so that a margin is not computed from a contract another process
// has already changed (a SetRate within the refresh interval) and recorded
// fleet-wide on the old interval. Space is rare (a partner refused on
// spacing); the read is one round trip, which the feedback read from every
// response (Learn, Clamp) does not pay. A shaper that never refreshes
// (WithContractRefresh(0)) follows only its own changes, and a failed read
// keeps the contract in force.
func (s *Shaper) current(ctx context.Context) *contract {
	if s.follows || s.refresh <= 0 {
		return s.live()
	}
	s.mu.Lock()
	epoch := s.epoch
	s.mu.Unlock()
	s.readAndAdopt(ctx, epoch)
	return s.live()
}

// readRemote reads a Redis store's record, bounded by the store's timeout,
// and adopts it, unless this shaper changed its contract since the read
// began (epoch): the record read may be older than the change. A read that
// fails (Redis down), or a record this shaper cannot follow, keeps the
// contract in force; the next interval reads again.
func (s *Shaper) readRemote(epoch uint64) {
	defer s.reading.Store(false)
	s.readAndAdopt(context.Background(), epoch)
}

// readAndAdopt reads the store's record and adopts it unless this shaper
// changed its contract since epoch; a failed read keeps the contract.
func (s *Shaper) readAndAdopt(ctx context.Context, epoch uint64) {
	rec, err := s.store.ReadContract(ctx, s.cfg.prefix)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch == epoch {
		_ = s.adopt(rec)
	}
}

// adopt makes rec the contract in force (the configured one when rec was
// made for another, or there is none); the caller holds s.mu.
func (s *Shaper) adopt(rec store.Record) error {
	if rec.Identity != s.identity {
		rec = store.Record{}
	}
	if cur := s.cur.Load(); rec.Version == cur.version && rec.Print() == cur.fields {
		return nil
	}
	c, err := s.build(rec)
	if err != nil {
		return err
	}
	for _, d := range c.dims {
		if d.Bound, err = s.store.Rebind(&d.Dim); err != nil {
			return err
		}
	}
	s.cur.Store(c)
	if s.watch == &s.adopted {
		s.adopted.Store(c.version)
	}
	s.epoch++
	return nil
}

// build returns the contract rec describes: the configured one with rec's
// fields. Nothing is bound yet.
func (s *Shaper) build(rec store.Record) (*contract, error) {
	c := &contract{maxQueue: s.base.maxQueue, version: rec.Version, fields: rec.Print(), watch: s.watch}
	if v, ok := rec.Fields[store.MaxQueueField]; ok {
		ns, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ns < 0 {
			return nil, &ConfigError{Algorithm: "shaper", Field: "MaxQueue", Value: v, Reason: "the store's contract record holds a malformed MaxQueue"}
		}
		c.maxQueue = time.Duration(ns)
	}
	for _, b := range s.base.dims {
		rate := b.rate
		if v, ok := rec.Fields[store.RateField(b.Name)]; ok {
			r, err := decodeRate(v)
			if err != nil {
				return nil, err
			}
			rate = r
		}
		d, err := s.redim(b, rate, c.maxQueue)
		if err != nil {
			return nil, err
		}
		c.dims = append(c.dims, d)
	}
	c.index()
	return c, nil
}

// redim returns configured dimension b at rate and maxQueue, unbound.
func (s *Shaper) redim(b *dim, rate Rate, maxQueue time.Duration) (*dim, error) {
	if err := b.spec.changeable(b.rate, rate); err != nil {
		return nil, err
	}
	d, err := newDim(&s.cfg, Dimension{Name: b.Name, Key: b.key, Cost: b.cost, Algorithm: b.spec}, rate, maxQueue)
	if err != nil {
		return nil, err
	}
	d.Bound = b.Bound
	return d, nil
}

// changeable refuses a live change the algorithm's state cannot follow:
// the window algorithms count per Period, so their Period stays (their
// Count may change). A quota's periods are its cadence's.
func (a Algorithm) changeable(from, to Rate) error {
	switch a.kind {
	case kindFixed, kindSliding, kindLog, kindTrailing:
		if to.Period != from.Period {
			return &ConfigError{Algorithm: a.String(), Field: "Period", Value: to.Period, Reason: fmt.Sprintf("a window algorithm's Period cannot change while it runs (it is %v); change Count, or start a shaper under another name", from.Period)}
		}
	}
	return nil
}

// SetRate changes the rate of the named dimension ("" for a shaper of one
// contract) while the shaper runs: no restart, and no burst at the switch.
// Slots already granted keep their times, and no slot granted after the
// change departs ahead of one granted before it: the key's schedule carries
// over, and a larger burst builds up at the new rate, never at once. On a
// Redis store the change is recorded in Redis, and every shaper of the
// fleet under the same prefix and configured contract follows it within
// its refresh interval (WithContractRefresh). docs/SHAPER.md says how a
// fleet changes its contract, docs/GUARANTEES.md what holds meanwhile. A
// window algorithm's Period cannot change (a *ConfigError); an invalid rate
// is refused as New refuses it; a store that cannot record the change
// fails (ErrStoreUnavailable): nothing changes then.
func (s *Shaper) SetRate(ctx context.Context, dimension string, rate Rate) error {
	if s == nil {
		return errNilShaper
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var b *dim
	for _, d := range s.base.dims {
		if d.Name == dimension {
			b = d
		}
	}
	if b == nil {
		return &ConfigError{Algorithm: "shaper", Field: "Dimension", Value: dimension, Reason: "the shaper has no dimension of that name"}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.redim(b, rate, s.cur.Load().maxQueue); err != nil {
		return err
	}
	return s.change(ctx, store.RateField(dimension), encodeRate(rate))
}

// SetMaxQueue changes the longest wait the shaper grants while it runs, as
// SetRate changes a rate: slots already granted keep their times, and a
// fleet on Redis follows. d < 0 is a *ConfigError.
func (s *Shaper) SetMaxQueue(ctx context.Context, d time.Duration) error {
	if s == nil {
		return errNilShaper
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if d < 0 {
		return &ConfigError{Algorithm: "shaper", Field: "MaxQueue", Value: d, Reason: "must be >= 0"}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cd := range s.cur.Load().dims {
		if _, err := s.redim(cd, cd.rate, d); err != nil {
			return err
		}
	}
	return s.change(ctx, store.MaxQueueField, strconv.FormatInt(int64(d), 10))
}

// change records one field in the store and adopts the record; the caller
// holds s.mu.
func (s *Shaper) change(ctx context.Context, field, value string) error {
	st := startStore(ctx)
	rec, err := s.store.WriteContract(ctx, s.cfg.prefix, s.identity, field, value)
	st.done("set_contract", err)
	if err != nil {
		return err
	}
	s.epoch++ // a read begun before the write may return the record before it
	return s.adopt(rec)
}

// Rate returns the rate in force of the named dimension ("" for a shaper of
// one contract), and false for a name the shaper does not have.
func (s *Shaper) Rate(dimension string) (Rate, bool) {
	if s == nil {
		return Rate{}, false
	}
	for _, d := range s.cur.Load().dims {
		if d.Name == dimension {
			return d.rate, true
		}
	}
	return Rate{}, false
}

func encodeRate(r Rate) string {
	return fmt.Sprintf("%d %d %d", r.Count, int64(r.Period), r.Burst)
}

func decodeRate(v string) (Rate, error) {
	f := strings.Fields(v)
	var n [3]int64
	if len(f) == 3 {
		var err error
		for i := range f {
			if n[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
				break
			}
		}
		if err == nil {
			return Rate{Count: n[0], Period: time.Duration(n[1]), Burst: n[2]}, nil
		}
	}
	return Rate{}, &ConfigError{Algorithm: "shaper", Field: "Rate", Value: v, Reason: "the store's contract record holds a malformed rate"}
}

// once returns a fresh flag for a reservation's copies to share, for a
// contract whose store gives back by the reservation's time (nil for the
// others: the store dedupes them).
func (c *contract) once() *atomic.Bool {
	if !c.gives {
		return nil
	}
	return new(atomic.Bool)
}
