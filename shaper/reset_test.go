package shaper

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// A Reset forgets a key's schedule, and the reservations granted before it
// give nothing back to the schedule granted after it, which never counted
// them: a cancel, a settle for less or at nothing leaves the slots after
// it where they are without it, on memory and on Redis, on a plain and on
// a learning shaper; a settle for more still charges its extra. Before
// the fix a cancel of a slot granted before the Reset gave its 600 ms back
// to the new schedule: the next two requests of 7 departed at once after
// one of 7, 14 units on a burst of 10 (the model test,
// node-nocoalesce/leaky/1dim seed 27).
func TestAResetDetachesTheReservationsGrantedBeforeIt(t *testing.T) {
	t.Parallel()
	_, node := redisClient(t)
	giveBacks := map[string]func(r *Reservation) error{
		"none":         func(*Reservation) error { return nil },
		"cancel":       func(r *Reservation) error { return r.Cancel(bg) },
		"settle less":  func(r *Reservation) error { return r.Settle(bg, 2) },
		"settle at 0":  func(r *Reservation) error { return r.Settle(bg, 0) },
		"settle more":  func(r *Reservation) error { return r.Settle(bg, 9) },
		"cancel again": func(r *Reservation) error { c := *r; _ = c.Cancel(bg); return r.Cancel(bg) },
	}
	for store, mk := range memoryAndNode(node) {
		for _, learning := range []bool{false, true} {
			var want []time.Duration
			for _, gb := range []string{"none", "cancel", "settle less", "settle at 0", "cancel again", "settle more"} {
				name := fmt.Sprintf("reset-%s-%v-%s", store, learning, gb)
				clock := timer.NewFake(time.Now())
				opts := []Option{WithClock(clock), WithMaxQueue(30 * time.Second), WithName(name)}
				if learning {
					opts = append(opts, WithLearning(Learning{Start: PerSecond(10), Floor: PerSecond(10)}))
				}
				s, err := New(mk(), PerSecond(10).WithBurst(10), opts...)
				if err != nil {
					t.Fatal(err)
				}
				var old []Reservation
				for range 12 {
					old = append(old, mustReserve(t, s, "b", 6))
				}
				clock.Advance(time.Second)
				if err := s.Reset(bg, "b"); err != nil {
					t.Fatal(err)
				}
				got := []time.Duration{mustReserve(t, s, "b", 7).Delay}
				if err := giveBacks[gb](&old[8]); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				for range 2 {
					got = append(got, mustReserve(t, s, "b", 7).Delay)
				}
				switch gb {
				case "none":
					want = got
					t.Logf("%s, learning %v: %v", store, learning, got)
				case "settle more": // the extra of 3 units is charged: 300 ms later, never sooner
					for i := range got {
						if got[i] < want[i] || i > 0 && got[i] != want[i]+300*time.Millisecond {
							t.Errorf("%s: delays %v, want %v with the 300 ms extra charged after the first", name, got, want)
							break
						}
					}
				default:
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Errorf("%s: delays %v, want %v as with no give-back: a reservation granted before the Reset gave back to the schedule after it", name, got, want)
					}
				}
			}
		}
	}
}
