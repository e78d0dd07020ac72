package shaper

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
)

// benchShaper: the real clock, a rate no benchmark exhausts, Allow-like use of
// Reserve (every call admitted at once).
func benchShaper(b testing.TB) (*Shaper, *memstore.Store) {
	store := memstore.New(memstore.WithSweepInterval(0))
	s, err := New(store, Rate{Count: 100000, Period: time.Second, Burst: 1 << 40})
	if err != nil {
		b.Fatal(err)
	}
	return s, store
}

// warmKeys returns n keys, each reserved once so that it exists in the store.
func warmKeys(s *Shaper, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
		_, _ = s.Reserve(bg, keys[i], 1)
	}
	return keys
}

// BenchmarkReserve: a hot key, 10,000 keys, and in parallel; allocations per
// reservation on existing keys are 0.
func BenchmarkReserve(b *testing.B) {
	b.Run("hot-key", func(b *testing.B) {
		s, _ := benchShaper(b)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Reserve(bg, "hot", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("10k-keys", func(b *testing.B) {
		s, _ := benchShaper(b)
		keys := warmKeys(s, 10000)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := s.Reserve(bg, keys[i%len(keys)], 1); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("parallel-10k-keys", func(b *testing.B) {
		s, _ := benchShaper(b)
		keys := warmKeys(s, 10000)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				_, _ = s.Reserve(bg, keys[i%len(keys)], 1)
				i += 7
			}
		})
	})
	b.Run("parallel-hot-key", func(b *testing.B) {
		s, _ := benchShaper(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, _ = s.Reserve(bg, "hot", 1)
			}
		})
	})
}

// BenchmarkBytesPerKey reports the heap held per live key of the memory store
// (leaky bucket; keys "user:NNNNNN", their strings included).
func BenchmarkBytesPerKey(b *testing.B) {
	const N = 200_000
	keys := make([]string, N)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(100000+i)
	}
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s, store := benchShaper(b)
		for _, k := range keys {
			_, _ = s.Reserve(bg, string([]byte(k)), 1) // a fresh string, as a caller's would be
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/N, "B/key")
		runtime.KeepAlive(store)
	}
}

func TestReserveOnAnExistingKeyDoesNotAllocate(t *testing.T) {
	s, _ := benchShaper(t)
	_, _ = s.Reserve(bg, "k", 1)
	if n := testing.AllocsPerRun(1000, func() { _, _ = s.Reserve(bg, "k", 1) }); n != 0 {
		t.Fatalf("%v allocations per Reserve on an existing key, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _, _ = s.Allow(bg, "k", 1) }); n != 0 {
		t.Fatalf("%v allocations per Allow on an existing key, want 0", n)
	}
}

// BenchmarkReserveAll: requests plus tokens on one account (two dimensions).
func BenchmarkReserveAll(b *testing.B) {
	store := memstore.New(memstore.WithSweepInterval(0))
	s, err := All(store, []Dimension{
		{Name: "requests", Rate: Rate{Count: 100000, Period: time.Second, Burst: 1 << 40}, Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: Rate{Count: 100000, Period: time.Second, Burst: 1 << 40}},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Reserve(bg, "acct", 700); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewKeyAtTheCap: the cost of a new key in a store at its MaxKeys
// cap of 1,000,000 keys, when every key is throttled (the new key is
// refused with memstore.ErrFull) and when every key is idle (the new key evicts
// one), on the fake clock so that the store's state is the same for every
// call. Each ns/op is one new key.
func BenchmarkNewKeyAtTheCap(b *testing.B) {
	const keys = 1_000_000
	fill := func(b *testing.B) (*Shaper, *timer.Fake) {
		clock := timer.NewFake(t0)
		store := memstore.New(memstore.WithMaxKeys(keys), memstore.WithSweepInterval(0))
		s, err := New(store, PerMinute(1), WithClock(clock))
		if err != nil {
			b.Fatal(err)
		}
		for i := range keys {
			if _, err := s.Reserve(bg, "user:"+strconv.Itoa(i), 1); err != nil {
				b.Fatal(err)
			}
		}
		return s, clock
	}
	names := make([]string, 1<<20)
	for i := range names {
		names[i] = "new:" + strconv.Itoa(i)
	}
	b.Run("refused", func(b *testing.B) {
		s, _ := fill(b)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := s.Reserve(bg, names[i%len(names)], 1); err != memstore.ErrFull {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("evicting", func(b *testing.B) {
		s, clock := fill(b)
		clock.Advance(time.Hour) // every key idle
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := s.Reserve(bg, names[i%len(names)], 1); err != nil {
				b.Fatal(err)
			}
			i++
			if i%keys == 0 {
				clock.Advance(time.Hour) // every old key evicted: the new ones go idle in turn
			}
		}
	})
}
