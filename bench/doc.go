// Package bench measures ThrottleKit beside the libraries it means to replace,
// in one run on one machine: golang.org/x/time/rate, go.uber.org/ratelimit and
// github.com/go-redis/redis_rate/v10. It is a module of its own so that these
// anchors never enter the library's go.mod.
//
// `make bench` runs TestReport with -report ../docs: in-process cost, keyed
// cost and bytes per key, pacing fidelity, Redis throughput and bytes per key,
// and a 4-process fleet, as medians of 3 runs with ratios to each anchor and
// the targets met or missed. It writes docs/BENCHMARKS.md and
// docs/pacing.svg. Without -report, TestReport is a smoke run of the same
// code at a tiny scale (`make test` runs it). The Benchmark functions give the
// same measurements to `go test -bench` and benchstat:
//
//	cd bench && go test -run '^$' -bench . -benchmem
package bench
