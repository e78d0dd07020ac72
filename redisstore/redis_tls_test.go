package redisstore

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// The Redis store works unchanged over TLS: against a redis-server that
// accepts only TLS with client certificates (made by the test, valid for an
// hour), the cross-store conformance passes, and reservations on Redis TIME
// are paced. A client without TLS, or without the client certificate,
// cannot talk to it at all, so the connection is really TLS.
func TestRedisOverTLS(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTLS(t)
	client := srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 })
	conformance(t, client, false)

	s, err := shaper.New(New(client, WithTimeout(slowMachine)), shaper.PerSecond(10), shaper.WithName("tls"))
	if err != nil {
		t.Fatal(err)
	}
	// A slot's Time counts from a clock reading taken after the reply, so
	// the first slot reads late by up to its call's duration, and the
	// second's 100 ms on Redis TIME may show that much less (a flake seen
	// once on a loaded host: 96.3 ms).
	start := time.Now()
	first := mustReserve(t, s, "k", 1)
	lag := time.Since(start)
	second := mustReserve(t, s, "k", 1)
	if gap := second.Time().Sub(first.Time()); gap < 100*time.Millisecond-lag-time.Microsecond {
		t.Fatalf("slots %v apart over TLS, want 100ms less the first reply's lag (%v)", gap, lag)
	}

	plain := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer plain.Close()
	if err := plain.Ping(bg).Err(); err == nil {
		t.Fatal("a client without TLS was answered: the server is not TLS-only")
	}
	noCert := srv.TLSConfig().Clone()
	noCert.Certificates = nil
	anon := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, TLSConfig: noCert})
	defer anon.Close()
	if err := anon.Ping(bg).Err(); err == nil {
		t.Fatal("a TLS client without the client certificate was answered")
	}
}

// Through go-redis's failover client (a primary, a replica and three
// sentinels), the cross-store conformance passes unchanged. Failing over
// under load is in make test-faults (reliability, TestFaults).
func TestRedisThroughSentinel(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t)
	conformance(t, s.Client(t, func(o *redis.FailoverOptions) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 }), false)
}
