package memstore

import (
	"context"
	"sync"

	"github.com/throttlekit/throttlekit-go/internal/fair"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// turns is the fair part of the store: per key, its fair.State. An entry
// lives while an owner waits on its key: the shaper leaves (fair.Update.Leave)
// when its last request of a flow is served or gone.
type turns struct {
	mu   sync.Mutex
	keys map[turnKey]*fair.State
}

type turnKey struct{ base, key string }

// Turn applies fair.State.Turn to t's key.
func (m *mem) Turn(ctx context.Context, t *store.Turns, p fair.Params, ups []fair.Update) (fair.Reply, error) {
	if err := ctx.Err(); err != nil {
		return fair.Reply{}, err
	}
	ts := &m.turns
	ts.mu.Lock()
	defer ts.mu.Unlock()
	k := turnKey{t.Base, t.Key}
	st := ts.keys[k]
	if st == nil {
		if ts.keys == nil {
			ts.keys = map[turnKey]*fair.State{}
		}
		st = &fair.State{}
		ts.keys[k] = st
	}
	reply := st.Turn(p, t.Owner, ups)
	if !st.Active(p.Now) {
		delete(ts.keys, k)
	}
	return reply, nil
}
