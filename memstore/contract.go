package memstore

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/throttlekit/throttlekit-go/internal/store"
)

// memRecord is a store's record for one prefix; its version is read
// on every call of the shapers under the prefix.
type memRecord struct {
	ver atomic.Uint64
	mu  sync.Mutex
	rec store.Record
}

// recordOf returns the record of prefix, creating an empty one.
func (m *mem) recordOf(prefix string) *memRecord {
	m.recMu.Lock()
	defer m.recMu.Unlock()
	if m.records == nil {
		m.records = map[string]*memRecord{}
	}
	r, ok := m.records[prefix]
	if !ok {
		r = &memRecord{}
		m.records[prefix] = r
	}
	return r
}

// Watch returns the version of prefix's record, which WriteContract moves
// at once: a shaper follows a change on its next call.
func (m *mem) Watch(prefix string) *atomic.Uint64 { return &m.recordOf(prefix).ver }

// ReadContract returns prefix's record.
func (m *mem) ReadContract(_ context.Context, prefix string) (store.Record, error) {
	r := m.recordOf(prefix)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.Clone(), nil
}

// WriteContract records one change of prefix's contract.
func (m *mem) WriteContract(_ context.Context, prefix, identity, field, value string) (store.Record, error) {
	r := m.recordOf(prefix)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec.Merge(identity, field, value)
	r.ver.Store(r.rec.Version)
	return r.rec.Clone(), nil
}

// Rebind gives d's namespace d's algorithm: the one every shard's keys of
// the namespace are swept and judged idle by.
func (m *mem) Rebind(d *store.Dim) (any, error) {
	md := d.Bound.(*memDim)
	m.nsMu.Lock()
	algs := slices.Clone(*m.algs.Load())
	algs[md.ns] = d.Alg
	m.algs.Store(&algs)
	m.nsMu.Unlock()
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		if int(md.ns) < len(sh.spaces) && sh.spaces[md.ns] != nil {
			sp := sh.spaces[md.ns]
			sp.alg = d.Alg
			if sp.states.states != nil {
				sp.states.alg = d.Alg
			}
		}
		sh.mu.Unlock()
	}
	return md, nil
}
