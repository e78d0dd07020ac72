package freeport

import (
	"net"
	"testing"
)

func TestPickIsOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := ephemeral()
	for _, offset := range []int{0, 10000} {
		for range 50 {
			p, err := Pick(offset)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range []int{p, p + offset} {
				if q >= lo && q <= hi || q < lowest || q > 65535 {
					t.Fatalf("Pick(%d) = %d: %d is in the ephemeral range [%d, %d] or out of [%d, 65535]", offset, p, q, lo, hi, lowest)
				}
			}
		}
	}
}

func TestFreeSeesAListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if Free(port) {
		t.Fatalf("Free(%d) with a listener on it", port)
	}
	_ = l.Close()
	if !Free(port) {
		t.Fatalf("Free(%d) after the listener closed", port)
	}
}
