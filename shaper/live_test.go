package shaper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// liveStores returns, per store kind, a maker of stores that share one
// budget: memory (one store for the whole test, as shapers in one process
// share it), a Redis node and the 3-master cluster (a new redisstore.Store per
// call, as each process of a fleet has its own).
func liveStores(t *testing.T) map[string]func() Store {
	t.Helper()
	node, cluster := nodeAndCluster(t)
	mem := memstore.New(memstore.WithSweepInterval(0))
	t.Cleanup(func() { _ = mem.Close() })
	return map[string]func() Store{
		"memory": func() Store { return mem },
		"redis": func() Store {
			return redisstore.New(node, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
		},
		"cluster": func() Store {
			return redisstore.New(cluster, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
		},
	}
}

// departures reserves n requests of cost 1 on key and returns their delays.
func departures(t *testing.T, s *Shaper, key string, n int) []time.Duration {
	t.Helper()
	var out []time.Duration
	for range n {
		out = append(out, mustReserve(t, s, key, 1).Delay)
	}
	return out
}

// A rate changed live holds from the next reservation, with no burst at the
// switch: slots granted before keep their times, and the key's schedule
// carries over (gcra.Kernel.Convert): the instant the old contract would
// have let its next unit go stays put, so no slot granted after the change
// departs ahead of one granted before, and a larger burst builds up at the
// new rate from there; on every store.
func TestSetRateHoldsFromTheNextReservation(t *testing.T) {
	t.Parallel()
	for kind, store := range liveStores(t) {
		t.Run(kind, func(t *testing.T) {
			clock := timer.NewFake(t0)
			s, err := New(store(), PerSecond(10), WithClock(clock), WithName("set-rate-"+kind))
			if err != nil {
				t.Fatal(err)
			}
			old := mustReserve(t, s, "k", 1)
			got := departures(t, s, "k", 3) // 100, 200, 300 ms
			if err := s.SetRate(bg, "", PerSecond(2)); err != nil {
				t.Fatal(err)
			}
			if r, _ := s.Rate(""); r != PerSecond(2) {
				t.Fatalf("Rate() = %v after SetRate(2/s)", r)
			}
			// Where 10/s would have sent the next (400 ms), then every 500 ms.
			got = append(got, departures(t, s, "k", 2)...)
			if err := s.SetRate(bg, "", PerSecond(100).WithBurst(5)); err != nil {
				t.Fatal(err)
			}
			// Where 2/s would have sent the next (1.4 s), then every 10 ms:
			// the new burst of 5 builds up at the new rate, not at once.
			got = append(got, departures(t, s, "k", 3)...)
			want := []time.Duration{100, 200, 300, 400, 900, 1400, 1410, 1420}
			for i := range want {
				want[i] *= time.Millisecond
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("delays %v, want %v", got, want)
			}
			if old.Time() != t0 {
				t.Fatalf("the slot granted before the changes moved to %v", old.Time().Sub(t0))
			}
		})
	}
}

// Every algorithm follows a lowered limit at once, its state carried over:
// a window or a quota admits its new Count less what it already counted
// (1 of 4, 3 taken); GCRA keeps the instant its next unit could go (the 3
// taken left 7 of 10 at once; 4/min keeps the burst they left beyond one
// unit, 60 s - 18 s - 6 s, and adds its own interval: 3 more); a token
// bucket keeps its tokens up to the new burst (4), as x/time/rate's
// SetLimit and SetBurst do. A window's Period cannot change.
func TestSetRateHoldsOnEveryAlgorithm(t *testing.T) {
	t.Parallel()
	for kind, store := range liveStores(t) {
		for _, alg := range []Algorithm{GCRA, TokenBucket, FixedWindow, SlidingWindow, SlidingWindowLog, Quota(Daily(0))} {
			t.Run(kind+"/"+alg.String(), func(t *testing.T) {
				clock := timer.NewFake(t0)
				s, err := New(store(), PerMinute(10).WithBurst(10), WithAlgorithm(alg), WithClock(clock), WithName("every-"+kind+"-"+alg.String()))
				if err != nil {
					t.Fatal(err)
				}
				for i := range 3 {
					if ok, err := s.Allow(bg, "k", 1); !ok || err != nil {
						t.Fatalf("request %d: %v %v", i, ok, err)
					}
				}
				if err := s.SetRate(bg, "", PerMinute(4).WithBurst(4)); err != nil {
					t.Fatal(err)
				}
				admitted := 0
				for range 10 {
					if ok, err := s.Allow(bg, "k", 1); err != nil {
						t.Fatal(err)
					} else if ok {
						admitted++
					}
				}
				want := 1
				switch alg {
				case GCRA:
					want = 3
				case TokenBucket:
					want = 4
				}
				if admitted != want {
					t.Fatalf("%d admitted after lowering the limit to 4 with 3 taken, want %d", admitted, want)
				}
				err = s.SetRate(bg, "", Rate{Count: 4, Period: time.Hour, Burst: 4})
				var ce *ConfigError
				switch alg {
				case FixedWindow, SlidingWindow, SlidingWindowLog:
					if !errors.As(err, &ce) || ce.Field != "Period" {
						t.Fatalf("a window's Period changed live: %v, want a *ConfigError on Period", err)
					}
				default:
					if err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// eventually waits, in real time, until cond holds: a shaper on Redis
// reads its record in the background.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("not within 10 s: %s", what)
		}
	}
}

// A fleet follows a change one process makes: every shaper under the same
// prefix and configured contract adopts it, a shaper on Redis after the
// first call of its next refresh interval, one started later after its
// first call, one on the same memory store at once; a shaper configured
// with another contract ignores it. Deleting the record returns the fleet
// to its configured contract.
func TestAFleetFollowsALiveChange(t *testing.T) {
	t.Parallel()
	node, cluster := nodeAndCluster(t)
	for kind, client := range map[string]redis.UniversalClient{"redis": node, "cluster": cluster} {
		t.Run(kind, func(t *testing.T) {
			clock := timer.NewFake(t0)
			name := "fleet-follows-" + kind
			process := func(rate Rate) *Shaper {
				s, err := New(redisstore.New(client, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine)), rate, WithClock(clock), WithName(name), WithMaxQueue(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			a, b := process(PerSecond(10)), process(PerSecond(10))
			mustReserve(t, b, "warm", 1) // b reads the (empty) record: its next read is a refresh interval away
			eventually(t, "b's first read", func() bool { return !b.reading.Load() })
			if err := a.SetRate(bg, "", PerSecond(1)); err != nil {
				t.Fatal(err)
			}
			if err := a.SetMaxQueue(bg, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if r, _ := b.Rate(""); r != PerSecond(10) || b.MaxQueue() != time.Minute {
				t.Fatalf("b follows before its refresh: %v, %v", r, b.MaxQueue())
			}
			clock.Advance(DefaultContractRefresh)
			mustReserve(t, b, "trigger", 1) // the first call of the interval starts a read
			eventually(t, "b follows a's change", func() bool {
				r, _ := b.Rate("")
				return r == PerSecond(1) && b.MaxQueue() == 5*time.Second
			})
			// Both now pace k at 1/s together, and refuse past 5 s.
			delays := []time.Duration{mustReserve(t, a, "k", 1).Delay, mustReserve(t, b, "k", 1).Delay}
			for range 4 {
				delays = append(delays, mustReserve(t, a, "k", 1).Delay)
			}
			if fmt.Sprint(delays) != "[0s 1s 2s 3s 4s 5s]" {
				t.Fatalf("delays %v, want 0s to 5s a second apart", delays)
			}
			if _, err := b.Reserve(bg, "k", 1); !errors.Is(err, ErrQueueFull) {
				t.Fatalf("a 6 s wait under a MaxQueue of 5 s: %v", err)
			}
			late := process(PerSecond(10)) // a process started after the change
			mustReserve(t, late, "other", 1)
			eventually(t, "a process started later follows", func() bool { r, _ := late.Rate(""); return r == PerSecond(1) })
			other := process(PerSecond(20)) // another configured contract: a redeployed fleet
			mustReserve(t, other, "other2", 1)
			eventually(t, "other's first read", func() bool { return !other.reading.Load() })
			if r, _ := other.Rate(""); r != PerSecond(20) {
				t.Fatalf("a shaper configured at 20/s follows a change made for 10/s: %v", r)
			}
			if err := client.Del(bg, contractKey("tk:"+name+":")).Err(); err != nil {
				t.Fatal(err)
			}
			clock.Advance(DefaultContractRefresh)
			mustReserve(t, b, "k2", 1)
			eventually(t, "b returns to its configured contract", func() bool {
				r, _ := b.Rate("")
				return r == PerSecond(10) && b.MaxQueue() == time.Minute
			})
		})
	}
	t.Run("memory", func(t *testing.T) {
		store := memstore.New(memstore.WithSweepInterval(0))
		defer store.Close()
		a, err := New(store, PerSecond(10), WithName("mem-fleet"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := New(store, PerSecond(10), WithName("mem-fleet"))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.SetRate(bg, "", PerSecond(1)); err != nil {
			t.Fatal(err)
		}
		if ok, _ := b.Allow(bg, "k", 1); !ok {
			t.Fatal("first request refused")
		}
		if r, _ := b.Rate(""); r != PerSecond(1) {
			t.Fatalf("b on the same memory store runs %v after a's change", r)
		}
		if ok, _ := a.Allow(bg, "k", 1); ok {
			t.Fatal("a second request within the second admitted at 1/s")
		}
		if _, err := New(store, PerSecond(10), WithName("mem-fleet")); err != nil {
			t.Fatalf("a shaper configured as the others, after a live change: %v", err)
		}
	})
}

// Every dimension of a multi-dimension shaper can change on its own, and
// the change reaches only that dimension.
func TestSetRateChangesOneDimension(t *testing.T) {
	t.Parallel()
	for kind, store := range liveStores(t) {
		t.Run(kind, func(t *testing.T) {
			clock := timer.NewFake(t0)
			s, err := All(store(), []Dimension{
				{Name: "requests", Rate: PerSecond(10), Cost: func(int64) int64 { return 1 }},
				{Name: "tokens", Rate: PerSecond(1000).WithBurst(1000)},
			}, WithClock(clock), WithName("one-dim-"+kind))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SetRate(bg, "tokens", PerSecond(100).WithBurst(100)); err != nil {
				t.Fatal(err)
			}
			if r, _ := s.Rate("requests"); r != PerSecond(10) {
				t.Fatalf("requests now %v", r)
			}
			got := departures(t, s, "k", 0)
			for range 3 { // tokens bind: 100 at once, then 100 a second
				got = append(got, mustReserve(t, s, "k", 100).Delay)
			}
			if fmt.Sprint(got) != fmt.Sprint([]time.Duration{0, time.Second, 2 * time.Second}) {
				t.Fatalf("delays %v; want 0, 1s, 2s (tokens at 100/s)", got)
			}
		})
	}
}

// Bad live changes are refused with a typed error and change nothing: no
// rate, no record, no other key.
func TestLiveChangesRefuseBadInput(t *testing.T) {
	t.Parallel()
	for kind, store := range liveStores(t) {
		t.Run(kind, func(t *testing.T) {
			clock := timer.NewFake(t0)
			s, err := All(store(), []Dimension{
				{Name: "requests", Rate: PerSecond(10)},
				{Name: "tokens", Rate: PerSecond(1000).WithBurst(1000)},
			}, WithClock(clock), WithName("bad-live-"+kind))
			if err != nil {
				t.Fatal(err)
			}
			cancelled, cancel := context.WithCancel(bg)
			cancel()
			for _, c := range []struct {
				name string
				err  error
				is   error
			}{
				{"unknown dimension", s.SetRate(bg, "nope", PerSecond(1)), ErrInvalidConfig},
				{"the empty name on a shaper of two", s.SetRate(bg, "", PerSecond(1)), ErrInvalidConfig},
				{"count 0", s.SetRate(bg, "tokens", Rate{Period: time.Second}), ErrInvalidConfig},
				{"negative burst", s.SetRate(bg, "tokens", PerSecond(5).WithBurst(-1)), ErrInvalidConfig},
				{"negative MaxQueue", s.SetMaxQueue(bg, -time.Second), ErrInvalidConfig},
				{"a done context", s.SetRate(cancelled, "tokens", PerSecond(5)), context.Canceled},
				{"a nil shaper", (*Shaper)(nil).SetRate(bg, "", PerSecond(5)), ErrInvalidConfig},
			} {
				if !errors.Is(c.err, c.is) {
					t.Errorf("%s: %v, want %v", c.name, c.err, c.is)
				}
			}
			rec, err := s.store.ReadContract(bg, s.cfg.prefix)
			if err != nil || rec.Version != 0 {
				t.Fatalf("a refused change was recorded: %+v, %v", rec, err)
			}
			if r, _ := s.Rate("tokens"); r != PerSecond(1000).WithBurst(1000) {
				t.Fatalf("tokens now %v", r)
			}
			if _, ok := (*Shaper)(nil).Rate(""); ok {
				t.Fatal("a nil shaper has a rate")
			}
		})
	}
}

// A redisstore.Store that cannot record a change fails it with a *redisstore.Error,
// whatever its failure policy (a change the fleet would not see is not
// made), and the shaper keeps its contract.
func TestSetRateNeedsTheStore(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client()
	for _, p := range []redisstore.FailurePolicy{redisstore.FailClosed, redisstore.FailOpen, redisstore.FailLocal(0.5)} {
		store := redisstore.New(c, redisstore.WithFailurePolicy(p), redisstore.WithTimeout(200*time.Millisecond))
		defer store.Close()
		s, err := New(store, PerSecond(10), WithName("set-down"))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Set(bg, contractKey("tk:set-down:"), "a string, not a hash", 0).Err(); err != nil {
			t.Fatal(err)
		}
		err = s.SetRate(bg, "", PerSecond(1))
		var se *redisstore.Error
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("%v: SetRate over a foreign record: %v, want a *redisstore.Error", p, err)
		}
		if r, _ := s.Rate(""); r != PerSecond(10) {
			t.Fatalf("%v: the rate changed to %v", p, r)
		}
		if ok, err := s.Allow(bg, fmt.Sprint(p), 1); !ok || err != nil { // a record it cannot read is ignored
			t.Fatalf("%v: Allow beside a foreign record: %v %v", p, ok, err)
		}
		_ = c.Del(bg, contractKey("tk:set-down:"))
	}
}

// FuzzContractRecord: whatever a contract record holds, reading it never
// panics; a shaper follows it or keeps its contract, and its contract is
// always one New would accept.
func FuzzContractRecord(f *testing.F) {
	f.Add("identity", "x", "version", "3", "rate:", "10 1000000000 2", "maxqueue", "5000000000")
	f.Add("version", "-1", "rate:", "0 0 0", "maxqueue", "x", "a", "b")
	f.Add("version", "1", "rate:", "10 -5 1", "maxqueue", "-1", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3, k4, v4 string) {
		rec, err := store.ParseRecord([]string{k1, v1, k2, v2, k3, v3, k4, v4})
		if err != nil {
			return
		}
		s, _, _ := newTest(t, PerSecond(10))
		rec.Identity = s.identity
		s.mu.Lock()
		_ = s.adopt(rec)
		s.mu.Unlock()
		c := s.cur.Load()
		if _, _, err := s.cfg.alg.build(c.dims[0].rate, c.maxQueue); err != nil || c.maxQueue < 0 {
			t.Fatalf("adopted %+v: a contract New refuses (%v)", c, err)
		}
		if _, err := s.Reserve(bg, "k", 1); err != nil && !errors.Is(err, ErrQueueFull) {
			t.Fatalf("Reserve under %+v: %v", c, err)
		}
	})
}
