package memstore_test

import (
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/storetest"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// An owner alone on a key is granted every turn it asks for, and a dead
// one holds the turn no longer than its TTL, on the memory store as on
// Redis (storetest.FairLoneOwner, FairDeadOwner).
func TestFairTurnsOfOwners(t *testing.T) {
	c := storetest.Candidate{Name: "memory", New: func() shaper.Store { return memstore.New(memstore.WithSweepInterval(0)) }}
	storetest.FairLoneOwner(t, c)
	storetest.FairDeadOwner(t, c)
}
