package redisproc

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Start gives a server that answers, and its stop takes it away.
func TestStartAnswersAndStopStops(t *testing.T) {
	addr, stop, err := Start(false)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("a started server: %v", err)
	}
	stop()
	if err := client.Ping(context.Background()).Err(); err == nil {
		t.Fatal("a stopped server still answers")
	}
}
