# ThrottleKit for Go. `make test` is what CI runs (.ci/run); `make demo` shows
# the main job on the in-memory math. See README.md.

GO          ?= go
FUZZTIME    ?= 30s
BENCHTIME   ?= 1s
# staticcheck is pinned here and run with `go run`, so it never enters go.mod.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: test fmt-check vet redis demo bench fuzz cover lint

## test: gofmt check, go vet, then every test under the race detector. Fuzz
## targets run their seed corpora (f.Add and testdata/fuzz) as ordinary tests;
## every example program is compiled by vet and test. Tests that need Redis
## start their own redis-server processes; `redis` installs it if missing.
test: fmt-check vet redis
	$(GO) test -race -count=1 -timeout 8m ./...
	cd bench && $(GO) vet ./... && $(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./...

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

## bench: every benchmark of the library with allocation counts, then the
## nested bench module (ThrottleKit beside redis_rate and a no-op EVALSHA on
## one Redis server it starts itself).
bench: redis
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...
	cd bench && $(GO) test -run '^$$' -bench . -benchtime 20000x -timeout 8m .

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
	$(GO) run $(STATICCHECK) ./...
