// Package script is the Go side of the Redis scripts of package lua: their
// arguments and their replies, a wire format between the Redis store and
// the scripts, not an API. Numbers cross the wire as strings formatted with
// %.17g (Redis truncates Lua numbers to integers in replies) and are parsed
// exactly on both sides.
package script

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/fair"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/lua"
)

// The scripts of package lua, as go-redis runs them (EVALSHA, then EVAL on
// NOSCRIPT).
var (
	// Reserve runs one transition over one or more dimensions, all or nothing.
	// Build its arguments with ReserveArgs and read its reply with ParseReserve.
	Reserve = redis.NewScript(lua.Lib + lua.Ledger + lua.Reserve)
	// ReserveGCRA is Reserve for one dimension of the GCRA family (kind "g"):
	// the same decision and the same stored state, at a fraction of Reserve's
	// cost inside Redis. Build its arguments with ReserveGCRAArgs; read its
	// reply with ParseReserveGCRA and turn it into the decision with
	// GCRAReply.Decide.
	ReserveGCRA = redis.NewScript(lua.GCRAAlone + lua.Ledger + lua.ReserveGCRA)
	// ReserveBatch decides many reservations of Reserve and ReserveGCRA in
	// one call, each exactly as its own call would in that order. Build its
	// keys and arguments with a Batch; its reply has one element per
	// reservation: that script's reply, or its error (a redis.Error).
	ReserveBatch = redis.NewScript(lua.Lib + lua.Ledger +
		"local function reserve_dims(KEYS, ARGV)\n" + lua.Reserve + "\nend\n" +
		"local function reserve_gcra(KEYS, ARGV)\n" + lua.ReserveGCRA + "\nend\n" +
		lua.ReserveBatch)
	// Settle gives back what a reservation did not use (see SettleArgs).
	Settle = redis.NewScript(lua.Lib + lua.Ledger + lua.Settle)
	// Status reads keys' standing without writing (ReserveArgs, with cost 0
	// for a dimension left out; ParseStatus).
	Status = redis.NewScript(lua.Lib + lua.Status)
	// Pause holds keys until now + d.
	Pause = redis.NewScript(lua.Lib + lua.Pause)
	// Learn keeps a partner key's learned record (see lua.Learn).
	Learn = redis.NewScript(lua.Lib + lua.Ledger + lua.Reset + lua.Learn)
	// Reset forgets state keys (now, then per key its kind and six
	// parameters; see lua.ResetKeys).
	Reset = redis.NewScript(lua.Lib + lua.Ledger + lua.Reset + lua.ResetKeys)
	// Clamp paces keys evenly until a partner's reset (now, interval and
	// span in ms).
	Clamp = redis.NewScript(lua.Lib + lua.Clamp)
	// Contract reads (no ARGV) or changes (identity, field, value) a
	// prefix's live contract; it replies with the record as HGETALL does.
	Contract = redis.NewScript(lua.Contract)
	// PermitTake takes one lease of an in-flight key (now, limit, lease ms
	// and id; ParseTake).
	PermitTake = redis.NewScript(lua.Lib + lua.PermitTake)
	// PermitRelease gives back leases of a key and announces it (channel,
	// tombstone flag, now, lease ms, ids); it replies how many it removed.
	PermitRelease = redis.NewScript(lua.Lib + lua.PermitRelease)
	// PermitRenew extends the leases a process holds, adding back those
	// lost while there is room (now, lease ms, limit or "", ids); it
	// replies with the ids lost.
	PermitRenew = redis.NewScript(lua.Lib + lua.PermitRenew)
	// PermitCount reads how many leases an in-flight key holds (now); it
	// replies with the count.
	PermitCount = redis.NewScript(lua.Lib + lua.PermitCount)
	// FairTurn is fair.State.Turn on one key (see lua.FairTurn); its reply
	// is read by ParseTurn.
	FairTurn = redis.NewScript(lua.Lib + lua.FairTurn)
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

// Any, appended to the ARGV of Reserve or Status, combines the dimensions
// with algorithms.AnyWithin (PeekAny) instead of All.
const Any = "any"

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

// GCRAParams returns the parameters of ReserveGCRA for a kind "g"
// algorithm's Params: interval, tau and max_wait, formatted (and boxed) once
// so that a caller can keep them.
func GCRAParams(p [6]float64) [3]any { return [3]any{Float(p[0]), Float(p[1]), Float(p[2])} }

// ReserveGCRAArgs returns the ARGV of ReserveGCRA: now (Float(ms), or
// ServerTime), the parameters from GCRAParams, and the cost. The KEYS are
// the state key and the pause key. It allocates the slice and nothing else
// for ServerTime and costs below 256.
func ReserveGCRAArgs(now string, params *[3]any, cost int64) []any {
	return []any{now, params[0], params[1], params[2], cost}
}

// GCRAReply is ReserveGCRA's answer: whether it admitted, and the inputs of
// the transition it made, exactly as Redis had them.
type GCRAReply struct {
	Allowed bool
	Binding int     // 0, or -1 when the pause floor bound
	Now     float64 // ms: the server's TIME, or the now the caller passed
	TAT     float64 // the TAT stored before the call; gcra.Cold if none
	// Under is the interval and tolerance the TAT was stored under (zero:
	// none recorded): Decide reads a TAT of another contract as
	// gcra.Kernel.Convert does, as the script did.
	Under [2]float64
	Floor float64 // the pause floor; Now if the key was not paused
	// Clamped says a partner's clamp held the key: one request departs per
	// slot, so the remaining figure is at most 1.
	Clamped bool
	// Handoff is the TAT floor relative to now that the caller passed as
	// ReserveGCRA's sixth argument (0: none); the caller sets it after
	// ParseReserveGCRA, and Decide applies it as the script did.
	Handoff float64
	// Seq is the grant's sequence number in the key's Ledger (0: the key
	// has none).
	Seq float64
	// Took says the reservation took a hole (see gcra.Ledger): it departs
	// at Hole, and the TAT did not move.
	Took bool
	Hole float64
}

// parseState reads a GCRA key's stored state: "tat", or "tat interval tau"
// (the contract it was stored under).
func parseState(v string) (tat float64, under [2]float64, err error) {
	f := strings.Fields(v)
	if len(f) != 1 && len(f) != 3 {
		return 0, under, fmt.Errorf("a GCRA state of %d fields", len(f))
	}
	if tat, err = strconv.ParseFloat(f[0], 64); err != nil || len(f) == 1 {
		return tat, under, err
	}
	for i := range 2 {
		if under[i], err = strconv.ParseFloat(f[1+i], 64); err != nil {
			return 0, under, err
		}
	}
	return tat, under, nil
}

// ParseReserveGCRA reads ReserveGCRA's reply, checking every element. now is
// the now the caller passed (ignored, and read from the reply, when the
// script read the server's TIME).
func ParseReserveGCRA(v any, now float64) (GCRAReply, error) {
	items, ok := v.([]any)
	if !ok || (len(items) != 6 && len(items) != 8 && len(items) != 9) {
		return GCRAReply{}, fmt.Errorf("throttlekit: unexpected reserve reply %v", v)
	}
	var s [9]string
	for i, it := range items {
		if s[i], ok = it.(string); !ok {
			return GCRAReply{}, fmt.Errorf("throttlekit: reserve reply element %d is %T, want a string", i, it)
		}
	}
	r := GCRAReply{Allowed: s[0] == "1", Now: now, TAT: gcra.Cold}
	bad := func(err error) (GCRAReply, error) {
		return GCRAReply{}, fmt.Errorf("throttlekit: reserve reply %q: %w", s, err)
	}
	bind, clamped := strings.CutSuffix(s[1], "c")
	r.Clamped = clamped
	if bind == "-1" {
		r.Binding = -1
	}
	if s[2] != "" { // the server's TIME, converted as the script converted it
		sec, err := strconv.ParseInt(s[2], 10, 64)
		if err != nil {
			return bad(err)
		}
		usec, err := strconv.ParseInt(s[3], 10, 64)
		if err != nil {
			return bad(err)
		}
		r.Now = float64(float64(sec)*1000) + float64(usec)/1000
	}
	r.Floor = r.Now
	var err error
	if s[4] != "" {
		if r.TAT, r.Under, err = parseState(s[4]); err != nil {
			return bad(err)
		}
	}
	if s[5] != "" {
		if r.Floor, err = strconv.ParseFloat(s[5], 64); err != nil {
			return bad(err)
		}
	}
	switch {
	case len(items) == 8 && s[6] == "g":
		r.Seq, err = strconv.ParseFloat(s[7], 64)
	case len(items) == 9 && s[6] == "h":
		r.Took = true
		if r.Hole, err = strconv.ParseFloat(s[7], 64); err == nil {
			r.Seq, err = strconv.ParseFloat(s[8], 64)
		}
	case len(items) != 6:
		err = fmt.Errorf("unknown Ledger reply %q", s[6])
	}
	if err != nil {
		return bad(err)
	}
	return r, nil
}

// Decide recomputes, with the kernel k of the algorithm whose parameters
// ReserveGCRA was given, the decision it made for cost (admissible: the
// caller checked). It returns whether the reservation was admitted, the
// delay (admitted) or the wait past MaxWait (refused) in ms, and the TAT the
// script stored when it admitted (the reservation's tag). The figures are
// Go's; the script's decision must agree with them, and an error says so if
// it does not.
func (r GCRAReply) Decide(k *gcra.Kernel, cost int64) (allowed bool, wait, tag float64, err error) {
	if r.Took { // a hole: the script decided on the key's Ledger, which Go does not hold
		return true, r.Hole - r.Now, r.TAT, nil
	}
	tat := r.TAT
	if u := r.Under; u[0] != 0 && (u[0] != k.Interval || u[1] != k.Tau) {
		tat = k.Convert(tat, r.Now, u[0], u[1])
	}
	if r.Handoff > 0 {
		if f := r.Now + r.Handoff; f > tat {
			tat = f
		}
	}
	next, wait, allowed := k.Reserve(tat, r.Now, r.Floor, cost) // a floor before now changes nothing
	if allowed != r.Allowed {
		return false, 0, 0, fmt.Errorf("throttlekit: Redis and Go disagree on a reservation (Redis allowed=%v at %v, TAT %v, floor %v): script and library versions differ?",
			r.Allowed, r.Now, r.TAT, r.Floor)
	}
	return allowed, wait, next, nil
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
	Seqs      []float64 // per dimension, its sequence number in its key's Ledger (0: none)
	Took      uint64    // admitted: bit i set when dimension i committed (every one without Any)
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
		switch len(s) {
		case 6 + 2*dims:
			r.Took = 1<<dims - 1
		case 7 + 2*dims: // with Any: which dimensions committed
			mask := s[6+2*dims]
			if len(mask) != dims {
				return Reply{}, fmt.Errorf("throttlekit: reserve reply: mask %q for %d dimensions", mask, dims)
			}
			for i := range dims {
				switch mask[i] {
				case '1':
					r.Took |= 1 << i
				case '0':
				default:
					return Reply{}, fmt.Errorf("throttlekit: reserve reply: mask %q", mask)
				}
			}
		default:
			return Reply{}, fmt.Errorf("throttlekit: reserve reply has %d tags and sequence numbers, want %d", len(s)-6, 2*dims)
		}
		r.Tags, r.Seqs = make([]float64, dims), make([]float64, dims)
		for i := range r.Tags {
			if r.Tags[i], err = strconv.ParseFloat(s[6+i], 64); err != nil {
				return Reply{}, fmt.Errorf("throttlekit: reserve reply: %w", err)
			}
			if r.Seqs[i], err = strconv.ParseFloat(s[6+dims+i], 64); err != nil {
				return Reply{}, fmt.Errorf("throttlekit: reserve reply: %w", err)
			}
		}
	}
	return r, nil
}

// StatusReply is Status's answer: the instant the script read at, the
// longest pause's end (Now when none), the binding dimension (-1 for the
// pause) and each dimension's figures.
type StatusReply struct {
	Now, Until float64
	Binding    int
	Dims       []algorithms.Standing
}

// ParseStatus reads Status's reply for dims dimensions, checking every
// element.
func ParseStatus(v any, dims int) (StatusReply, error) {
	items, ok := v.([]any)
	if !ok || len(items) != 3+3*dims {
		return StatusReply{}, fmt.Errorf("throttlekit: unexpected status reply %v", v)
	}
	f := make([]float64, len(items))
	binding := 0
	for i, it := range items {
		s, ok := it.(string)
		if !ok {
			return StatusReply{}, fmt.Errorf("throttlekit: status reply element %d is %T, want a string", i, it)
		}
		var err error
		if i == 2 {
			binding, err = strconv.Atoi(s)
		} else {
			f[i], err = strconv.ParseFloat(s, 64)
		}
		if err != nil {
			return StatusReply{}, fmt.Errorf("throttlekit: status reply: %w", err)
		}
	}
	r := StatusReply{Now: f[0], Until: f[1], Binding: binding, Dims: make([]algorithms.Standing, dims)}
	if r.Binding < -1 || r.Binding >= dims {
		return StatusReply{}, fmt.Errorf("throttlekit: status reply names dimension %d of %d", r.Binding, dims)
	}
	for i := range r.Dims {
		r.Dims[i] = algorithms.Standing{Delay: f[3+3*i], Remaining: f[4+3*i], Reset: f[5+3*i]}
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

// Batch gathers the reservations of one ReserveBatch call.
type Batch struct {
	Keys []string
	Args []any
	n    int
}

// Reset empties b, keeping its arrays.
func (b *Batch) Reset() {
	clear(b.Args)
	b.Keys, b.Args, b.n = b.Keys[:0], b.Args[:0], 0
}

// Add appends one reservation: gcra says whether keys and args are
// ReserveGCRA's (else Reserve's).
func (b *Batch) Add(gcra bool, keys []string, args []any) {
	if b.n == 0 {
		b.Args = append(b.Args, 0) // the count: Argv sets it
	}
	kind := "r"
	if gcra {
		kind = "g"
	}
	b.Keys = append(b.Keys, keys...)
	b.Args = append(b.Args, kind, len(keys), len(args))
	b.Args = append(b.Args, args...)
	b.n++
}

// Len is how many reservations b holds.
func (b *Batch) Len() int { return b.n }

// Argv returns ReserveBatch's ARGV for b.
func (b *Batch) Argv() []any {
	if b.n > 0 {
		b.Args[0] = b.n
	}
	return b.Args
}

// SplitBatch returns the reply of each of ReserveBatch's n reservations,
// as its own script would have replied (a value, or an error), and how
// long the batch ran on the server after it read TIME (ms).
func SplitBatch(v any, n int) ([]any, float64, error) {
	items, ok := v.([]any)
	if !ok || len(items) != n+1 {
		return nil, 0, fmt.Errorf("throttlekit: batch reply %T of %d elements, want %d", v, lenOf(v), n+1)
	}
	s, ok := items[n].(string)
	took, err := strconv.ParseFloat(s, 64)
	if !ok || err != nil || !(took >= 0 && took < 1e9) {
		return nil, 0, fmt.Errorf("throttlekit: batch reply ends with %v, want the ms it took", items[n])
	}
	return items[:n], took, nil
}

func lenOf(v any) int {
	if items, ok := v.([]any); ok {
		return len(items)
	}
	return -1
}

// TakeReply is PermitTake's answer.
type TakeReply struct {
	OK     bool
	InUse  int64   // leases held after the call
	Expiry float64 // ms until the earliest held lease expires (+Inf: none)
}

// ParseTake reads PermitTake's reply, checking every element.
func ParseTake(v any) (TakeReply, error) {
	items, ok := v.([]any)
	if !ok || len(items) != 3 {
		return TakeReply{}, fmt.Errorf("throttlekit: unexpected take_permit reply %v", v)
	}
	var s [3]string
	for i, it := range items {
		if s[i], ok = it.(string); !ok {
			return TakeReply{}, fmt.Errorf("throttlekit: take_permit reply element %d is %T, want a string", i, it)
		}
	}
	if s[0] != "0" && s[0] != "1" {
		return TakeReply{}, fmt.Errorf("throttlekit: take_permit reply %q", s)
	}
	r := TakeReply{OK: s[0] == "1"}
	var err error
	if r.InUse, err = ParseCount(s[1]); err != nil {
		return TakeReply{}, err
	}
	if r.Expiry, err = strconv.ParseFloat(s[2], 64); err != nil || r.Expiry != r.Expiry {
		return TakeReply{}, fmt.Errorf("throttlekit: take_permit reply %q: the expiry is not a number", s)
	}
	return r, nil
}

// ParseCount reads a count the permit scripts reply with (fmt of a whole
// number of at least 0).
func ParseCount(v any) (int64, error) {
	s, ok := v.(string)
	n, err := strconv.ParseInt(s, 10, 64)
	if !ok || err != nil || n < 0 {
		return 0, fmt.Errorf("throttlekit: unexpected count %v in a permit script's reply", v)
	}
	return n, nil
}

// TurnArgs returns FairTurn's ARGV: now, the TTL, MaxRun, the owner,
// Fresh and Hold, then each update's five values.
func TurnArgs(now string, p fair.Params, owner string, ups []fair.Update) []any {
	args := make([]any, 0, 6+5*len(ups))
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	args = append(args, now, Float(p.TTL), p.MaxRun, owner, flag(p.Fresh), flag(p.Hold))
	for _, u := range ups {
		f := "w"
		switch {
		case u.Leave:
			f = "x"
		case u.Last:
			f = "l"
		}
		args = append(args, u.Name, strconv.Itoa(u.Priority), Float(u.Weight), Float(u.Cost), f)
	}
	return args
}

// ParseTurn reads FairTurn's reply, checking every element.
func ParseTurn(v any) (fair.Reply, error) {
	vs, ok := v.([]any)
	if !ok || len(vs) != 10 {
		return fair.Reply{}, fmt.Errorf("throttlekit: unexpected fair_turn reply %v", v)
	}
	str := make([]string, len(vs))
	for i, it := range vs {
		s, ok := it.(string)
		if !ok {
			return fair.Reply{}, fmt.Errorf("throttlekit: fair_turn reply element %d is %T, want a string", i, it)
		}
		str[i] = s
	}
	var nums [6]float64
	for i := range nums {
		x, err := strconv.ParseFloat(str[3+i], 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
			return fair.Reply{}, fmt.Errorf("throttlekit: fair_turn reply element %d is %q, want a number", 3+i, str[3+i])
		}
		nums[i] = x
	}
	class, err := strconv.Atoi(str[2])
	if err != nil || (str[0] != "0" && str[0] != "1") || (str[9] != "0" && str[9] != "1") {
		return fair.Reply{}, fmt.Errorf("throttlekit: unexpected fair_turn reply %q", str)
	}
	return fair.Reply{
		Granted: str[0] == "1", Name: str[1], Priority: class,
		Start:   fair.Tag{Hi: nums[0], Lo: nums[1]},
		Finish:  fair.Tag{Hi: nums[2], Lo: nums[3]},
		V:       fair.Tag{Hi: nums[4], Lo: nums[5]},
		Renewed: str[9] == "1",
	}, nil
}
