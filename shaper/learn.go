package shaper

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/learn"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/trace"
)

// Learning makes a shaper learn each key's rate from its partner's
// feedback (WithLearning, docs/LEARNING.md). The shaper's own contract
// is the ceiling: a learned rate never exceeds it.
type Learning struct {
	// Floor is the least rate learning tunes a key to (default
	// DefaultLearningFloor, or the contract when that is slower).
	Floor Rate
	// Start is a key's rate before its partner has said anything
	// (default: Floor). It doubles each time the partner is seen
	// accepting it (at most once a second) until the partner refuses a
	// request or states its policy.
	Start Rate
	// Memory is how long the store keeps a key's learned record after
	// its last change, and at least until a statement of the partner's it
	// holds ends (a remaining count's reset, a stated policy); default
	// DefaultLearningMemory. A fleet restarted within it resumes at the
	// rate it had learned.
	Memory time.Duration
}

// DefaultLearningFloor is Learning.Floor's default: one request a second.
var DefaultLearningFloor = PerSecond(1)

// DefaultLearningMemory is Learning.Memory's default.
const DefaultLearningMemory = 24 * time.Hour

// WithLearning makes the shaper learn each key's rate from its partner's
// feedback (Shaper.Learn, which package transport calls for every
// response): the rate the partner states (RateLimit-Policy) is adopted at
// once; a partner that states nothing is probed, the rate tuned by its
// 429s and 503s between l.Floor and the shaper's own contract, which it
// never exceeds. The learned rate is kept in the store, per key, for
// every shaper under the same prefix: a fleet on Redis learns one rate
// and paces by it together.
func WithLearning(l Learning) Option {
	return func(c *config) {
		for _, r := range []struct {
			name string
			rate Rate
		}{{"Learning.Floor", l.Floor}, {"Learning.Start", l.Start}} {
			if r.rate != (Rate{}) && (r.rate.Count <= 0 || r.rate.Period <= 0) {
				c.err = &ConfigError{Algorithm: "shaper", Field: r.name, Value: r.rate, Reason: "needs a Count and a Period > 0 (or the zero Rate for the default)"}
				return
			}
		}
		if l.Memory < 0 {
			c.err = &ConfigError{Algorithm: "shaper", Field: "Learning.Memory", Value: l.Memory, Reason: "must be >= 0"}
			return
		}
		c.learning = &l
	}
}

// Feedback is what a partner's response says of a key; package transport
// reads it from every response (see Shaper.Learn).
type Feedback struct {
	// Departed is when the request departed (zero: now). A refusal of a
	// request that departed before the learned rate last changed says
	// nothing of the rate in force, and changes nothing.
	Departed time.Time
	// Refused says the partner refused the request for its rate: a 429,
	// or GitHub's 403 with Retry-After or nothing left (as
	// transport.Feedback reads it; a 503 is the partner unavailable, which
	// only pauses). A refusal measures the partner's limit (see
	// docs/LEARNING.md); with a Pause, once per pause: the refusals of
	// requests that departed before the pause's end change nothing.
	Refused bool
	// Pause is how long the partner asks everyone to wait (Retry-After,
	// or headers saying nothing remains before their reset).
	Pause time.Duration
	// Policy is the quota per window the partner states (IETF
	// RateLimit-Policy); the zero Rate when it states none.
	Policy Rate
	// Remaining and Reset are the partner's count of requests left until
	// its reset, when HasRemaining. A Remaining of 0 with a Reset pauses
	// the key until the reset (on every shaper, however short a Pause
	// beside it): nothing departs before it.
	Remaining    int64
	Reset        time.Duration
	HasRemaining bool
}

// Learner is the capability of a Reserver that takes its partner's
// feedback: *Shaper, and Route and otelshaper.Wrap over one.
type Learner interface {
	Learn(ctx context.Context, key string, fb Feedback) error
}

var _ Learner = (*Shaper)(nil)

// Learned is what a shaper WithLearning learned of a key (Status.Learned).
type Learned struct {
	// Rate is the rate in force, in requests per second.
	Rate float64
	// Found is the rate the partner was last found (a refusal) or said
	// (a policy) to accept (0: not yet known: the rate doubles each time
	// the partner is seen accepting it, until a refusal or a policy); the
	// rate then holds 0.97 of a rate found, all of a rate said, and rises
	// past it only as the partner's answers show each step accepted.
	Found float64
	// Policy is the rate the partner states, while its statement holds
	// (0: none).
	Policy float64
	// Event is what last changed the rate: "started", "refused",
	// "advertised", "remaining", "paused" or "probed" (a step up the
	// partner's answers warranted); "none" before the key's first
	// reservation or feedback.
	Event string
	// Changed is when it changed, on the shaper's clock (for "paused",
	// the pause's end: the rate resumes from it).
	Changed time.Time
}

// The learning's cadence: how often a process reads its fleet's record
// and renews the clamp the rate makes, and how long that clamp lasts
// beyond the furthest slot it can hold (learnedClamp).
const (
	learnEvery     = 250 * time.Millisecond
	learnClampSpan = 10 * time.Second
	learnRetry     = time.Second // after a failed store call
)

// learner is a learning shaper's state: per key, what this process holds
// of the fleet's record.
type learner struct {
	cfg   Learning
	ttl   float64 // ms
	keys  sync.Map
	count atomic.Int64 // entries made since the last sweep
}

// learnedKey is one key's: the record last read or written, the next
// instant to read it again, and this process's last responses.
type learnedKey struct {
	next atomic.Int64 // unix ns: the next sync
	used atomic.Int64 // unix ns: the last reservation
	mu   sync.Mutex
	st   learn.State
	// The gate: the requests of this process holding a slot not yet
	// come (out), and those waiting to take one, first come first served.
	gmu   sync.Mutex
	out   int
	limit int // the last limit computed (this process's share of gateSpan at the learned rate)
	queue []chan struct{}
	// This process's tallies of the partner's answers by departure
	// bucket (store.TallyWidth): mine, its own of the last
	// store.TallyLife; pend, those not yet added to the fleet's.
	mine map[int64]store.Tally
	pend map[int64]store.Tally
	// fleet is the fleet's tallies as the last store call read them: the
	// probe's evidence (learnEvidence).
	fleet []store.Tally
}

// record counts a response to a request that departed at dep (ms).
func (lk *learnedKey) record(dep float64, ok bool) {
	b := int64(dep / store.TallyWidth)
	if lk.mine == nil {
		lk.mine, lk.pend = map[int64]store.Tally{}, map[int64]store.Tally{}
	}
	for _, m := range []map[int64]store.Tally{lk.mine, lk.pend} {
		t := m[b]
		t.Bucket = b
		t.Answered++
		if ok {
			t.Accepted++
		}
		m[b] = t
	}
	lk.prune(int64((dep - store.TallyLife) / store.TallyWidth))
}

// prune forgets the tallies of the buckets before oldest: the store keeps
// none older (while it cannot be reached, pend would grow otherwise).
func (lk *learnedKey) prune(oldest int64) {
	for _, m := range []map[int64]store.Tally{lk.mine, lk.pend} {
		for k := range m {
			if k < oldest {
				delete(m, k)
			}
		}
	}
}

// drain returns the tallies not yet added to the fleet's, and forgets
// them (undrain puts them back when the store call fails).
func (lk *learnedKey) drain() []store.Tally {
	if len(lk.pend) == 0 {
		return nil
	}
	out := make([]store.Tally, 0, len(lk.pend))
	for _, t := range lk.pend {
		out = append(out, t)
	}
	clear(lk.pend)
	return out
}

func (lk *learnedKey) undrain(ts []store.Tally) {
	for _, t := range ts {
		p := lk.pend[t.Bucket]
		p.Bucket, p.Accepted, p.Answered = t.Bucket, p.Accepted+t.Accepted, p.Answered+t.Answered
		lk.pend[t.Bucket] = p
	}
}

// countSlack is how far low acceptedRate takes the fleet's count of
// accepted answers to read at most.
const countSlack = 1.3

// acceptedRate measures the partner for a refusal of a request that
// departed at dep, ms: the rate it accepted, fleet-wide, in the second
// that ended two buckets before dep's bucket began, read from the store
// with this process's answers added (this process's own when the store
// cannot answer); -1 with fewer than learn.MinSample answers. Where one
// learned rate was in force throughout that second, the rate is the share
// of the answers that were accepted times that rate, between the accepted
// count and countSlack times it: a partner that refuses is overloaded, so
// the fleet was sending at the rate in force, and the share holds where
// the count reads low (answers of other processes not yet added, or not
// yet come back; a refusal at 20.4/s against a limit of 20 found 14, and
// each such refusal dropped the rate a third below the limit). Where a
// probe's step of at most 1.41 overran after the probe had climbed past
// the limit found last, and the second was sent before the step (or
// mostly) and all accepted, the rate is the geometric middle of the rates
// before and at the step, at least the count.
func (s *Shaper) acceptedRate(ctx context.Context, l *store.Learned, lk *learnedKey, dep, ms float64, p learn.Params) float64 {
	to := int64(dep/store.TallyWidth) - 3
	from := to - int64(1000/store.TallyWidth) + 1
	add := lk.drain()
	_, ts, err := s.store.Learn(context.WithoutCancel(ctx), l, &store.LearnOp{Now: ms, Want: learn.ReadOnly, Add: add, From: max(from, 1)})
	if err != nil {
		lk.undrain(add)
		ts = make([]store.Tally, 0, len(lk.mine))
		for _, t := range lk.mine {
			ts = append(ts, t)
		}
	}
	var accepted, answered int64
	for _, t := range ts {
		if t.Bucket >= from && t.Bucket <= to {
			accepted += t.Accepted
			answered += t.Answered
		}
	}
	if answered < learn.MinSample {
		return -1
	}
	counted := float64(accepted) * 1000 / (float64(to-from+1) * store.TallyWidth)
	st := &lk.st
	start, end := float64(from)*store.TallyWidth, float64(to+1)*store.TallyWidth
	if f := learn.ProbeFactor(st.Step); st.Event == learn.Probed && st.Step > 0 && f <= math.Sqrt2 && st.Max > 0 && st.T0 > start && accepted == answered {
		// A probe's step overran, and the second measured was sent
		// before it, or mostly: it reads the rate before the step, which
		// the partner took in full. Where the probe had climbed past the
		// limit found last (the partner's limit rose), that limit lies
		// between the two rates: the middle, not the lower end (a fleet
		// climbing 46.9 -> 66.4/s against a limit raised to 60 found
		// 47 and stayed at 76 % of it for the phase).
		if before := st.Base / f; before > (1+learn.Same)*st.Max {
			return max(counted, math.Sqrt(before*st.Base))
		}
	}
	if st.Event != learn.None && st.T0 <= start {
		// One rate in force throughout the second (or rising to its end,
		// recovering): the share of it the partner accepted.
		// The count may read up to ~30 % low; the share times the rate
		// reads high when the fleet sent less than the rate (its
		// callers' demand, slots still to come): the lower of the two.
		return max(counted, min(float64(accepted)/float64(answered)*st.Rate(end, p), countSlack*counted))
	}
	return counted
}

// learnEvidence is what the fleet's tallies, as the last store call read
// them, say of the rate in force at ms (learn.State.Probe): the answers to
// the requests that departed in the buckets from ProbeFrom (whole buckets)
// to the one three before ms's (the other processes have added theirs),
// at most 2 s of them and as many as make learn.MinSample at the rate (at
// least 2).
func learnEvidence(lk *learnedKey, st *learn.State, ms float64, p learn.Params) learn.Evidence {
	start, ok := st.ProbeFrom(ms)
	if !ok {
		return learn.Evidence{}
	}
	r := st.Rate(ms, p)
	n := int64(min(max(math.Ceil(learn.MinSample/r*1000/store.TallyWidth), 2), 8))
	if st.Max > 0 && st.Step > 0 && r < 1.5*st.Max {
		// A step near the limit found last: 2 s of answers, so that a
		// partner's burst absorbing the step's small excess for a second
		// does not pass for acceptance (a 5-request bucket at 40/s took
		// 1.1x for 1.9 s, and the next step drew 10 refusals).
		n = 8
	}
	to := int64(ms/store.TallyWidth) - 3
	from := max(to-n+1, int64(math.Ceil(start/store.TallyWidth)))
	if from > to {
		return learn.Evidence{}
	}
	ev := learn.Evidence{From: float64(from) * store.TallyWidth, To: float64(to+1) * store.TallyWidth}
	for _, t := range lk.fleet {
		if t.Bucket >= from && t.Bucket <= to {
			ev.Accepted += t.Accepted
			ev.Answered += t.Answered
		}
	}
	if float64(ev.Answered) < float64(n)*store.TallyWidth/1000*r/2 {
		return learn.Evidence{} // too short a window for the rate: wait for more
	}
	return ev
}

func newLearner(l *Learning) *learner {
	cfg := *l
	if cfg.Floor == (Rate{}) {
		cfg.Floor = DefaultLearningFloor
	}
	if cfg.Start == (Rate{}) {
		cfg.Start = cfg.Floor
	}
	if cfg.Memory == 0 {
		cfg.Memory = DefaultLearningMemory
	}
	return &learner{cfg: cfg, ttl: algorithms.DurationMillis(cfg.Memory)}
}

// perSecond is r's rate per second.
func perSecond(r Rate) float64 { return float64(r.Count) / r.Period.Seconds() }

// params are the learning's bounds under contract c: its ceiling is the
// slowest of c's dimensions, in requests of cost 1.
func (l *learner) params(c *contract) learn.Params {
	ceil := contractRate(c)
	if math.IsInf(ceil, 1) {
		ceil = math.MaxFloat64
	}
	floor := min(perSecond(l.cfg.Floor), ceil)
	return learn.Params{Floor: floor, Ceiling: ceil, Start: min(max(perSecond(l.cfg.Start), floor), ceil)}
}

// sweepEvery is how many new entries pass between sweeps of the entries
// unused for learnIdle (their record stays in the store).
const (
	sweepEvery = 1024
	learnIdle  = time.Minute
)

func (l *learner) key(key string, now time.Time) *learnedKey {
	if v, ok := l.keys.Load(key); ok {
		lk := v.(*learnedKey)
		lk.used.Store(now.UnixNano())
		return lk
	}
	lk := &learnedKey{}
	lk.used.Store(now.UnixNano())
	v, loaded := l.keys.LoadOrStore(key, lk)
	if !loaded && l.count.Add(1)%sweepEvery == 0 {
		idle := now.Add(-learnIdle).UnixNano()
		l.keys.Range(func(k, v any) bool {
			if o := v.(*learnedKey); o != lk && o.used.Load() < idle {
				l.keys.CompareAndDelete(k, v)
			}
			return true
		})
	}
	return v.(*learnedKey)
}

// learnSync keeps key's clamp at the learned rate before a reservation:
// every learnEvery it reads the fleet's record and renews the clamp (one
// store call); between, it costs a map lookup.
func (s *Shaper) learnSync(ctx context.Context, c *contract, key string, now time.Time) {
	lk := s.learner.lockDue(key, now)
	if lk == nil {
		return
	}
	defer lk.mu.Unlock()
	_, _ = s.learnUpdate(ctx, c, key, lk, now, nil, false)
}

// lockDue returns key's learning state locked when its renewal is due at
// now, or nil (unlocked) when it is not: a map lookup between renewals.
func (l *learner) lockDue(key string, now time.Time) *learnedKey {
	lk := l.key(key, now)
	if now.UnixNano() < lk.next.Load() {
		return nil
	}
	lk.mu.Lock()
	if now.UnixNano() < lk.next.Load() {
		lk.mu.Unlock()
		return nil
	}
	return lk
}

// learnPeek is learnSync for Status: the clamp renewed when due, as the
// reservation right after would renew it, so that Status reads the slot
// that reservation gets. A key the fleet has no record of gets none (the
// reservation starts it, its clamp's first slot at once, as Status reads
// the key unclamped): Status writes no record.
func (s *Shaper) learnPeek(ctx context.Context, c *contract, key string, now time.Time) {
	lk := s.learner.lockDue(key, now)
	if lk == nil {
		return
	}
	defer lk.mu.Unlock()
	if lk.st.Event == learn.None {
		ks, err := s.keysOf(c, key)
		if err != nil {
			return
		}
		cur, _, err := s.store.Learn(context.WithoutCancel(ctx), &store.Learned{Base: s.cfg.prefix, Key: key, KeySet: ks}, &store.LearnOp{Now: algorithms.Millis(now), Want: learn.ReadOnly})
		if err != nil || cur == "" {
			return
		}
		if st, err := learn.Parse(cur); err == nil {
			lk.st = st
		} // a corrupt record: replaced, as the reservation would
	}
	_, _ = s.learnUpdate(ctx, c, key, lk, now, nil, false)
}

// learnUpdate applies f (nil: nothing) to key's record at now and writes
// it back with the clamp its rate makes, when the record is still the one
// this process read; otherwise it adopts the fleet's record and applies f
// again. With reset it resets key's state keys but their clamps in the
// same store call (store.LearnOp.Reset). The probe steps up as the
// fleet's answers, read at the last call, show the rate accepted
// (learnEvidence), written with the next call. It reports whether f or
// the probe changed the record. lk.mu is held.
func (s *Shaper) learnUpdate(ctx context.Context, c *contract, key string, lk *learnedKey, now time.Time, f func(*learn.State) bool, reset bool) (bool, error) {
	ks, err := s.keysOf(c, key)
	if err != nil {
		return false, err
	}
	p := s.learner.params(c)
	ms := algorithms.Millis(now)
	l := &store.Learned{Base: s.cfg.prefix, Key: key, KeySet: ks}
	var last error
	for range 4 {
		st, fresh := lk.st, false
		if st.Event == learn.None {
			st, fresh = learn.Start(lk.st.Ver, ms, p), true
		}
		changed := f != nil && f(&st)
		changed = st.Probe(ms, learnEvidence(lk, &st, ms, p), p) || changed
		rec := ""
		if changed || fresh {
			rec = st.String()
		}
		if rec == "" && !reset && now.UnixNano() < lk.next.Load() {
			return false, nil // nothing to write, and the clamp is fresh
		}
		rate := st.Rate(ms, p)
		cl := learnedClamp(c, ms, 1000/rate+marginMs(c, st.MarginAt(ms), rate))
		add := lk.drain()
		from := max(int64((ms-store.TallyLife)/store.TallyWidth), 1) // every tally the store keeps: the probe's evidence
		// The record lives Memory after its last change, and at least as
		// long as a statement of the partner's it holds (a remaining count
		// until its reset, a policy): forgotten before, the key would
		// start afresh above what the partner said it allows.
		ttl := max(s.learner.ttl, st.CapEnd-ms, st.PolicyEnd-ms)
		cur, ts, err := s.store.Learn(context.WithoutCancel(ctx), l, &store.LearnOp{Now: ms, Want: lk.st.Ver, Rec: rec, TTL: ttl, Clamp: cl, Add: add, From: from, Reset: reset})
		if err != nil {
			lk.undrain(add)
			lk.next.Store(now.Add(learnRetry).UnixNano())
			return false, err
		}
		lk.fleet = ts
		if (rec == "" && learn.Version(cur) == st.Ver) || (rec != "" && cur == rec) {
			lk.st = st
			lk.next.Store(now.Add(learnEvery).UnixNano())
			return changed, nil
		}
		// Another process changed the record: adopt it and try again.
		got, perr := learn.Parse(cur)
		if perr != nil {
			got = learn.State{Ver: learn.Version(cur)} // a corrupt record is replaced
			last = fmt.Errorf("%w: key %q: %v", ErrInvalidState, key, perr)
		}
		lk.st = got
	}
	lk.next.Store(now.Add(learnEvery).UnixNano())
	if last == nil {
		last = fmt.Errorf("%w: key %q: the learned record kept changing under this process", ErrInvalidState, key)
	}
	return false, last
}

// learnedClamp is the clamp a learned interval (ms) sets at ms under
// contract c. It outlasts the next slot it can hold: a slot is granted at
// most c.maxQueue ahead, by a process that renewed the clamp at most
// learnEvery before, and the next one is an interval after it. A clamp
// that ended before the next slot its departures made would release that
// slot at its end (and its renewal would start it afresh): a slow policy
// would leak a departure every span.
func learnedClamp(c *contract, ms, interval float64) *store.LearnClamp {
	return &store.LearnClamp{Now: ms, Interval: interval, Span: algorithms.DurationMillis(learnClampSpan+c.maxQueue) + interval}
}

// marginMs is the margin the learned clamp keeps, in ms, for a margin of
// m ms in the key's record (Space) and a learned rate of rate per second
// under contract c: none on a burst contract or a rate faster than
// MinSpacedInterval, at most a tenth of the learned interval.
func marginMs(c *contract, m, rate float64) float64 {
	if !(m > 0) || !strict(c) {
		return 0
	}
	interval := time.Duration(float64(time.Second) / rate)
	if interval < MinSpacedInterval {
		return 0
	}
	return min(m, algorithms.DurationMillis(interval/10))
}

// strict reports whether every dimension of contract c has a burst of 1.
func strict(c *contract) bool {
	for _, d := range c.dims {
		if d.rate.burst() > 1 {
			return false
		}
	}
	return true
}

// Learn takes a partner's feedback on key (see Feedback; package transport
// calls it for every response). On a shaper WithLearning it updates the
// key's learned rate, fleet-wide: a stated policy is adopted, a refusal
// lowers the rate to what the partner was found to accept, a pause
// holds the key and the rate resumes from where it was, paced, not in a
// burst. Any shaper pauses the key for fb.Pause (see Pause; a burst
// contract resumes paced at its rate for as long as the pause lasted, at
// least a second, unless a count the partner stated spaces it further
// apart) and clamps it to the remaining count (see Clamp); none
// remaining pauses it until the reset.
// Feedback only ever slows a key below the shaper's contract.
func (s *Shaper) Learn(ctx context.Context, key string, fb Feedback) error {
	if s == nil {
		return errNilShaper
	}
	if err := checkKey(key); err != nil {
		return err
	}
	if fb.Pause < 0 || fb.Reset < 0 || fb.Remaining < 0 {
		return &ConfigError{Algorithm: "shaper", Field: "Feedback", Value: fb, Reason: "Pause, Reset and Remaining must be >= 0"}
	}
	if fb.Policy != (Rate{}) && (fb.Policy.Count <= 0 || fb.Policy.Period <= 0) {
		return &ConfigError{Algorithm: "shaper", Field: "Feedback.Policy", Value: fb.Policy, Reason: "needs a Count and a Period > 0 (or the zero Rate for none)"}
	}
	pause := min(fb.Pause, MaxPause)
	if s.learner == nil || s.rateless {
		return s.plainFeedback(ctx, key, fb, pause)
	}
	if fb.HasRemaining && fb.Remaining == 0 && fb.Reset > 0 {
		// Nothing left until the reset: a pause until it, fleet-wide (as
		// Clamp's remaining <= 0 and a shaper that does not learn), not a
		// rate of one per reset.
		pause = max(pause, min(fb.Reset, MaxPause))
	}
	now := s.cfg.clock.Now()
	ms := algorithms.Millis(now)
	dep := ms
	if !fb.Departed.IsZero() {
		dep = algorithms.Millis(fb.Departed)
	}
	c := s.live()
	p := s.learner.params(c)
	lk := s.learner.key(key, now)
	lk.mu.Lock()
	lk.record(dep, !fb.Refused)
	before := lk.st
	ks, err := s.keysOf(c, key)
	if err != nil {
		lk.mu.Unlock()
		return err
	}
	l := &store.Learned{Base: s.cfg.prefix, Key: key, KeySet: ks}
	accepted, measured := -1.0, false
	_, err = s.learnUpdate(ctx, c, key, lk, now, func(st *learn.State) bool {
		changed := false
		if fb.Policy != (Rate{}) {
			life := max(2*fb.Policy.Period, time.Minute)
			changed = st.Advertise(ms, perSecond(fb.Policy), ms+algorithms.DurationMillis(life), p) || changed
		}
		// A count is kept even where the contract binds before it: a live
		// SetRate may lift the contract past it before its reset. Capped
		// writes a count no tighter than the one in force, and ending no
		// later, not again: about one write per partner window.
		if fb.HasRemaining && fb.Reset > 0 {
			changed = st.Capped(ms, float64(fb.Remaining), algorithms.DurationMillis(min(fb.Reset, MaxPause)), p) || changed
		}
		if fb.Refused && st.Event != learn.None && dep >= st.HoldFrom && !(st.Event == learn.Refused && dep < st.T0+learn.Hold) {
			if !measured { // one read, however often the record changes under us
				accepted, measured = s.acceptedRate(ctx, l, lk, dep, ms, p), true
			}
			changed = st.Refuse(ms, dep, accepted, p) || changed
		}
		if pause > 0 {
			changed = st.Pause(ms, algorithms.DurationMillis(pause), p) || changed
		}
		return changed
	}, false)
	after := lk.st
	lk.mu.Unlock()
	if h := trace.From(ctx); h != nil && h.Learned != nil && after.Ver != before.Ver {
		h.Learned(ctx, key, after.Rate(ms, p), after.Event.String())
	}
	if pause > 0 {
		return s.Pause(context.WithoutCancel(ctx), key, pause)
	}
	return err
}

// learnCap is Clamp on a shaper WithLearning: the remaining count caps
// key's learned rate until the reset, in the record the fleet shares, so
// that the learned clamp, renewed every learnEvery, carries it instead of
// replacing it.
func (s *Shaper) learnCap(ctx context.Context, c *contract, key string, remaining int64, reset time.Duration) error {
	now := s.cfg.clock.Now()
	ms := algorithms.Millis(now)
	p := s.learner.params(c)
	lk := s.learner.key(key, now)
	lk.mu.Lock()
	defer lk.mu.Unlock()
	_, err := s.learnUpdate(ctx, c, key, lk, now, func(st *learn.State) bool {
		return st.Capped(ms, float64(remaining), algorithms.DurationMillis(reset), p)
	}, false)
	return err
}

// learnSpace is Space on a shaper WithLearning: the margin goes into
// key's learned record, which every process's renewal of the learned
// clamp reads (its interval carries the margin, by the learned interval:
// marginMs), and the clamp is renewed with it in the same store call. The
// widest margin in force holds (learn.State.Space).
func (s *Shaper) learnSpace(ctx context.Context, c *contract, key string, margin time.Duration, now time.Time) error {
	if margin <= 0 || !strict(c) {
		return nil
	}
	if _, err := s.keysOf(c, key); err != nil {
		return err
	}
	ms := algorithms.Millis(now)
	m, end := algorithms.DurationMillis(margin), ms+algorithms.DurationMillis(MarginSpan)
	lk := s.learner.key(key, now)
	lk.mu.Lock()
	defer lk.mu.Unlock()
	tr := startStore(ctx)
	_, err := s.learnUpdate(ctx, c, key, lk, now, func(st *learn.State) bool { return st.Space(ms, m, end) }, false)
	tr.done("clamp", err)
	return err
}

// learnReset is Reset on a shaper WithLearning: key's schedule and pause
// go, in the same store call that renews the learned rate's clamp, which
// stays throughout: the key departs at its learned rate right after it,
// its spacing unbroken, never at the contract's.
func (s *Shaper) learnReset(ctx context.Context, c *contract, key string) error {
	now := s.cfg.clock.Now()
	lk := s.learner.key(key, now)
	lk.mu.Lock()
	defer lk.mu.Unlock()
	_, err := s.learnUpdate(ctx, c, key, lk, now, nil, true)
	return err
}

// plainFeedback is Learn on a shaper that does not learn: a pause, then
// the remaining count as a clamp; with none remaining, a pause until the
// reset, however short the pause asked for.
func (s *Shaper) plainFeedback(ctx context.Context, key string, fb Feedback, pause time.Duration) error {
	ctx = context.WithoutCancel(ctx)
	if pause > 0 {
		if err := s.Pause(ctx, key, pause); err != nil {
			return err
		}
		if err := s.resumePaced(ctx, key, pause); err != nil {
			return err
		}
	}
	if fb.HasRemaining && !s.rateless && (pause <= 0 || fb.Remaining == 0) {
		return s.Clamp(ctx, key, fb.Remaining, min(fb.Reset, MaxPause)) // remaining 0: a pause until the reset
	}
	return nil
}

// resumePaced keeps a burst contract from releasing its burst when a
// partner's pause of d ends: for as long as the pause (at least a
// second) after it, departures are spaced at the contract's interval.
func (s *Shaper) resumePaced(ctx context.Context, key string, d time.Duration) error {
	if s.rateless {
		return nil
	}
	c := s.live()
	bursty := false
	for _, dm := range c.dims {
		bursty = bursty || dm.rate.burst() > 1
	}
	if !bursty {
		return nil // strict pacing already: nothing departs in a burst
	}
	span := d + max(d, time.Second)
	if span > MaxPause {
		return nil
	}
	rate := contractRate(c)
	n := int64(math.Floor(rate * span.Seconds()))
	if n < 1 {
		return nil
	}
	return s.clamp(ctx, key, n, span, true) // a partner's tighter count stays
}

// contractRate is the rate, per second, of requests of cost 1 the
// contract c allows (its slowest dimension; +Inf with none).
func contractRate(c *contract) float64 {
	r := math.Inf(1)
	for _, d := range c.dims {
		r = min(r, perSecond(d.rate))
	}
	return r
}

// learned returns what the shaper learned of key, for Status: the
// record this process holds, read again from the store (one read that
// writes nothing).
func (s *Shaper) learned(ctx context.Context, c *contract, key string) (*Learned, error) {
	if s.learner == nil {
		return nil, nil
	}
	now := s.cfg.clock.Now()
	ms := algorithms.Millis(now)
	ks, err := s.keysOf(c, key)
	if err != nil {
		return nil, err
	}
	lk := s.learner.key(key, now)
	lk.mu.Lock()
	defer lk.mu.Unlock()
	cur, _, err := s.store.Learn(ctx, &store.Learned{Base: s.cfg.prefix, Key: key, KeySet: ks}, &store.LearnOp{Now: ms, Want: learn.ReadOnly})
	if err != nil {
		return nil, err
	}
	p := s.learner.params(c)
	if st, err := learn.Parse(cur); err == nil {
		lk.st = st
	}
	st := lk.st
	out := &Learned{Rate: st.Rate(ms, p), Found: st.Max, Event: st.Event.String()}
	if st.Event == learn.Advertised {
		out.Found = st.Policy // Max is the policy over learn.Keep: the plateau holds the policy itself
	}
	if st.Event == learn.None {
		out.Event = "none"
		return out, nil
	}
	if st.Policy > 0 && ms < st.PolicyEnd {
		out.Policy = st.Policy
	}
	out.Changed = algorithms.Time(st.T0)
	return out, nil
}

// String describes l for logs.
func (l *Learned) String() string {
	if l == nil {
		return "not learning"
	}
	return fmt.Sprintf("%.4g/s (%s at %s)", l.Rate, l.Event, l.Changed.Format(time.RFC3339Nano))
}

// gateSpan is how far ahead a learning key's requests take their slots,
// fleet-wide: a rate learned lower applies within it.
const gateSpan = 200 * time.Millisecond

// gate waits until key has fewer slots taken and not yet come in this
// process than its share (lk.share) of gateSpan's worth at the learned
// rate (at least 1), and returns the call that
// lets the next request in. A wait the learned rate says would pass
// MaxQueue or ctx's deadline is refused at once, as a reservation's
// would be.
func (l *learner) gate(ctx context.Context, s *Shaper, key string) (func(), error) {
	now := s.cfg.clock.Now()
	lk := l.key(key, now)
	ms := algorithms.Millis(now)
	c := s.live()
	// The fleet's record, read again when due: the gate admits by the
	// rate in force, not by the one this process read last.
	s.learnSync(ctx, c, key, now)
	lk.mu.Lock()
	rate := lk.st.Rate(ms, l.params(c))
	share := lk.share(ms)
	lk.mu.Unlock()
	limit := max(1, int(math.Ceil(rate*share*gateSpan.Seconds())))
	lk.gmu.Lock()
	lk.limit = limit
	lk.admitLocked()
	if lk.out < limit && len(lk.queue) == 0 {
		lk.out++
		lk.gmu.Unlock()
		return lk.leave, nil
	}
	// The requests ahead leave at the learned rate at best.
	ahead := time.Duration(float64(lk.out+len(lk.queue)) / rate * float64(time.Second))
	if ahead > c.maxQueue {
		lk.gmu.Unlock()
		return nil, s.queueFull(c, key, ahead-c.maxQueue, "")
	}
	if dl, ok := ctx.Deadline(); ok && ahead > time.Until(dl) { // a deadline is on the real clock, as acquire reads it
		lk.gmu.Unlock()
		return nil, &DeadlineError{Key: key, Delay: ahead, Deadline: dl}
	}
	ch := make(chan struct{})
	lk.queue = append(lk.queue, ch)
	lk.gmu.Unlock()
	select {
	case <-ch: // admitted: out counts us already
		return lk.leave, nil
	case <-ctx.Done():
		lk.gmu.Lock()
		defer lk.gmu.Unlock()
		if i := slices.Index(lk.queue, ch); i >= 0 {
			lk.queue = slices.Delete(lk.queue, i, i+1)
			return nil, ctx.Err()
		}
		// Admitted as ctx ended: pass the place on.
		lk.leaveLocked()
		return nil, ctx.Err()
	}
}

// share is this process's share of the fleet's answers on the key in the
// last 2 s whose tallies every process has added (1 with fewer than
// learn.MinSample answers: a process alone, or a key just started), so
// that the fleet, not each process, holds gateSpan of slots: a fleet of
// four each holding gateSpan's worth held 0.8 s of slots at 20/s, all
// sent at the old rate after a refusal, and a process's answers came in
// bunches 0.8 s apart, after the second a refusal measures (acceptedRate)
// had been read without them. lk.mu is held.
func (lk *learnedKey) share(ms float64) float64 {
	to := int64(ms/store.TallyWidth) - 3
	from := to - int64(2000/store.TallyWidth) + 1
	var mine, fleet int64
	for _, t := range lk.fleet {
		if t.Bucket >= from && t.Bucket <= to {
			fleet += t.Answered
		}
	}
	for b, t := range lk.mine {
		if b >= from && b <= to {
			mine += t.Answered
		}
	}
	if fleet < learn.MinSample || mine >= fleet {
		return 1
	}
	return float64(mine) / float64(fleet)
}

// leave lets the next request of the gate in.
func (lk *learnedKey) leave() {
	lk.gmu.Lock()
	lk.leaveLocked()
	lk.gmu.Unlock()
}

func (lk *learnedKey) leaveLocked() {
	lk.out--
	lk.admitLocked()
}

// admitLocked lets waiting requests in while fewer than the limit hold a
// slot (the limit grows with the learned rate).
func (lk *learnedKey) admitLocked() {
	for lk.out < max(lk.limit, 1) && len(lk.queue) > 0 {
		ch := lk.queue[0]
		lk.queue = lk.queue[1:]
		lk.out++
		close(ch)
	}
}

// MarginSpan is how long a margin set by Space holds: a caller renews it
// (package transport does, every MarginSpan/2 while it sends on the key).
const MarginSpan = time.Minute

// Spacer is the capability of a Reserver that keeps a margin between
// departures (see Shaper.Space): *Shaper, and Route and otelshaper.Wrap
// over one.
type Spacer interface {
	Space(ctx context.Context, key string, margin time.Duration) error
}

var _ Spacer = (*Shaper)(nil)

// Space keeps key's departures at least the contract's interval plus
// margin apart, fleet-wide, for MarginSpan: a partner that measures the
// spacing of its arrivals strictly (a leaky bucket with no burst, such as
// nginx's limit_req) then never sees two requests closer than the
// interval, although each departure is a little late (timer wake-up,
// the HTTP client) and a late departure followed by an on-time one would
// otherwise arrive too close. The margin is at most a tenth of the
// interval. It applies to a strict contract only (every dimension a
// LeakyBucket, GCRA or TokenBucket of burst 1) of at least
// MinSpacedInterval (50/s or slower); a burst contract tolerates the
// lateness already, a window algorithm counts no spacing, and Space does
// nothing to either. It
// never loosens a partner's clamp in force (see Clamp). On a shaper
// WithLearning the margin goes into the key's learned record, fleet-wide,
// and the learned rate's clamp carries it, by the learned interval, in
// every process, from the call: the widest margin asked within MarginSpan
// holds.
// Package transport calls it for every key it sends on
// (transport.WithSpacingMargin).
func (s *Shaper) Space(ctx context.Context, key string, margin time.Duration) error {
	if s == nil {
		return errNilShaper
	}
	if err := checkKey(key); err != nil {
		return err
	}
	if margin < 0 {
		return &ConfigError{Algorithm: "shaper", Field: "Space", Value: margin, Reason: "the margin must be >= 0"}
	}
	if s.rateless {
		return nil
	}
	c := s.current(ctx)
	now := s.cfg.clock.Now()
	if s.learner != nil {
		return s.learnSpace(ctx, c, key, margin, now)
	}
	interval, ok := strictInterval(c)
	if !ok {
		return nil
	}
	m := min(margin, interval/10)
	if m <= 0 {
		return nil
	}
	ks, err := s.keysOf(c, key)
	if err != nil {
		return err
	}
	ms := algorithms.Millis(now)
	st := startStore(ctx)
	_, _, err = s.store.Learn(ctx, &store.Learned{Base: s.cfg.prefix, Key: key, KeySet: ks}, &store.LearnOp{Now: ms,
		Clamp: &store.LearnClamp{Now: ms, Interval: algorithms.DurationMillis(interval + m), Span: algorithms.DurationMillis(MarginSpan), Tighter: true}})
	st.done("clamp", err)
	return err
}

// MinSpacedInterval is the shortest interval Space keeps a margin on: a
// partner that measures arrivals in whole milliseconds cannot hold a
// faster contract strictly (a millisecond of lateness is a tenth of it),
// and a margin there would cost a tenth of the rate for nothing.
const MinSpacedInterval = 20 * time.Millisecond

// strictInterval is the interval between requests of cost 1 contract c
// allows, when every dimension is strict (the leaky bucket, GCRA or the
// token bucket, burst 1) and it is at least MinSpacedInterval.
func strictInterval(c *contract) (time.Duration, bool) {
	var longest time.Duration
	for _, d := range c.dims {
		if d.rate.burst() > 1 || d.Kern == nil && d.spec.kind != kindToken { // a burst, or a window algorithm: not spaced strictly
			return 0, false
		}
		longest = max(longest, d.rate.Period/time.Duration(d.rate.Count))
	}
	return longest, longest >= MinSpacedInterval
}
