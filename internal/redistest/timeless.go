package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlowMachine is the store timeout of tests that check correctness, not
// timeouts: under -race on two busy cores hundreds of concurrent calls queue
// for the pool far longer than the Redis store's default timeout, which
// would turn a correctness check into a flaky timeout check.
const SlowMachine = 30 * time.Second

// DeadlineClient returns a client on a fresh redis-server that honours
// context deadlines on the socket and never retries.
func DeadlineClient(t *testing.T) (*Server, *redis.Client) {
	t.Helper()
	srv := Start(t)
	return srv, srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 })
}

// NodeAndCluster starts a Redis node and a 3-master cluster for a test on
// a simulated clock, and returns a Timeless client of each.
func NodeAndCluster(t *testing.T) (single, cluster redis.UniversalClient) {
	t.Helper()
	_, node := DeadlineClient(t)
	return Timeless(node), Timeless(StartCluster(t).Client(t))
}

// derivedSuffixes are the suffixes of the keys the Redis store's scripts
// derive from a state key (docs/REDIS.md, "Keys"): its Ledger's and a
// partner's clamp.
var derivedSuffixes = [...]string{":l", ":h", ":b", ":c", ":k"}

// Timeless makes every script call on client drop, in the same MULTI,
// the TTL of each key it names and of those keys' Ledger keys. Tests on a
// simulated clock need it: the store sets TTLs in simulated milliseconds
// (a pause of 3 ms, a window 1 ms from its end), and Redis expires keys on
// its own clock, so on a loaded machine a key could expire in real time
// before the next operation at the same simulated instant reads it, while
// the memory store keeps it, and the two would differ for a reason that
// is not the math. Persisting in a later call leaves that window open; in
// the same transaction there is none. The Redis store's
// TestRedisKeysExpireWhenIdle covers the TTLs themselves.
func Timeless(client redis.UniversalClient) redis.UniversalClient {
	client.AddHook(timelessHook{client})
	return client
}

type timelessHook struct{ c redis.UniversalClient }

func (timelessHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (timelessHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h timelessHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if name := cmd.Name(); (name != "evalsha" && name != "eval") || len(args) < 3 {
			return next(ctx, cmd)
		}
		n, _ := args[2].(int)
		_, _ = h.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			_ = p.Process(ctx, cmd)
			for _, k := range args[3 : 3+n] {
				key := fmt.Sprint(k)
				p.Persist(ctx, key)
				if !strings.Contains(key, "{") { // a contract record: no TTL, no derived keys, no hash tag
					continue
				}
				for _, suffix := range derivedSuffixes {
					p.Persist(ctx, key+suffix)
				}
			}
			return nil
		})
		return cmd.Err()
	}
}
