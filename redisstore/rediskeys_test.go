package redisstore

import (
	"strings"
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/store"
)

// keyTuple is what a Redis key must identify: the shaper's prefix, the
// dimension's name ("" for a shaper of one contract), the hash tag (the
// first dimension's key), the dimension's key, and the kind.
type keyTuple struct {
	base, name, tag, key string
	kind                 keyKind
}

// keyKind is a kind of key: a state key, a pause key, an in-flight key
// (permitKey), a key the scripts derive from a state key (derivedSuffixes),
// a key's fair turns (fairKey) or its learned record (learnedKey): the
// shaper's, not a dimension's, so their tuples have no name; or an
// in-flight key's tombstones (tombKey).
type keyKind uint8

const (
	stateKind keyKind = iota
	pauseKind
	inFlightKind
	fairKind    = inFlightKind + 1 + keyKind(len(derivedSuffixes))
	learnedKind = fairKind + 1
	tombKind    = learnedKind + 1 // an in-flight key's tombstones (tombKey)
	kinds       = tombKind + 1
)

func (k keyTuple) redisKey() string {
	d := &store.Dim{Base: k.base, Name: k.name}
	tag := k.tag
	if k.name == "" {
		tag = k.key // a shaper of one contract hashes on its own key
	}
	switch k.kind {
	case inFlightKind:
		return permitKey(&store.Permit{Dim: d, Key: k.key, Slot: tag})
	case tombKind:
		return tombKey(permitKey(&store.Permit{Dim: d, Key: k.key, Slot: tag}))
	case fairKind:
		return fairKey(&store.Turns{Base: k.base, Key: k.key, Slot: k.tag})
	case learnedKind:
		return learnedKey(&store.Learned{Base: k.base, Key: k.key, KeySet: store.KeySet{Slot: k.tag}})
	}
	keys := redisKeys(store.KeySet{Dims: []*store.Dim{d}, Keys: []string{k.key}, Slot: tag})
	switch {
	case k.kind == pauseKind:
		return keys[1]
	case k.kind > inFlightKind:
		return keys[0] + derivedSuffixes[k.kind-inFlightKind-1]
	}
	return keys[0]
}

// hashTag returns what Redis Cluster hashes: the text between the first "{"
// and the first "}" after it.
func hashTag(k string) string {
	open := strings.IndexByte(k, '{')
	if open < 0 {
		return k
	}
	closing := strings.IndexByte(k[open+1:], '}')
	if closing <= 0 {
		return k
	}
	return k[open+1 : open+1+closing]
}

// The mapping from (prefix, dimension, hash tag, key, kind) to a Redis key
// is one to one, over every kind (state, pause, in-flight, and the keys the
// scripts derive), and the cluster slot is chosen by the tag alone: no key,
// name or prefix, however hostile, can share another's Redis key or choose
// its own slot. Before the fix a user "x:p" had user "x"'s pause key.
func FuzzRedisKeysAreInjective(f *testing.F) {
	hostile := []string{"", "x", "x:p", ":p", "p", "a:b", "{", "}", "{x}", `\`, `\(`, `\;`, ":", "}:p", "x\\", "ключ", "x:f", ":f", "}:f"}
	for i, a := range hostile {
		b := hostile[(i+3)%len(hostile)]
		f.Add("tk:n:", "user", a, b, uint8(stateKind), "tk:n:", "user", a, b+":p", uint8(pauseKind))
		f.Add("tk:n:", "", a, a, uint8(stateKind), "tk:n:", "", a+":p", a+":p", uint8(pauseKind))
		f.Add("tk:n:", "a", "t", a+":b", uint8(stateKind), "tk:n:", "a:"+a, "t", "b", uint8(stateKind))
		f.Add("tk:{"+a, "", b, b, uint8(pauseKind), "tk:", "", "{"+a+"}"+b, b, uint8(stateKind))
		f.Add("tk:n:", "user", a, b, uint8(inFlightKind), "tk:n:", "user", a, b+":f", uint8(stateKind))
		f.Add("tk:n:", "", a, a, uint8(inFlightKind), "tk:n:", "", a+":f", a+":f", uint8(stateKind))
		f.Add("tk:n:", "f", a, b, uint8(inFlightKind), "tk:n:", "", "f", "f", uint8(i)%uint8(kinds))
		f.Add("tk:n:", "", a, b, uint8(fairKind), "tk:n:", "", a, b+":q", uint8(stateKind))
		f.Add("tk:n:", "", a, ":q:"+b, uint8(stateKind), "tk:n:", "", a, b, uint8(fairKind))
		f.Add("tk:n:", "q", a, b, uint8(stateKind), "tk:n:", "", a, b, uint8(fairKind))
		f.Add("tk:n:", "", a, b, uint8(learnedKind), "tk:n:", "", a, b, uint8(fairKind))
		f.Add("tk:n:", "", a, ":a:"+b, uint8(stateKind), "tk:n:", "", a, b, uint8(learnedKind))
		f.Add("tk:n:", "a", a, b, uint8(stateKind), "tk:n:", "", a, b, uint8(learnedKind))
		f.Add("tk:n:", "user", a, b, uint8(tombKind), "tk:n:", "user", a, b+":f", uint8(inFlightKind))
		f.Add("tk:n:", "", a, a, uint8(tombKind), "tk:n:", "", a+":t", a+":t", uint8(inFlightKind))
		f.Add("tk:n:", "", a, a+":f", uint8(tombKind), "tk:n:", "", a, a, uint8(stateKind))
		f.Add("tk:n:", "t", a, b, uint8(inFlightKind), "tk:n:", "", a, b, uint8(tombKind))
	}
	f.Fuzz(func(t *testing.T, base1, name1, tag1, key1 string, kind1 uint8, base2, name2, tag2, key2 string, kind2 uint8) {
		a := keyTuple{base1, name1, tag1, key1, keyKind(kind1) % kinds}
		b := keyTuple{base2, name2, tag2, key2, keyKind(kind2) % kinds}
		for _, k := range []*keyTuple{&a, &b} {
			switch {
			case k.kind == fairKind || k.kind == learnedKind: // the shaper's: no dimension name; tagged by the slot dimension's key
				k.name = ""
			case k.name == "":
				k.tag = k.key
			}
		}
		ka, kb := a.redisKey(), b.redisKey()
		if (ka == kb) != (a == b) {
			t.Fatalf("%+v -> %q\n%+v -> %q", a, ka, b, kb)
		}
		if got, want := hashTag(ka), escapeTag(a.tag); got != want || got == "" {
			t.Fatalf("%+v: Redis hashes %q, want the escaped tag %q", a, got, want)
		}
	})
}
