// Package redisproc starts private redis-server processes on free loopback
// ports for the fleet examples, when they are not given a Redis to use: a
// node, or a Redis Cluster of three masters.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/internal/freeport"
)

// Start starts a private redis-server on a free loopback port (in
// cluster mode, with its cluster bus port free too) and returns its
// address and the function that stops it and removes its directory. A port
// taken between the pick and the bind makes it try another.
func Start(cluster bool) (string, func(), error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("redis-server not found: install it (Debian: apt-get install redis-server) or pass -redis host:port")
	}
	for attempt := 1; ; attempt++ {
		addr, stop, err := start(bin, cluster)
		if err == nil || !errors.Is(err, errInUse) || attempt == 10 {
			return addr, stop, err
		}
	}
}

var errInUse = errors.New("address already in use")

func start(bin string, cluster bool) (string, func(), error) {
	port, err := FreePort(cluster)
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "redisproc")
	if err != nil {
		return "", nil, err
	}
	logFile := filepath.Join(dir, "redis.log")
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logFile}
	if cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = os.RemoveAll(dir)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer client.Close()
	self := "process_id:" + strconv.Itoa(cmd.Process.Pid) + "\r\n"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// The answer must come from this process: on a port taken before
		// the bind, another server may answer.
		if info, err := client.Info(context.Background(), "server").Result(); err == nil && strings.Contains(info, self) {
			return addr, stop, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logFile)
			stop()
			if strings.Contains(string(log), "Address already in use") {
				return "", nil, fmt.Errorf("redis-server on %s: %w", addr, errInUse)
			}
			return "", nil, fmt.Errorf("redis-server on %s exited: %s", addr, log)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
	}
}

// FreePort returns a free loopback port outside the kernel's ephemeral
// range; with bus, port+10000 (a cluster node's bus) is free too.
func FreePort(bus bool) (int, error) {
	offset := 0
	if bus {
		offset = 10000
	}
	return freeport.Pick(offset)
}

// StartCluster starts a Redis Cluster of three masters on loopback and
// returns their addresses and the function that stops them.
func StartCluster() ([]string, func(), error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, nil, errors.New("redis-cli not found: install it (Debian: apt-get install redis-server) or pass -cluster with the addresses of its masters")
	}
	var addrs []string
	var stops []func()
	stop := func() {
		for _, s := range stops {
			s()
		}
	}
	for range 3 {
		addr, s, err := Start(true)
		if err != nil {
			stop()
			return nil, nil, err
		}
		addrs, stops = append(addrs, addr), append(stops, s)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	if out, err := exec.Command(cli, append(args, "--cluster-yes")...).CombinedOutput(); err != nil {
		stop()
		return nil, nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	for _, addr := range addrs {
		client := redis.NewClient(&redis.Options{Addr: addr})
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			info, _ := client.ClusterInfo(context.Background()).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				_ = client.Close()
				stop()
				return nil, nil, fmt.Errorf("the cluster node %s is not ok within 20 s", addr)
			}
		}
		_ = client.Close()
	}
	return addrs, stop, nil
}
