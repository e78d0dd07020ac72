# ThrottleKit for Go. `make test` is what CI runs (.ci/run); `make demo` shows
# the main job on the in-memory math. See README.md.

GO          ?= go
FUZZTIME    ?= 30s
BENCHTIME   ?= 1s
# staticcheck is pinned here and run with `go run`, so it never enters go.mod.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test test-faults soak fmt-check vet redis examples demo bench bench-raw fuzz cover lint

## test: gofmt check, go vet, then every test under the race detector
## (package transport and the four fleet examples last, one at a time: the
## fleet's processes and the strict nginx partner, which judges arrivals to
## the millisecond, are judged on a clock real time drives, and need the
## machine to themselves; package shaper's model-based test runs on a
## simulated clock that waits for its own process to be quiescent, so it
## runs beside the other packages; shaper and redisstore, the longest, are
## named first so that they start first). TestModel's budget:
## MODEL_SEEDS=1 seed of MODEL_OPS=60 ops per configuration, 74
## configurations over memory, a node (coalescing on and off) and a 3-master
## cluster: 73 s under -race beside a CPU hog on each of 2 cores (-short,
## 30 ops: 40 s). Fuzz
## targets run their seed corpora (f.Add and testdata/fuzz) as ordinary tests;
## every example program is compiled by vet and test. Tests that need Redis
## start their own redis-server processes; `redis` installs it if missing.
test: fmt-check vet redis
	$(GO) test -race -count=1 -timeout 8m ./shaper ./redisstore $$($(GO) list ./... | grep -v -e '/shaper$$' -e '/redisstore$$' -e '/examples/redis-fleet$$' -e '/examples/inflight-fleet$$' -e '/examples/fair-tenants$$' -e '/examples/adaptive$$' -e '/transport$$')
	$(GO) test -race -count=1 -timeout 8m -p 1 ./transport ./examples/redis-fleet ./examples/inflight-fleet ./examples/fair-tenants ./examples/adaptive
	cd bench && $(GO) vet ./... && $(GO) test -count=1 -run TestReport -bench . -benchtime 1x ./...
	$(MAKE) --no-print-directory examples

## examples: the examples of the root module are built and tested by `go
## test ./...`; this vets and tests examples/otel (a module of its own, so that
## the OpenTelemetry SDK and exporters stay out of the library's go.mod) and
## runs quickstart and otel to completion with -short.
examples:
	cd examples/otel && $(GO) vet ./... && $(GO) test -race -count=1 ./... && $(GO) run . -short > /dev/null
	$(GO) run ./examples/quickstart -short > /dev/null

## test-faults: the fault and load tests against real redis-server processes
## (reliability/, -tags faults): Redis paused, killed and restarted, its
## script cache flushed, blocked by DEBUG SLEEP, a cluster master and a
## Sentinel primary failing over;
## 1,000,000 reservations over 10,000 keys; a fleet of 2 processes that
## coalesces. Each prints its figures. CI runs it. The faults run two at a
## time, each on servers of its own (they mostly wait on the faults'
## seconds: 8 waiters at 100/s use little of a core).
test-faults: redis
	$(GO) test -race -count=1 -tags faults -timeout 15m -parallel 2 -v -run 'TestFaults|TestLoad' ./reliability/
	$(GO) test -race -count=1 -tags faults -timeout 5m -v -run 'TestFleetCoalesces' ./examples/redis-fleet/

## soak: SOAK_DURATION (default 5m) of mixed load; prints the heap and the
## goroutine count every 10 s and fails if either grows. Not run by CI.
SOAK_DURATION ?= 5m
soak: redis
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -tags soak -timeout 30m -v -run TestSoak ./reliability/

fmt-check:
	@unformatted="$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi

vet:
	$(GO) vet ./...

redis:
	@sh scripts/ensure-redis.sh

## demo: a fake partner on loopback allowing 25 requests/s; the same burst of
## 100 through a plain client and through a shaped one (about 5 seconds).
demo:
	$(GO) run ./examples/quickstart

## bench: the side-by-side report (bench/report_test.go): ThrottleKit beside
## x/time/rate, uber-go/ratelimit and redis_rate in one run, medians of
## BENCHRUNS runs, written to docs/BENCHMARKS.md and docs/pacing.svg (about
## 18 minutes on 2 cores; it starts its own Redis). `bench-raw` prints every
## benchmark of the library and of the bench module instead.
BENCHRUNS ?= 3
bench: redis
	cd bench && $(GO) test -count=1 -run TestReport -report ../docs -runs $(BENCHRUNS) -timeout 30m -v .

bench-raw: redis
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...
	cd bench && $(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -timeout 15m .

## fuzz: a real fuzzing run of FUZZTIME for every fuzz target, one at a time.
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
		for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$target ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

## cover: test coverage per function, total last.
cover: redis
	$(GO) test -count=1 -coverprofile=coverage.out ./...
	$(GO) tool cover -func=coverage.out | tail -n 25

## lint: staticcheck at the pinned version.
lint:
	$(GO) run $(STATICCHECK) -tags faults,soak ./...
