package memstore

import (
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/store"
)

// The mapping from (prefix, in-flight dimension, key) to a memory store's
// permits is one to one: a permit taken on one tuple is counted on no
// other, whatever ":" the parts hold. Before the fix the entry was named
// prefix + name + ":" and key: shaper "a" with dimension "b:c" and shaper
// "a:b" with dimension "c" (prefixes "tk:a:" and "tk:a:b:") shared one
// budget. The Redis store's FuzzRedisKeysAreInjective is the same promise
// for its keys.
func FuzzMemoryPermitKeysAreInjective(f *testing.F) {
	hostile := []string{"", "x", ":", "a:b", "b:c", "c", "tk:a:", "tk:a:b:", "{", "}", `\`, "ключ", "x:f"}
	f.Add("tk:a:", "b:c", "k", "tk:a:b:", "c", "k")
	f.Add("tk:a:", "", "b:k", "tk:a:b:", "", "k")
	f.Add("tk:", "a", "", "tk:a:", "", "")
	for i, a := range hostile {
		b := hostile[(i+3)%len(hostile)]
		f.Add("tk:"+a, b, a, "tk:"+a+":", b, a)
		f.Add("tk:", a+":"+b, "k", "tk:"+a+":", b, "k")
		f.Add("tk:", a, b+":k", "tk:", a+":"+b, "k")
	}
	f.Fuzz(func(t *testing.T, base1, name1, key1, base2, name2, key2 string) {
		m := New(WithSweepInterval(0))
		b := store.Of(m)
		permit := func(base, name, key string) *store.Permit {
			d := &store.Dim{Name: name, Base: base, Prefix: base}
			if name != "" {
				d.Prefix += name + ":"
			}
			return &store.Permit{Dim: d, Key: key, Slot: key, Limit: 1, Lease: 1000}
		}
		pa, pb := permit(base1, name1, key1), permit(base2, name2, key2)
		if tk, err := b.TakePermit(bg, pa, "first", 0); err != nil || !tk.OK {
			t.Fatalf("the first take: %+v %v", tk, err)
		}
		tk, err := b.TakePermit(bg, pb, "second", 0)
		if err != nil {
			t.Fatal(err)
		}
		same := base1 == base2 && name1 == name2 && key1 == key2
		if tk.OK == same {
			t.Fatalf("(%q, %q, %q) then (%q, %q, %q): the second take granted %v, want %v (one permit per key)", base1, name1, key1, base2, name2, key2, tk.OK, !same)
		}
	})
}
