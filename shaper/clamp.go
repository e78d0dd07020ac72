package shaper

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
)

// Clamp paces key evenly until a partner's reset: the partner says only
// remaining more calls are allowed within reset (its RateLimit-Remaining
// and RateLimit-Reset headers, which package transport passes here). Until
// then the requests on key (every dimension's key, as Pause holds them)
// depart at least reset/remaining apart in every process sharing the
// store. A clamp only adds a floor, never speeds a key up. A later clamp
// replaces an earlier one and spreads its count from the key's next slot
// on: a next slot the earlier clamp (a spacing margin, see Space) still
// holds stays held, but no later than the new interval after the
// departure before it, so a clamp never delays the next departure past
// where it was. A cancelled slot that was the last under a clamp gives the clamp's slot
// back; granted slots keep their times. On a shaper WithLearning the
// count caps the key's learned rate until the reset (remaining per reset,
// fleet-wide, see docs/LEARNING.md): the learned rate's clamp, renewed,
// keeps it, and a cap already tighter stays, whether the contract binds
// or not (a live SetRate may lift the contract past it before the reset).
// Without learning, a remaining count the contract could not exceed
// before the reset anyway records nothing; remaining <= 0 pauses the key
// until the reset;
// reset <= 0 does nothing; a reset above MaxPause is a *ConfigError.
func (s *Shaper) Clamp(ctx context.Context, key string, remaining int64, reset time.Duration) error {
	return s.clamp(ctx, key, remaining, reset, false)
}

// clamp is Clamp; with keepTighter (a pause's resumed pace) it merges with
// the clamp in force: the one spacing departures further apart holds,
// until the later of the two ends, so that the pace after a partner's
// pause never loosens the partner's own count, and a later, shorter pause
// (a Retry-After counting down) never shortens the pace a longer one set.
func (s *Shaper) clamp(ctx context.Context, key string, remaining int64, reset time.Duration, keepTighter bool) error {
	if s == nil {
		return errNilShaper
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.rateless { // nothing but permits: no pace to clamp
		return nil
	}
	if reset > MaxPause {
		return &ConfigError{Algorithm: "shaper", Field: "Clamp", Value: reset, Reason: fmt.Sprintf("the reset must be at most %v", MaxPause)}
	}
	if reset <= 0 {
		return nil
	}
	if remaining <= 0 {
		return s.Pause(ctx, key, reset)
	}
	c := s.live()
	if s.learner != nil { // the learned rate's clamp carries it: one clamp per key, which its renewal never loosens
		return s.learnCap(ctx, c, key, remaining, reset)
	}
	if float64(remaining) >= s.allowance(c, reset) {
		return nil
	}
	ks, err := s.keysOf(c, key)
	if err != nil {
		return err
	}
	span := algorithms.DurationMillis(reset)
	st := startStore(ctx)
	err = s.store.Clamp(ctx, ks, algorithms.Millis(s.cfg.clock.Now()), span/float64(remaining), span, keepTighter)
	st.done("clamp", err)
	return err
}

// allowance is how many requests of cost 1 contract c lets depart within
// d: the least, over its dimensions, of Burst + Count per Period over d.
func (s *Shaper) allowance(c *contract, d time.Duration) float64 {
	least := math.Inf(1)
	for _, dm := range c.dims {
		r := dm.rate
		least = min(least, float64(r.burst())+float64(r.Count)*d.Seconds()/r.Period.Seconds())
	}
	return least
}

// Clamp clamps key on the Reserver it routes to (see Shaper.Clamp); one
// without a Clamp method fails with a *ConfigError.
func (r *router) Clamp(ctx context.Context, key string, remaining int64, reset time.Duration) error {
	to, err := r.to(key)
	if err != nil {
		return err
	}
	if c, ok := to.(Clamper); ok {
		return c.Clamp(ctx, key, remaining, reset)
	}
	return &ConfigError{Algorithm: "route", Field: "pick", Value: fmt.Sprintf("%T", to), Reason: "the Reserver picked for the key has no Clamp method"}
}
