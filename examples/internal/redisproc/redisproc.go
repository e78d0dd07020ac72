// Package redisproc starts private redis-server processes on free loopback
// ports for the fleet examples, when they are not given a Redis to use: a
// node, or a Redis Cluster of three masters.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Start starts a private redis-server on a free loopback port (in
// cluster mode, with its cluster bus port free too) and returns its
// address and the function that stops it and removes its directory.
func Start(cluster bool) (string, func(), error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("redis-server not found: install it (Debian: apt-get install redis-server) or pass -redis host:port")
	}
	port, err := FreePort(cluster)
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "redisproc")
	if err != nil {
		return "", nil, err
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}
	if cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if client.Ping(context.Background()).Err() == nil {
			return addr, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server on %s did not answer", addr)
		}
	}
}

// FreePort returns a free loopback port; with bus, port+10000 (a cluster
// node's bus) is free too.
func FreePort(bus bool) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !bus {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		if b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
			_ = b.Close()
			return port, nil
		}
	}
	return 0, errors.New("no free port")
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
