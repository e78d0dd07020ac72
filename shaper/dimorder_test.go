package shaper

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// orderDims is a three-dimension contract whose dimensions differ in every
// way the slot can: a per-user one (no mapping), an account-wide one (a Key
// mapping, so the slot dimension by default) and a token one whose Cost
// leaves it out of some requests.
func orderDims() []Dimension {
	return []Dimension{
		{Name: "user", Rate: PerSecond(3).WithBurst(2), Cost: func(int64) int64 { return 1 }},
		{Name: "account", Rate: PerSecond(2), Key: func(k string) string { return "acct:" + k[:1] }, Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: PerSecond(40).WithBurst(12), Cost: func(c int64) int64 {
			if c == 3 {
				return 0 // a request of cost 3 leaves the token dimension out
			}
			return 4 * c
		}},
	}
}

// orderKeys share accounts ("a1" and "a{2}" are both account "acct:a") and
// hold the characters the Redis key layout escapes.
var orderKeys = []string{"a1", "a{2}", `a\3`, "b1", "b}2", "b:p", "{c", "c:"}

// permutations returns every order of dims.
func permutations(dims []Dimension) [][]Dimension {
	if len(dims) <= 1 {
		return [][]Dimension{dims}
	}
	var out [][]Dimension
	for i := range dims {
		rest := append(append([]Dimension{}, dims[:i]...), dims[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]Dimension{dims[i]}, p...))
		}
	}
	return out
}

// The same dimensions in any order give the same result on every store:
// the memory store, a Redis node and a Redis cluster, for every one of the
// six orders of a contract in which users share an account and some
// requests leave a dimension out. Before the slot dimension was chosen
// explicitly, Redis placed a reservation in the slot of its first
// dimension's key, so with the user first each user had an account budget
// of its own, and a request leaving the first dimension out moved the
// others' state to new keys.
func TestDimensionOrderNeverChangesTheResult(t *testing.T) {
	t.Parallel()
	single, cluster := nodeAndCluster(t)
	stores := []struct {
		name string
		make func() Store
	}{
		{"memory", func() Store { return memstore.New(memstore.WithSweepInterval(0)) }},
		{"redis", func() Store {
			return redisstore.New(single, redisstore.WithClientClock(), redisstore.WithTimeout(5*time.Second))
		}},
		{"cluster", func() Store {
			return redisstore.New(cluster, redisstore.WithClientClock(), redisstore.WithTimeout(5*time.Second))
		}},
	}
	var want []string
	for _, st := range stores {
		for i, dims := range permutations(orderDims()) {
			clock := timer.NewFake(t0)
			prefix := fmt.Sprintf("order%d:", i)
			s, err := All(st.make(), dims, WithClock(clock), WithMaxQueue(time.Second), WithPrefix(prefix))
			if err != nil {
				t.Fatal(err)
			}
			got := runScenarioKeys(t, s, clock, 7, orderKeys, nil, true)
			if want == nil {
				want = got
				continue
			}
			sameTranscript(t, fmt.Sprintf("%s, order %s/%s/%s", st.name, dims[0].Name, dims[1].Name, dims[2].Name), "the first order", want, got)
		}
	}
	// The run must have exercised what it claims: shared accounts binding,
	// refusals, and requests that leave the token dimension out.
	var refusals, accountBound int
	for _, line := range want {
		if strings.Contains(line, "queue-full") {
			refusals++
		}
		if strings.Contains(line, ", account)") {
			accountBound++
		}
	}
	if refusals == 0 || accountBound == 0 {
		t.Fatalf("the scenario never refused (%d) or never bound on the account (%d): it tests nothing", refusals, accountBound)
	}
}

// Two dimensions with Key mappings leave the slot dimension ambiguous: All
// refuses them unless one is marked, and refuses two marks.
func TestSlotDimensionMustBeUnambiguous(t *testing.T) {
	t.Parallel()
	team := func(k string) string { return "team:" + k[:1] }
	org := func(string) string { return "org" }
	cases := []struct {
		name string
		dims []Dimension
		ok   bool
	}{
		{"two mappings, none marked", []Dimension{{Name: "team", Rate: PerSecond(5), Key: team}, {Name: "org", Rate: PerSecond(9), Key: org}}, false},
		{"two mappings, the broadest marked", []Dimension{{Name: "team", Rate: PerSecond(5), Key: team}, {Name: "org", Rate: PerSecond(9), Key: org, Slot: true}}, true},
		{"two marked", []Dimension{{Name: "team", Rate: PerSecond(5), Key: team, Slot: true}, {Name: "org", Rate: PerSecond(9), Key: org, Slot: true}}, false},
		{"one mapping", []Dimension{{Name: "user", Rate: PerSecond(5)}, {Name: "org", Rate: PerSecond(9), Key: org}}, true},
	}
	for _, c := range cases {
		_, err := All(memstore.New(memstore.WithSweepInterval(0)), c.dims)
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v is not an ErrInvalidConfig", c.name, err)
		}
	}
}

// The marked slot dimension places every key of a request on a cluster in
// its key's slot: users of one org share the org's budget.
func TestMarkedSlotSharesTheBroadestBudgetOnACluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t).Client(t)
	for _, client := range []redis.UniversalClient{cluster} {
		s, err := All(redisstore.New(client, redisstore.WithTimeout(slowMachine)), []Dimension{
			{Name: "team", Rate: PerSecond(100).WithBurst(100), Key: func(k string) string { return "team:" + k[:1] }},
			{Name: "org", Rate: PerMinute(1), Key: func(string) string { return "org" }, Slot: true},
		}, WithName("slot"), WithMaxQueue(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		mustReserve(t, s, "a-user", 1)
		if _, err := s.Reserve(bg, "b-user", 1); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("a user of another team got a slot of the org's 1/min budget that a-user used: %v", err)
		}
	}
}
