// Package bench measures ThrottleKit beside the libraries it means to replace,
// in one run on one machine. It is a separate module so that the anchors
// (go-redis/redis_rate, and later golang.org/x/time/rate and
// go.uber.org/ratelimit) never enter the library's go.mod.
//
//	cd bench && go test -run '^$' -bench . -benchtime 20000x
//
// or `make bench` from the repository root.
package bench
