// Package redistest starts real redis-server processes for tests: a single
// node on a free loopback port, or a 3-master Redis Cluster. It never fakes
// Redis. If redis-server is not installed the test fails and says how to
// install it; `make test` installs it on Debian.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	Port int
	dir  string
	args []string
	cmd  *exec.Cmd
	tls  *tls.Config // a server started with StartTLS: what its clients use
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

func binary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found on PATH: the tests need a real Redis. Install it with `apt-get install redis-server` (Debian; `make test` does this), or put redis-server and redis-cli on PATH", name)
	}
	return path
}

// freePort returns a loopback port that is free, and whose cluster bus port
// (port+10000) is free too when bus is set.
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	for range 100 {
		p := 20000 + rand.IntN(25000)
		if !free(p) || bus && !free(p+10000) {
			continue
		}
		return p
	}
	t.Fatal("redistest: no free loopback port found")
	return 0
}

func free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// Start starts a single redis-server on a free loopback port, with no
// persistence, and stops it when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, false, extra...)
}

func start(t testing.TB, cluster bool, extra ...string) *Server {
	t.Helper()
	bin := binary(t, "redis-server")
	s := &Server{t: t, dir: t.TempDir()}
	s.Port = freePort(t, cluster)
	s.args = append([]string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no",
	}, extra...)
	if cluster {
		s.args = append(s.args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.dir, "nodes.conf"), "--cluster-node-timeout", "2000")
	}
	s.launch(bin)
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) launch(bin string) {
	s.t.Helper()
	s.cmd = exec.Command(bin, s.args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("redistest: starting redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, TLSConfig: s.tls})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(context.Background()).Err(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redistest: redis-server on %s did not answer PING within 10 s; its log:\n%s", s.Addr(), log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Client returns a client for the server, closed when the test ends.
func (s *Server) Client(opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.Addr(), TLSConfig: s.tls}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Pause stops the process (SIGSTOP): connections stay open, nothing answers.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Kill stops the process for good (state is lost: there is no persistence).
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart kills the process and starts a fresh one on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.launch(binary(s.t, "redis-server"))
}

// Cluster is a Redis Cluster of three masters on loopback, and with
// StartClusterWithReplicas one replica of each.
type Cluster struct {
	Nodes []*Server
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// StartCluster starts three redis-server processes in cluster mode, joins them
// with `redis-cli --cluster create` (no replicas) and waits for the cluster to
// report cluster_state:ok on every node.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	return startCluster(t, 0)
}

// StartClusterWithReplicas starts six nodes: three masters and one replica of
// each, so that a test can kill a master and watch its replica be promoted
// (cluster-node-timeout is 2 s). It returns once the cluster is ok and every
// replica has synchronised.
func StartClusterWithReplicas(t testing.TB) *Cluster {
	t.Helper()
	c := startCluster(t, 1)
	c.waitEveryNode(t, 30*time.Second, "did not finish replication setup", func(ctx context.Context, client *redis.Client) (string, bool, error) {
		info, err := client.Info(ctx, "replication").Result()
		return info, strings.Contains(info, "role:master") && strings.Contains(info, "connected_slaves:1") ||
			strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up"), err
	})
	return c
}

// waitEveryNode polls each node with check every 50 ms until it reports ok,
// and fails t (saying what went wrong, with check's last answer) if the
// nodes are not all ok within d.
func (c *Cluster) waitEveryNode(t testing.TB, d time.Duration, what string, check func(context.Context, *redis.Client) (string, bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for _, n := range c.Nodes {
		client := redis.NewClient(&redis.Options{Addr: n.Addr()})
		for {
			info, ok, err := check(context.Background(), client)
			if err == nil && ok {
				break
			}
			if time.Now().After(deadline) {
				_ = client.Close()
				t.Fatalf("redistest: cluster node %s %s within %v: %v %q", n.Addr(), what, d, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = client.Close()
	}
}

func startCluster(t testing.TB, replicas int) *Cluster {
	t.Helper()
	cli := binary(t, "redis-cli")
	c := &Cluster{}
	for range 3 * (1 + replicas) {
		c.Nodes = append(c.Nodes, start(t, true))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitEveryNode(t, 20*time.Second, "not ok", func(ctx context.Context, client *redis.Client) (string, bool, error) {
		info, err := client.ClusterInfo(ctx).Result()
		return info, clusterOK(info), err
	})
	return c
}

func clusterOK(info string) bool {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "cluster_state:ok" {
			return true
		}
	}
	return false
}

// String describes the cluster for test logs.
func (c *Cluster) String() string { return fmt.Sprint(c.Addrs()) }
