// Package redistest starts real redis-server processes for tests: a single
// node on a free loopback port, or a 3-master Redis Cluster. It never fakes
// Redis. If redis-server is not installed the test fails and says how to
// install it; `make test` installs it on Debian.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/internal/freeport"
)

// Server is one redis-server process owned by a test.
type Server struct {
	t      testing.TB
	Port   int
	dir    string
	bus    bool                    // a cluster node: port+10000 must be free too
	argsOn func(port int) []string // the command line for a port
	cmd    *exec.Cmd
	tls    *tls.Config // a server started with StartTLS: what its clients use
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

// freePort returns a loopback port outside the ephemeral range that is
// free, and whose cluster bus port (port+10000) is free too when bus is set.
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	offset := 0
	if bus {
		offset = 10000
	}
	p, err := freeport.Pick(offset)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Start starts a single redis-server on a free loopback port, with no
// persistence, and stops it when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return start(t, false, extra...)
}

func start(t testing.TB, cluster bool, extra ...string) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir(), bus: cluster}
	s.argsOn = func(port int) []string {
		args := append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", s.dir, "--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no",
		}, extra...)
		if cluster {
			args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(s.dir, "nodes.conf"), "--cluster-node-timeout", "2000")
		}
		return args
	}
	s.startOnFreePort()
	return s
}

// startOnFreePort launches the server on a port it picks, and on another
// when the one picked was taken before redis-server bound it (another test
// process picked it too). It stops the server when the test ends.
func (s *Server) startOnFreePort() {
	s.t.Helper()
	bin := binary(s.t, "redis-server")
	s.t.Cleanup(s.Kill)
	for attempt := 1; ; attempt++ {
		s.Port = freePort(s.t, s.bus)
		err := s.launch(bin)
		if err == nil {
			return
		}
		if !errors.Is(err, errInUse) || attempt == 10 {
			s.t.Fatal(err)
		}
	}
}

// errInUse is launch's error when the port was taken before the bind.
var errInUse = errors.New("address already in use")

// launch starts the process on s.Port and waits until it answers. It
// returns an error wrapping errInUse when the process exited because the
// port was taken.
func (s *Server) launch(bin string) error {
	s.t.Helper()
	logFile := filepath.Join(s.dir, "redis.log")
	_ = os.Remove(logFile)
	s.cmd = exec.Command(bin, s.argsOn(s.Port)...)
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("redistest: starting redis-server: %w", err)
	}
	cmd := s.cmd
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, TLSConfig: s.tls,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The answer must come from this process: on a port taken before
		// the bind, another test's server may answer.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil && strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
			return nil
		}
		if exited(cmd) {
			s.cmd = nil
			log, _ := os.ReadFile(logFile)
			if strings.Contains(string(log), "Address already in use") {
				return fmt.Errorf("redistest: redis-server on %s: %w; its log:\n%s", s.Addr(), errInUse, log)
			}
			return fmt.Errorf("redistest: redis-server on %s exited before answering; its log:\n%s", s.Addr(), log)
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			return fmt.Errorf("redistest: redis-server on %s did not answer within 10 s; its log:\n%s", s.Addr(), log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exited reports whether cmd's process has exited, and reaps it then. It
// polls (WNOHANG) rather than leaving a goroutine in wait(2): the model
// test counts a goroutine in a system call as a world still moving.
func exited(cmd *exec.Cmd) bool {
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WNOHANG, nil)
	return pid == cmd.Process.Pid || errors.Is(err, syscall.ECHILD)
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

// InSleep reports whether the server's main thread is asleep in nanosleep,
// as it is while it runs DEBUG SLEEP (an idle server waits in epoll
// instead), read from /proc/<pid>/wchan; known is false where the kernel
// does not say (no /proc, or a wchan hidden as "0").
func (s *Server) InSleep() (asleep, known bool) {
	if s.cmd == nil || s.cmd.Process == nil {
		return false, false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(s.cmd.Process.Pid) + "/wchan")
	if err != nil || len(b) == 0 || string(b) == "0" {
		return false, false
	}
	return strings.Contains(string(b), "nanosleep"), true
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
	bin := binary(s.t, "redis-server")
	// The port is the server's address, so it is kept; a process that took
	// it in the meantime is waited out for a while.
	for attempt := 1; ; attempt++ {
		err := s.launch(bin)
		if err == nil {
			return
		}
		if !errors.Is(err, errInUse) || attempt == 20 {
			s.t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
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
