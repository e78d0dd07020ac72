// Package freeport picks loopback ports for the servers that the tests and
// the examples start (redis-server, nginx). A port is drawn from outside the
// kernel's ephemeral range, so that no client connection of this or another
// process can hold it as its source port between the pick and the server's
// bind. A pick still races with another process picking the same port, so
// the starters retry on "Address already in use".
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
)

// lowest is the lowest port picked: below it live well-known services.
const lowest = 10000

// ephemeral returns the kernel's ephemeral port range, or Linux's default.
func ephemeral() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	var a, z int
	if n, _ := fmt.Sscan(string(b), &a, &z); n == 2 && a > 0 && z >= a {
		return a, z
	}
	return lo, hi
}

// Range returns the ports Pick draws from, [from, to), for a server that
// also needs port+offset free (a cluster bus: offset 10000; else 0).
func Range(offset int) (from, to int) {
	lo, hi := ephemeral()
	if lo-offset-lowest >= 1000 {
		return lowest, lo - offset
	}
	// The ephemeral range starts too low to leave room below it: draw from
	// above it instead.
	return hi + 1, 65536 - offset
}

// Pick returns a loopback port that is free now, outside the ephemeral
// range, whose port+offset is free too.
func Pick(offset int) (int, error) {
	from, to := Range(offset)
	if to <= from {
		return 0, fmt.Errorf("freeport: no room for a port and its port+%d outside the ephemeral range", offset)
	}
	for range 200 {
		p := from + rand.IntN(to-from)
		if Free(p) && (offset == 0 || Free(p+offset)) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("freeport: no free loopback port found in [%d, %d)", from, to)
}

// Free reports whether a listener can bind 127.0.0.1:port now.
func Free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
