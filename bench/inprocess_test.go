package bench

import (
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// open is a contract no benchmark reaches: 100,000/s per key (the most a key
// may have) with a burst of 2^40.
var open = shaper.Rate{Count: 100000, Period: time.Second, Burst: 1 << 40}

func memShaper(b testing.TB) *shaper.Shaper {
	store := memstore.New()
	b.Cleanup(func() { _ = store.Close() })
	s, err := shaper.New(store, open)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// inProcess are the single-limiter benchmarks: ThrottleKit's memory store on
// one hot key (the keyed lookup included), x/time/rate on one limiter, uber's
// ratelimit at a rate that never sleeps.
var inProcess = []struct {
	name string
	op   func(b testing.TB) func()
}{
	{"throttlekit-reserve", func(b testing.TB) func() {
		s := memShaper(b)
		return func() {
			if _, err := s.Reserve(ctx, "hot", 1); err != nil {
				b.Fatal(err)
			}
		}
	}},
	{"throttlekit-allow", func(b testing.TB) func() {
		s := memShaper(b)
		return func() {
			if ok, err := s.Allow(ctx, "hot", 1); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	}},
	{"throttlekit-wait-nosleep", func(b testing.TB) func() {
		s := memShaper(b)
		return func() {
			if err := s.Wait(ctx, "hot", 1); err != nil {
				b.Fatal(err)
			}
		}
	}},
	{"xrate-allown", func(b testing.TB) func() {
		l := rate.NewLimiter(1e9, 1e9)
		return func() {
			if !l.AllowN(time.Now(), 1) {
				b.Fatal("x/time/rate refused")
			}
		}
	}},
	{"xrate-reserven", func(b testing.TB) func() {
		l := rate.NewLimiter(1e9, 1e9)
		return func() {
			if !l.ReserveN(time.Now(), 1).OK() {
				b.Fatal("x/time/rate refused")
			}
		}
	}},
	{"uber-take", func(b testing.TB) func() {
		l := ratelimit.New(1e9, ratelimit.WithoutSlack)
		return func() { l.Take() }
	}},
}

// BenchmarkInProcess: each in-process operation, on one goroutine and in
// parallel (GOMAXPROCS goroutines).
func BenchmarkInProcess(b *testing.B) {
	for _, c := range inProcess {
		b.Run(c.name, func(b *testing.B) {
			op := c.op(b)
			b.ReportAllocs()
			for b.Loop() {
				op()
			}
		})
		b.Run(c.name+"-parallel", func(b *testing.B) {
			op := c.op(b)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					op()
				}
			})
		})
	}
}

// limiterMap is the usual hand-rolled keyed limiter: a mutex-guarded map of
// *rate.Limiter, created on first use.
type limiterMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (l *limiterMap) allow(key string) bool {
	l.mu.Lock()
	lim, ok := l.m[key]
	if !ok {
		lim = rate.NewLimiter(1e9, 1e9)
		l.m[key] = lim
	}
	l.mu.Unlock()
	return lim.AllowN(time.Now(), 1)
}

func keyNames(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	return keys
}

// keyed returns the operation on n keys, every key already created.
func keyed(b testing.TB, lib string, keys []string) func(i int) {
	switch lib {
	case "throttlekit":
		s := memShaper(b)
		for _, k := range keys {
			_, _ = s.Reserve(ctx, k, 1)
		}
		return func(i int) {
			if _, err := s.Reserve(ctx, keys[i%len(keys)], 1); err != nil {
				b.Fatal(err)
			}
		}
	default:
		l := &limiterMap{m: map[string]*rate.Limiter{}}
		for _, k := range keys {
			l.allow(k)
		}
		return func(i int) {
			if !l.allow(keys[i%len(keys)]) {
				b.Fatal("refused")
			}
		}
	}
}

// BenchmarkKeyed: a reservation on one of n existing keys, in key order,
// ThrottleKit's memory store beside a mutex-guarded map of *rate.Limiter.
func BenchmarkKeyed(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		keys := keyNames(n)
		for _, lib := range []string{"throttlekit", "xrate-map"} {
			b.Run(lib+"/keys="+strconv.Itoa(n), func(b *testing.B) {
				op := keyed(b, lib, keys)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					op(i)
					i++
				}
			})
		}
	}
}

// bytesPerKey returns the live heap per key after n keys were created, the
// key strings included (they are made fresh for each library).
func bytesPerKey(b testing.TB, lib string, n int) float64 {
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	var keep any
	switch lib {
	case "throttlekit":
		store := memstore.New()
		defer store.Close()
		s, err := shaper.New(store, open)
		if err != nil {
			b.Fatal(err)
		}
		for i := range n {
			if _, err := s.Reserve(ctx, "user:"+strconv.Itoa(i), 1); err != nil {
				b.Fatal(err)
			}
		}
		keep = store
	default:
		l := &limiterMap{m: map[string]*rate.Limiter{}}
		for i := range n {
			l.allow("user:" + strconv.Itoa(i))
		}
		keep = l
	}
	after := heap()
	runtime.KeepAlive(keep)
	return float64(after-before) / float64(n)
}

// BenchmarkBytesPerKey: live heap per key with 1,000,000 keys.
func BenchmarkBytesPerKey(b *testing.B) {
	for _, lib := range []string{"throttlekit", "xrate-map"} {
		b.Run(lib, func(b *testing.B) {
			perKey := bytesPerKey(b, lib, 1_000_000)
			for b.Loop() {
			}
			b.ReportMetric(perKey, "B/key")
		})
	}
}
