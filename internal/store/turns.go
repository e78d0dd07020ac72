package store

import (
	"context"

	"github.com/throttlekit/throttlekit-go/internal/fair"
)

// Turns names one key's fair turns: the flows of a shaper's requests
// waiting on the key take turns in the order of package fair.
type Turns struct {
	Base string // the shaper's prefix
	Key  string // the caller's key
	Slot string // the key whose hash slot it lives in (KeySet.Slot)
}

// FairTurns is the fair-queuing part of the store contract.
type FairTurns interface {
	// Turn applies fair.State.Turn to t's key at p.Now (ms on the
	// shaper's clock; a remote store reads its own) and returns its reply.
	// The key's state lives while a flow waits on it, and TTL after.
	Turn(ctx context.Context, t *Turns, p fair.Params, cands []fair.Cand) (fair.Reply, error)
}
