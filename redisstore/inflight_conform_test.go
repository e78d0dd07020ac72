package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/learn"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/storetest"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// The in-flight scenario gives the memory store's transcript on a node and
// on a real 3-master cluster: permits up to the limit, released once,
// given back by a cancel and a refusal, counted by Status, and waiters
// served in order, woken by the release notices of the store's
// subscription. And fair turns give the memory store's replies, bit for
// bit: lua/fair_turn.lua is internal/fair's Turn; an owner alone is
// granted every turn it asks for. And a learning fleet
// paces and reports as it does on memory: lua/learn.lua is memstore's
// Learn.
func TestInFlightAndTurnsMatchMemoryStore(t *testing.T) {
	t.Parallel()
	// Timeless: the scripts set TTLs in the fake clock's milliseconds, and
	// under load Redis expired a key in real time between two steps at the
	// same simulated instant (a refusal past MaxQueue admitted on the
	// cluster, once in make test), which the memory store kept.
	node, cluster := redistest.NodeAndCluster(t)
	for _, client := range []redis.UniversalClient{node, cluster} {
		c := storetest.Candidate{Name: fmt.Sprintf("%T", client), New: func() shaper.Store {
			s := New(client, WithClientClock(), WithTimeout(slowMachine))
			t.Cleanup(func() { _ = s.Close() })
			return s
		}}
		storetest.InFlight(t, c)
		storetest.InFlightKeysApart(t, c)
		storetest.FairTurns(t, c)
		storetest.FairLoneOwner(t, c)
		storetest.FairDeadOwner(t, c)
		storetest.Learned(t, c)
	}
}

// A ctx that ends while the take's script runs leaves no permit behind:
// the lease the script may have taken is given back by the store's
// clean-up within a retry, not when it expires (found by the in-flight fleet example: 500 Acquires with
// timeouts of 0 to 600 µs left every permit of 100 held for a lease).
func TestInFlightATakeCutShortLeavesNoPermit(t *testing.T) {
	t.Parallel()
	srv, deadlines := redisClient(t)
	plain := srv.Client() // its calls run on after the caller's ctx ends
	for _, client := range []redis.UniversalClient{plain, deadlines} {
		st := New(client, WithTimeout(slowMachine))
		defer st.Close()
		s, err := shaper.All(st, []shaper.Dimension{{Name: "open", InFlight: 100}}, shaper.WithName(fmt.Sprintf("cut-short-%p", client)))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var wg sync.WaitGroup
		for i := range 500 {
			wg.Go(func() {
				c, cancel := context.WithTimeout(ctx, time.Duration(i%13)*50*time.Microsecond)
				defer cancel()
				if r, err := s.Acquire(c, "k", 1); err == nil {
					_ = r.Release(ctx)
				}
			})
		}
		wg.Wait()
		// The store's clean-up gives back what a cut take took within a
		// retry (50 ms at most), not a lease (10 s) later: polled for 2 s,
		// the tolerance for this host's scheduling.
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			status, err := s.Status(ctx, "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			held := status.Dimensions[0].InFlight
			if held == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%T: %d permits held 2 s after every Acquire returned and every grant was released", client, held)
			}
		}
	}
}

// A learning fleet keeps what its partner said on a node and on a real
// 3-master cluster, as on memory (storetest.LearnedKeepsThePartnersWord):
// a slow policy's pace, a remaining count's, a clamp's, after a Reset,
// across a version's wrap (lua/learn.lua reads versions as Go does); and
// whatever the feedback (storetest.LearnedKeepsWhatIsStatedWhateverTheFeedback);
// a partner's pause never loosens its count (storetest.PausesKeepThePartnersCount);
// a learned pace outlives a MaxQueue shrunk live (storetest.ALearnedPaceOutlivesAShorterQueue);
// and a partner's count outlives a contract lifted live (storetest.ALearnedCountOutlivesALiftedContract).
func TestLearnedKeepsThePartnersWord(t *testing.T) {
	t.Parallel()
	// Timeless: the scripts set TTLs in the fake clock's milliseconds, and
	// under load Redis expired a key in real time between two steps at the
	// same simulated instant (a refusal past MaxQueue admitted on the
	// cluster, once in make test), which the memory store kept.
	node, cluster := redistest.NodeAndCluster(t)
	for _, client := range []redis.UniversalClient{node, cluster} {
		t.Run(fmt.Sprintf("%T", client), func(t *testing.T) {
			c := storetest.Candidate{Name: fmt.Sprintf("%T", client), New: func() shaper.Store {
				s := New(client, WithClientClock(), WithTimeout(slowMachine))
				t.Cleanup(func() { _ = s.Close() })
				return s
			}}
			storetest.LearnedKeepsThePartnersWord(t, c)
			storetest.LearnedKeepsWhatIsStatedWhateverTheFeedback(t, c, 6)
			storetest.PausesKeepThePartnersCount(t, c)
			storetest.PausesNeverShortenThePace(t, c, 6)
			storetest.ALearnedPaceOutlivesAShorterQueue(t, c)
			storetest.ALearnedCountOutlivesALiftedContract(t, c)
		})
	}
}

// lua/learn.lua reads a record's version as learn.Version does, string
// for string: it writes over a record exactly when the version the caller
// expects is the one Go reads, so Go and Lua agree on every record, foreign
// ones included (issue 37, defect 27: a version is never taken for 0, "no
// record", unless Go takes it so too).
func TestLearnReadsAVersionAsGoDoes(t *testing.T) {
	t.Parallel()
	_, client := redisClient(t)
	st := New(client, WithClientClock(), WithTimeout(slowMachine))
	defer st.Close()
	b := store.Of(st)
	l := &store.Learned{Base: "ver:", Key: "k", KeySet: store.KeySet{Slot: "k"}}
	for i, v := range []string{"", "0 1", "1 2", "007 1", "7 1", "+7 1", "7x 1", " 7 1", "7", "18446744073709551614 1", "18446744073709551615 1",
		"18446744073709551616 1", "99999999999999999999 1", "100000000000000000000 1", "1e3 1", "٣ 1"} {
		l.Key = fmt.Sprintf("k%d", i)
		if v != "" {
			if err := client.Set(context.Background(), learnedKey(l), v, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		want := learn.Version(v)
		for _, try := range []uint64{want, want + 1} {
			cur, _, err := b.Learn(context.Background(), l, &store.LearnOp{Now: 1, Want: try, Rec: "5 x", TTL: 1e6})
			if err != nil {
				t.Fatal(err)
			}
			if wrote := cur == "5 x"; wrote != (try == want) {
				t.Fatalf("record %q: Go reads version %d; expecting %d, the script wrote: %v", v, want, try, wrote)
			}
			if cur == "5 x" {
				break
			}
		}
	}
}
