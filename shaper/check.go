package shaper

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// check validates what every method is given and reads the clock once.
func (s *Shaper) check(ctx context.Context, c *contract, key string, cost int64) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if err := checkKey(key); err != nil {
		return time.Time{}, err
	}
	if cost < 1 {
		if len(c.dims) == 0 { // nothing but an in-flight dimension
			return time.Time{}, &CostError{Algorithm: "in-flight", Cost: cost, Reason: "must be >= 1", Key: key, Dimension: s.flight.dim.Name}
		}
		return time.Time{}, &CostError{Algorithm: c.dims[0].Alg.Name(), Cost: cost, Reason: "must be >= 1", Key: key, Dimension: c.dims[0].Name}
	}
	return s.cfg.clock.Now(), nil
}

// validCost checks cost against d's admissibility rule before any store is
// asked, so that every store gives the same answer, and a cost that can
// never be admitted is refused before a round trip (the Redis scripts check
// it again and refuse without writing).
func validCost(d *dim, alg algorithms.Algorithm, key string, cost int64) error {
	if err := alg.ValidateCost(cost); err != nil {
		return store.NameCost(err, &d.Dim, key)
	}
	return nil
}

// admissible checks c against alg on d's key dimKey: a cost alg could never
// admit is an error for All; for Any it only leaves d out (never), since
// another dimension may admit it.
func (s *Shaper) admissible(d *dim, alg algorithms.Algorithm, dimKey string, c int64) (never, err error) {
	if err := validCost(d, alg, dimKey, c); err != nil {
		if s.any {
			return err, nil
		}
		return nil, err
	}
	return nil, nil
}

func checkKey(key string) error {
	if len(key) > MaxKeyLen {
		return &KeyError{Key: key[:64], Len: len(key), Reason: fmt.Sprintf("longer than MaxKeyLen (%d bytes)", MaxKeyLen)}
	}
	return nil
}

// keys maps key to every dimension's key, in the contract in force.
func (s *Shaper) keys(key string) (store.KeySet, error) {
	return s.keysOf(s.cur.Load(), key)
}

// keysOf is keys in contract c.
func (s *Shaper) keysOf(c *contract, key string) (store.KeySet, error) {
	if err := checkKey(key); err != nil {
		return store.KeySet{}, err
	}
	keys := make([]string, len(c.dims))
	for i, d := range c.dims {
		keys[i] = key
		if d.key != nil {
			keys[i] = d.key(key)
			if err := checkKey(keys[i]); err != nil {
				return store.KeySet{}, err
			}
		}
	}
	return store.KeySet{Dims: c.sdims, Keys: keys, Slot: s.slotOf(key)}, nil
}

// slotOf returns the key whose hash slot holds every key of a request on
// key: the slot dimension's key (see Dimension.Slot).
func (s *Shaper) slotOf(key string) string {
	if s.slot == nil || s.slot.key == nil {
		return key
	}
	return s.slot.key(key)
}
