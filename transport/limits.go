package transport

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// What ParseLimits reads of a response, at most: a partner's headers can
// hold 10 MB (net/http's default), and a broken or hostile one must not
// stall every caller.
const (
	// maxFieldLines is how many lines of each field ParseLimits reads;
	// the lines after them are ignored.
	maxFieldLines = 16
	// maxFieldBytes is the longest field line ParseLimits reads; a
	// longer one is ignored, as malformed.
	maxFieldBytes = 4096
	// maxFieldMembers is how many members of a Structured Field's List
	// (over all its lines) ParseLimits reads; the members after them are
	// checked, and ignored.
	maxFieldMembers = 64
)

// sfLine is one line of a Structured Field as ParseLimits reads it.
type sfLine struct {
	text  string
	items []sfItem // its members, as many as maxFieldMembers leaves
	list  bool     // it parses as a List
}

// parseSFField parses each line of field name that ParseLimits reads
// (fieldLines) as a List, keeping the field's first maxFieldMembers
// members. Each field is parsed once, for every dialect that reads it.
func parseSFField(h http.Header, name string) []sfLine {
	lines := fieldLines(h, name)
	out := make([]sfLine, len(lines))
	keep := maxFieldMembers
	for i, l := range lines {
		items, ok := parseSFList(l, keep)
		out[i] = sfLine{text: l, items: items, list: ok}
		keep -= len(items)
	}
	return out
}

// fieldLines returns the lines of field name that ParseLimits reads: the
// first maxFieldLines, less those longer than maxFieldBytes.
func fieldLines(h http.Header, name string) []string {
	vs := h.Values(name)
	if len(vs) == 0 {
		return nil
	}
	out := make([]string, 0, min(len(vs), maxFieldLines))
	for _, v := range vs[:min(len(vs), maxFieldLines)] {
		if len(v) <= maxFieldBytes {
			out = append(out, v)
		}
	}
	return out
}

// fieldValue returns the first line of field name ("" when it has none,
// or when that line is longer than maxFieldBytes).
func fieldValue(h http.Header, name string) string {
	if v := h.Get(name); len(v) <= maxFieldBytes {
		return v
	}
	return ""
}

// Dimension names what a limit counts: requests, tokens, or another unit a
// partner names. Units a partner names in an IETF RateLimit-Policy ("qu")
// are kept as sent, in lower case.
type Dimension string

// The dimensions ParseLimits reports.
const (
	// Requests counts requests (calls). It is the unit when a partner names none.
	Requests Dimension = "requests"
	// Tokens counts model tokens, input and output together (OpenAI,
	// Anthropic).
	Tokens Dimension = "tokens"
	// InputTokens counts model input (prompt) tokens (Anthropic).
	InputTokens Dimension = "input-tokens"
	// OutputTokens counts model output (completion) tokens (Anthropic).
	OutputTokens Dimension = "output-tokens"
	// ContentBytes counts content bytes, an IETF quota unit (qu="content-bytes").
	ContentBytes Dimension = "content-bytes"
	// ConcurrentRequests counts requests in flight at once, an IETF quota
	// unit (qu="concurrent-requests"); its Window, if any, means little.
	ConcurrentRequests Dimension = "concurrent-requests"
	// Points counts GitHub GraphQL API points (x-ratelimit-resource: graphql).
	Points Dimension = "points"
)

// Limit is one rate limit a partner's response states. Fields a response
// does not state are zero; HasRemaining and HasReset tell a stated 0 from
// an unstated one.
type Limit struct {
	// Dimension is what the limit counts.
	Dimension Dimension
	// Policy is the policy's name when the partner gives one: the IETF
	// policy name, or GitHub's x-ratelimit-resource ("core", "search",
	// "graphql", ...). Empty otherwise.
	Policy string
	// Quota is the number of units allowed per Window; 0 when not stated.
	Quota float64
	// Window is the period Quota applies to; 0 when not stated or not known.
	Window time.Duration
	// Remaining is the number of units left until Reset; valid when
	// HasRemaining.
	Remaining float64
	// HasRemaining reports whether the response stated Remaining.
	HasRemaining bool
	// Reset is the time from now until Remaining is restored; valid when
	// HasReset. 0 means now (or a reset time already past).
	Reset time.Duration
	// HasReset reports whether the response stated Reset.
	HasReset bool
	// Partition is the IETF partition key (the pk parameter): the base64
	// text of the byte sequence as sent, without its colons; "" when none.
	Partition string
	// Dialect names the header family the limit came from: "ietf"
	// (RateLimit-Policy and RateLimit with named policies), "ratelimit"
	// (the older drafts' RateLimit-Limit, -Remaining, -Reset and
	// "limit=, remaining=, reset=" forms), "x-ratelimit" (X-RateLimit-*),
	// "github" (X-RateLimit-* with X-RateLimit-Resource), "openai" or
	// "anthropic".
	Dialect string
}

// Rate reports the quota per second, Quota divided by Window, and false
// when Quota or Window is unknown or zero. A rate too large for a float64
// is reported as math.MaxFloat64.
func (l Limit) Rate() (float64, bool) {
	if !(l.Quota > 0) || math.IsInf(l.Quota, 0) || l.Window <= 0 {
		return 0, false
	}
	r := l.Quota / l.Window.Seconds()
	switch {
	case math.IsInf(r, 1):
		return math.MaxFloat64, true
	case r == 0: // underflow: a tiny quota over a long window
		return math.SmallestNonzeroFloat64, true
	}
	return r, true
}

// ParseLimits reads every rate-limit header dialect in h and returns one
// Limit per limit they state. now is the time the response arrived; resets
// given as a point in time are measured from it.
//
// It understands:
//
//   - RateLimit-Policy and RateLimit as draft-ietf-httpapi-ratelimit-headers-10
//     defines them: Structured Field lists of named policies,
//     `"default";q=100;w=60` and `"default";r=50;t=30`. A RateLimit item
//     and the RateLimit-Policy item of the same name (and partition key)
//     make one Limit, with Dialect "ietf".
//   - The older drafts' forms, Dialect "ratelimit": RateLimit-Limit,
//     RateLimit-Remaining and RateLimit-Reset (seconds); RateLimit as a
//     dictionary, `limit=100, remaining=50, reset=30`; and RateLimit-Policy
//     and RateLimit-Limit policies without names, `100;w=60`. The
//     "expiring limit" takes its Window from the policy with its quota.
//   - X-RateLimit-Limit, -Remaining and -Reset (seconds from now, or a Unix
//     time in seconds or milliseconds), Dialect "x-ratelimit". With
//     X-RateLimit-Resource (GitHub) the Dialect is "github", the resource is
//     the Policy, X-RateLimit-Used stands in for a missing Remaining, and
//     the documented windows apply: an hour for "core" and "graphql"
//     (counted in Points), a minute for "search" and "code_search".
//   - OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}, resets
//     such as "6m0s" or "59.724s"; Window is a minute.
//   - Anthropic's anthropic-ratelimit-{requests,tokens,input-tokens,
//     output-tokens}-{limit,remaining,reset}, resets as RFC 3339 times;
//     Window is a minute.
//
// Limits come in that order: within the IETF and older-draft dialects in
// the order the response lists its policies, and for OpenAI and Anthropic
// requests first, then tokens (then input and output tokens). The same
// headers always give the same slice, and no limit twice.
//
// Malformed fields and members and negative numbers are ignored, as the
// IETF draft requires ("Malformed RateLimit header fields MUST be
// ignored"); unknown parameters are comments. ParseLimits never fails and
// never panics. Each Structured Field line is parsed on its own, so one
// malformed line does not hide the others. ParseLimits returns nil when h
// states no limit.
//
// Numbers are read by each dialect's own grammar, strictly; anything else
// is malformed. RateLimit-Policy, RateLimit and RateLimit-Limit hold the
// Structured Field numbers of RFC 9651: an Integer of at most 15 digits,
// or a Decimal of at most 12 digits, a point and 1 to 3 digits (a longer
// one fails its whole line, as RFC 9651 parsing does). The other fields
// hold plain decimal digits: a count (a limit, a remaining or used count)
// is digits only, seconds and milliseconds (RateLimit-Reset,
// X-RateLimit-Reset, retry-after-ms) digits with an optional fraction,
// "1.5". No sign, exponent, hexadecimal, digit separator ("1_000"),
// "Inf" or "NaN" is read. The spaces and tabs around a field value are
// not part of it (RFC 9110) and are ignored. A plain number or a
// duration too large to hold saturates. OpenAI's resets are Go durations
// as time.Duration.String writes them, Anthropic's RFC 3339 date-times.
//
// What it reads is bounded, and it takes time linear in it: of each field
// only the first 16 lines are read, a line longer than 4,096 bytes is
// ignored, as malformed, and of a Structured Field List only the first
// 64 members are read (the others are checked, so that a malformed line
// is still ignored whole).
//
// Retry-After is not a limit: read it with RetryAfter. A secondary limit
// (GitHub's, for one) arrives as a 403 or 429 with Retry-After, or as
// Remaining 0 with a Reset; Feedback reads both as a refusal.
func ParseLimits(h http.Header, now time.Time) []Limit {
	var out []Limit
	policy, ratelimit := parseSFField(h, "RateLimit-Policy"), parseSFField(h, "RateLimit")
	out = appendIETFLimits(out, policy, ratelimit)
	out = appendDraftLimits(out, h, policy, ratelimit)
	out = appendXRateLimits(out, h, now)
	out = appendOpenAILimits(out, h)
	out = appendAnthropicLimits(out, h, now)
	return out
}

// RetryAfter reads Retry-After (whole seconds or an HTTP date, see
// ParseRetryAfter) and retry-after-ms (milliseconds, possibly fractional,
// as OpenAI and Azure send it). When both are present and valid the longer
// wait wins. It returns false when neither is valid.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	d, ok := ParseRetryAfter(fieldValue(h, "Retry-After"), now)
	if ms, okMs := plainDecimal(fieldValue(h, "Retry-After-Ms")); okMs {
		d, ok = max(d, milliseconds(ms)), true
	}
	return d, ok
}

// milliseconds converts a non-negative number of milliseconds to a
// Duration, saturating.
func milliseconds(ms float64) time.Duration { return seconds(ms / 1000) }

// trimOWS drops the spaces and tabs around a field value, which are not
// part of it (RFC 9110, section 5.5).
func trimOWS(v string) string { return strings.Trim(v, " \t") }

// plainCount reads a count (a limit, a remaining or used count): decimal
// digits only, 1*DIGIT, between optional spaces and tabs. A count past
// float64's range saturates.
func plainCount(v string) (float64, bool) {
	s := trimOWS(v)
	if s == "" || !allDigits(s) {
		return 0, false
	}
	return digitsValue(s), true
}

// plainDecimal reads seconds or milliseconds: 1*DIGIT ["." 1*DIGIT],
// between optional spaces and tabs. A value past float64's range
// saturates.
func plainDecimal(v string) (float64, bool) {
	s := trimOWS(v)
	if !isDecimal(s) {
		return 0, false
	}
	return digitsValue(s), true
}

// digitsValue is the value of s, digits with an optional fraction, which
// strconv.ParseFloat reads exactly as the grammar means it (no sign,
// exponent, base prefix or separator can reach it): the nearest float64,
// math.MaxFloat64 past its range.
func digitsValue(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	if math.IsInf(f, 1) {
		return math.MaxFloat64
	}
	return f
}

// IETF draft-ietf-httpapi-ratelimit-headers-10.

const (
	dialectIETF      = "ietf"
	dialectRateLimit = "ratelimit"
	dialectX         = "x-ratelimit"
	dialectGitHub    = "github"
	dialectOpenAI    = "openai"
	dialectAnthropic = "anthropic"
)

// appendIETFLimits reads the named policies of RateLimit-Policy and the
// service limits of RateLimit (draft-10, sections 3 and 4), given their
// lines (parseSFField).
func appendIETFLimits(out []Limit, policyLines, ratelimitLines []sfLine) []Limit {
	var (
		policies []Limit
		idx      policyIndex
	)
	for _, line := range policyLines {
		for _, it := range line.items {
			if it.kind != sfString && it.kind != sfToken {
				continue // numbers are the older drafts' policies; others are malformed
			}
			if l, ok := ietfPolicy(it); ok && idx.add(l.Policy, l.Partition, len(policies)) {
				policies = append(policies, l)
			}
		}
	}
	matched := make([]bool, len(policies))
	var (
		unmatched []Limit
		seen      policyIndex
	)
	for _, line := range ratelimitLines { // a line that is no List is perhaps the older dictionary form: appendDraftLimits
		for _, it := range line.items {
			if it.kind != sfString && it.kind != sfToken {
				continue
			}
			r, t, hasT, pk, ok := ietfServiceLimit(it)
			if !ok {
				continue
			}
			if i := idx.find(it.str, pk); i >= 0 {
				if matched[i] {
					continue // the first service limit for a policy wins
				}
				matched[i] = true
				p := &policies[i]
				p.Remaining, p.HasRemaining = r, true
				p.Reset, p.HasReset = t, hasT
				if p.Partition == "" && pk != "" {
					p.Partition = pk
					idx.keyed(it.str, pk, i)
				}
				continue
			}
			if !seen.add(it.str, pk, len(unmatched)) {
				continue
			}
			unmatched = append(unmatched, Limit{
				Dimension: Requests, // the draft's default quota unit
				Policy:    it.str,
				Remaining: r, HasRemaining: true,
				Reset: t, HasReset: hasT,
				Partition: pk,
				Dialect:   dialectIETF,
			})
		}
	}
	out = append(out, policies...)
	return append(out, unmatched...)
}

// policyIndex finds policies by name and partition key in constant time
// (a response may name thousands), as a scan of the list in order would.
// The zero policyIndex is empty.
type policyIndex struct {
	exact   map[policyKey]int // the first policy of each name and key
	byName  map[string]int    // the first policy of each name
	unkeyed map[string][]int  // the policies of each name without a key, in order
}

type policyKey struct{ name, pk string }

// add records policy i named name with partition key pk, and reports
// false, recording nothing, when one of that name and key is recorded.
func (x *policyIndex) add(name, pk string, i int) bool {
	k := policyKey{name, pk}
	if _, dup := x.exact[k]; dup {
		return false
	}
	if x.exact == nil {
		x.exact, x.byName, x.unkeyed = map[policyKey]int{}, map[string]int{}, map[string][]int{}
	}
	x.exact[k] = i
	if _, ok := x.byName[name]; !ok {
		x.byName[name] = i
	}
	if pk == "" {
		x.unkeyed[name] = append(x.unkeyed[name], i)
	}
	return true
}

// keyed records that policy i, the first of its name without a
// partition key, took key pk from its service limit (find returned it).
func (x *policyIndex) keyed(name, pk string, i int) {
	if q := x.unkeyed[name]; len(q) > 0 && q[0] == i {
		x.unkeyed[name] = q[1:]
	}
	if _, ok := x.exact[policyKey{name, pk}]; !ok {
		x.exact[policyKey{name, pk}] = i
	}
}

// find returns the policy a service limit named name with partition key
// pk belongs to: the first of that name and key; else the first of that
// name whose key or pk is missing (a missing key on either side matches
// any); -1 for none.
func (x *policyIndex) find(name, pk string) int {
	if i, ok := x.exact[policyKey{name, pk}]; ok {
		return i
	}
	if pk == "" {
		if i, ok := x.byName[name]; ok {
			return i
		}
	} else if q := x.unkeyed[name]; len(q) > 0 {
		return q[0]
	}
	return -1
}

// ietfPolicy reads one quota policy item: "name";q=100;w=60;qu="...";pk=:...:
// q is required; a known parameter with a value of the wrong type or out of
// range makes the whole item malformed. Unknown parameters are comments.
func ietfPolicy(it sfItem) (Limit, bool) {
	q, ok := it.param("q")
	if !ok || q.kind != sfNumber || q.num < 0 {
		return Limit{}, false
	}
	l := Limit{Dimension: Requests, Policy: it.str, Quota: nonNegZero(q.num), Dialect: dialectIETF}
	if w, ok := it.param("w"); ok {
		// "MUST be a non-negative, non-zero, Integer value expressing an
		// interval in seconds" (draft-10 §3.1.3). No default: unstated is 0.
		if w.kind != sfNumber || !(w.num > 0) {
			return Limit{}, false
		}
		l.Window = seconds(w.num)
	}
	if qu, ok := it.param("qu"); ok {
		// A String per draft-10; a Token is taken too, as for policy names.
		if qu.kind != sfString && qu.kind != sfToken || qu.str == "" {
			return Limit{}, false
		}
		l.Dimension = Dimension(strings.ToLower(qu.str))
	}
	if pk, ok := it.param("pk"); ok {
		if pk.kind != sfBytes {
			return Limit{}, false
		}
		l.Partition = pk.str
	}
	return l, true
}

// ietfServiceLimit reads one service limit item: "name";r=50;t=30;pk=:...:
// r is required, t optional (draft-10 §4.1).
func ietfServiceLimit(it sfItem) (remaining float64, reset time.Duration, hasReset bool, pk string, ok bool) {
	r, ok := it.param("r")
	if !ok || r.kind != sfNumber || r.num < 0 {
		return 0, 0, false, "", false
	}
	if t, ok := it.param("t"); ok {
		if t.kind != sfNumber || t.num < 0 {
			return 0, 0, false, "", false
		}
		reset, hasReset = seconds(t.num), true
	}
	if p, ok := it.param("pk"); ok {
		if p.kind != sfBytes {
			return 0, 0, false, "", false
		}
		pk = p.str
	}
	return nonNegZero(r.num), reset, hasReset, pk, true
}

func nonNegZero(f float64) float64 {
	if f == 0 {
		return 0 // not -0
	}
	return f
}

// The older drafts (up to draft-07): one "expiring limit" in
// RateLimit-Limit/-Remaining/-Reset or RateLimit: limit=, remaining=,
// reset=, and policies as bare numbers, "10, 10;w=1, 1000;w=3600".

type draftPolicy struct {
	quota  float64
	window time.Duration
}

// draftPolicyItem reads "100;w=60". A w that is not a positive number makes
// the item malformed.
func draftPolicyItem(it sfItem) (draftPolicy, bool) {
	if it.kind != sfNumber || it.num < 0 {
		return draftPolicy{}, false
	}
	p := draftPolicy{quota: nonNegZero(it.num)}
	if w, ok := it.param("w"); ok {
		if w.kind != sfNumber || !(w.num > 0) {
			return draftPolicy{}, false
		}
		p.window = seconds(w.num)
	}
	return p, true
}

func appendDraftLimits(out []Limit, h http.Header, policyLines, ratelimitLines []sfLine) []Limit {
	e := Limit{Dimension: Requests, Dialect: dialectRateLimit}
	hasQuota := false
	var policies []draftPolicy
	// RateLimit-Limit: 10, 10;w=1, 1000;w=3600 (draft-03): the first member
	// is the expiring limit, the others are its policies.
	first := true
	for _, line := range parseSFField(h, "RateLimit-Limit") {
		for _, it := range line.items {
			p, ok := draftPolicyItem(it)
			if first {
				first = false
				if ok {
					e.Quota, e.Window, hasQuota = p.quota, p.window, true
				}
				continue
			}
			if ok {
				policies = append(policies, p)
			}
		}
	}
	if n, ok := plainCount(fieldValue(h, "RateLimit-Remaining")); ok {
		e.Remaining, e.HasRemaining = n, true
	}
	if n, ok := plainDecimal(fieldValue(h, "RateLimit-Reset")); ok {
		e.Reset, e.HasReset = seconds(n), true
	}
	// RateLimit: limit=100, remaining=50, reset=30 (draft-07), a Dictionary;
	// it fills in what the separate fields left unsaid.
	for _, line := range ratelimitLines {
		if line.list {
			continue // the named-policy form: appendIETFLimits
		}
		dict, ok := parseSFDict(line.text)
		if !ok {
			continue
		}
		if v, ok := dict.get("limit"); ok && !hasQuota && v.kind == sfNumber && v.num >= 0 {
			e.Quota, hasQuota = nonNegZero(v.num), true
		}
		if v, ok := dict.get("remaining"); ok && !e.HasRemaining && v.kind == sfNumber && v.num >= 0 {
			e.Remaining, e.HasRemaining = nonNegZero(v.num), true
		}
		if v, ok := dict.get("reset"); ok && !e.HasReset && v.kind == sfNumber && v.num >= 0 {
			e.Reset, e.HasReset = seconds(v.num), true
		}
	}
	// RateLimit-Policy: 100;w=60, 1000;w=3600 (drafts 05 to 07).
	for _, line := range policyLines {
		for _, it := range line.items {
			if p, ok := draftPolicyItem(it); ok {
				policies = append(policies, p)
			}
		}
	}
	if hasQuota && e.Window == 0 {
		// "The expiring limit MUST be set to the service limit that is
		// closest to reaching its limit", and two policies "MUST NOT be
		// associated with the same quota units value" (draft-07, "Limit
		// Keyword" and "RateLimit-Policy"): the policy with the expiring
		// limit's quota is its policy.
		for _, p := range policies {
			if p.quota == e.Quota && p.window > 0 {
				e.Window = p.window
				break
			}
		}
	}
	if hasQuota || e.HasRemaining || e.HasReset {
		out = append(out, e)
	}
	seen := make(map[draftPolicy]bool, len(policies))
	for _, p := range policies {
		if hasQuota && p.quota == e.Quota && (p.window == e.Window || p.window == 0) {
			continue // the expiring limit itself
		}
		if seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, Limit{Dimension: Requests, Quota: p.quota, Window: p.window, Dialect: dialectRateLimit})
	}
	return out
}

// X-RateLimit-* and GitHub.

// githubWindows are the windows GitHub documents per resource: "the
// maximum number of requests that you can make per hour" (REST, resource
// core), "points that you can use per hour" (GraphQL), search "30 requests
// per minute" and search code "9 requests per minute". Other resources
// have no window documented; their Window is left 0.
// https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api
// https://docs.github.com/en/graphql/overview/rate-limits-and-query-limits-for-the-graphql-api
// https://docs.github.com/en/rest/search/search#rate-limit
var githubWindows = map[string]time.Duration{
	"core":        time.Hour,
	"graphql":     time.Hour,
	"search":      time.Minute,
	"code_search": time.Minute,
}

func appendXRateLimits(out []Limit, h http.Header, now time.Time) []Limit {
	l := Limit{Dimension: Requests, Dialect: dialectX}
	hasQuota := false
	if n, ok := plainCount(fieldValue(h, "X-RateLimit-Limit")); ok {
		l.Quota, hasQuota = n, true
	}
	if n, ok := plainCount(fieldValue(h, "X-RateLimit-Remaining")); ok {
		l.Remaining, l.HasRemaining = n, true
	}
	if d, ok := resetIn(fieldValue(h, "X-RateLimit-Reset"), now); ok {
		l.Reset, l.HasReset = d, true
	}
	if used, ok := plainCount(fieldValue(h, "X-RateLimit-Used")); ok && hasQuota && !l.HasRemaining {
		// GitHub: x-ratelimit-used, "the number of requests you have made in
		// the current rate limit window".
		l.Remaining, l.HasRemaining = nonNegZero(max(0, l.Quota-used)), true
	}
	if !hasQuota && !l.HasRemaining && !l.HasReset {
		return out
	}
	if res := trimOWS(fieldValue(h, "X-RateLimit-Resource")); res != "" {
		l.Dialect, l.Policy = dialectGitHub, res
		l.Window = githubWindows[strings.ToLower(res)]
		if strings.EqualFold(res, "graphql") {
			l.Dimension = Points
		}
	}
	return append(out, l)
}

// OpenAI.

// appendOpenAILimits reads x-ratelimit-{limit,remaining,reset}-{requests,
// tokens}: https://platform.openai.com/docs/guides/rate-limits ("Rate
// limits in headers"). OpenAI's limits are requests and tokens per minute
// (RPM, TPM), so Window is a minute; its other limits (per day, say) have
// no header.
func appendOpenAILimits(out []Limit, h http.Header) []Limit {
	for _, d := range [...]struct {
		dim    Dimension
		suffix string
	}{{Requests, "requests"}, {Tokens, "tokens"}} {
		l := Limit{Dimension: d.dim, Window: time.Minute, Dialect: dialectOpenAI}
		hasQuota := false
		if n, ok := plainCount(fieldValue(h, "X-Ratelimit-Limit-"+d.suffix)); ok {
			l.Quota, hasQuota = n, true
		}
		if n, ok := plainCount(fieldValue(h, "X-Ratelimit-Remaining-"+d.suffix)); ok {
			l.Remaining, l.HasRemaining = n, true
		}
		if r, ok := parseResetDuration(fieldValue(h, "X-Ratelimit-Reset-"+d.suffix)); ok {
			l.Reset, l.HasReset = r, true
		}
		if hasQuota || l.HasRemaining || l.HasReset {
			out = append(out, l)
		}
	}
	return out
}

// durationUnits are the units of a Go duration string, largest first.
var durationUnits = [...]struct {
	name string
	d    uint64
}{
	{"h", uint64(time.Hour)},
	{"m", uint64(time.Minute)},
	{"s", uint64(time.Second)},
	{"ms", uint64(time.Millisecond)},
	{"us", uint64(time.Microsecond)},
	{"µs", uint64(time.Microsecond)}, // U+00B5 micro sign
	{"μs", uint64(time.Microsecond)}, // U+03BC Greek mu
	{"ns", uint64(time.Nanosecond)},
}

// parseResetDuration reads an OpenAI reset: a Go duration as
// time.Duration.String writes it ("1s", "6m0s", "12ms", "59.724s",
// "1h2m3.5s"), or a bare number of seconds (as Azure OpenAI sends it).
// Unlike time.ParseDuration it rejects signs, units out of order or
// repeated, and fractions without digits on both sides of the point, and it
// saturates rather than fails on overflow.
func parseResetDuration(v string) (time.Duration, bool) {
	s := trimOWS(v)
	if s == "" {
		return 0, false
	}
	if isDecimal(s) {
		return seconds(digitsValue(s)), true
	}
	var total uint64
	last := -1
	for s != "" {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == 0 {
			return 0, false
		}
		whole, fracDigits := s[:i], ""
		s = s[i:]
		if s != "" && s[0] == '.' {
			j := 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if j == 1 {
				return 0, false
			}
			fracDigits, s = s[1:j], s[j:]
		}
		j := 0
		for j < len(s) && (s[j] < '0' || s[j] > '9') && s[j] != '.' {
			j++
		}
		name := s[:j]
		s = s[j:]
		u := -1
		for k, unit := range durationUnits {
			if unit.name == name {
				u = k
				break
			}
		}
		if u < 0 || u <= last || last >= 0 && durationUnits[u].d == durationUnits[last].d {
			return 0, false
		}
		last = u
		total = satAdd(total, scaledDigits(whole, fracDigits, durationUnits[u].d))
	}
	if total > math.MaxInt64 {
		return math.MaxInt64, true
	}
	return time.Duration(total), true
}

// isDecimal reports whether s is digits, optionally with a fraction:
// "12", "0.5".
func isDecimal(s string) bool {
	whole, frac, hasPoint := strings.Cut(s, ".")
	return whole != "" && allDigits(whole) && (!hasPoint || frac != "" && allDigits(frac))
}

// scaledDigits returns whole.frac × unit, saturating at math.MaxUint64.
// whole and frac are decimal digits; frac may be empty.
func scaledDigits(whole, frac string, unit uint64) uint64 {
	var w uint64
	for _, c := range []byte(whole) {
		hi, lo := bits.Mul64(w, 10)
		lo, carry := bits.Add64(lo, uint64(c-'0'), 0)
		if hi != 0 || carry != 0 {
			return math.MaxUint64
		}
		w = lo
	}
	hi, total := bits.Mul64(w, unit)
	if hi != 0 {
		return math.MaxUint64
	}
	// The fraction: up to 19 digits (10^19 < 2^64) are exact enough; the
	// rest are below a nanosecond.
	if len(frac) > 19 {
		frac = frac[:19]
	}
	var f, scale uint64 = 0, 1
	for _, c := range []byte(frac) {
		f, scale = f*10+uint64(c-'0'), scale*10
	}
	fh, fl := bits.Mul64(f, unit)
	part, _ := bits.Div64(fh, fl, scale) // f < scale, so the quotient fits
	return satAdd(total, part)
}

func satAdd(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

// Anthropic.

// appendAnthropicLimits reads anthropic-ratelimit-{requests,tokens,
// input-tokens,output-tokens}-{limit,remaining,reset}, resets "provided in
// RFC 3339 format": https://docs.anthropic.com/en/api/rate-limits
// ("Response headers"). Anthropic's limits are per minute (RPM, ITPM,
// OTPM), so Window is a minute. Token remaining counts are rounded to the
// nearest thousand by Anthropic. On a 429 Anthropic also sends
// retry-after: see RetryAfter.
func appendAnthropicLimits(out []Limit, h http.Header, now time.Time) []Limit {
	for _, d := range [...]struct {
		dim    Dimension
		prefix string
	}{
		{Requests, "Anthropic-Ratelimit-Requests-"},
		{Tokens, "Anthropic-Ratelimit-Tokens-"},
		{InputTokens, "Anthropic-Ratelimit-Input-Tokens-"},
		{OutputTokens, "Anthropic-Ratelimit-Output-Tokens-"},
	} {
		l := Limit{Dimension: d.dim, Window: time.Minute, Dialect: dialectAnthropic}
		hasQuota := false
		if n, ok := plainCount(fieldValue(h, d.prefix+"Limit")); ok {
			l.Quota, hasQuota = n, true
		}
		if n, ok := plainCount(fieldValue(h, d.prefix+"Remaining")); ok {
			l.Remaining, l.HasRemaining = n, true
		}
		if t, ok := parseRFC3339(trimOWS(fieldValue(h, d.prefix+"Reset"))); ok {
			l.Reset, l.HasReset = max(0, t.Sub(now)), true // Sub saturates
		}
		if hasQuota || l.HasRemaining || l.HasReset {
			out = append(out, l)
		}
	}
	return out
}

// parseRFC3339 reads an RFC 3339 date-time (section 5.6), full-date "T"
// full-time: "T" and "Z" in either case, a fraction of a second of any
// length (nanoseconds kept), "Z" or a numeric offset of at most 23:59;
// seconds 00 to 59 (a leap second is not read). time.Parse takes more: a
// comma for the point, offsets such as +24:00.
func parseRFC3339(s string) (time.Time, bool) {
	if len(s) < len("2006-01-02T15:04:05Z") {
		return time.Time{}, false
	}
	num := func(v string) (int, bool) {
		n := 0
		for _, c := range []byte(v) {
			if !isDigit(c) {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(s[0:4])
	month, ok2 := num(s[5:7])
	day, ok3 := num(s[8:10])
	hour, ok4 := num(s[11:13])
	minute, ok5 := num(s[14:16])
	sec, ok6 := num(s[17:19])
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || s[4] != '-' || s[7] != '-' || s[10] != 'T' && s[10] != 't' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	if month < 1 || month > 12 || day < 1 || day > time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day() ||
		hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	rest, ns := s[19:], 0
	if rest != "" && rest[0] == '.' {
		j := 1
		for j < len(rest) && isDigit(rest[j]) {
			j++
		}
		if j == 1 {
			return time.Time{}, false
		}
		for k := 1; k <= 9; k++ { // nanoseconds; the digits past them are dropped
			ns *= 10
			if k < j {
				ns += int(rest[k] - '0')
			}
		}
		rest = rest[j:]
	}
	off := 0
	switch {
	case rest == "Z" || rest == "z":
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, okH := num(rest[1:3])
		om, okM := num(rest[4:6])
		if !okH || !okM || oh > 23 || om > 59 {
			return time.Time{}, false
		}
		off = (oh*60 + om) * 60
		if rest[0] == '-' {
			off = -off
		}
	default:
		return time.Time{}, false
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, ns, time.FixedZone("", off)), true
}

// Structured Field Values (RFC 9651), the parts the RateLimit fields use.
// The parser follows RFC 9651 section 4.2, numbers included (a number
// with more digits than the RFC allows fails the line); each field line
// is parsed on its own. It takes time linear in the line: a repeated
// parameter or dictionary key is kept as a list entry and looked up from
// the end, where RFC 9651 overwrites the value in place (the last value
// wins either way).

type sfKind uint8

const (
	sfNumber sfKind = iota + 1 // Integer or Decimal
	sfString
	sfToken
	sfBytes // str holds the base64 text as sent
	sfBool
	sfDate
	sfDisplay
	sfInner // an Inner List; its members are dropped
)

type sfItem struct {
	kind    sfKind
	num     float64
	integer bool // an Integer (sfNumber, sfDate): no point
	str     string
	params  []sfParam
}

type sfParam struct {
	key string
	val sfItem
}

// param returns the value of the parameter key: its last, as RFC 9651
// section 4.2.3.2 keeps it.
func (it sfItem) param(key string) (sfItem, bool) {
	return lastParam(it.params, key)
}

type sfDict []sfParam

// get returns the value of the member key: its last (RFC 9651 section
// 4.2.2).
func (d sfDict) get(key string) (sfItem, bool) { return lastParam(d, key) }

func lastParam(ps []sfParam, key string) (sfItem, bool) {
	for i := len(ps) - 1; i >= 0; i-- {
		if ps[i].key == key {
			return ps[i].val, true
		}
	}
	return sfItem{}, false
}

type sfParser struct {
	s     string
	i     int
	arena []sfParam // the parameters of the line's items, which slice it
}

func (p *sfParser) eof() bool  { return p.i >= len(p.s) }
func (p *sfParser) peek() byte { return p.s[p.i] }

func (p *sfParser) skipSP() {
	for !p.eof() && p.peek() == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for !p.eof() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

// parseSFList parses one field line as a List (RFC 9651 §4.2.1). It
// returns its first keep members (every one is checked).
func parseSFList(line string, keep int) ([]sfItem, bool) {
	p := &sfParser{s: strings.Trim(line, " \t")}
	var out []sfItem
	for !p.eof() {
		mark := len(p.arena)
		it, ok := p.itemOrInnerList()
		if !ok {
			return nil, false
		}
		if len(out) < keep {
			out = append(out, it)
		} else {
			p.arena = p.arena[:mark] // checked, not kept
		}
		if !p.nextMember() {
			return nil, false
		}
	}
	return out, true
}

// parseSFDict parses one field line as a Dictionary (RFC 9651 §4.2.2).
// A repeated key is kept as another member; get returns its last value.
func parseSFDict(line string) (sfDict, bool) {
	p := &sfParser{s: strings.Trim(line, " \t")}
	var out sfDict
	for !p.eof() {
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		var v sfItem
		if !p.eof() && p.peek() == '=' {
			p.i++
			if v, ok = p.itemOrInnerList(); !ok {
				return nil, false
			}
		} else {
			v = sfItem{kind: sfBool, num: 1}
			if v.params, ok = p.params(); !ok {
				return nil, false
			}
		}
		out = append(out, sfParam{key, v})
		if !p.nextMember() {
			return nil, false
		}
	}
	return out, true
}

// nextMember consumes the separator after a list or dictionary member:
// true at the end of input or after a comma followed by more.
func (p *sfParser) nextMember() bool {
	p.skipOWS()
	if p.eof() {
		return true
	}
	if p.peek() != ',' {
		return false
	}
	p.i++
	p.skipOWS()
	return !p.eof() // a trailing comma is malformed
}

func (p *sfParser) itemOrInnerList() (sfItem, bool) {
	if !p.eof() && p.peek() == '(' {
		return p.innerList()
	}
	it, ok := p.bareItem()
	if !ok {
		return sfItem{}, false
	}
	it.params, ok = p.params()
	return it, ok
}

func (p *sfParser) innerList() (sfItem, bool) {
	p.i++ // (
	// Its items' parameters are dropped.
	mark := len(p.arena)
	for {
		p.skipSP()
		if p.eof() {
			return sfItem{}, false
		}
		if p.peek() == ')' {
			p.i++
			p.arena = p.arena[:mark]
			ps, ok := p.params()
			return sfItem{kind: sfInner, params: ps}, ok
		}
		if _, ok := p.bareItem(); !ok {
			return sfItem{}, false
		}
		if _, ok := p.params(); !ok {
			return sfItem{}, false
		}
		if p.eof() || p.peek() != ' ' && p.peek() != ')' {
			return sfItem{}, false
		}
	}
}

// params reads an item's parameters into the parser's arena and returns
// them (a slice of it that later ones do not overwrite).
func (p *sfParser) params() ([]sfParam, bool) {
	start := len(p.arena)
	for !p.eof() && p.peek() == ';' {
		p.i++
		p.skipSP()
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		v := sfItem{kind: sfBool, num: 1}
		if !p.eof() && p.peek() == '=' {
			p.i++
			if v, ok = p.bareItem(); !ok {
				return nil, false
			}
		}
		p.arena = append(p.arena, sfParam{key, v})
	}
	if len(p.arena) == start {
		return nil, true
	}
	return p.arena[start:len(p.arena):len(p.arena)], true
}

func (p *sfParser) key() (string, bool) {
	start := p.i
	if p.eof() || !(isLCAlpha(p.peek()) || p.peek() == '*') {
		return "", false
	}
	p.i++
	for !p.eof() {
		c := p.peek()
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], true
}

func (p *sfParser) bareItem() (sfItem, bool) {
	if p.eof() {
		return sfItem{}, false
	}
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token()
	case c == ':':
		return p.bytes()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			v := float64(p.s[p.i+1] - '0')
			p.i += 2
			return sfItem{kind: sfBool, num: v}, true
		}
		return sfItem{}, false
	case c == '@':
		p.i++
		it, ok := p.number()
		if !ok || !it.integer { // a Date is an Integer
			return sfItem{}, false
		}
		return sfItem{kind: sfDate, num: it.num, integer: true}, true
	case c == '%':
		return p.displayString()
	}
	return sfItem{}, false
}

// number reads an Integer or a Decimal as RFC 9651 section 4.2.4 does:
// sf-integer, an optional "-" and 1 to 15 digits, or sf-decimal, an
// optional "-", 1 to 12 digits, "." and 1 to 3 digits; more digits fail.
// Its value is exact (an Integer) or the nearest float64 (a Decimal).
func (p *sfParser) number() (sfItem, bool) {
	start := p.i
	if !p.eof() && p.peek() == '-' { // eof: "@" ends the field
		p.i++
	}
	digits := p.i
	for !p.eof() && isDigit(p.peek()) {
		p.i++
	}
	n := p.i - digits
	if n == 0 {
		return sfItem{}, false
	}
	integer := true
	if !p.eof() && p.peek() == '.' {
		if n > 12 {
			return sfItem{}, false
		}
		p.i++
		frac := p.i
		for !p.eof() && isDigit(p.peek()) {
			p.i++
		}
		if f := p.i - frac; f < 1 || f > 3 {
			return sfItem{}, false
		}
		integer = false
	} else if n > 15 {
		return sfItem{}, false
	}
	f, err := strconv.ParseFloat(p.s[start:p.i], 64) // the grammar checked: at most 15 digits
	if err != nil {
		return sfItem{}, false
	}
	return sfItem{kind: sfNumber, num: f, integer: integer}, true
}

func (p *sfParser) str() (sfItem, bool) {
	p.i++ // "
	start := p.i
	for !p.eof() { // without an escape, the String is a part of the line
		c := p.peek()
		if c == '"' {
			p.i++
			return sfItem{kind: sfString, str: p.s[start : p.i-1]}, true
		}
		if c == '\\' || c < 0x20 || c > 0x7e {
			break
		}
		p.i++
	}
	var b strings.Builder
	b.WriteString(p.s[start:p.i])
	for !p.eof() {
		c := p.peek()
		p.i++
		switch {
		case c == '\\':
			if p.eof() || p.peek() != '"' && p.peek() != '\\' {
				return sfItem{}, false
			}
			b.WriteByte(p.peek())
			p.i++
		case c == '"':
			return sfItem{kind: sfString, str: b.String()}, true
		case c < 0x20 || c > 0x7e:
			return sfItem{}, false
		default:
			b.WriteByte(c)
		}
	}
	return sfItem{}, false
}

func (p *sfParser) token() (sfItem, bool) {
	start := p.i
	p.i++
	for !p.eof() && (isTChar(p.peek()) || p.peek() == ':' || p.peek() == '/') {
		p.i++
	}
	return sfItem{kind: sfToken, str: p.s[start:p.i]}, true
}

// bytes reads :base64: and keeps the base64 text. RFC 9651 §4.2.7 asks
// parsers not to fail on missing padding or non-zero pad bits, so only the
// alphabet is checked.
func (p *sfParser) bytes() (sfItem, bool) {
	p.i++ // :
	start := p.i
	for !p.eof() && p.peek() != ':' {
		c := p.peek()
		if !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
			return sfItem{}, false
		}
		p.i++
	}
	if p.eof() {
		return sfItem{}, false
	}
	s := p.s[start:p.i]
	p.i++ // :
	return sfItem{kind: sfBytes, str: s}, true
}

// displayString reads %"..." (RFC 9651 §4.2.10): percent-encoded UTF-8.
func (p *sfParser) displayString() (sfItem, bool) {
	p.i++ // %
	if p.eof() || p.peek() != '"' {
		return sfItem{}, false
	}
	p.i++
	var b []byte
	for !p.eof() {
		c := p.peek()
		p.i++
		switch {
		case c == '%':
			if p.i+2 > len(p.s) {
				return sfItem{}, false
			}
			v, err := strconv.ParseUint(p.s[p.i:p.i+2], 16, 8)
			if err != nil || strings.ToLower(p.s[p.i:p.i+2]) != p.s[p.i:p.i+2] {
				return sfItem{}, false
			}
			b = append(b, byte(v))
			p.i += 2
		case c == '"':
			s := string(b)
			if !utf8.ValidString(s) {
				return sfItem{}, false
			}
			return sfItem{kind: sfDisplay, str: s}, true
		case c < 0x20 || c > 0x7e:
			return sfItem{}, false
		default:
			b = append(b, c)
		}
	}
	return sfItem{}, false
}

func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || c >= 'A' && c <= 'Z' }

func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
