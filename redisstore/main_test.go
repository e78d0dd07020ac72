package redisstore

import (
	"context"
	"testing"

	"github.com/throttlekit/throttlekit-go/shaper"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

func mustReserve(t *testing.T, s *shaper.Shaper, key string, cost int64) shaper.Reservation {
	t.Helper()
	r, err := s.Reserve(bg, key, cost)
	if err != nil {
		t.Fatalf("Reserve(%q, %d): %v", key, cost, err)
	}
	return r
}
