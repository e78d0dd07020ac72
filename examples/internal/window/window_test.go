package window

import (
	"testing"
	"time"
)

func TestMostInOneSecond(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	for _, c := range []struct {
		ts   []time.Time
		want int
	}{
		{nil, 0},
		{at(0), 1},
		{at(0, 999), 2},
		{at(0, 1000), 1}, // half-open: 1 s apart are in different windows
		{at(0, 100, 200, 1150, 1199, 1201), 3},
	} {
		if got := MostInOneSecond(c.ts); got != c.want {
			t.Errorf("%v: %d, want %d", c.ts, got, c.want)
		}
	}
}
