package redisstore

import (
	"strings"

	"github.com/throttlekit/throttlekit-go/internal/store"
)

// escape makes s safe before and inside the hash tag: no "{" or "}"
// survives, and the mapping is one to one.
func escape(s string) string {
	if !strings.ContainsAny(s, `{}\`) {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `{`, `\(`, `}`, `\)`).Replace(s)
}

// escapeTag is escape for the hash tag, which must never be empty: Redis
// Cluster ignores "{}" and hashes the whole key, which would scatter the keys
// of one request over several slots. The empty tag is written `\e`, which
// escape never produces.
func escapeTag(s string) string {
	if s == "" {
		return `\e`
	}
	return escape(s)
}

// escapePart is escape for the parts after the hash tag, which ":"
// separates: ":" is escaped too, so that no part can end early.
func escapePart(s string) string {
	if !strings.ContainsAny(s, `{}\:`) {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `{`, `\(`, `}`, `\)`, `:`, `\;`).Replace(s)
}

// redisKeys returns, per dimension, the state key and the pause key. tag is
// the key whose slot they all live in. The mapping from (prefix, dimension,
// key, kind) to a Redis key is one to one (FuzzRedisKeysAreInjective):
//
//	one contract:   E(prefix) "{" T(key) "}"                     state
//	                E(prefix) "{" T(key) "}:p"                   pause
//	dimension name: E(prefix) "{" T(tag) "}" P(name) ":" P(key)  state
//	                E(prefix) "{" T(tag) "}" P(name) ":" P(key) ":p"  pause
//
// (an in-flight dimension's leases are in its state key + ":f": permitKey),
// where E escapes "\", "{" and "}" (T is E, with "" written `\e` so that a
// tag is never empty), and P escapes ":" as well: the first "{" opens the
// tag, the first "}" after it closes it, a part after it never holds a raw
// ":", and a name is never empty. A key with a Ledger (see lua.Ledger) keeps
// it in the state key + ":l", ":h", ":b" and ":c", which the scripts derive: a
// command with more than ten arguments is refused, with the connection
// closed, before AUTH, so that the keys a reservation passes stay two.
func redisKeys(ks store.KeySet) []string {
	keys, tag := ks.Keys, ks.Slot
	out := make([]string, 0, 2*len(ks.Dims))
	for i, d := range ks.Dims {
		var p string // the pause key; the state key is p without ":p" (one allocation for both)
		if d.Name != "" {
			p = escape(d.Base) + "{" + escapeTag(tag) + "}" + escapePart(d.Name) + ":" + escapePart(keys[i]) + ":p"
		} else {
			p = escape(d.Base) + "{" + escapeTag(tag) + "}:p"
		}
		out = append(out, p[:len(p)-2], p)
	}
	return out
}

// derivedSuffixes are the suffixes of the keys the scripts derive from a
// state key: its Ledger's (lua.Ledger) and a partner's clamp (lua.Clamp).
var derivedSuffixes = [...]string{":l", ":h", ":b", ":c", ":k"}

// contractKey is the Redis key of prefix's live contract: the escaped
// prefix and no hash tag, which no state key is (each has one).
func contractKey(prefix string) string { return escape(prefix) + "contract" }

// permitKey is the Redis key of p's in-flight leases: a sorted set of lease
// ids scored by their expiry (ms on the scripts' clock), in the hash slot of
// p.Slot. It is the state key of p's dimension and key (redisKeys, tagged
// by p.Slot) followed by ":f", which no other kind ends with:
//
//	one contract:   E(prefix) "{" T(slot) "}:f"
//	dimension name: E(prefix) "{" T(slot) "}" P(name) ":" P(key) ":f"
//
// A shaper of one contract passes its key as the slot (the key itself is
// then not written again). Its tombstones (tombKey) are permitKey + ":t".
func permitKey(p *store.Permit) string {
	d := p.Dim
	if d.Name != "" {
		return escape(d.Base) + "{" + escapeTag(p.Slot) + "}" + escapePart(d.Name) + ":" + escapePart(p.Key) + ":f"
	}
	return escape(d.Base) + "{" + escapeTag(p.Slot) + "}:f"
}
