package reliability

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/otelshaper"
	"github.com/throttlekit/throttlekit-go/queue"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

// TestMain checks for leaked goroutines. go-redis's pool keeps redialling a
// killed node on a goroutine of its own, which sleeps a second between tries
// and ends after the client is closed: it is not ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// typed reports whether err is one of the documented, matchable errors.
func typed(err error) bool {
	var re *shaper.RateError
	return errors.Is(err, shaper.ErrInvalidConfig) || errors.Is(err, shaper.ErrInvalidCost) ||
		errors.Is(err, shaper.ErrInvalidKey) || errors.Is(err, shaper.ErrQueueFull) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &re)
}

// badInput reports whether err refuses the input itself (so nothing may have
// been written).
func badInput(err error) bool {
	return errors.Is(err, shaper.ErrInvalidConfig) || errors.Is(err, shaper.ErrInvalidCost) || errors.Is(err, shaper.ErrInvalidKey)
}

var algorithmsByte = []shaper.Algorithm{
	shaper.LeakyBucket, shaper.GCRA, shaper.TokenBucket, shaper.FixedWindow, shaper.SlidingWindow,
	shaper.SlidingWindowLog, shaper.Quota(shaper.Daily(0)),
}

var fuzzID atomic.Int64

// FuzzBadInput drives arbitrary rates, costs, keys, pauses and MaxQueues
// through New and every method on a Redis store: each call succeeds or fails
// with a typed error, never panics, and a call refused for its input writes
// nothing (DBSIZE is unchanged across it).
func FuzzBadInput(f *testing.F) {
	srv := redistest.Start(f)
	client := srv.Client()
	store := redisstore.New(client, redisstore.WithTimeout(30*time.Second)) // 1 MiB keys under -race
	f.Add(int64(10), int64(time.Second), int64(1), int64(1), "k", int64(time.Second), int64(30*time.Second), uint8(0), "10/s")
	f.Add(int64(0), int64(time.Second), int64(1), int64(1), "k", int64(0), int64(0), uint8(1), "0/s")
	f.Add(int64(-5), int64(-1), int64(-1), int64(-1), "", int64(-1), int64(-1), uint8(2), "NaN/s")
	f.Add(int64(math.MaxInt64), int64(1), int64(math.MaxInt64), int64(math.MaxInt64), "\xff\xfe{}", int64(math.MaxInt64), int64(math.MaxInt64), uint8(3), "1e400/h")
	f.Add(int64(1), int64(math.MaxInt64), int64(1), int64(2), strings.Repeat("x", 1<<20), int64(math.MinInt64), int64(math.MinInt64), uint8(4), "7/3s burst -1")
	f.Add(int64(100), int64(time.Millisecond), int64(1000), int64(1001), "user:\x00", int64(400*24*time.Hour), int64(time.Nanosecond), uint8(5), "+Inf/min")
	f.Add(int64(3), int64(time.Minute), int64(0), int64(0), "k k", int64(1), int64(100*365*24*time.Hour), uint8(6), "1000000/month burst 999999999999")
	f.Fuzz(func(t *testing.T, count, period, burst, cost int64, key string, pause, maxQueue int64, alg uint8, text string) {
		if r, err := shaper.ParseRate(text); err != nil && !typed(err) {
			t.Fatalf("ParseRate(%q): untyped %T %v", text, err, err)
		} else if err == nil && r.String() == "" {
			t.Fatalf("ParseRate(%q) gave an empty rate", text)
		}
		ctx := context.Background()
		size := func() int64 {
			n, err := client.DBSize(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		name := fmt.Sprintf("fz%d", fuzzID.Add(1))
		before := size()
		s, err := shaper.New(store, shaper.Rate{Count: count, Period: time.Duration(period), Burst: burst},
			shaper.WithName(name), shaper.WithMaxQueue(time.Duration(maxQueue)),
			shaper.WithAlgorithm(algorithmsByte[int(alg)%len(algorithmsByte)]))
		if err != nil {
			if !typed(err) {
				t.Fatalf("New: untyped %T %v", err, err)
			}
			if got := size(); got != before {
				t.Fatalf("New refused (%v) but wrote %d keys", err, got-before)
			}
			return
		}
		calls := []struct {
			name string
			call func() error
		}{
			{"Reserve", func() error { _, err := s.Reserve(ctx, key, cost); return err }},
			{"Allow", func() error { _, err := s.Allow(ctx, key, cost); return err }},
			{"Wait", func() error {
				wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
				defer cancel()
				return s.Wait(wctx, key, cost)
			}},
			{"Pause", func() error { return s.Pause(ctx, key, time.Duration(pause)) }},
			{"Reset", func() error { return s.Reset(ctx, key) }},
		}
		for _, c := range calls {
			before := size()
			err := c.call()
			if err != nil && !typed(err) {
				t.Fatalf("%s(%.40q, %d): untyped %T %v", c.name, key, cost, err, err)
			}
			if err != nil && badInput(err) {
				if got := size(); got != before {
					t.Fatalf("%s refused (%v) but wrote %d keys", c.name, err, got-before)
				}
			}
		}
		_ = s.Reset(ctx, key) // keep the server small across iterations
	})
}

// TestNilAndBrokenParts: nil clients and reservers, and policies with NaN or
// infinite shares, are refused with typed errors at the boundary; nothing is
// written.
func TestNilAndBrokenParts(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	stores := map[string]shaper.Store{
		"nil client":               redisstore.New(nil),
		"FailLocal(NaN)":           redisstore.New(client, redisstore.WithFailurePolicy(redisstore.FailLocal(math.NaN()))),
		"FailLocal(+Inf)":          redisstore.New(client, redisstore.WithFailurePolicy(redisstore.FailLocal(math.Inf(1)))),
		"FailLocal(-1)":            redisstore.New(client, redisstore.WithFailurePolicy(redisstore.FailLocal(-1))),
		"timeout 0":                redisstore.New(client, redisstore.WithTimeout(0)),
		"memory MaxKeys -1":        memstore.New(memstore.WithMaxKeys(-1)),
		"memory sweep interval -1": memstore.New(memstore.WithSweepInterval(-1)),
	}
	for name, st := range stores {
		if _, err := shaper.New(st, shaper.PerSecond(1)); !errors.Is(err, shaper.ErrInvalidConfig) {
			t.Errorf("%s: New returned %v, want ErrInvalidConfig", name, err)
		}
		if c, ok := st.(interface{ Close() error }); ok {
			_ = c.Close()
		}
	}
	if _, err := shaper.New(nil, shaper.PerSecond(1)); !errors.Is(err, shaper.ErrInvalidConfig) {
		t.Errorf("nil store: %v", err)
	}
	var ce *shaper.ConfigError
	rt := transport.New(nil)
	body := &closeTracker{Reader: bytes.NewReader([]byte("x"))}
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", body)
	if _, err := rt.RoundTrip(req); !errors.As(err, &ce) || !body.closed {
		t.Errorf("transport.New(nil).RoundTrip: %v (body closed %v)", err, body.closed)
	}
	q := queue.New(nil)
	if err := q.Submit(ctx, queue.Job{Key: "k", Run: func(context.Context) error { return nil }}); !errors.As(err, &ce) {
		t.Errorf("queue.New(nil).Submit: %v", err)
	}
	if err := q.Close(ctx); err != nil {
		t.Error(err)
	}
	if _, err := otelshaper.Wrap(nil).Reserve(ctx, "k", 1); !errors.As(err, &ce) {
		t.Errorf("otelshaper.Wrap(nil).Reserve: %v", err)
	}
	if n, _ := client.DBSize(ctx).Result(); n != 0 {
		t.Errorf("%d keys written by refused calls", n)
	}
}

type closeTracker struct {
	*bytes.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }
