package redisstore

import (
	"strings"
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/store"
)

// keyTuple is what a Redis key must identify: the shaper's prefix, the
// dimension's name ("" for a shaper of one contract), the hash tag (the
// first dimension's key), the dimension's key, and the kind (state or pause).
type keyTuple struct {
	base, name, tag, key string
	pause                bool
}

func (k keyTuple) redisKey() string {
	d := &store.Dim{Base: k.base, Name: k.name}
	tag := k.tag
	if k.name == "" {
		tag = k.key // a shaper of one contract hashes on its own key
	}
	keys := redisKeys(store.KeySet{Dims: []*store.Dim{d}, Keys: []string{k.key}, Slot: tag})
	if k.pause {
		return keys[1]
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
// is one to one, and the cluster slot is chosen by the tag alone: no key,
// name or prefix, however hostile, can share another's Redis key or choose
// its own slot. Before the fix a user "x:p" had user "x"'s pause key.
func FuzzRedisKeysAreInjective(f *testing.F) {
	hostile := []string{"", "x", "x:p", ":p", "p", "a:b", "{", "}", "{x}", `\`, `\(`, `\;`, ":", "}:p", "x\\", "ключ"}
	for i, a := range hostile {
		b := hostile[(i+3)%len(hostile)]
		f.Add("tk:n:", "user", a, b, false, "tk:n:", "user", a, b+":p", true)
		f.Add("tk:n:", "", a, a, false, "tk:n:", "", a+":p", a+":p", true)
		f.Add("tk:n:", "a", "t", a+":b", false, "tk:n:", "a:"+a, "t", "b", false)
		f.Add("tk:{"+a, "", b, b, true, "tk:", "", "{"+a+"}"+b, b, false)
	}
	f.Fuzz(func(t *testing.T, base1, name1, tag1, key1 string, pause1 bool, base2, name2, tag2, key2 string, pause2 bool) {
		a := keyTuple{base1, name1, tag1, key1, pause1}
		b := keyTuple{base2, name2, tag2, key2, pause2}
		if a.name == "" {
			a.tag = a.key
		}
		if b.name == "" {
			b.tag = b.key
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
