package memstore_test

import (
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/storetest"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// An owner alone on a key is granted every turn it asks for, on the memory
// store as on Redis (storetest.FairLoneOwner).
func TestFairALoneOwnerIsGrantedEveryTurn(t *testing.T) {
	storetest.FairLoneOwner(t, storetest.Candidate{Name: "memory", New: func() shaper.Store { return memstore.New(memstore.WithSweepInterval(0)) }})
}
