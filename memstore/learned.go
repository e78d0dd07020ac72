package memstore

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/throttlekit/throttlekit-go/internal/learn"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// learned is the learning part of the store: per key, the record its
// shapers share and the instant it expires, and the tallies of the
// partner's answers.
type learned struct {
	mu      sync.Mutex
	keys    map[turnKey]learnedRec
	tallies map[turnKey]*tallies
	writes  int // since the last sweep of expired records
}

type learnedRec struct {
	v   string
	end float64
}

// tallies are a key's buckets and the instant they expire.
type tallies struct {
	b   map[int64]store.Tally
	end float64
}

// sweepLearned is how many writes pass between sweeps of expired records.
const sweepLearned = 1024

// Learn adds op's tallies, compares l's record's version with op.Want
// and, when they match, writes op.Rec and sets op.Clamp (see
// store.Learning).
func (m *mem) Learn(ctx context.Context, l *store.Learned, op *store.LearnOp) (string, []store.Tally, error) {
	if err := ctx.Err(); err != nil {
		return "", nil, err
	}
	ls := &m.learned
	ls.mu.Lock()
	defer ls.mu.Unlock()
	now := op.Now
	k := turnKey{l.Base, l.Key}
	if ls.writes++; ls.writes >= sweepLearned {
		ls.writes = 0
		for k, r := range ls.keys {
			if now >= r.end {
				delete(ls.keys, k)
			}
		}
		for k, t := range ls.tallies {
			if now >= t.end {
				delete(ls.tallies, k)
			}
		}
	}
	var out []store.Tally
	if len(op.Add) > 0 || op.From > 0 {
		t := ls.tallies[k]
		if t != nil && now >= t.end {
			t = nil
		}
		if t == nil && len(op.Add) > 0 {
			if ls.tallies == nil {
				ls.tallies = map[turnKey]*tallies{}
			}
			t = &tallies{b: map[int64]store.Tally{}}
			ls.tallies[k] = t
		}
		if t != nil {
			if len(op.Add) > 0 {
				for _, a := range op.Add {
					c := t.b[a.Bucket]
					c.Bucket, c.Accepted, c.Answered = a.Bucket, c.Accepted+a.Accepted, c.Answered+a.Answered
					t.b[a.Bucket] = c
				}
				t.end = now + store.TallyLife
			}
			oldest := int64((now - store.TallyLife) / store.TallyWidth)
			for _, b := range slices.Sorted(maps.Keys(t.b)) {
				if b < oldest {
					delete(t.b, b)
				} else if op.From > 0 && b >= op.From {
					out = append(out, t.b[b])
				}
			}
		}
	}
	cur, ok := ls.keys[k]
	if ok && now >= cur.end {
		delete(ls.keys, k)
		cur = learnedRec{}
	}
	if learn.Version(cur.v) != op.Want {
		return cur.v, out, nil
	}
	if op.Rec != "" {
		if ls.keys == nil {
			ls.keys = map[turnKey]learnedRec{}
		}
		cur = learnedRec{v: op.Rec, end: now + op.TTL}
		ls.keys[k] = cur
	}
	if c := op.Clamp; c != nil {
		if op.Reset { // the clamp in force stays throughout: no reservation sees the keys unclamped
			m.reset(l.KeySet, c.Now, true)
		}
		m.clamp(l.KeySet, c.Now, c.Interval, c.Span, c.Tighter, false)
	}
	return cur.v, out, nil
}
