package gcra

import (
	"math"
	"slices"
)

// A Ledger is what a key of the GCRA family keeps, beside its TAT, once a
// reservation on it has been cancelled or settled: enough to give back what
// a reservation did not use without ever letting the key's departures break
// the contract. Keys that never settle or cancel have none and pay nothing.
//
// # The rule
//
// Replay a key's departures in time order, each with its cost c at its
// instant t, through GCRA: R = max(R, t - ex) + T*c, where ex = max(0, T*c
// - tau) spreads a cost above the burst over the time before its departure.
// The departures conform when no step leaves R above t + tau. R is a
// max-plus fold, so R = max over departures i of (t_i - ex_i) + T*(the cost
// of every departure at or after t_i), which is at most term(i) = t_i +
// T*(that cost). The kernel's TAT s is never below R, and a departure
// granted from s conforms together with every departure already granted,
// wherever in time it falls.
//
// A reservation r at t_r that gives back d ms of cost (T*(reserved -
// actual)) lowers by d the term of every departure at or before t_r, and
// leaves the others alone. So the TAT may drop by
//
//	refund = min(d, s - Q(t_r)),   Q(t) = max term(i) over departures after t,
//
// and no more: a lower TAT would let a new departure fit where the
// departures after t_r leave no room. The tail of the schedule (nothing
// after t_r) refunds all of d; a reservation followed by others refunds what
// their backlog leaves, which is tau - T*c for a departure that waited (the
// burst it did not use), and nothing once the key has been idle after t_r.
// The Ledger keeps Q as a staircase of at most MaxMarks steps, each an upper
// bound on the terms of the departures up to its instant; merging two steps
// keeps the larger bound, so it only ever refunds less.
//
// A reservation cancelled before its slot leaves a hole: the part of its
// cost the TAT could not take back stays at its instant, and the next
// reservation that can depart exactly then, and fits, takes it without
// moving the TAT. A departure replaced by a smaller one at the same instant
// can only lower terms, so a hole is always safe to fill; it is never moved
// to another instant, which could be unsafe.
//
// An overrun (a settle for more than reserved) is charged at once: the
// TAT grows by the extra, and so does the term of every departure at or
// before its instant t. It also raises by up to the extra the replay at
// every instant after t, where a hole lies, or may lie later: a hole was
// safe to fill because the departure it replaces fitted there, and that
// departure was granted without the overrun (which the contract lets it
// break: it is charged, never refused). So a hole at or after t keeps only
// what the extra leaves of it, and a reservation granted before the
// overrun and cancelled after it leaves a hole without what the overruns
// settled since its grant, at or before its instant, add there (the
// Ledger remembers them: Overruns). A slot granted after an overrun, from
// the TAT or from a hole, so makes room for it; slots granted before keep
// their times.
//
// Every grant made while a key has a Ledger gets a sequence number, and the
// Ledger remembers which of the last SeqWindow were settled or cancelled: a
// reservation settles once, however many copies of it are settled or
// cancelled, and one older than the window refunds nothing. A reservation
// granted before the Ledger existed is named by its tag, the TAT its commit
// stored (unique while no give-back has lowered the TAT): cancelled before
// its slot, it leaves a hole, once; settled, its extra cost is charged and
// nothing is given back.
type Ledger struct {
	// Interval and Tau are the parameters of the kernel the Ledger was made
	// under: its rule holds for one contract, so a key whose contract
	// changes live drops it (see Fits).
	Interval, Tau float64
	Start         float64   // the sequence number before this Ledger's first grant
	Seq           float64   // the sequence number of its last grant
	Marks         []Mark    // ascending instants, descending bounds; at most MaxMarks
	Holes         []Hole    // ascending instants
	Overruns      []Overrun // in the order they were settled; at most MaxOverruns
	done          [SeqWindow / 64]uint64
	pre           []float64 // the tags of reservations granted before the Ledger that were cancelled, not yet past; ascending
}

// Mark is one step of the staircase: every departure after the previous
// step's instant and at or before At has a term of at most Q.
type Mark struct{ At, Q float64 }

// Hole is cost (ms, T*units) a cancelled reservation left at its instant.
type Hole struct{ At, Cap float64 }

// Overrun is an extra X (ms, T*units) charged at the instant At, after the
// grant whose sequence number is Seq: a reservation granted up to it
// (sequence number at most Seq, or granted before the Ledger) and cancelled
// later at or after At leaves a hole without X. Until is the key's TAT
// after the charge: every reservation granted before it departs before
// Until, so once Until has passed it matters no more.
type Overrun struct{ At, X, Seq, Until float64 }

// MaxOverruns is how many overruns a Ledger remembers; past it the two
// settled first become one that counts for both (the earlier instant, the
// sum of the extras, the later sequence number and end), which only ever
// leaves smaller holes.
const MaxOverruns = 8

// MaxMarks is how many steps the staircase keeps.
const MaxMarks = 8

// SeqWindow is how many of a key's latest grants can still settle.
const SeqWindow = 4096

// NewLedger returns the Ledger of a key whose TAT is s (Cold for none), at
// now. Every departure granted so far lies before s (a grant's TAT is
// above its departure, and TATs only grow without a Ledger), whatever
// contract granted it: a key whose contract changed live holds departures
// of several. Sequence numbers start at now in µs, above those of any
// earlier Ledger of the key that is gone (its Redis keys expired, at least
// a millisecond after its last grant); one that replaces a Ledger still
// held is made by RenewLedger.
func (k *Kernel) NewLedger(s, now float64) *Ledger {
	l := &Ledger{Interval: k.Interval, Tau: k.Tau, Start: math.Floor(now * 1000)}
	l.Seq = l.Start
	// On a key still busy, the departures granted so far get a step at s
	// with no bound (their terms are unknown: a cost above the burst has a
	// term above s): a reservation departing before s refunds nothing.
	// Every one granted from now on departs after now, and a reservation
	// departing before a cold key's old departures is never granted.
	if s > now {
		l.Marks = append(l.Marks, Mark{At: s, Q: Unbounded})
	}
	return l
}

// RenewLedger returns the fresh Ledger of a key whose Ledger old has gone
// idle (see Idle), at now, its TAT s: NewLedger, numbering its grants
// after old's last, so that a copy of a reservation old granted names none
// of the new Ledger's (old's last grant may be numbered at or past now in
// µs: a Ledger made and gone idle within the microsecond, or one that
// granted faster than a reservation a microsecond); and keeping old's
// claims of the reservations granted before it, so that a copy of one
// settled later does nothing (as on Redis, where they stay in K:c).
func (k *Kernel) RenewLedger(old *Ledger, s, now float64) *Ledger {
	l := k.NewLedger(s, now)
	if old.Seq > l.Start {
		l.Start, l.Seq = old.Seq, old.Seq
	}
	l.pre = slices.Clone(old.pre)
	return l
}

// ResetLedger returns the Ledger a key keeps when it is reset at now (its
// schedule forgotten, its TAT cold), its TAT s and its Ledger old (nil:
// none), or nil when nothing granted before can still be given back (s
// and old's horizon have passed). The reservations granted before the reset
// may still be cancelled or settled: they give nothing back to the
// schedule granted after it, which never counted them. Their departures
// lie at or before the horizon h (the later of s and old's horizon): a
// step at h with no bound refunds nothing there; an overrun of tau at now,
// before every sequence number of the new Ledger, leaves no hole of
// theirs; h, claimed as a tag, keeps the Ledger until it has passed. A
// settle for more still charges its extra. The reservations granted after
// the reset give nothing back either while they depart before h (the
// step's bound), but leave their holes. Sequence numbers continue after
// old's, so that old's name none of the new Ledger's.
func (k *Kernel) ResetLedger(old *Ledger, s, now float64) *Ledger {
	h := s
	if old != nil {
		h = math.Max(h, old.Horizon())
	}
	if !(h > now) {
		return nil
	}
	l := k.NewLedger(h, now)
	if old != nil && old.Seq > l.Start {
		l.Start, l.Seq = old.Seq, old.Seq
	}
	l.Overruns = append(l.Overruns, Overrun{At: now, X: k.Tau, Seq: l.Start, Until: h})
	l.claimPre(h)
	return l
}

// Fits reports whether l was made under k's parameters, so that its rule
// holds for k's decisions. A Ledger that does not fit is dropped by a grant
// (the key goes on without one, or with a fresh one once idle) and gives
// nothing back to a settle: only an extra is charged.
func (l *Ledger) Fits(k *Kernel) bool { return l.Interval == k.Interval && l.Tau == k.Tau }

// Charge is what a settle of cost units settled at actual does to a TAT s
// through a Ledger that does not fit its kernel k: an extra is charged,
// nothing is given back.
func (k *Kernel) Charge(s float64, cost, actual int64) float64 {
	tc, ta := float64(k.Interval*float64(cost)), float64(k.Interval*float64(actual))
	if ta > tc {
		return s + (ta - tc)
	}
	return s
}

// ChargeCold is what a settle of cost units settled at actual does to a key
// found cold at now (its state expired or was evicted): every departure it
// held had a term at most its TAT, which was at most now when it went cold,
// and the extra raises those terms by T*(actual - cost); so the TAT to
// store is now plus the extra (now when there is none).
func (k *Kernel) ChargeCold(now float64, cost, actual int64) float64 {
	return k.Charge(now, cost, actual)
}

// Unbounded is the bound of a step whose departures' terms are unknown.
const Unbounded = 1e300

// q is Q(t): the bound on the terms of the departures after t.
func (l *Ledger) q(t float64) float64 {
	q := math.Inf(-1)
	for _, m := range l.Marks {
		if m.At > t && m.Q > q {
			q = m.Q
		}
	}
	return q
}

// qFrom is the bound on the terms of the departures at or after t.
func (l *Ledger) qFrom(t float64) float64 {
	q := math.Inf(-1)
	for _, m := range l.Marks {
		if m.At >= t && m.Q > q {
			q = m.Q
		}
	}
	return q
}

// grow adds x to every step that may hold a departure at or before t: the
// steps before t, and the first at or after it.
func (l *Ledger) grow(t, x float64) {
	for i := range l.Marks {
		l.Marks[i].Q += x
		if l.Marks[i].At >= t {
			return
		}
	}
}

// Grant records a departure at t of cost units granted from the TAT (not
// from a hole) and returns its sequence number.
func (l *Ledger) Grant(k *Kernel, t float64, cost int64) float64 {
	tc := float64(k.Interval * float64(cost))
	// Its term: its own cost, and the cost at or after t, which is at most
	// the bound of the steps there minus t (before grow: they do not hold
	// this one yet).
	term := math.Max(t, l.qFrom(t)) + tc
	l.grow(t, tc)
	l.mark(t, term)
	return l.next()
}

// next numbers a grant and clears its settled flag.
func (l *Ledger) next() float64 {
	l.Seq++
	i := uint64(l.Seq) % SeqWindow
	l.done[i/64] &^= 1 << (i % 64)
	return l.Seq
}

// mark inserts the step (t, q), drops steps it dominates and merges the two
// earliest while there are too many.
func (l *Ledger) mark(t, q float64) {
	i := 0
	for i < len(l.Marks) && l.Marks[i].At < t {
		i++
	}
	if i < len(l.Marks) && l.Marks[i].At == t {
		l.Marks[i].Q = math.Max(l.Marks[i].Q, q)
	} else {
		l.Marks = append(l.Marks, Mark{})
		copy(l.Marks[i+1:], l.Marks[i:])
		l.Marks[i] = Mark{At: t, Q: q}
	}
	// A step whose bound a later step reaches adds nothing: the later one
	// covers its departures too (extending its range backwards).
	out := l.Marks[:0]
	for j, m := range l.Marks {
		dominated := false
		for _, later := range l.Marks[j+1:] {
			if later.Q >= m.Q {
				dominated = true
				break
			}
		}
		if !dominated {
			out = append(out, m)
		}
	}
	l.Marks = out
	// Too many: the two neighbours whose bounds differ least become one step
	// with the larger bound, so that a query between them loses the least.
	for len(l.Marks) > MaxMarks {
		i := 0
		for j := 1; j+1 < len(l.Marks); j++ {
			if l.Marks[j].Q-l.Marks[j+1].Q < l.Marks[i].Q-l.Marks[i+1].Q {
				i = j
			}
		}
		l.Marks[i+1].Q = l.Marks[i].Q
		l.Marks = append(l.Marks[:i], l.Marks[i+1:]...)
	}
}

// MaxPre is how many reservations granted before a Ledger it remembers as
// settled or cancelled (see claimPre).
const MaxPre = 64

// claimPre marks settled or cancelled the reservation granted before the
// Ledger whose commit stored tag (before a Ledger a key's TAT only grows,
// so a tag names one grant); false when it was already. Claims are kept
// while the Ledger lives, past their slots, so that a copy settled late
// does nothing; past MaxPre the oldest is forgotten (a copy of it then
// charges its extra again: too much, never too little).
func (l *Ledger) claimPre(tag float64) bool {
	i, found := slices.BinarySearch(l.pre, tag)
	if found {
		return false
	}
	l.pre = slices.Insert(l.pre, i, tag)
	if len(l.pre) > MaxPre {
		l.pre = slices.Delete(l.pre, 0, 1)
	}
	return true
}

// Claim outcomes (see claim).
const (
	claimed = iota // marked settled now
	already        // settled or cancelled before: nothing more happens
	unknown        // not in the window (granted before this Ledger, or too long ago)
)

// claim marks sequence number seq settled and says whether it was, already
// was, or cannot be told (unknown: granted before this Ledger began, or
// more than SeqWindow grants ago).
func (l *Ledger) claim(seq float64) int {
	if !(seq > l.Start && seq <= l.Seq && l.Seq-seq < SeqWindow) {
		return unknown
	}
	i := uint64(seq) % SeqWindow
	if l.done[i/64]&(1<<(i%64)) != 0 {
		return already
	}
	l.done[i/64] |= 1 << (i % 64)
	return claimed
}

// Settle applies the actual cost of the reservation seq (or, granted before
// the Ledger, tag), of cost units at t, to a key whose TAT is s at now, and
// returns the TAT to store. Less than reserved gives back what the rule
// allows; more is charged at once, so that the departures granted after it
// make room for it; once settled, nothing more happens.
func (l *Ledger) Settle(k *Kernel, s, t float64, cost, actual int64, seq, tag, now float64) float64 {
	known := true
	if seq == 0 { // granted before the Ledger: named by its tag
		if !l.claimPre(tag) {
			return s
		}
	} else {
		switch l.claim(seq) {
		case already:
			return s
		case unknown: // too old to tell a copy from the first settle: an extra is charged, nothing given back
			known = false
		}
	}
	tc, ta := float64(k.Interval*float64(cost)), float64(k.Interval*float64(actual))
	switch {
	case ta > tc: // the extra, at t: every term that includes t grows, and the holes after t shrink
		l.charge(t, ta-tc, s+(ta-tc), now)
		return s + (ta - tc)
	case seq == 0 || !known || ta == tc: // before the Ledger nothing is given back: its step has no bound
		return s
	}
	// Its own term drops by less than the difference when it costs more
	// than the burst (it was spread over the time before t).
	own := math.Min(tc, k.Tau) - math.Min(ta, k.Tau)
	refund := math.Min(own, l.room(s, t, tc-ta))
	l.lower(t, tc-ta) // the terms that held the cost given back
	return s - refund
}

// Overran records the extra of a settle of cost units at actual, at t,
// charged on the key (whose TAT is s after it, at now) outside the
// Ledger's own Settle: by the tail rule, just before the Ledger was made
// (Kernel.SettleTail), or for a slot granted under a contract changed
// since (Kernel.Charge). Nothing happens when actual is at most cost.
func (l *Ledger) Overran(k *Kernel, t float64, cost, actual int64, s, now float64) {
	tc, ta := float64(k.Interval*float64(cost)), float64(k.Interval*float64(actual))
	if ta > tc {
		l.charge(t, ta-tc, s, now)
	}
}

// charge applies an extra x charged at t to the Ledger of a key whose TAT
// is s after the charge, at now: the terms that include t grow by x; every
// hole at or after t loses x (one left with less than a unit is dropped);
// and the overrun is remembered for the holes that reservations granted
// before it may leave later (see Overrun), the ones already past
// forgotten.
func (l *Ledger) charge(t, x, s, now float64) {
	l.grow(t, x)
	holes := l.Holes[:0]
	for _, h := range l.Holes {
		if h.At >= t {
			if h.Cap -= x; h.Cap < l.Interval {
				continue
			}
		}
		holes = append(holes, h)
	}
	l.Holes = holes
	kept := l.Overruns[:0]
	for _, o := range l.Overruns {
		if o.Until >= now {
			kept = append(kept, o)
		}
	}
	l.Overruns = append(kept, Overrun{At: t, X: x, Seq: l.Seq, Until: s})
	if len(l.Overruns) > MaxOverruns {
		a, b := l.Overruns[0], l.Overruns[1]
		l.Overruns[1] = Overrun{At: math.Min(a.At, b.At), X: a.X + b.X, Seq: math.Max(a.Seq, b.Seq), Until: math.Max(a.Until, b.Until)}
		l.Overruns = slices.Delete(l.Overruns, 0, 1)
	}
}

// debt is what the overruns settled after the grant of the reservation seq
// (0: granted before the Ledger), at or before its instant t, add to the
// replay at t: a hole it leaves there is that much smaller.
func (l *Ledger) debt(t, seq float64) float64 {
	d := 0.0
	for _, o := range l.Overruns {
		if o.At <= t && seq <= o.Seq {
			d += o.X
		}
	}
	return d
}

// room is how far a TAT s may drop for d given back at t: min(d, s - Q(t)),
// never below 0.
func (l *Ledger) room(s, t, d float64) float64 { return math.Max(0, math.Min(d, s-l.q(t))) }

// lower takes x off the steps at or before t.
func (l *Ledger) lower(t, x float64) {
	for i := range l.Marks {
		if l.Marks[i].At <= t {
			l.Marks[i].Q -= x
		}
	}
}

// Cancel gives back the reservation seq (or, granted before the Ledger,
// tag), of cost units at t, before t (the caller checks the time; now is
// the store's clock): what the TAT may take back it takes, and the rest,
// less what overruns settled since its grant add at t, is left at t as a
// hole. It returns the TAT to store.
func (l *Ledger) Cancel(k *Kernel, s, t float64, cost int64, seq, tag, now float64) float64 {
	// A tag already past names a slot already past: cancelling it frees nothing.
	if seq == 0 && (tag < now || !l.claimPre(tag)) || seq != 0 && l.claim(seq) != claimed {
		return s
	}
	tc := float64(k.Interval * float64(cost))
	refund := l.room(s, t, tc)
	l.lower(t, refund) // only the refunded cost leaves the terms: the hole's stays, to be taken
	// The hole holds what is left of the reservation's share of t itself,
	// min(T*cost, tau): a cost above the burst was spread over the time
	// before t, which the reservations taking the hole, departing at t,
	// cannot use.
	// Less what the overruns settled since its grant add at t: the
	// departure it replaces was granted without them.
	if rest := math.Min(tc, k.Tau) - refund - l.debt(t, seq); rest > 0 {
		l.addHole(t, rest)
	}
	return s - refund
}

func (l *Ledger) addHole(t, c float64) {
	i := 0
	for i < len(l.Holes) && l.Holes[i].At < t {
		i++
	}
	if i < len(l.Holes) && l.Holes[i].At == t {
		l.Holes[i].Cap += c
		return
	}
	l.Holes = append(l.Holes, Hole{})
	copy(l.Holes[i+1:], l.Holes[i:])
	l.Holes[i] = Hole{At: t, Cap: c}
}

// Take gives a reservation of cost at now the earliest hole it fits in, if
// one lies at or after floor (now, or a pause's end), within MaxWait, and
// before before (the departure the TAT would give it; +Inf when it would be
// refused). It drops the holes already past and returns the hole's instant
// and its sequence number, or ok false.
func (l *Ledger) Take(k *Kernel, now, floor, before float64, cost int64) (at, seq float64, ok bool) {
	j := 0
	for j < len(l.Holes) && l.Holes[j].At < now {
		j++
	}
	if j > 0 {
		l.Holes = append(l.Holes[:0], l.Holes[j:]...)
	}
	tc := float64(k.Interval * float64(cost))
	for i := range l.Holes {
		h := &l.Holes[i]
		if h.At >= before || h.At-now > k.MaxWait {
			return 0, 0, false
		}
		if h.At < floor || h.Cap < tc {
			continue
		}
		at = h.At
		if h.Cap -= tc; h.Cap < k.Interval { // nothing of cost >= 1 fits any more
			l.Holes = append(l.Holes[:i], l.Holes[i+1:]...)
		}
		return at, l.next(), true
	}
	return 0, 0, false
}

// Idle reports whether the Ledger no longer matters at now for a key whose
// TAT is s: the key is cold (every departure's term is at most s <= now, so
// a refund could only lower a TAT already past), no hole lies ahead, and no
// cancelled reservation granted before it could still be cancelled again.
func (l *Ledger) Idle(s, now float64) bool {
	return s <= now && l.Horizon() < now
}

// Claim records that the reservation granted before l whose commit stored
// tag has been settled or cancelled (the one whose give-back made l), so
// that a copy of it does nothing.
func (l *Ledger) Claim(tag float64) { l.claimPre(tag) }

// Horizon is the instant after which l holds nothing that matters but what
// the key's TAT says: its last hole, or its last claimed tag.
func (l *Ledger) Horizon() float64 {
	h := math.Inf(-1)
	if n := len(l.Holes); n > 0 {
		h = l.Holes[n-1].At
	}
	if n := len(l.pre); n > 0 {
		h = max(h, l.pre[n-1])
	}
	return h
}
