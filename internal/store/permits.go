package store

import "context"

// Permit names one in-flight key of a shaper's in-flight dimension: at most
// Limit leases are held on it at once, fleet-wide on a shared store.
type Permit struct {
	Dim   *Dim   // Name and Base name the key; Bound is the store's data
	Key   string // after the dimension's Key mapping
	Slot  string // the key whose hash slot it lives in (KeySet.Slot)
	Limit int64  // permits
	Lease float64
	// Lease is how long (ms) a lease lasts once taken unless the store
	// renews it: a store of one process holds it until it is released; a
	// shared store renews the leases its process holds and lets those of a
	// process that died expire.
}

// Lease is a permit held: the id the taker chose, unique to that grant,
// and where it was granted.
type Lease struct {
	ID    string
	Local bool // granted by a failure policy's local store (FailLocal)
	Open  bool // granted by FailOpen while the store was down: nothing counted
}

// Taken is what TakePermit answers.
type Taken struct {
	OK    bool
	Lease Lease // OK: the lease to release
	InUse int64 // permits in use on the key after the call
	// Expiry is how long (ms) until the earliest lease on the key expires
	// unless renewed (+Inf when no lease can expire: a store of one process,
	// or OK): a waiter tries again then at the latest, in case its holder
	// died without releasing.
	Expiry float64
}

// Permits is the in-flight part of the store contract.
type Permits interface {
	// TakePermit takes one lease with id on p's key if fewer than p.Limit
	// are held, at now (ms on the shaper's clock; a remote store reads its
	// own). A lease held past its expiry is dropped first, never before.
	// A take that returns an error holds nothing: a store whose call may
	// have taken the lease before it failed (the caller's deadline, a
	// timeout, an outage) gives it back itself, ordered after the take
	// whatever order its calls arrive in, as soon as it can be heard. A
	// store that can no longer keep a lease (a closed Redis store, which
	// would not renew it) refuses with an error.
	TakePermit(ctx context.Context, p *Permit, id string, now float64) (Taken, error)
	// ReleasePermit gives back the lease l, if p's key still holds it: a
	// lease that expired and was granted again under another id is never
	// released by its old holder. Releasing twice does nothing. A release
	// that fails is retried by the store until it is heard (or the lease
	// expires).
	ReleasePermit(ctx context.Context, p *Permit, l Lease) error
	// PermitsInUse reads how many leases p's key holds, expired ones aside.
	PermitsInUse(ctx context.Context, p *Permit, now float64) (int64, error)
	// Freed registers ch, which receives without blocking whenever a
	// permit of p's key may have been released in any process sharing the
	// store; stop unregisters it. A notice may be lost (a shared store's
	// subscription was down): a waiter also tries again at Taken.Expiry.
	Freed(p *Permit, ch chan<- struct{}) (stop func())
}
