package shaper

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/script"
)

// Clamp paces key evenly until a partner's reset: the partner says that
// only remaining more calls on key are allowed in the next reset (its
// RateLimit-Remaining and RateLimit-Reset headers, which the transport
// package reads and passes here). Until then, the requests reserved on key
// (on every dimension's key, as Pause holds them) depart at least
// reset/remaining apart, in every process sharing the store, so the fleet
// spreads what is left over the window instead of spending it at once and
// collecting 429s. A clamp only ever adds a floor: the contract still
// holds, so it never speeds a key up. A later clamp replaces an earlier
// one (a new window), keeping its next slot; slots granted before a clamp
// keep their times.
//
// A remaining count the contract could not exceed before the reset anyway
// (every dimension's Burst + Count per Period over reset) records nothing;
// remaining <= 0 pauses the key until the reset (Pause); reset <= 0 does
// nothing. A reset above MaxPause is a *ConfigError.
func (s *Shaper) Clamp(ctx context.Context, key string, remaining int64, reset time.Duration) error {
	if s == nil {
		return errNilShaper
	}
	if err := ctx.Err(); err != nil {
		return err
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
	if float64(remaining) >= s.allowance(c, reset) {
		return nil
	}
	ks, err := s.keysOf(c, key)
	if err != nil {
		return err
	}
	span := algorithms.DurationMillis(reset)
	st := startStore(ctx)
	err = s.store.clamp(ctx, ks, algorithms.Millis(s.cfg.clock.Now()), span/float64(remaining), span)
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
	if c, ok := to.(interface {
		Clamp(context.Context, string, int64, time.Duration) error
	}); ok {
		return c.Clamp(ctx, key, remaining, reset)
	}
	return &ConfigError{Algorithm: "route", Field: "pick", Value: fmt.Sprintf("%T", to), Reason: "the Reserver picked for the key has no Clamp method"}
}

func (r *RedisStore) clamp(ctx context.Context, ks keyset, now, interval, span float64) error {
	all := redisKeys(ks)
	sk := make([]string, len(ks.dims))
	for i := range ks.dims {
		sk[i] = all[2*i]
	}
	err := r.write(ctx, "clamp", ks, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error {
			return script.Clamp.Run(ctx, r.client, sk, r.now(now), script.Float(interval), script.Float(span)).Err()
		})
	})
	if r.local != nil && !errors.Is(err, ErrInvalidState) { // the local fallback honours the clamp too
		_ = r.local.clamp(ctx, r.twins(ks), now, interval, span)
	}
	return err
}
