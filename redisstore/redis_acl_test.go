package redisstore

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/fair"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/lua"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// aclRules reads the two ACL rules docs/REDIS.md gives a deployment: the
// one for a single node or Sentinel, and the Cluster's addition.
func aclRules(t *testing.T) (rule []string, cluster string) {
	t.Helper()
	doc, err := os.ReadFile("../docs/REDIS.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(doc), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[0] == "ACL" && f[1] == "SETUSER" && f[2] == "throttlekit" && rule == nil {
			rule = f[3:]
		}
		if strings.HasPrefix(line, "ACL SETUSER throttlekit +") {
			cluster = strings.Fields(line)[3]
		}
	}
	if rule == nil || cluster == "" {
		t.Fatal("docs/REDIS.md gives no `ACL SETUSER throttlekit ...` rule (and its Cluster line)")
	}
	return rule, cluster
}

// setUser creates the user throttlekit (password pw) on every node with
// rule, its key pattern ~tk:* replaced by pattern, plus extra.
func setUser(t *testing.T, nodes []*redistest.Server, rule []string, pattern string, extra ...string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", "throttlekit", "reset"}
	for _, r := range append(slices.Clone(rule), extra...) {
		switch {
		case r == "~tk:*":
			r = pattern
		case r == "&tk:*": // the release channels (permits.go) live under the prefix too
			r = "&" + strings.TrimPrefix(pattern, "~")
		case strings.HasPrefix(r, ">"):
			r = ">pw"
		}
		args = append(args, r)
	}
	for _, n := range nodes {
		if err := n.Client().Do(bg, args...).Err(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
}

// The ACL rule docs/REDIS.md gives names exactly the commands the store
// sends and its scripts run, and only the keys and channels of the prefix.
func TestTheDocumentedACLRuleIsExact(t *testing.T) {
	t.Parallel()
	rule, cluster := aclRules(t)
	used := map[string]bool{"evalsha": true, "eval": true, "del": true, "pttl": true, // the store's own: scripts, Reset, a pause's time left
		"subscribe": true, "ping": true} // release notices (Freed), and go-redis's health check of that subscription
	for _, src := range []string{lua.Lib, lua.Ledger, lua.Reserve, lua.ReserveGCRA, lua.GCRAAlone, lua.ReserveBatch, lua.Settle, lua.Status, lua.Pause, lua.Contract, lua.Clamp,
		lua.PermitTake, lua.PermitRelease, lua.PermitRenew, lua.PermitCount, lua.FairTurn, lua.Learn} {
		for _, m := range regexp.MustCompile(`redis\.p?call\('([A-Z]+)'`).FindAllStringSubmatch(src, -1) {
			used[strings.ToLower(m[1])] = true
		}
	}
	granted := map[string]bool{}
	for _, r := range rule {
		switch {
		case strings.HasPrefix(r, "+"):
			granted[r[1:]] = true
		case strings.HasPrefix(r, "~") && r != "~tk:*", strings.HasPrefix(r, "%"), strings.HasPrefix(r, "&") && r != "&tk:*",
			r == "+@all", r == "allkeys", r == "allcommands", r == "allchannels":
			t.Fatalf("the rule grants %q: more than the prefix's keys and channels", r)
		}
	}
	for c := range used {
		if !granted[c] {
			t.Errorf("the store uses %s, which the documented rule does not grant", strings.ToUpper(c))
		}
	}
	for c := range granted {
		if !used[c] {
			t.Errorf("the documented rule grants %s, which the store never uses", strings.ToUpper(c))
		}
	}
	if !slices.Contains(rule, "-@all") || !slices.Contains(rule, "resetchannels") || !slices.Contains(rule, "&tk:*") || cluster != "+cluster|slots" {
		t.Fatalf("the rule must start from nothing (-@all, resetchannels), grant the prefix's channels (&tk:*), and a Cluster add only CLUSTER SLOTS: %v, %q", rule, cluster)
	}
}

// Through a user holding only the documented rule, the store works: the
// whole cross-store conformance (the test adds MULTI, EXEC and PERSIST,
// which its own harness uses, never the store), and on Redis TIME every
// operation, on a node and on the 3-master cluster, in-flight permits
// included (take, count, renewal, release and its notice), fair turns, and
// a learning shaper's record and the clamps of its rate and of a margin.
func TestRedisWorksThroughTheLeastPrivilegedUser(t *testing.T) {
	t.Parallel()
	rule, clusterRule := aclRules(t)
	srv := redistest.Start(t)
	setUser(t, []*redistest.Server{srv}, rule, "~conf*", "+multi", "+exec", "+persist")
	conformance(t, srv.Client(func(o *redis.Options) {
		o.Username, o.Password, o.MaxRetries, o.ContextTimeoutEnabled = "throttlekit", "pw", -1, true
	}), true) // through the batch script, which runs every reservation script

	setUser(t, []*redistest.Server{srv}, rule, "~tk:*")
	cl := redistest.StartCluster(t)
	setUser(t, cl.Nodes, append(slices.Clone(rule), clusterRule), "~tk:*")
	node := srv.Client(func(o *redis.Options) { o.Username, o.Password, o.MaxRetries = "throttlekit", "pw", -1 })
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), Username: "throttlekit", Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { _ = cluster.Close() })
	for name, client := range map[string]redis.UniversalClient{"node": node, "cluster": cluster} {
		s, err := shaper.All(New(client, WithTimeout(slowMachine)), []shaper.Dimension{
			{Name: "requests", Rate: shaper.PerSecond(10).WithBurst(3), Cost: func(int64) int64 { return 1 }},
			{Name: "tokens", Rate: shaper.PerSecond(100).WithBurst(50)},
		}, shaper.WithName("acl"))
		if err != nil {
			t.Fatal(err)
		}
		one, err := shaper.New(New(client, WithTimeout(slowMachine)), shaper.PerSecond(10).WithBurst(3), shaper.WithName("acl1"))
		if err != nil {
			t.Fatal(err)
		}
		learner, err := shaper.New(New(client, WithTimeout(slowMachine)), shaper.PerSecond(10), shaper.WithName("acl2"), shaper.WithLearning(shaper.Learning{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, sh := range []*shaper.Shaper{s, one, learner} {
			r, err := sh.Reserve(bg, "k", 5)
			if err != nil {
				t.Fatalf("%s: Reserve: %v", name, err)
			}
			steps := map[string]error{"settle": r.Settle(bg, 2)}
			r2, err := sh.Reserve(bg, "k", 5)
			steps["reserve"] = err
			steps["cancel"] = r2.Cancel(bg)
			_, steps["status"] = sh.Status(bg, "k", 1)
			_, steps["allow"] = sh.Allow(bg, "k", 1)
			steps["pause"] = sh.Pause(bg, "k", 50*time.Millisecond)
			steps["wait"] = sh.Wait(bg, "k", 1)                                                             // asks for the pause's time left
			steps["fair wait"] = sh.Wait(shaper.WithFlow(bg, shaper.Flow{Name: "tenant"}), "k", 1)          // a turn, and the flow leaving
			steps["learn"] = sh.Learn(bg, "k", shaper.Feedback{Refused: true, Policy: shaper.PerSecond(5)}) // the learned record and its clamp
			steps["space"] = sh.Space(bg, "k", time.Millisecond)                                            // a margin's clamp
			steps["reset"] = sh.Reset(bg, "k")
			for op, err := range steps {
				if err != nil {
					t.Fatalf("%s, %s: %s: %v", name, sh.Name(), op, err)
				}
			}
		}
		holder, waiter := New(client, WithTimeout(slowMachine)), New(client, WithTimeout(slowMachine))
		t.Cleanup(func() { _, _ = holder.Close(), waiter.Close() })
		p := permitOf("tk:acl:", "calls", "k", 1, time.Minute, nil)
		ch := make(chan struct{}, 1)
		t.Cleanup(store.Of(waiter).Freed(p, ch))
		tk, err := store.Of(holder).TakePermit(bg, p, "id-"+name, 0)
		if err != nil || !tk.OK {
			t.Fatalf("%s: TakePermit: %+v %v", name, tk, err)
		}
		// The renewal, through the same user: the lease made due now and
		// renewed by the renewer's own round, which moves its expiry on.
		taken, err := client.ZScore(bg, permitKey(p), "id-"+name).Result()
		if err != nil {
			t.Fatalf("%s: the lease's expiry: %v", name, err)
		}
		if err := renewNow(holder); err != nil {
			t.Fatalf("%s: renewal: %v", name, err)
		}
		if renewed, err := client.ZScore(bg, permitKey(p), "id-"+name).Result(); err != nil || renewed <= taken || holder.LeasesLost() != 0 {
			t.Fatalf("%s: the lease's expiry after a renewal: %v (taken with %v) %v, %d lost; want it moved on", name, renewed, taken, err, holder.LeasesLost())
		}
		if n, err := store.Of(waiter).PermitsInUse(bg, p, 0); err != nil || n != 1 {
			t.Fatalf("%s: PermitsInUse: %d %v, want the lease held", name, n, err)
		}
		if err := store.Of(holder).ReleasePermit(bg, p, tk.Lease); err != nil {
			t.Fatalf("%s: ReleasePermit: %v", name, err)
		}
		if !noticed(ch, 2*time.Second) {
			t.Fatalf("%s: the release was not announced", name)
		}
		// Fair turns, every command of the script: grants, a refusal, an
		// owner expiring (its flow forgotten), and the last owner leaving
		// (the keys deleted).
		clientClock := New(client, WithClientClock(), WithTimeout(slowMachine)) // the steps' own instants
		t.Cleanup(func() { _ = clientClock.Close() })
		turns := store.Of(clientClock)
		for i, step := range []struct {
			owner string
			ups   []fair.Update
			want  string // the flow granted, "" none
		}{
			{"p2", []fair.Update{{Name: "b", Weight: 1, Cost: 1}}, "b"},
			{"p1", []fair.Update{{Name: "a", Weight: 1, Cost: 1}}, "a"},
			{"p1", nil, ""}, // b, served earlier, has the turn
			{"p2", nil, "b"},
			{"p1", []fair.Update{{Name: "c", Weight: 1, Cost: 1}}, "c"}, // p1's wait expired: a forgotten
			{"p2", []fair.Update{{Name: "b", Leave: true}}, ""},
			{"p1", []fair.Update{{Name: "c", Leave: true}}, ""},
		} {
			tr := &store.Turns{Base: "tk:acl:", Key: "turns", Slot: "turns", Owner: step.owner}
			// At 1060 p1's wait (1020 + 35) has expired, p2's (1030 + 35) not.
			p := fair.Params{Now: []float64{1000, 1010, 1020, 1030, 1060, 1061, 1062}[i], TTL: 35}
			r, err := turns.Turn(bg, tr, p, step.ups)
			if err != nil || r.Granted != (step.want != "") || r.Name != step.want {
				t.Fatalf("%s: fair turn %d: %+v %v, want %q granted", name, i, r, err, step.want)
			}
		}
	}
}

// The least-privileged user touches nothing outside its prefix: it can
// neither read nor write another key, and a shaper configured with another
// prefix fails every call with an *Error naming NOPERM, under every
// failure policy, never served by the policy.
func TestTheLeastPrivilegedUserCannotLeaveItsPrefix(t *testing.T) {
	t.Parallel()
	rule, _ := aclRules(t)
	srv := redistest.Start(t)
	setUser(t, []*redistest.Server{srv}, rule, "~tk:*")
	admin := srv.Client()
	if err := admin.Set(bg, "session:42", "secret", 0).Err(); err != nil {
		t.Fatal(err)
	}
	c := srv.Client(func(o *redis.Options) { o.Username, o.Password, o.MaxRetries = "throttlekit", "pw", -1 })
	if err := c.Get(bg, "session:42").Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("GET outside the prefix: %v, want NOPERM", err)
	}
	if err := c.Set(bg, "session:42", "overwritten", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
		t.Fatalf("SET outside the prefix: %v, want NOPERM", err)
	}
	if err := c.Eval(bg, "return redis.call('GET', KEYS[1])", []string{"session:42"}).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("a script reading outside the prefix: %v, want NOPERM", err)
	}
	if v, _ := admin.Get(bg, "session:42").Result(); v != "secret" {
		t.Fatalf("the key outside the prefix was changed: %q", v)
	}
	for _, policy := range []FailurePolicy{FailClosed, FailOpen, FailLocal(1)} {
		store := New(c, WithFailurePolicy(policy))
		t.Cleanup(func() { _ = store.Close() })
		s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithPrefix("session:"))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			_, err := s.Reserve(bg, "42", 1)
			var se *Error
			if !errors.As(err, &se) || !errors.Is(err, shaper.ErrStoreUnavailable) || !strings.Contains(se.Err.Error(), "NOPERM") {
				t.Fatalf("policy %d: a prefix outside the rule: %v, want an *Error with NOPERM", policy.kind, err)
			}
		}
		if _, err := s.Status(bg, "42", 1); !errors.Is(err, shaper.ErrStoreUnavailable) {
			t.Fatalf("policy %d: Status outside the rule: %v", policy.kind, err)
		}
		if store.Degraded() != 0 {
			t.Fatalf("policy %d: %d calls outside the rule were served by the policy", policy.kind, store.Degraded())
		}
	}
}
