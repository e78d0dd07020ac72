//go:build linux

package shaper_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// socketsUnread reports a socket of this process with bytes received and
// not yet read (FIONREAD on each socket in /proc/self/fd): a Redis reply,
// or a pub/sub notice or confirmation, that a goroutine will read. The
// servers' side needs no reading: see quiet.settle's two PINGs.
func socketsUnread() string {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return ""
	}
	for _, e := range entries {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var n int32
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); errno == 0 && n > 0 {
			return fmt.Sprintf("%d bytes unread on socket fd %d (%s)", n, fd, target)
		}
	}
	return ""
}
