package memstore_test

import (
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/storetest"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// Status consumes nothing on the memory store (storetest.StatusConsumesNothing):
// every scenario of the cross-store conformance, run with a Status before
// each reservation and without, gives the same outcome at every step, and
// each Status predicts the reservation it precedes. The Redis store's tests
// run the same suite, and compare their transcripts with this store's.
func TestStatusConsumesNothing(t *testing.T) {
	t.Parallel()
	storetest.StatusConsumesNothing(t, storetest.Candidate{Name: "memory", New: func() shaper.Store {
		return memstore.New(memstore.WithSweepInterval(0))
	}})
}

// A learning fleet keeps what its partner said on the memory store
// (storetest.LearnedKeepsThePartnersWord): a slow policy's pace, a
// remaining count's, a clamp's, after a Reset, across a version's wrap;
// and a partner's pause never loosens its count. The Redis store's tests run the same suite on a node and a cluster.
func TestLearnedKeepsThePartnersWord(t *testing.T) {
	t.Parallel()
	c := storetest.Candidate{Name: "memory", New: func() shaper.Store {
		return memstore.New(memstore.WithSweepInterval(0))
	}}
	storetest.LearnedKeepsThePartnersWord(t, c)
	storetest.PausesKeepThePartnersCount(t, c)
	storetest.PausesNeverShortenThePace(t, c, 40)
	storetest.ALearnedPaceOutlivesAShorterQueue(t, c)
	storetest.ALearnedCountOutlivesALiftedContract(t, c)
}

// The class of the above on the memory store: whatever the feedback, a
// stated policy, a remaining count and a clamp are kept, and the learned
// rate stays under them (storetest.LearnedKeepsWhatIsStatedWhateverTheFeedback).
func TestLearnedKeepsWhatIsStatedWhateverTheFeedback(t *testing.T) {
	t.Parallel()
	storetest.LearnedKeepsWhatIsStatedWhateverTheFeedback(t, storetest.Candidate{Name: "memory", New: func() shaper.Store {
		return memstore.New(memstore.WithSweepInterval(0))
	}}, 100)
}

// Shapers whose prefix, in-flight dimension and key differ never share a
// permit on the memory store (storetest.InFlightKeysApart); the Redis
// store's tests run the same check on a node and a cluster.
func TestInFlightKeysApart(t *testing.T) {
	t.Parallel()
	storetest.InFlightKeysApart(t, storetest.Candidate{Name: "memory", New: func() shaper.Store {
		return memstore.New(memstore.WithSweepInterval(0))
	}})
}

// Takes cut short by their deadline leave no permit behind on the memory
// store (storetest.InFlightDeadlines); the Redis store's tests run it on a
// node and a cluster.
func TestInFlightDeadlines(t *testing.T) {
	t.Parallel()
	storetest.InFlightDeadlines(t, storetest.Candidate{Name: "memory", New: func() shaper.Store {
		return memstore.New(memstore.WithSweepInterval(0))
	}}, 2000)
}
