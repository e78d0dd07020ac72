package partnertest

import (
	"fmt"
	"math"
	"time"
)

// A Counter is one of a partner's limits as the partner counts it, on the
// partner's own clock: Admit judges an arrival and records it if it is
// admitted; Done corrects an admitted arrival's units once the call's
// actual usage is known (an LLM's tokens), as the partner does when the
// response completes. Counters are not safe for concurrent use.
type Counter interface {
	// Admit reports whether an arrival at t of units is admitted, and
	// records it if so; it returns an id for Done.
	Admit(t time.Time, units int64) (id int, ok bool)
	// Done says the call id, admitted for units, used actual, at t.
	Done(t time.Time, id int, actual int64)
	// String describes the limit.
	String() string
}

// Trailing counts the units of the arrivals in the trailing Window (an
// arrival at a stops counting at a+Window) and refuses one that would
// bring them above Quota: OpenAI's TPM and RPM.
type Trailing struct {
	Quota  int64
	Window time.Duration

	log []entry
}

type entry struct {
	at    time.Time
	units int64
}

// Admit implements Counter.
func (c *Trailing) Admit(t time.Time, units int64) (int, bool) {
	var used int64
	for _, e := range c.log {
		if e.at.Add(c.Window).After(t) && !e.at.After(t) {
			used += e.units
		}
	}
	if used+units > c.Quota {
		return -1, false
	}
	c.log = append(c.log, entry{t, units})
	return len(c.log) - 1, true
}

// Done implements Counter: the arrival's units become actual.
func (c *Trailing) Done(_ time.Time, id int, actual int64) { c.log[id].units = actual }

func (c *Trailing) String() string { return fmt.Sprintf("trailing %d per %v", c.Quota, c.Window) }

// Fixed counts the units of the arrivals in fixed windows of Window,
// starting at Anchor, or at the first arrival when Anchor is zero, and
// refuses above Quota: GitHub's hourly limit, a daily quota.
type Fixed struct {
	Quota  int64
	Window time.Duration
	Anchor time.Time

	window int64 // the current window's index
	used   int64
	log    []entry
	index  []int64
}

func (c *Fixed) at(t time.Time) int64 {
	if c.Anchor.IsZero() {
		c.Anchor = t
	}
	d := t.Sub(c.Anchor)
	i := int64(d / c.Window)
	if d < 0 && d%c.Window != 0 {
		i--
	}
	return i
}

// Admit implements Counter.
func (c *Fixed) Admit(t time.Time, units int64) (int, bool) {
	w := c.at(t)
	if w != c.window {
		c.window, c.used = w, 0
	}
	if c.used+units > c.Quota {
		return -1, false
	}
	c.used += units
	c.log, c.index = append(c.log, entry{t, units}), append(c.index, w)
	return len(c.log) - 1, true
}

// Done implements Counter: within its window, the arrival's units become
// actual.
func (c *Fixed) Done(_ time.Time, id int, actual int64) {
	if c.index[id] == c.window {
		c.used += actual - c.log[id].units
	}
	c.log[id].units = actual
}

func (c *Fixed) String() string { return fmt.Sprintf("fixed %d per %v", c.Quota, c.Window) }

// Bucket holds Capacity units, refilled continuously at Refill units a
// second, and refuses an arrival that costs more than it holds; it starts
// full. Done gives back what a call did not use, and takes what it used
// beyond (the bucket may go below zero): Anthropic, Stripe, a GCRA.
type Bucket struct {
	Capacity float64
	Refill   float64 // units per second

	tokens float64
	last   time.Time
	admits []int64
}

func (c *Bucket) fill(t time.Time) {
	if c.last.IsZero() {
		c.tokens, c.last = c.Capacity, t
	}
	if t.After(c.last) {
		c.tokens = math.Min(c.Capacity, c.tokens+c.Refill*t.Sub(c.last).Seconds())
		c.last = t
	}
}

// Admit implements Counter.
func (c *Bucket) Admit(t time.Time, units int64) (int, bool) {
	c.fill(t)
	if c.tokens+1e-9 < float64(units) {
		return -1, false
	}
	c.tokens -= float64(units)
	c.admits = append(c.admits, units)
	return len(c.admits) - 1, true
}

// Done implements Counter.
func (c *Bucket) Done(t time.Time, id int, actual int64) {
	c.fill(t)
	c.tokens = math.Min(c.Capacity, c.tokens+float64(c.admits[id]-actual))
	c.admits[id] = actual
}

func (c *Bucket) String() string {
	return fmt.Sprintf("bucket of %v refilled at %v/s", c.Capacity, c.Refill)
}

// LimitReq is nginx's limit_req, as ngx_http_limit_req_module counts:
// Rate requests a second with Burst beyond it, every arrival's time in
// whole milliseconds; each admitted request adds 1000 to an excess that
// drains at Rate*ms, and one that would leave more than Burst*1000 is
// refused. It counts requests: units are ignored.
type LimitReq struct {
	Rate  float64
	Burst int64

	excess int64
	last   int64 // ms
	seen   bool
}

// Admit implements Counter.
func (c *LimitReq) Admit(t time.Time, _ int64) (int, bool) {
	now := t.UnixMilli()
	excess := int64(0)
	if c.seen {
		ms := now - c.last
		if ms < 0 {
			ms = -ms
		}
		excess = c.excess - int64(c.Rate*1000)*ms/1000 + 1000
		if excess < 0 {
			excess = 0
		}
	}
	if c.seen && excess > c.Burst*1000 {
		return -1, false
	}
	c.excess, c.last, c.seen = excess, now, true
	return 0, true
}

// Done implements Counter: nginx does not look at usage.
func (c *LimitReq) Done(time.Time, int, int64) {}

func (c *LimitReq) String() string { return fmt.Sprintf("limit_req %v r/s burst %d", c.Rate, c.Burst) }
