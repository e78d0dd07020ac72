package script

import (
	"strings"
	"testing"
)

// The reply parsers take whatever Redis (or something posing as it) sends:
// they never panic, and what they accept is within bounds: a Took mask
// names only the dimensions there are, a status names a dimension that
// exists, or the pause.
func FuzzParseReplies(f *testing.F) {
	f.Add("1\x000\x005\x00100\x000\x001000\x00123\x00124\x000\x000\x0010", uint8(2))
	f.Add("1\x000\x005\x00100\x00-1\x001000\x00123\x000", uint8(1))
	f.Add("1000\x001000\x00-1\x000\x001\x000", uint8(1))
	f.Add("1\x00-1\x00\x00\x001000\x00\x00h\x001001\x007", uint8(1))
	f.Add("1\x003\x0059990", uint8(1)) // PermitTake's, and a count
	f.Add("0\x00-3\x00nan", uint8(1))
	f.Fuzz(func(t *testing.T, raw string, n uint8) {
		dims := int(n%8) + 1
		parts := strings.Split(raw, "\x00")
		items := make([]any, len(parts))
		for i, p := range parts {
			items[i] = p
		}
		if r, err := ParseReserve(items, dims); err == nil && r.Allowed {
			if r.Took>>dims != 0 || len(r.Tags) != dims || len(r.Seqs) != dims {
				t.Fatalf("ParseReserve accepted %q for %d dimensions: %+v", raw, dims, r)
			}
		}
		if r, err := ParseStatus(items, dims); err == nil {
			if r.Binding < -1 || r.Binding >= dims || len(r.Dims) != dims {
				t.Fatalf("ParseStatus accepted %q for %d dimensions: %+v", raw, dims, r)
			}
		}
		if r, err := ParseTake(items); err == nil && (r.InUse < 0 || r.Expiry != r.Expiry) {
			t.Fatalf("ParseTake accepted %q: %+v", raw, r)
		}
		if n, err := ParseCount(raw); err == nil && n < 0 {
			t.Fatalf("ParseCount accepted %q: %d", raw, n)
		}
		_, _ = ParseReserveGCRA(items, 1000)
		_, _ = ParseReserve(append(items, 42), dims) // not a string
		_, _ = ParseStatus(raw, dims)                // not a list
	})
}
