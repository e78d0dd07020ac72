package memstore

import (
	"context"
	"math"
	"sync"

	"github.com/throttlekit/throttlekit-go/internal/store"
)

// permits is the in-flight part of the store: per key, the leases held and
// the channels of the waiters to tell when one is released. A process's
// leases die with it, so none expires here: a lease is held until it is
// released. An entry lives while it holds a lease or a waiter listens.
type permits struct {
	mu   sync.Mutex
	keys map[permitKey]*permitState
}

// permitKey names one key's permits: the shaper's prefix, the in-flight
// dimension's name and the key, kept apart (not joined into one string), so
// that no two (prefix, name, key) share an entry, whatever ":" they hold:
// shaper "a" with dimension "b:c" and shaper "a:b" with dimension "c" keep
// their own permits, as on Redis (FuzzMemoryPermitKeysAreInjective).
type permitKey struct{ base, name, key string }

type permitState struct {
	held      map[string]struct{}
	listeners map[*chan<- struct{}]struct{}
}

func keyOf(p *store.Permit) permitKey { return permitKey{p.Dim.Base, p.Dim.Name, p.Key} }

// state returns p's entry, creating it; the caller holds ps.mu.
func (ps *permits) state(k permitKey) *permitState {
	if ps.keys == nil {
		ps.keys = map[permitKey]*permitState{}
	}
	st := ps.keys[k]
	if st == nil {
		st = &permitState{held: map[string]struct{}{}, listeners: map[*chan<- struct{}]struct{}{}}
		ps.keys[k] = st
	}
	return st
}

// forget drops k's entry once it holds nothing; the caller holds ps.mu.
func (ps *permits) forget(k permitKey, st *permitState) {
	if len(st.held) == 0 && len(st.listeners) == 0 {
		delete(ps.keys, k)
	}
}

// TakePermit takes a lease on p's key if fewer than p.Limit are held.
func (m *mem) TakePermit(ctx context.Context, p *store.Permit, id string, _ float64) (store.Taken, error) {
	if err := ctx.Err(); err != nil {
		return store.Taken{}, err
	}
	ps := &m.permits
	ps.mu.Lock()
	defer ps.mu.Unlock()
	k := keyOf(p)
	st := ps.state(k)
	if _, dup := st.held[id]; !dup && int64(len(st.held)) >= p.Limit {
		n := int64(len(st.held))
		ps.forget(k, st)
		return store.Taken{InUse: n, Expiry: math.Inf(1)}, nil
	}
	st.held[id] = struct{}{}
	return store.Taken{OK: true, Lease: store.Lease{ID: id}, InUse: int64(len(st.held)), Expiry: math.Inf(1)}, nil
}

// ReleasePermit gives back l if p's key holds it, and tells the waiters.
func (m *mem) ReleasePermit(_ context.Context, p *store.Permit, l store.Lease) error {
	ps := &m.permits
	ps.mu.Lock()
	defer ps.mu.Unlock()
	k := keyOf(p)
	st := ps.keys[k]
	if st == nil {
		return nil
	}
	if _, ok := st.held[l.ID]; !ok {
		return nil
	}
	delete(st.held, l.ID)
	for ch := range st.listeners {
		select {
		case *ch <- struct{}{}:
		default:
		}
	}
	ps.forget(k, st)
	return nil
}

// PermitsInUse returns how many leases p's key holds.
func (m *mem) PermitsInUse(ctx context.Context, p *store.Permit, _ float64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ps := &m.permits
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if st := ps.keys[keyOf(p)]; st != nil {
		return int64(len(st.held)), nil
	}
	return 0, nil
}

// Freed registers ch for the releases of p's key.
func (m *mem) Freed(p *store.Permit, ch chan<- struct{}) (stop func()) {
	ps := &m.permits
	ps.mu.Lock()
	defer ps.mu.Unlock()
	k := keyOf(p)
	ref := &ch
	ps.state(k).listeners[ref] = struct{}{}
	return func() {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		if st := ps.keys[k]; st != nil {
			delete(st.listeners, ref)
			ps.forget(k, st)
		}
	}
}
