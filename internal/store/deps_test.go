package store_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The core and the memory store compile no Redis client, and no
// OpenTelemetry: an in-memory user builds neither. The store packages keep
// to the direction of imports of DESIGN.md: the core never imports a store,
// and no store imports the core.
func TestTheCoreAndTheMemoryStoreCompileNoRedisClient(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH")
	}
	const mod = "github.com/throttlekit/throttlekit-go/"
	deps := func(pkgs ...string) []string {
		t.Helper()
		args := append([]string{"list", "-deps"}, pkgs...)
		out, err := exec.Command(goTool, args...).Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		return strings.Fields(string(out))
	}
	for _, p := range deps(mod+"shaper", mod+"memstore") {
		if strings.Contains(p, "go-redis") || strings.HasPrefix(p, "go.opentelemetry.io/") {
			t.Errorf("shaper and memstore compile %s", p)
		}
	}
	for store, forbidden := range map[string][]string{
		"shaper":     {mod + "memstore", mod + "redisstore"},
		"memstore":   {mod + "shaper", mod + "redisstore"},
		"redisstore": {mod + "shaper"},
	} {
		for _, p := range deps(mod + store) {
			for _, f := range forbidden {
				if p == f {
					t.Errorf("%s imports %s", store, f)
				}
			}
		}
	}
}
