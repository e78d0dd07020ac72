package lua

import (
	_ "embed"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lib.lua
	lib string
	//go:embed reserve.lua
	reserveSrc string
	//go:embed cancel.lua
	cancelSrc string
	//go:embed pause.lua
	pauseSrc string
)

var (
	// Reserve runs one transition over one or more dimensions, all or nothing.
	// Build its arguments with ReserveArgs and read its reply with ParseReserve.
	Reserve = redis.NewScript(lib + reserveSrc)
	// Cancel refunds GCRA reservations whose keys' schedules still end with them.
	Cancel = redis.NewScript(lib + cancelSrc)
	// Pause holds keys until now + d.
	Pause = redis.NewScript(lib + pauseSrc)
)

// Float formats x as the scripts read it: exactly, in at most 17 significant digits.
func Float(x float64) string { return strconv.FormatFloat(x, 'g', 17, 64) }

// Dim is one dimension of a Reserve call.
type Dim struct {
	Kind   string     // algorithms.Algorithm.Params kind
	Params [6]float64 // its parameters
	Cost   int64
}

// ServerTime, passed as now, makes a script read Redis TIME.
const ServerTime = ""

// ReserveArgs returns the ARGV of Reserve: now (Float(ms), or ServerTime)
// and each dimension's kind, parameters and cost. The KEYS are, per
// dimension, its state key then its pause key.
func ReserveArgs(now string, dims []Dim) []any {
	args := make([]any, 0, 1+8*len(dims))
	args = append(args, now)
	for _, d := range dims {
		args = append(args, d.Kind)
		for _, p := range d.Params {
			args = append(args, Float(p))
		}
		args = append(args, strconv.FormatInt(d.Cost, 10))
	}
	return args
}

// Reply is Reserve's answer.
type Reply struct {
	Allowed   bool
	Wait      float64 // admitted: the delay (ms); refused: the retry-after (ms)
	Remaining float64
	Reset     float64 // ms
	Binding   int     // the binding dimension (0-based), -1 for a pause
	Now       float64 // the instant the script decided at (ms)
	Tags      []float64
}

// ParseReserve reads Reserve's reply, checking every element.
func ParseReserve(v any, dims int) (Reply, error) {
	items, ok := v.([]any)
	if !ok || len(items) < 6 {
		return Reply{}, fmt.Errorf("throttlekit: unexpected reserve reply %v", v)
	}
	s := make([]string, len(items))
	for i, it := range items {
		if s[i], ok = it.(string); !ok {
			return Reply{}, fmt.Errorf("throttlekit: reserve reply element %d is %T, want a string", i, it)
		}
	}
	var r Reply
	var err error
	r.Allowed = s[0] == "1"
	nums := []*float64{&r.Wait, &r.Remaining, &r.Reset}
	for i, p := range nums {
		if *p, err = strconv.ParseFloat(s[1+i], 64); err != nil {
			return Reply{}, fmt.Errorf("throttlekit: reserve reply: %w", err)
		}
	}
	if r.Binding, err = strconv.Atoi(s[4]); err != nil {
		return Reply{}, fmt.Errorf("throttlekit: reserve reply: %w", err)
	}
	if r.Now, err = strconv.ParseFloat(s[5], 64); err != nil {
		return Reply{}, fmt.Errorf("throttlekit: reserve reply: %w", err)
	}
	if r.Allowed {
		if len(s) != 6+dims {
			return Reply{}, fmt.Errorf("throttlekit: reserve reply has %d tags, want %d", len(s)-6, dims)
		}
		r.Tags = make([]float64, dims)
		for i := range r.Tags {
			if r.Tags[i], err = strconv.ParseFloat(s[6+i], 64); err != nil {
				return Reply{}, fmt.Errorf("throttlekit: reserve reply: %w", err)
			}
		}
	}
	return r, nil
}

// DecodeState parses a stored state ("" is a cold key).
func DecodeState(s string) ([]float64, error) {
	fields := strings.Fields(s)
	st := make([]float64, len(fields))
	for i, f := range fields {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, fmt.Errorf("throttlekit: stored state %q: %w", s, err)
		}
		st[i] = x
	}
	return st, nil
}
