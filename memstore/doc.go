// Package memstore is the in-process store of package shaper: every key's
// state in this process's memory, sharded, with no allocation per
// reservation on an existing key.
//
//	store := memstore.New()
//	defer store.Close()
//	s, err := shaper.New(store, shaper.PerSecond(10))
//
// Idle keys (state equivalent to a cold key) are evicted by a background
// sweeper (WithSweepInterval); WithMaxKeys caps the entries held, and a new
// key at the cap with nothing idle fails with ErrFull. For a fleet of
// processes sharing one budget, use package redisstore.
package memstore
