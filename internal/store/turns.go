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
	// Owner names the caller among the processes sharing the key (no
	// spaces): its registrations are its own.
	Owner string
}

// FairTurns is the fair-queuing part of the store contract.
type FairTurns interface {
	// Turn applies fair.State.Turn for t.Owner to t's key at p.Now (ms on
	// the shaper's clock; a remote store reads its own) and returns its
	// reply. The key's state lives while an owner waits on it, and a
	// while after. Data at the key the store did not write, or its own
	// corrupt, fails the call with an error matching ErrInvalidState.
	Turn(ctx context.Context, t *Turns, p fair.Params, ups []fair.Update) (fair.Reply, error)
}
