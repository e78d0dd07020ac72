// Package reliability holds ThrottleKit's fault, bad-input, load and soak
// tests against real redis-server processes. It has no code of its own.
//
//	make test-faults  // -tags faults: Redis paused, killed, script cache flushed,
//	                  // blocked by a slow command, a cluster master failing over;
//	                  // 1,000,000 reservations over 10,000 keys
//	make soak         // -tags soak: 5 minutes of mixed load, memory and goroutines
//
// The bad-input tests and fuzz targets have no tag: `make test` runs them.
// docs/RELIABILITY.md lists each promise and the test that proves it.
package reliability
