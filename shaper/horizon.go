package shaper

import (
	"context"
	"slices"
	"sync"
	"time"
)

// WithHorizon holds, in each process, the requests of a key that would
// take a slot more than d ahead (default: none held; every request takes
// its slot at once, up to MaxQueue ahead): Wait and Acquire let them take
// their slots in arrival order, as the slots of this process come within
// d, so that a key never holds more than about d of slots per process
// ahead of time. Slots granted ahead count their reservations' estimates
// until the calls settle for what they used: under a long queue, a
// contract whose calls settle for less (LLM tokens against a trailing
// window) would keep much of its window for estimates; held back, it keeps
// d's worth per process. A wait the held requests say would pass MaxQueue
// is refused at once with a *QueueFullError. Package partner sets it for
// limits of a call's cost.
func WithHorizon(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			c.err = &ConfigError{Algorithm: "shaper", Field: "Horizon", Value: d, Reason: "must be >= 0 (0: none)"}
		}
		c.horizon = d
	}
}

// horizon is WithHorizon's gate: per key, this process's latest slot and
// the requests waiting to take theirs.
type horizon struct {
	clock  Clock
	span   time.Duration
	mu     sync.Mutex
	keys   map[string]*ahead
	enters int // since the last sweep of idle keys
}

// ahead is one key's gate: its latest slot granted in this process, the
// reservations being made, and the requests waiting in arrival order (the
// first is woken when it may go).
type ahead struct {
	tail    time.Time
	making  int
	waiters []chan struct{}
	spans   []time.Duration // each waiter's span (fair.go's span), in waiters' order
	queued  time.Duration   // their sum
}

// enter waits until key's latest slot in this process is within the span
// and no request is ahead of this one, and returns the call that records
// the slot this request got (its Time; zero when it got none).
func (h *horizon) enter(ctx context.Context, s *Shaper, c *contract, key string, cost int64) (func(time.Time), error) {
	clk := s.cfg.clock
	h.mu.Lock()
	now := clk.Now()
	if h.enters++; h.enters >= 1024 { // drop the keys idle since their last slot
		h.enters = 0
		for k, a := range h.keys {
			h.forget(k, a, now)
		}
	}
	a := h.keys[key]
	if a == nil {
		a = &ahead{}
		h.keys[key] = a
	}
	if len(a.waiters) == 0 && a.making == 0 && a.tail.Sub(now) <= h.span {
		a.making++
		h.mu.Unlock()
		return func(slot time.Time) { h.leave(key, a, slot) }, nil
	}
	// The requests ahead leave at the contract's rate at best.
	mine := s.span(ctx, c, cost)
	ahead := max(a.tail.Sub(now), 0) // a zero tail: none granted yet
	if late := ahead + a.queued + mine - h.span - c.maxQueue; late > 0 {
		h.forget(key, a, now)
		h.mu.Unlock()
		return nil, s.queueFull(c, key, late, "")
	}
	if dl, ok := ctx.Deadline(); ok {
		if wait := ahead + a.queued + mine - h.span; wait > time.Until(dl) {
			h.forget(key, a, now)
			h.mu.Unlock()
			return nil, &DeadlineError{Key: key, Delay: wait, Deadline: dl}
		}
	}
	ch := make(chan struct{}, 1)
	a.waiters, a.spans, a.queued = append(a.waiters, ch), append(a.spans, mine), a.queued+mine
	h.mu.Unlock()
	for {
		h.mu.Lock()
		now = clk.Now()
		var wait time.Duration // 0: until woken
		if a.waiters[0] == ch && a.making == 0 {
			if a.tail.Sub(now) <= h.span {
				a.queued -= a.spans[0]
				a.waiters, a.spans = a.waiters[1:], a.spans[1:]
				a.making++
				h.wake(a)
				h.mu.Unlock()
				return func(slot time.Time) { h.leave(key, a, slot) }, nil
			}
			wait = a.tail.Sub(now) - h.span
		}
		h.mu.Unlock()
		var tc <-chan time.Time
		var t Timer
		if wait > 0 {
			t = clk.NewTimer(wait)
			tc = t.C()
		}
		select {
		case <-ch:
		case <-tc:
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			h.mu.Lock()
			if i := slices.Index(a.waiters, ch); i >= 0 {
				a.queued -= a.spans[i]
				a.waiters, a.spans = slices.Delete(a.waiters, i, i+1), slices.Delete(a.spans, i, i+1)
			}
			h.wake(a)
			h.forget(key, a, clk.Now())
			h.mu.Unlock()
			return nil, ctx.Err()
		}
		if t != nil {
			t.Stop()
		}
	}
}

// leave records the slot a request of key got and lets the next one
// check; h.mu is not held.
func (h *horizon) leave(key string, a *ahead, slot time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if slot.After(a.tail) {
		a.tail = slot
	}
	a.making--
	h.wake(a)
	h.forget(key, a, h.now())
}

// wake tells the first waiter of a to look again; h.mu is held.
func (h *horizon) wake(a *ahead) {
	if len(a.waiters) > 0 {
		select {
		case a.waiters[0] <- struct{}{}:
		default:
		}
	}
}

// forget drops a key that nobody waits on or reserves on and whose latest
// slot has come; h.mu is held.
func (h *horizon) forget(key string, a *ahead, now time.Time) {
	if a.making == 0 && len(a.waiters) == 0 && !a.tail.After(now) {
		if h.keys[key] == a {
			delete(h.keys, key)
		}
	}
}

func (h *horizon) now() time.Time { return h.clock.Now() }
