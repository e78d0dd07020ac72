package memstore

import (
	"context"
	"sync"

	"github.com/throttlekit/throttlekit-go/internal/learn"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// learned is the learning part of the store: per key, the record its
// shapers share and the instant it expires.
type learned struct {
	mu     sync.Mutex
	keys   map[turnKey]learnedRec
	writes int // since the last sweep of expired records
}

type learnedRec struct {
	v   string
	end float64
}

// sweepLearned is how many writes pass between sweeps of expired records.
const sweepLearned = 1024

// Learn compares l's record's version with want and, when they match,
// writes rec and sets c (see store.Learning).
func (m *mem) Learn(ctx context.Context, l *store.Learned, now float64, want uint64, rec string, ttl float64, c *store.LearnClamp) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	ls := &m.learned
	ls.mu.Lock()
	defer ls.mu.Unlock()
	k := turnKey{l.Base, l.Key}
	cur, ok := ls.keys[k]
	if ok && now >= cur.end {
		delete(ls.keys, k)
		cur = learnedRec{}
	}
	if learn.Version(cur.v) != want {
		return cur.v, nil
	}
	if rec != "" {
		if ls.keys == nil {
			ls.keys = map[turnKey]learnedRec{}
		}
		if ls.writes++; ls.writes >= sweepLearned {
			ls.writes = 0
			for k, r := range ls.keys {
				if now >= r.end {
					delete(ls.keys, k)
				}
			}
		}
		cur = learnedRec{v: rec, end: now + ttl}
		ls.keys[k] = cur
	}
	if c != nil {
		m.clamp(l.KeySet, c.Now, c.Interval, c.Span, c.Tighter)
	}
	return cur.v, nil
}
