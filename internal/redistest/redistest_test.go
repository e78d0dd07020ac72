package redistest

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartPauseRestart(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := c.Get(tctx, "k").Err()
	cancel()
	if err == nil {
		t.Fatal("a paused server answered")
	}
	s.Resume()
	s.Restart()
	if got, err := c.Get(ctx, "k").Result(); err == nil || got != "" {
		t.Fatalf("after a restart the key survived (%q, %v): there is no persistence", got, err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	cl := StartCluster(t)
	c := cl.Client(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d", "{x}1", "{x}2"} {
		if err := c.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("SET %s on %v: %v", k, cl, err)
		}
	}
	var mu sync.Mutex
	total, masters := int64(0), 0
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		mu.Lock()
		defer mu.Unlock()
		total += n
		if n > 0 {
			masters++
		}
		return err
	})
	if err != nil || total != 6 || masters < 2 {
		t.Fatalf("keys spread over %d masters, %d keys in all (err %v); want 6 keys on at least 2 of 3", masters, total, err)
	}
}

// A Sentinel deployment fails over: killing the primary promotes the
// replica, and a failover client follows it.
func TestSentinelFailsOver(t *testing.T) {
	s := StartSentinel(t)
	c := s.Client(t, func(o *redis.FailoverOptions) { o.MaxRetries = -1 })
	ctx := context.Background()
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.Primary.Kill()
	for !s.Promoted(ctx) {
		if time.Since(start) > 30*time.Second {
			t.Fatal("the replica was not promoted within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for c.Set(ctx, "k", "after", 0).Err() != nil {
		if time.Since(start) > 30*time.Second {
			t.Fatal("the failover client did not reach the promoted replica within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the failover client wrote to the promoted replica %v after the primary died", time.Since(start).Round(time.Millisecond))
}

// A port taken between the pick and redis-server's bind (another test
// process picked it too) is reported at once as errInUse, not after the
// 10 s PING deadline, and the starter moves to another port.
func TestLaunchOnATakenPortSaysSo(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := &Server{t: t, dir: t.TempDir(), Port: l.Addr().(*net.TCPAddr).Port}
	s.argsOn = func(port int) []string {
		return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no"}
	}
	t.Cleanup(s.Kill)
	start := time.Now()
	err = s.launch(binary(t, "redis-server"))
	if !errors.Is(err, errInUse) {
		t.Fatalf("launch on a taken port: %v, want errInUse", err)
	}
	// Tolerance: the process exits as soon as its bind fails; 5 s leaves a
	// loaded host room and still fails a launch that waits out its 10 s.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("launch took %v to see the taken port: %v", d, err)
	}
	s.startOnFreePort()
	if s.Port == l.Addr().(*net.TCPAddr).Port {
		t.Fatal("the starter kept the taken port")
	}
	if err := s.Client().Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}
