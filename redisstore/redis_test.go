package redisstore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/storetest"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// The Redis helpers every store's tests share (internal/redistest).
const slowMachine = redistest.SlowMachine

var (
	redisClient    = redistest.DeadlineClient
	nodeAndCluster = redistest.NodeAndCluster
	timeless       = redistest.Timeless
)

// The Redis store (client clock) and the memory store give the same outcome
// for every operation of every scenario (storetest.Conformance): same
// delays, same refusals, same errors; keys with braces, spaces, backslashes
// and non-ASCII included.
//
// With batched, every reservation goes through the batch script
// (script.ReserveBatch) as a batch of one, as coalesced reservations do;
// TestRedisBatchesDecideAsOneCallEach covers batches of many.
func conformance(t *testing.T, client redis.UniversalClient, batched bool) {
	timeless(client)
	storetest.Conformance(t, storetest.Candidate{Name: fmt.Sprint(batched), New: func() shaper.Store {
		s := New(client, WithClientClock(), WithTimeout(5*time.Second))
		if batched {
			spyOn(s).batched = true
		}
		return s
	}})
}

// clientClockStore returns a Candidate: stores on client, on the client
// clock.
func clientClockStore(client redis.UniversalClient) storetest.Candidate {
	return storetest.Candidate{Name: fmt.Sprintf("%T", client), New: func() shaper.Store {
		return New(client, WithClientClock(), WithTimeout(slowMachine))
	}}
}

func TestRedisStoreMatchesMemoryStore(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	conformance(t, c, false)
	conformance(t, c, true)
}

func TestRedisClusterMatchesMemoryStore(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	c := cl.Client(t)
	conformance(t, c, false)
	conformance(t, c, true)
}

// Keys never choose their slot: braces in keys and prefixes are escaped, so a
// key's own text decides nothing, and a multi-dimension reservation's keys
// share the slot of its first dimension's key.
func TestRedisKeysAreEscaped(t *testing.T) {
	t.Parallel()
	d := &store.Dim{Base: "tk:{evil}:", Name: "tokens"}
	keys := redisKeys(store.KeySet{Dims: []*store.Dim{{Base: "tk:{evil}:"}, d}, Keys: []string{"{slot}x", "y}"}, Slot: "{slot}x"})
	for _, k := range keys {
		open := strings.Index(k, "{")
		closing := strings.Index(k[open+1:], "}")
		if tag := k[open+1 : open+1+closing]; tag != `\(slot\)x` {
			t.Fatalf("key %q hashes on %q, want the escaped first key", k, tag)
		}
	}
	if escape(`a\(`) == escape(`a{`) {
		t.Fatal("escaping is not one to one")
	}
}

// The memory store, a single node and the cluster give the same outcome for
// edge inputs (storetest.Edges): costs at and past every algorithm's
// admissibility boundary, keys at the MaxQueue boundary, and keys built to
// collide.
func TestEdgeInputsAreTheSameOnEveryStore(t *testing.T) {
	t.Parallel()
	single, cluster := nodeAndCluster(t)
	storetest.Edges(t, clientClockStore(single), clientClockStore(cluster))
}

// Status consumes nothing on Redis (storetest.StatusConsumesNothing): every
// scenario, run with a Status before each reservation and without, gives
// the same outcome at every step, on a node and on the 3-master cluster.
func TestStatusConsumesNothing(t *testing.T) {
	t.Parallel()
	single, cluster := nodeAndCluster(t)
	for _, c := range []redis.UniversalClient{single, cluster} {
		storetest.StatusConsumesNothing(t, clientClockStore(c))
	}
}

// timeless does what the tests on a simulated clock rely on: every key a
// script wrote, its Ledger's included, has no TTL once the call returns.
func TestTimelessClientsKeepEveryKeyTheScriptsWrite(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	timeless(c)
	clock := timer.NewFake(storetest.T0)
	s, err := shaper.New(New(c, WithClientClock(), WithTimeout(slowMachine)), shaper.PerSecond(10).WithBurst(3), shaper.WithClock(clock), shaper.WithPrefix("tl:"))
	if err != nil {
		t.Fatal(err)
	}
	r := mustReserve(t, s, "k", 2)
	if err := r.Settle(bg, 1); err != nil { // writes the key's Ledger
		t.Fatal(err)
	}
	if err := s.Pause(bg, "k", time.Second); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(bg, "tl:*").Result()
	if err != nil || len(keys) < 3 {
		t.Fatalf("keys %v (%v): want the state, its Ledger and the pause", keys, err)
	}
	for _, k := range keys {
		if ttl := c.PTTL(bg, k).Val(); ttl != -1*time.Nanosecond && ttl != -1*time.Millisecond {
			t.Fatalf("%s keeps a TTL of %v", k, ttl)
		}
	}
}
