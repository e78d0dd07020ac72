// Package redisstore is the fleet's store of package shaper: every key's
// state in Redis, so that every process building the same shaper (same name
// or prefix, same configuration) on the same Redis shares one budget per key.
// It takes any go-redis redis.UniversalClient (a single node, Sentinel or
// Cluster) and needs Redis 6.2 or later.
//
//	client := redis.NewClient(&redis.Options{Addr: "redis:6379", ContextTimeoutEnabled: true})
//	store := redisstore.New(client, redisstore.WithFailurePolicy(redisstore.FailLocal(1.0/4)))
//	defer store.Close() // the client stays yours to close
//	s, err := shaper.New(store, shaper.PerSecond(500), shaper.WithName("partner-a"))
//	err = s.Wait(ctx, "account-42", 1) // one budget per key, fleet-wide
//
// Each reservation is one Lua script over all of its keys, deciding exactly
// as the memory store (package memstore) does, on Redis TIME so that hosts
// whose clocks disagree share one schedule (WithClientClock uses the
// shaper's clock instead, for tests). Its delay counts from the reply, so no
// caller departs before its slot. WithTimeout bounds each call once it holds
// a connection (DefaultTimeout, 250 ms).
//
// While Redis is down or silent the failure policy answers: FailClosed (the
// default) returns an *Error, which matches shaper.ErrStoreUnavailable;
// FailOpen admits everything, unpaced, and counts it in Store.Degraded;
// FailLocal(share) paces each process on a private memory store at share of
// the rate (1/N for N processes), and hands a one-dimension leaky bucket's or
// GCRA's schedule over at each switch, so the switch adds no burst.
// A wrong password or a missing permission is an *Error under every policy,
// and a key holding data the store did not write fails that call alone with
// a *StateError (shaper.ErrInvalidState), never served by a policy.
//
// Under load a process coalesces: the reservations made while its calls are
// in flight go together in its next call, one script execution that decides
// each exactly as its own call would have. An idle process still pays one
// round trip per reservation. WithCoalescing(false) sends one call each.
//
// Keys are the shaper's prefix and the caller's key in a hash tag, escaped
// so that no caller key can choose its cluster slot; every key expires once
// it is equivalent to an idle one. docs/REDIS.md gives the key layout, the
// failure rules, the ACL rule of a least-privileged user, and the limits.
package redisstore
