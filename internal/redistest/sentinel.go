package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterName is the name the sentinels of StartSentinel monitor.
const MasterName = "mymaster"

// Sentinel is a primary, a replica of it and three sentinels watching the
// primary (quorum 2, down after 1 s), all on loopback.
type Sentinel struct {
	Primary, Replica *Server
	Sentinels        []*Server
}

// StartSentinel starts the primary, its replica and three sentinels, and
// returns once the replica is in sync and every sentinel knows the replica
// and the two other sentinels, so that a failover can start as soon as the
// primary dies.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	s := &Sentinel{Primary: Start(t)}
	s.Replica = Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(s.Primary.Port))
	for range 3 {
		n := &Server{t: t, dir: t.TempDir()}
		n.argsOn = func(port int) []string {
			conf := filepath.Join(n.dir, "sentinel.conf")
			text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\nlogfile %s\n"+
				"sentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %s 1000\n"+
				"sentinel failover-timeout %s 10000\nsentinel parallel-syncs %s 1\n",
				port, n.dir, filepath.Join(n.dir, "redis.log"), MasterName, s.Primary.Port, MasterName, MasterName, MasterName)
			if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{conf, "--sentinel"}
		}
		n.startOnFreePort()
		s.Sentinels = append(s.Sentinels, n)
	}
	s.wait(t, 30*time.Second)
	return s
}

// wait polls until the replica is in sync and every sentinel sees the
// replica and the other two sentinels.
func (s *Sentinel) wait(t testing.TB, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(d)
	replica := redis.NewClient(&redis.Options{Addr: s.Replica.Addr()})
	defer replica.Close()
	for {
		info, err := replica.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: the replica did not sync within %v: %v %q", d, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, n := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: n.Addr()})
		for {
			m, err := c.Master(ctx, MasterName).Result()
			if err == nil && m["num-slaves"] == "1" && m["num-other-sentinels"] == "2" {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("redistest: sentinel %s does not see the replica and the two other sentinels within %v: %v %v", n.Addr(), d, err, m)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = c.Close()
	}
}

// Addrs returns the sentinels' addresses.
func (s *Sentinel) Addrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		out[i] = n.Addr()
	}
	return out
}

// Client returns a failover client (go-redis's NewFailoverClient) through
// the sentinels, closed when the test ends.
func (s *Sentinel) Client(t testing.TB, opts ...func(*redis.FailoverOptions)) *redis.Client {
	o := &redis.FailoverOptions{MasterName: MasterName, SentinelAddrs: s.Addrs()}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewFailoverClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Promoted reports whether the replica now serves as the primary.
func (s *Sentinel) Promoted(ctx context.Context) bool {
	c := redis.NewClient(&redis.Options{Addr: s.Replica.Addr(), MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "role:master")
}
