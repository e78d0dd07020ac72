package lua

import _ "embed"

// The scripts, as Redis runs them. An entry script is Lib followed by its own
// lines (ReserveGCRA stands alone); the library loads each with EVALSHA,
// falling back to EVAL when Redis answers NOSCRIPT.
var (
	// Lib ports every algorithm of package algorithms line for line.
	//
	//go:embed lib.lua
	Lib string

	// Reserve runs one transition over one or more dimensions, all or
	// nothing. KEYS: per dimension, its state key then its pause key. ARGV:
	// now in ms ("" reads Redis TIME), then per dimension its kind, six
	// parameters and its cost.
	//
	//go:embed reserve.lua
	Reserve string

	// ReserveGCRA is Reserve for one dimension of the GCRA family (the leaky
	// bucket and GCRA): the same decision and stored state, at a fraction of
	// Reserve's cost inside Redis. It replies with its transition's inputs.
	// It reads and writes through batch_time, read_keys and write_tat: alone,
	// it follows GCRAAlone and Ledger.
	//
	//go:embed reserve_gcra.lua
	ReserveGCRA string

	// ReserveBatch decides many reservations in one call, one after another,
	// each exactly as its own call of ReserveGCRA or Reserve would in that
	// order, each with its own reply or error. It follows Lib, Ledger, and
	// the bodies of Reserve and ReserveGCRA made functions:
	// "local function reserve_dims(KEYS, ARGV)\n" + Reserve + "\nend\n", and
	// the same of ReserveGCRA as reserve_gcra. KEYS: the reservations' keys in
	// turn; ARGV: their count, then per reservation 'g' (ReserveGCRA) or 'r'
	// (Reserve), its number of keys and of arguments, and its arguments.
	//
	//go:embed reserve_batch.lua
	ReserveBatch string

	// GCRAAlone is what ReserveGCRA reads and writes through when it runs
	// alone: TIME, one MGET, one SET (a batch defines its own).
	//
	//go:embed gcra_alone.lua
	GCRAAlone string

	// Ledger is the rule by which a key of the GCRA family gives back what
	// reservations did not use (internal/gcra's Ledger), as a function that
	// the other scripts call when a key has one.
	//
	//go:embed ledger.lua
	Ledger string

	// Reset is reset_keys, the Reset of state keys that keeps a Ledger for
	// the reservations granted before it (gcra.Kernel.ResetLedger): a
	// function of Lib and Ledger that ResetKeys and Learn call.
	//
	//go:embed reset.lua
	Reset string

	// ResetKeys forgets state keys (redisstore's Reset).
	//
	//go:embed reset_keys.lua
	ResetKeys string

	// Settle gives back what a reservation did not use, settled with its
	// actual cost or cancelled before its slot.
	//
	//go:embed settle.lua
	Settle string

	// Status reads keys' standing without writing anything: per
	// dimension, when a request could depart, what remains and when the key
	// is cold (algorithms.Peek).
	//
	//go:embed status.lua
	Status string

	// Pause holds keys until now + d.
	//
	//go:embed pause.lua
	Pause string

	// Learn keeps a partner key's learned record and sets the clamp
	// its rate makes, when the record's version is the caller's.
	//
	//go:embed learn.lua
	Learn string

	// Clamp paces keys evenly until a partner's reset: KEYS: the state
	// keys; ARGV: now in ms ("" reads Redis TIME), the interval and the span
	// in ms.
	//
	//go:embed clamp.lua
	Clamp string

	// Contract reads or changes the live contract of the shapers under one
	// prefix (a hash). KEYS: the record. ARGV: nothing to read it; or the
	// configured contract's identity, a field and its value to change it.
	// It stands alone (no Lib).
	//
	//go:embed contract.lua
	Contract string

	// PermitTake takes one lease of an in-flight key (a sorted set: lease
	// ids scored by their expiry) if fewer than the limit are held, after
	// dropping the leases whose expiry has come; an id already held is
	// refreshed and taken again; an id with a tombstone (its clean-up came
	// first) is not taken. KEYS: the in-flight key, its tombstones. ARGV: now
	// in ms ("" reads Redis TIME), the limit, the lease in ms, the lease's
	// id. Reply: "1" taken or "0" refused, the leases held after, the ms
	// until the earliest expires ("inf": none). A lease further ahead than
	// any lease could be is foreign data (TKSTATE).
	//
	//go:embed permit_take.lua
	PermitTake string

	// PermitRelease gives back leases of an in-flight key, each if it holds
	// the id, and then publishes the key on the channel; asked to, it
	// leaves a tombstone for each id, for a lease, so that a take or renewal
	// of it arriving later adds nothing. KEYS: the in-flight key, its
	// tombstones. ARGV: the channel, "1" for tombstones (else "0"), now in
	// ms ("" reads Redis TIME), the lease in ms, then the ids (one or more).
	// Reply: how many it removed.
	//
	//go:embed permit_release.lua
	PermitRelease string

	// PermitRenew extends to now + lease the leases of an in-flight key that
	// a process holds, adding back those the key lost while it has room
	// (always, with no limit: a failure policy's grants registered), never
	// one with a tombstone. KEYS: the in-flight key, its tombstones. ARGV:
	// now in ms ("" reads Redis TIME), the lease in ms, the limit ("":
	// none), then the ids. Reply: the ids lost (no room, or released).
	//
	//go:embed permit_renew.lua
	PermitRenew string

	// PermitCount reads how many leases an in-flight key holds, expired
	// ones aside, writing nothing; foreign data is refused (TKSTATE). KEYS:
	// the in-flight key. ARGV: now in ms ("" reads Redis TIME). Reply: the
	// count.
	//
	//go:embed permit_count.lua
	PermitCount string

	// FairTurn is internal/fair's State.Turn on one key (a hash), operation
	// for operation. KEYS: the fair key. ARGV: now in ms ("" reads Redis
	// TIME), the TTL ms, MaxRun, then per candidate its name,
	// weight, priority, cost and "w", "l" (last) or "x" (leaving). Reply:
	// the granted candidate (0-based, "-1": none), the turn's start tag, V,
	// then each candidate's finish tag, then each candidate's seq.
	//
	//go:embed fair_turn.lua
	FairTurn string
)
