package shaper

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/script"
)

// DefaultContractRefresh is how often a shaper on a RedisStore reads the
// live contract its fleet shares, unless WithContractRefresh says otherwise.
const DefaultContractRefresh = time.Second

// WithContractRefresh sets how often a shaper on a RedisStore reads the
// contract recorded by SetRate and SetMaxQueue in any process of its fleet
// (default DefaultContractRefresh; 0: never, the shaper follows only its own
// changes). The first call of each interval starts the read in the
// background; no caller waits for it. A shaper on a MemoryStore follows a
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
	maxQueue time.Duration
	version  uint64 // the version of the store's record it follows (0: the configured contract)
	fields   string // the record's fields, canonical (see record.print): a record deleted and made anew restarts its version
	// watch is the version in force: a MemoryStore's record version, which
	// any shaper under the prefix may change; on a RedisStore the version
	// this shaper adopted last (liveState.adopted). The contract is in
	// force while it equals version.
	watch *atomic.Uint64
}

// record is a live contract as a store keeps it for the shapers under one
// prefix: the fields that differ from the configured contract it was made
// for. A record made for another configured contract (a fleet redeployed
// with new rates) is ignored, and replaced by the next change.
type record struct {
	version  uint64
	identity string            // the configured contract (Shaper.identity)
	fields   map[string]string // rateField(name) -> "count period-ns burst"; maxQueueField -> ns
}

const maxQueueField = "maxqueue"

func rateField(dimension string) string { return "rate:" + dimension }

// liveState is the Shaper's state for live changes.
type liveState struct {
	base     *contract // as configured
	identity string    // the configured contract, whole
	mu       sync.Mutex
	watch    *atomic.Uint64 // every contract's watch: a MemoryStore's record version for the prefix, or &adopted
	adopted  atomic.Uint64  // a RedisStore: the version of the contract in force
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
		fmt.Fprintf(&id, "%s=%s;", d.name, d.identity)
	}
	s.identity = id.String()
	s.watch = &s.adopted
	switch st := s.store.(type) {
	case *MemoryStore:
		s.watch = st.recordVersion(s.cfg.prefix)
	case *RedisStore:
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
// recorded in a MemoryStore (one atomic load per call). On a RedisStore
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
	if s.mem != nil {
		return s.follow()
	}
	return s.cur.Load()
}

// refreshAt starts a read of a RedisStore's record in the background
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

// follow adopts a MemoryStore's record.
func (s *Shaper) follow() *contract {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watch.Load() == s.cur.Load().version { // another caller followed it
		return s.cur.Load()
	}
	if rec, err := s.store.readContract(context.Background(), s.cfg.prefix); err == nil {
		_ = s.adopt(rec)
	}
	return s.cur.Load()
}

// readRemote reads a RedisStore's record, bounded by the store's timeout,
// and adopts it, unless this shaper changed its contract since the read
// began (epoch): the record read may be older than the change. A read that
// fails (Redis down), or a record this shaper cannot follow, keeps the
// contract in force; the next interval reads again.
func (s *Shaper) readRemote(epoch uint64) {
	defer s.reading.Store(false)
	rec, err := s.store.readContract(context.Background(), s.cfg.prefix)
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
func (s *Shaper) adopt(rec record) error {
	if rec.identity != s.identity {
		rec = record{}
	}
	if cur := s.cur.Load(); rec.version == cur.version && rec.print() == cur.fields {
		return nil
	}
	c, err := s.build(rec)
	if err != nil {
		return err
	}
	for _, d := range c.dims {
		if d.bound, err = s.store.rebind(d); err != nil {
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
func (s *Shaper) build(rec record) (*contract, error) {
	c := &contract{maxQueue: s.base.maxQueue, version: rec.version, fields: rec.print(), watch: s.watch}
	if v, ok := rec.fields[maxQueueField]; ok {
		ns, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ns < 0 {
			return nil, &ConfigError{Algorithm: "shaper", Field: "MaxQueue", Value: v, Reason: "the store's contract record holds a malformed MaxQueue"}
		}
		c.maxQueue = time.Duration(ns)
	}
	for _, b := range s.base.dims {
		rate := b.rate
		if v, ok := rec.fields[rateField(b.name)]; ok {
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
	return c, nil
}

// redim returns configured dimension b at rate and maxQueue, unbound.
func (s *Shaper) redim(b *dim, rate Rate, maxQueue time.Duration) (*dim, error) {
	if err := s.cfg.alg.changeable(b.rate, rate); err != nil {
		return nil, err
	}
	alg, allow, err := s.cfg.alg.build(rate, maxQueue)
	if err != nil {
		return nil, err
	}
	d := *b
	d.alg, d.allow, d.rate, d.maxQueue = alg, allow, rate, maxQueue
	d.identity = fmt.Sprintf("%v %v maxqueue=%v", s.cfg.alg, rate, maxQueue)
	d.setKernels()
	return &d, nil
}

// changeable refuses a live change the algorithm's state cannot follow:
// the window algorithms count per Period, so their Period stays (their
// Count may change). A quota's periods are its cadence's.
func (a Algorithm) changeable(from, to Rate) error {
	switch a.kind {
	case kindFixed, kindSliding, kindLog:
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
// over, so a key that was busy stays busy, the next request departs when
// the old contract would have let it go, and a larger burst builds up at
// the new rate from there, never at once. A shaper that has not
// followed the change yet reads the schedule the same way in its own
// contract, so while a change propagates each slot keeps the interval of
// the shaper that granted it from the slot before. On a RedisStore the
// change is recorded in Redis, and every
// shaper of the fleet under the same prefix and configured contract
// follows it within its refresh interval (WithContractRefresh), processes
// started later included. docs/SHAPER.md says how a fleet changes its
// contract; docs/GUARANTEES.md what holds while it does.
//
// A window algorithm's Period cannot change (a *ConfigError); an invalid
// rate is refused as New refuses it, and a store that cannot record the
// change returns a *StoreError: nothing changes then.
func (s *Shaper) SetRate(ctx context.Context, dimension string, rate Rate) error {
	if s == nil {
		return errNilShaper
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var b *dim
	for _, d := range s.base.dims {
		if d.name == dimension {
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
	return s.change(ctx, rateField(dimension), encodeRate(rate))
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
	return s.change(ctx, maxQueueField, strconv.FormatInt(int64(d), 10))
}

// change records one field in the store and adopts the record; the caller
// holds s.mu.
func (s *Shaper) change(ctx context.Context, field, value string) error {
	st := startStore(ctx)
	rec, err := s.store.writeContract(ctx, s.cfg.prefix, s.identity, field, value)
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
		if d.name == dimension {
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

// merge applies one change to rec as a store does: a record made for
// another configured contract is replaced, and the version grows.
func (rec *record) merge(identity, field, value string) {
	if rec.identity != identity {
		rec.identity, rec.fields = identity, nil
	}
	if rec.fields == nil {
		rec.fields = map[string]string{}
	}
	rec.fields[field] = value
	rec.version++
}

// parseRecord reads a record from a flat list of field, value pairs (Redis
// HGETALL).
func parseRecord(kv []string) (record, error) {
	rec := record{fields: map[string]string{}}
	if len(kv)%2 != 0 {
		return record{}, fmt.Errorf("throttlekit: a contract record of %d items", len(kv))
	}
	for i := 0; i < len(kv); i += 2 {
		switch k, v := kv[i], kv[i+1]; k {
		case "version":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return record{}, fmt.Errorf("throttlekit: a contract record's version %q", v)
			}
			rec.version = n
		case "identity":
			rec.identity = v
		default:
			rec.fields[k] = v
		}
	}
	return rec, nil
}

// memRecord is a MemoryStore's record for one prefix; its version is read
// on every call of the shapers under the prefix.
type memRecord struct {
	ver atomic.Uint64
	mu  sync.Mutex
	rec record
}

// recordOf returns the record of prefix, creating an empty one.
func (m *MemoryStore) recordOf(prefix string) *memRecord {
	m.recMu.Lock()
	defer m.recMu.Unlock()
	if m.records == nil {
		m.records = map[string]*memRecord{}
	}
	r, ok := m.records[prefix]
	if !ok {
		r = &memRecord{}
		m.records[prefix] = r
	}
	return r
}

func (m *MemoryStore) recordVersion(prefix string) *atomic.Uint64 { return &m.recordOf(prefix).ver }

func (m *MemoryStore) readContract(_ context.Context, prefix string) (record, error) {
	r := m.recordOf(prefix)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.clone(), nil
}

func (m *MemoryStore) writeContract(_ context.Context, prefix, identity, field, value string) (record, error) {
	r := m.recordOf(prefix)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec.merge(identity, field, value)
	r.ver.Store(r.rec.version)
	return r.rec.clone(), nil
}

// rebind gives d's namespace d's algorithm: the one every shard's keys of
// the namespace are swept and judged idle by.
func (m *MemoryStore) rebind(d *dim) (any, error) {
	md := d.bound.(*memDim)
	m.nsMu.Lock()
	algs := slices.Clone(*m.algs.Load())
	algs[md.ns] = d.alg
	m.algs.Store(&algs)
	m.nsMu.Unlock()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		if int(md.ns) < len(sh.spaces) && sh.spaces[md.ns] != nil {
			sp := sh.spaces[md.ns]
			sp.alg = d.alg
			if sp.states.states != nil {
				sp.states.alg = d.alg
			}
		}
		sh.mu.Unlock()
	}
	return md, nil
}

// print returns rec's fields in one canonical string: two records with the
// same version are the same change only if they print the same (a record
// deleted from Redis by hand restarts its version at 1).
func (rec record) print() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(rec.fields)) {
		fmt.Fprintf(&b, "%s=%s;", k, rec.fields[k])
	}
	return b.String()
}

// clone returns rec with its own fields.
func (rec record) clone() record {
	out := rec
	out.fields = maps.Clone(rec.fields)
	return out
}

// contractKey is the Redis key of prefix's live contract: the escaped
// prefix and no hash tag, which no state key is (each has one).
func contractKey(prefix string) string { return escape(prefix) + "contract" }

func (r *RedisStore) readContract(ctx context.Context, prefix string) (record, error) {
	if !r.health.isUp() {
		return record{}, errJudgedDown
	}
	return r.contract(ctx, prefix)
}

func (r *RedisStore) writeContract(ctx context.Context, prefix, identity, field, value string) (record, error) {
	rec, err := r.contract(ctx, prefix, identity, field, value)
	if err != nil {
		if e := callerDone(ctx); e != nil {
			return record{}, e
		}
		return record{}, &StoreError{Op: "set_contract", Err: err}
	}
	return rec, nil
}

// contract runs lua.Contract on prefix's record: a read without args, a
// change with them.
func (r *RedisStore) contract(ctx context.Context, prefix string, args ...any) (record, error) {
	var rec record
	err := r.call(ctx, false, func(ctx context.Context) error {
		kv, err := script.Contract.Run(ctx, r.client, []string{contractKey(prefix)}, args...).StringSlice()
		if err != nil {
			return err
		}
		rec, err = parseRecord(kv)
		return err
	})
	return rec, err
}

// rebind formats d's parameters for the scripts, and gives FailLocal's twin
// the new rate at the policy's share.
func (r *RedisStore) rebind(d *dim) (any, error) {
	old, rd := redisOf(d), newRedisDim(d)
	if old.twin == nil {
		return rd, nil
	}
	twin, err := r.atShare(d, *old.twin)
	if err != nil {
		return nil, err
	}
	if twin.bound, err = r.local.rebind(&twin); err != nil {
		return nil, err
	}
	rd.twin = &twin
	return rd, nil
}
