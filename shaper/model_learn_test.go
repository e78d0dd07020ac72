package shaper_test

// The model's learning and spacing ops (Shaper.Learn with refusals,
// stated policies, remaining counts and Retry-After pauses; Shaper.Space),
// and the oracle's rules for them.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// policyRec is what a partner's feedback promised to hold on a learning
// key: a stated policy (at most count departures in any window of period)
// or a remaining count (at most count departures before the reset, at
// least period/count apart), from the Learn op on, while it holds. The
// learned record outlives Reset (docs/LEARNING.md), so these do too.
type policyRec struct {
	kind   string // "policy" or "remaining"
	op     int
	until  int // the op of the next statement of its kind on the key
	key    string
	at     time.Time // the clock before the Learn call
	end    time.Time // when it stops holding
	count  int64
	period time.Duration
}

// bounds reports whether it bounds the learned rate: a count of 0 is a
// pause until its reset (docs/LEARNING.md: nothing remaining pauses the
// key, and the rate resumes where it was after it), not a rate.
func (p policyRec) bounds() bool { return p.kind != "remaining" || p.count > 0 }

// rate is the rate it allows, per second.
func (p policyRec) rate() float64 {
	if p.kind == "remaining" {
		return float64(max(p.count, 1)) / p.period.Seconds()
	}
	return float64(p.count) / p.period.Seconds()
}

// spaceRec is a margin Space set: from from (the call) to end, the
// departures granted by later calls are at least gap apart.
type spaceRec struct {
	op, until int
	key       string
	from, end time.Time
	gap       time.Duration
}

// learnedRead is the last learned rate Status reported for a key.
type learnedRead struct {
	rate  float64
	event string
	deps  int // the departures the model had recorded on the key then
	op    int
}

// The policies a partner states (issue 37: GitHub's unauthenticated 60/h,
// "1 per 30 s"), and the remaining counts and resets it reports.
var (
	modelPolicies = []shaper.Rate{shaper.PerSecond(5), {Count: 60, Period: time.Hour}, {Count: 1, Period: 30 * time.Second}, shaper.PerSecond(2), shaper.PerSecond(100)}
	modelRemains  = []int64{0, 1, 2, 3, 10, 100}
	modelResets   = []time.Duration{3 * time.Second, 30 * time.Second, 3 * time.Minute, time.Hour}
)

// doLearn gives a shaper a partner's feedback on a key: a refusal, a
// stated policy, a remaining count, a Retry-After pause, or an accepted
// response (o.mode).
func (m *mrun) doLearn(o mop) {
	si := m.shaperIdx(o)
	key := m.keys[o.key]
	s := m.sh[si]
	pick := func(n int) int { return int(o.sel*float64(n)) % n }
	var fb shaper.Feedback
	switch k := o.mode; {
	case k < 3: // a 429, of the latest departure on the key
		fb.Refused = true
		for _, d := range slices.Backward(m.o.deps) {
			if d.key == key {
				fb.Departed = d.at
				break
			}
		}
	case k < 6:
		fb.Policy = modelPolicies[pick(len(modelPolicies))]
	case k < 8:
		fb.HasRemaining, fb.Remaining, fb.Reset = true, modelRemains[pick(len(modelRemains))], modelResets[o.cp%len(modelResets)]
	case k < 10: // a 429 or 503 with Retry-After
		fb.Refused, fb.Pause = true, time.Duration(1+o.cp%5)*time.Second
	case k == 10:
		fb.Policy = modelPolicies[pick(len(modelPolicies))]
		fb.HasRemaining, fb.Remaining, fb.Reset = true, modelRemains[o.cp%len(modelRemains)], modelResets[o.cp%len(modelResets)]
	}
	a := m.snap(si)
	c := m.contractOf(si, a)
	var pre []snap // every shaper's contract before: a change may land meanwhile
	for i := range m.sh {
		pre = append(pre, m.snap(i))
	}
	before := m.clock.Now()
	err := s.Learn(m.ctx, key, fb)
	after := m.clock.Now()
	certain := a.equal(m.snap(si)) || !m.world.redis()
	m.logf("Learn sh%d %q %s: %s", si, key, describeFeedback(fb), errText(err))
	if err != nil {
		m.fail("error", "Learn(%s): %v", describeFeedback(fb), err)
		return
	}
	mk := m.key(key)
	if fb.Pause > 0 {
		d := min(fb.Pause, shaper.MaxPause)
		m.pause(key, d, before, after)
		// A burst contract resumes paced (a clamp) for as long again.
		mk.clampHi = maxTime(mk.clampHi, after.Add(2*d+time.Second))
		if !m.cfg.learn && certain {
			m.recordPace(key, d, before, c)
		}
	}
	if fb.HasRemaining && fb.Reset > 0 {
		reset := min(fb.Reset, shaper.MaxPause)
		if m.cfg.learn {
			m.endLearned("remaining", key)
			m.learned = append(m.learned, policyRec{kind: "remaining", op: m.op, until: math.MaxInt, key: key, at: before, end: before.Add(reset), count: fb.Remaining, period: reset})
			m.endSpaces(key)
		} else if fb.Pause <= 0 {
			m.recordClamp(key, fb.Remaining, reset, before, after, c, certain, "learn")
			m.endSpaces(key)
		}
	}
	if fb.Policy != (shaper.Rate{}) && m.cfg.learn {
		m.endLearned("policy", key)
		life := max(2*fb.Policy.Period, time.Minute)
		m.learned = append(m.learned, policyRec{kind: "policy", op: m.op, until: math.MaxInt, key: key, at: before, end: before.Add(life), count: fb.Policy.Count, period: fb.Policy.Period})
	}
	if m.cfg.learn {
		m.readLearned(si, key, "after the Learn", pre)
	}
}

func describeFeedback(fb shaper.Feedback) string {
	var parts []string
	if fb.Refused {
		parts = append(parts, "refused")
		if !fb.Departed.IsZero() {
			parts = append(parts, "departed "+fb.Departed.Format("15:04:05.000000"))
		}
	}
	if fb.Pause > 0 {
		parts = append(parts, fmt.Sprintf("pause %v", fb.Pause))
	}
	if fb.Policy != (shaper.Rate{}) {
		parts = append(parts, fmt.Sprintf("policy %d per %v", fb.Policy.Count, fb.Policy.Period))
	}
	if fb.HasRemaining {
		parts = append(parts, fmt.Sprintf("%d remaining until %v", fb.Remaining, fb.Reset))
	}
	if len(parts) == 0 {
		return "accepted"
	}
	return strings.Join(parts, ", ")
}

// endLearned ends the key's open statement of kind: a new one replaces it.
func (m *mrun) endLearned(kind, key string) {
	for i := range m.learned {
		if r := &m.learned[i]; r.kind == kind && r.key == key && r.until == math.MaxInt {
			r.until = m.op
		}
	}
}

// inForce returns the statements of key in force at t.
func (m *mrun) inForce(key string, t time.Time) []policyRec {
	var out []policyRec
	for _, r := range m.learned {
		if r.key == key && r.until == math.MaxInt && t.Before(r.end) {
			out = append(out, r)
		}
	}
	return out
}

// readLearned reads what shaper si learned of key (Status) and checks it
// against the contract and the partner's statements in force: the learned
// rate is at most the contract's slowest dimension and every stated policy
// and remaining count in force, and at least the floor unless a statement
// holds it lower (docs/LEARNING.md, "What it guarantees").
func (m *mrun) readLearned(si int, key, when string, pre []snap) {
	st, err := m.sh[si].Status(m.ctx, key, 1)
	if err != nil {
		var qf *shaper.QueueFullError
		if !errors.As(err, &qf) {
			m.fail("error", "Status %s: %v", when, err)
		}
		return
	}
	l := st.Learned
	if l == nil {
		m.fail("learn", "Status of a learning shaper has no Learned")
		return
	}
	now := m.clock.Now()
	// Each process bounds the fleet's record by its own contract: while a
	// change propagates (before the calls, or during them), the more
	// generous ceiling and the lower floor.
	var ceiling, floor, highFloor float64 // highFloor: the floor of the shaper whose contract puts it highest
	snaps := slices.Clone(pre)
	for i := range m.sh {
		snaps = append(snaps, m.snap(i))
	}
	for i, sn := range snaps {
		c := math.Inf(1)
		for _, r := range sn.rates {
			c = min(c, float64(r.Count)/r.Period.Seconds())
		}
		f := 1.0
		if lf := m.seq.feat.learn.Floor; lf != (shaper.Rate{}) {
			f = float64(lf.Count) / lf.Period.Seconds()
		}
		if i == 0 {
			ceiling, floor = c, min(f, c)
		}
		ceiling, floor, highFloor = max(ceiling, c), min(floor, f, c), max(highFloor, min(f, c))
	}
	m.logf("  learned on %q (sh%d, %s): %.6g/s, %s, found %.6g, policy %.6g", key, si, when, l.Rate, l.Event, l.Found, l.Policy)
	const rel = 1e-9
	if l.Rate > ceiling*(1+rel) {
		m.fail("learn", "the learned rate of %q is %.9g/s, above the contract's %.9g/s (%s)", key, l.Rate, ceiling, when)
	}
	// A cap only tightens the rate until its reset: a statement superseded
	// by a looser one may still hold it lower.
	lowest := floor
	for _, r := range m.learned {
		if r.key == key && now.Before(r.end) && r.bounds() {
			lowest = min(lowest, r.rate())
		}
	}
	for _, r := range m.inForce(key, now) {
		if r.bounds() && l.Rate > r.rate()*(1+rel) && m.at(r.op) {
			m.failDefect(rateAboveStatement(r), "learn", "the learned rate of %q is %.9g/s, above the partner's %s of op %d (%.9g/s) in force until %s (%s)", key, l.Rate, r.kind, r.op, r.rate(), m.rel(r.end), when)
		}
	}
	if l.Event != "none" && l.Rate < lowest*(1-rel) {
		m.fail("learn", "the learned rate of %q is %.9g/s, below the floor %.9g/s, and no statement of the partner in force holds it there (%s)", key, l.Rate, lowest, when)
	}
	// An idle key keeps its rate: nothing was sent to measure a higher one
	// (issue 37, defect 23: the probe grows from the last change whether or
	// not anything was sent).
	deps := 0
	for _, d := range m.o.deps {
		if d.key == key {
			deps++
		}
	}
	// After a refusal the rate rises over a second to 0.97 of the rate
	// found and holds there (docs/LEARNING.md); only the probe after the
	// hold goes past it, and it has nothing to probe with. The floor may
	// lift it: a contract raised live lifts a floor it had capped.
	if prev, ok := m.lastLearned[key]; ok && prev.deps == deps && prev.event == "refused" && l.Event == "refused" && l.Rate > max(prev.rate, 0.97*l.Found, highFloor)*(1+rel) {
		m.failDefect(23, "learn", "the learned rate of %q rose from %.6g/s (op %d) to %.6g/s, past 0.97 of the rate found (%.6g/s), with nothing sent on the key since (%s)", key, prev.rate, prev.op, l.Rate, l.Found, when)
	}
	if m.lastLearned == nil {
		m.lastLearned = map[string]learnedRead{}
	}
	m.lastLearned[key] = learnedRead{rate: l.Rate, event: l.Event, deps: deps, op: m.op}
}

// at reports whether op was the current one or before (a record's rule
// holds from the op after it set it; the read right after is in it).
func (m *mrun) at(op int) bool { return op <= m.op }

// rateAboveStatement names the defect a learned rate above a statement is
// known as: a remaining count's cap (22 is the transport's; the learned
// cap itself) or a stated policy.
func rateAboveStatement(r policyRec) int {
	if r.kind == "policy" {
		return 20
	}
	return 0
}

// doSpace sets a margin between a key's departures (Shaper.Space).
func (m *mrun) doSpace(o mop) {
	si := m.shaperIdx(o)
	key := m.keys[o.key]
	margin := []time.Duration{4 * time.Millisecond, 2 * time.Millisecond, 0, 10 * time.Millisecond, time.Millisecond, -time.Millisecond}[o.mode%6]
	before := m.clock.Now()
	err := m.sh[si].Space(m.ctx, key, margin)
	m.logf("Space sh%d %q margin %v: %s", si, key, margin, errText(err))
	if margin < 0 {
		if !errors.Is(err, shaper.ErrInvalidConfig) {
			m.fail("error", "Space with a margin of %v: %s, want a ConfigError", margin, errText(err))
		}
		return
	}
	if err != nil {
		m.fail("error", "Space: %v", err)
		return
	}
	// The margin applies to a strict contract (every dimension of burst 1)
	// of at least MinSpacedInterval, up to a tenth of its interval.
	sn := m.snap(si)
	var interval time.Duration
	for _, r := range sn.rates {
		if burstOf(r) > 1 {
			return
		}
		interval = max(interval, r.Period/time.Duration(r.Count))
	}
	mg := min(margin, interval/10)
	if interval < shaper.MinSpacedInterval || mg <= 0 {
		return
	}
	// On a learning shaper too the margin holds from the call: it goes into
	// the learned record, and the learned clamp is renewed with it in the
	// same store call.
	m.endSpaces(key)
	m.spaces = append(m.spaces, spaceRec{op: m.op, until: math.MaxInt, key: key, from: before, end: before.Add(shaper.MarginSpan), gap: interval + mg})
	mk := m.key(key)
	mk.clampHi = maxTime(mk.clampHi, before.Add(shaper.MarginSpan))
}

// endSpaces ends the margins of key (or of every key, for ""): a contract
// changed, the key reset or clamped by its partner.
func (m *mrun) endSpaces(key string) {
	for i := range m.spaces {
		if r := &m.spaces[i]; (key == "" || r.key == key) && r.until == math.MaxInt {
			r.until = m.op
		}
	}
}

// checkLearned (the run's end):
//   - a stated policy: the departures granted after it, while it holds, are
//     at most its count in any window of its period;
//   - a remaining count: at most that many depart before its reset, at
//     least reset/remaining apart;
//   - a margin: a strict contract's departures granted after it, while it
//     holds, are at least its interval plus the margin apart.
func (m *mrun) checkLearned() []finding {
	var out []finding
	deps := func(key string, op, until int, from, end time.Time) []*departure {
		var in []*departure
		for _, d := range m.o.deps {
			if d.key == key && d.op > op && d.op < until && !d.cancelled && !d.at.Before(from) && d.at.Add(modelEps).Before(end) {
				in = append(in, d)
			}
		}
		slices.SortFunc(in, byTime)
		return in
	}
	for _, r := range m.learned {
		in := deps(r.key, r.op, r.until, r.at, r.end)
		switch r.kind {
		case "policy":
			// In any window [t, t+period), at most count.
			for i := 0; i+int(r.count) < len(in); i++ {
				j := i + int(r.count)
				if in[j].at.Sub(in[i].at)+modelEps < r.period {
					out = append(out, finding{kind: "learn", defect: 18, msg: fmt.Sprintf("key %q: the partner stated %d per %v at op %d (until %s), and %d departures granted after it fall within %v: from %v to %v",
						r.key, r.count, r.period, r.op, r.end.Format("15:04:05"), r.count+1, in[j].at.Sub(in[i].at), in[i], in[j])})
					break
				}
			}
		case "remaining":
			if int64(len(in)) > r.count {
				out = append(out, finding{kind: "learn", defect: remainingDefect(r), msg: fmt.Sprintf("key %q: the partner said %d remaining until %v at op %d (until %s), and %d departures granted after it come before then; the last is %v",
					r.key, r.count, r.period, r.op, r.end.Format("15:04:05"), len(in), in[len(in)-1])})
				continue
			}
			gap := r.period / time.Duration(max(r.count, 1))
			for i := 1; i < len(in); i++ {
				if in[i].at.Sub(in[i-1].at)+modelEps < gap {
					out = append(out, finding{kind: "learn", defect: 18, msg: fmt.Sprintf("key %q: %d remaining until %v (op %d) spreads them %v apart, and %v departs %v after %v",
						r.key, r.count, r.period, r.op, gap, in[i], in[i].at.Sub(in[i-1].at), in[i-1])})
					break
				}
			}
		}
		if len(out) >= 3 {
			return out
		}
	}
	for _, r := range m.spaces {
		in := deps(r.key, r.op, r.until, r.from, r.end)
		for i := 1; i < len(in); i++ {
			if in[i].at.Sub(in[i-1].at)+modelEps < r.gap {
				out = append(out, finding{kind: "space", defect: m.spaceDefect(), msg: fmt.Sprintf("key %q: the margin of op %d spaces a strict contract's departures %v apart (its interval plus the margin) until %s, and %v departs %v after %v",
					r.key, r.op, r.gap, r.end.Format("15:04:05"), in[i], in[i].at.Sub(in[i-1].at), in[i-1])})
				break
			}
		}
	}
	return out
}

// remainingDefect: a count of 0 spent by a learning shaper's cap of one
// per reset is not among issue 37's defects.
func remainingDefect(r policyRec) int {
	if r.count == 0 {
		return defectZeroRemaining
	}
	return 18
}

// spaceDefect: on a learning shaper the margin was kept in the process
// that called Space, and another process's renewal of the learned clamp
// dropped it: the defect the model found (fixed: the margin is in the
// learned record).
func (m *mrun) spaceDefect() int {
	if m.cfg.learn && m.cfg.fleet {
		return defectLearnedMargin
	}
	return 0
}
