package store

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Record is a live contract as a store keeps it for the shapers under one
// prefix: the fields that differ from the configured contract it was made
// for. A record made for another configured contract (a fleet redeployed
// with new rates) is ignored, and replaced by the next change.
type Record struct {
	Version  uint64
	Identity string            // the configured contract
	Fields   map[string]string // RateField(name) -> "count period-ns burst"; MaxQueueField -> ns
}

// MaxQueueField is the field of a changed MaxQueue.
const MaxQueueField = "maxqueue"

// RateField is the field of the named dimension's changed rate.
func RateField(dimension string) string { return "rate:" + dimension }

// Merge applies one change to rec as a store does: a record made for
// another configured contract is replaced, and the version grows.
func (rec *Record) Merge(identity, field, value string) {
	if rec.Identity != identity {
		rec.Identity, rec.Fields = identity, nil
	}
	if rec.Fields == nil {
		rec.Fields = map[string]string{}
	}
	rec.Fields[field] = value
	rec.Version++
}

// Print returns rec's fields in one canonical string: two records with the
// same version are the same change only if they print the same (a record
// deleted from Redis by hand restarts its version at 1).
func (rec Record) Print() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(rec.Fields)) {
		fmt.Fprintf(&b, "%s=%s;", k, rec.Fields[k])
	}
	return b.String()
}

// Clone returns rec with its own fields.
func (rec Record) Clone() Record {
	out := rec
	out.Fields = maps.Clone(rec.Fields)
	return out
}

// ParseRecord reads a record from a flat list of field, value pairs (Redis
// HGETALL).
func ParseRecord(kv []string) (Record, error) {
	rec := Record{Fields: map[string]string{}}
	if len(kv)%2 != 0 {
		return Record{}, fmt.Errorf("throttlekit: a contract record of %d items", len(kv))
	}
	for i := 0; i < len(kv); i += 2 {
		switch k, v := kv[i], kv[i+1]; k {
		case "version":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return Record{}, fmt.Errorf("throttlekit: a contract record's version %q", v)
			}
			rec.Version = n
		case "identity":
			rec.Identity = v
		default:
			rec.Fields[k] = v
		}
	}
	return rec, nil
}
