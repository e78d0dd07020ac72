package transport

import (
	"fmt"
	"math"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// limitCase is one response's headers, as name/value pairs, and the limits
// ParseLimits must read from them. now is 2026-03-01T12:00:00Z, Unix
// 1772366400 (headers_test.go).
type limitCase struct {
	name string
	kv   []string
	want []Limit
}

var limitCases = []limitCase{
	{"none", nil, nil},
	{"unrelated headers", []string{"Content-Type", "application/json", "X-Request-Id", "req_1"}, nil},

	// draft-ietf-httpapi-ratelimit-headers-10, the examples of sections 3.2 and 4.2.
	{"ietf: policy and service limit (draft-10 §3.2, §4.2)",
		[]string{"RateLimit-Policy", `"default";q=100;w=10`, "RateLimit", `"default";r=50;t=30`},
		[]Limit{{Dimension: Requests, Policy: "default", Quota: 100, Window: 10 * time.Second,
			Remaining: 50, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Dialect: "ietf"}}},
	{"ietf: two policies (draft-10 §3)",
		[]string{"RateLimit-Policy", `"burst";q=100;w=60,"daily";q=1000;w=86400`},
		[]Limit{
			{Dimension: Requests, Policy: "burst", Quota: 100, Window: time.Minute, Dialect: "ietf"},
			{Dimension: Requests, Policy: "daily", Quota: 1000, Window: 24 * time.Hour, Dialect: "ietf"},
		}},
	{"ietf: two policies, two service limits in another order",
		[]string{"RateLimit-Policy", `"permin";q=50;w=60,"perhr";q=1000;w=3600`, "RateLimit", `"perhr";r=999;t=3000, "permin";r=0;t=12`},
		[]Limit{
			{Dimension: Requests, Policy: "permin", Quota: 50, Window: time.Minute, Remaining: 0, HasRemaining: true, Reset: 12 * time.Second, HasReset: true, Dialect: "ietf"},
			{Dimension: Requests, Policy: "perhr", Quota: 1000, Window: time.Hour, Remaining: 999, HasRemaining: true, Reset: 3000 * time.Second, HasReset: true, Dialect: "ietf"},
		}},
	{"ietf: policies split over field lines",
		[]string{"RateLimit-Policy", `"permin";q=50;w=60`, "RateLimit-Policy", `"perhr";q=1000;w=3600`},
		[]Limit{
			{Dimension: Requests, Policy: "permin", Quota: 50, Window: time.Minute, Dialect: "ietf"},
			{Dimension: Requests, Policy: "perhr", Quota: 1000, Window: time.Hour, Dialect: "ietf"},
		}},
	{"ietf: partition key (draft-10 §3.2)",
		[]string{"RateLimit-Policy", `"peruser";q=100;w=60;pk=:cHsdsRa894==:`},
		[]Limit{{Dimension: Requests, Policy: "peruser", Quota: 100, Window: time.Minute, Partition: "cHsdsRa894==", Dialect: "ietf"}}},
	{"ietf: quota unit content-bytes (draft-10 §3.2)",
		[]string{"RateLimit-Policy", `"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`},
		[]Limit{{Dimension: ContentBytes, Policy: "peruser", Quota: 65535, Window: 10 * time.Second, Partition: "sdfjLJUOUH==", Dialect: "ietf"}}},
	{"ietf: quota unit concurrent-requests, token name, upper-case unit",
		[]string{"RateLimit-Policy", `open;q=8;qu="Concurrent-Requests"`},
		[]Limit{{Dimension: ConcurrentRequests, Policy: "open", Quota: 8, Dialect: "ietf"}}},
	{"ietf: service limit without a reset or a policy (draft-10 §4.2)",
		[]string{"RateLimit", `"default";r=999;pk=:dHJpYWwxMjEzMjM=:`},
		[]Limit{{Dimension: Requests, Policy: "default", Remaining: 999, HasRemaining: true, Partition: "dHJpYWwxMjEzMjM=", Dialect: "ietf"}}},
	{"ietf: service limit with a partition key matches the policy (draft-10 §4.2)",
		[]string{"RateLimit-Policy", `"default";q=300000000;qu="content-bytes";w=60`, "RateLimit", `"default";r=300000000;t=60;pk=:QXBwLTk5OQ==:`},
		[]Limit{{Dimension: ContentBytes, Policy: "default", Quota: 300000000, Window: time.Minute,
			Remaining: 300000000, HasRemaining: true, Reset: time.Minute, HasReset: true, Partition: "QXBwLTk5OQ==", Dialect: "ietf"}}},
	{"ietf: another partition is another limit",
		[]string{"RateLimit-Policy", `"u";q=10;w=1;pk=:YQ==:`, "RateLimit", `"u";r=3;t=1;pk=:Yg==:`},
		[]Limit{
			{Dimension: Requests, Policy: "u", Quota: 10, Window: time.Second, Partition: "YQ==", Dialect: "ietf"},
			{Dimension: Requests, Policy: "u", Remaining: 3, HasRemaining: true, Reset: time.Second, HasReset: true, Partition: "Yg==", Dialect: "ietf"},
		}},
	{"ietf: a service limit goes to the policy with its partition key first",
		[]string{"RateLimit-Policy", `"u";q=10;w=1, "u";q=20;w=1;pk=:YQ==:`, "RateLimit", `"u";r=7;pk=:YQ==:`},
		[]Limit{
			{Dimension: Requests, Policy: "u", Quota: 10, Window: time.Second, Dialect: "ietf"},
			{Dimension: Requests, Policy: "u", Quota: 20, Window: time.Second, Remaining: 7, HasRemaining: true, Partition: "YQ==", Dialect: "ietf"},
		}},
	{"ietf: a service limit for an unknown policy comes after the policies",
		[]string{"RateLimit", `"other";r=1;t=2`, "RateLimit-Policy", `"default";q=10;w=1`},
		[]Limit{
			{Dimension: Requests, Policy: "default", Quota: 10, Window: time.Second, Dialect: "ietf"},
			{Dimension: Requests, Policy: "other", Remaining: 1, HasRemaining: true, Reset: 2 * time.Second, HasReset: true, Dialect: "ietf"},
		}},
	{"ietf: a policy named twice: the first wins; so does the first service limit",
		[]string{"RateLimit-Policy", `"a";q=10;w=1, "a";q=20;w=2`, "RateLimit", `"a";r=1;t=1, "a";r=9;t=9`},
		[]Limit{{Dimension: Requests, Policy: "a", Quota: 10, Window: time.Second, Remaining: 1, HasRemaining: true, Reset: time.Second, HasReset: true, Dialect: "ietf"}}},
	{"ietf: unknown and vendor parameters are comments",
		[]string{"RateLimit-Policy", `"a";q=10;w=1;acme-burst=5;comment="fixed window";flag`, "RateLimit", `"a";r=4;acme-x=?1`},
		[]Limit{{Dimension: Requests, Policy: "a", Quota: 10, Window: time.Second, Remaining: 4, HasRemaining: true, Dialect: "ietf"}}},
	{"ietf: decimals are read (as headers.go reads them)",
		[]string{"RateLimit", `"p";r=2.5;t=1.5`},
		[]Limit{{Dimension: Requests, Policy: "p", Remaining: 2.5, HasRemaining: true, Reset: 1500 * time.Millisecond, HasReset: true, Dialect: "ietf"}}},
	{"ietf: malformed members are ignored, the others read",
		[]string{"RateLimit-Policy", `"noq";w=60, "neg";q=-1, "zero-w";q=5;w=0, "str-q";q="5", "bad-qu";q=5;qu=5, "bad-pk";q=5;pk="x", ("inner");q=1, 7.5;w=-1, "ok";q=5;w=1`,
			"RateLimit", `"nor";t=5, "negr";r=-1, "negt";r=1;t=-3, "tok-t";r=1;t=soon, "ok";r=2`},
		[]Limit{{Dimension: Requests, Policy: "ok", Quota: 5, Window: time.Second, Remaining: 2, HasRemaining: true, Dialect: "ietf"}}},
	{"ietf: a malformed field line is ignored, the other lines read",
		[]string{"RateLimit-Policy", `"a";q=10;W=1`, "RateLimit-Policy", `"b";q=20,`, "RateLimit-Policy", `"c";q=30 "d"`, "RateLimit-Policy", `"e";q=40;w=4`,
			"RateLimit", `"e";r=1;t=1;`, "RateLimit", `"e";r=3;t=2`},
		[]Limit{{Dimension: Requests, Policy: "e", Quota: 40, Window: 4 * time.Second, Remaining: 3, HasRemaining: true, Reset: 2 * time.Second, HasReset: true, Dialect: "ietf"}}},
	{"ietf: RFC 9651's largest numbers are read; a reset too long to hold saturates",
		[]string{"RateLimit", `"p";r=999999999999999;t=999999999999999, "d";r=999999999999.999`},
		[]Limit{
			{Dimension: Requests, Policy: "p", Remaining: 999999999999999, HasRemaining: true, Reset: math.MaxInt64, HasReset: true, Dialect: "ietf"},
			{Dimension: Requests, Policy: "d", Remaining: 999999999999.999, HasRemaining: true, Dialect: "ietf"},
		}},
	{"ietf: an Integer past 15 digits fails its line (RFC 9651 4.2.4)",
		[]string{"RateLimit", `"p";r=9999999999999999;t=1`, "RateLimit", `"q";r=2`},
		[]Limit{{Dimension: Requests, Policy: "q", Remaining: 2, HasRemaining: true, Dialect: "ietf"}}},
	{"ietf: a Decimal past 12 digits or 3 decimals fails its line (RFC 9651 4.2.4)",
		[]string{"RateLimit", `"p";r=1234567890123.5`, "RateLimit", `"p";r=1.2345`, "RateLimit-Policy", `"p";q=1;w=1.0001`, "RateLimit-Policy", `"p";q=1.;w=1`},
		nil},

	// The older drafts.
	{"ratelimit: dictionary with an unnamed policy (draft-07, RateLimit-Policy)",
		[]string{"RateLimit-Policy", "100;w=10", "RateLimit", "limit=100, remaining=50, reset=5"},
		[]Limit{{Dimension: Requests, Quota: 100, Window: 10 * time.Second, Remaining: 50, HasRemaining: true, Reset: 5 * time.Second, HasReset: true, Dialect: "ratelimit"}}},
	{"ratelimit: dictionary alone (draft-07, Client Behavior)",
		[]string{"RateLimit", "limit=10, remaining=1, reset=7"},
		[]Limit{{Dimension: Requests, Quota: 10, Remaining: 1, HasRemaining: true, Reset: 7 * time.Second, HasReset: true, Dialect: "ratelimit"}}},
	{"ratelimit: unnamed policies (draft-07, RateLimit-Policy)",
		[]string{"RateLimit-Policy", "10;w=1, 50;w=60, 1000;w=3600, 5000;w=86400"},
		[]Limit{
			{Dimension: Requests, Quota: 10, Window: time.Second, Dialect: "ratelimit"},
			{Dimension: Requests, Quota: 50, Window: time.Minute, Dialect: "ratelimit"},
			{Dimension: Requests, Quota: 1000, Window: time.Hour, Dialect: "ratelimit"},
			{Dimension: Requests, Quota: 5000, Window: 24 * time.Hour, Dialect: "ratelimit"},
		}},
	{"ratelimit: separate fields (draft-06, Client Behavior)",
		[]string{"RateLimit-Limit", "10", "RateLimit-Remaining", "1", "RateLimit-Reset", "7"},
		[]Limit{{Dimension: Requests, Quota: 10, Remaining: 1, HasRemaining: true, Reset: 7 * time.Second, HasReset: true, Dialect: "ratelimit"}}},
	{"ratelimit: limit with its policies (draft-03, RateLimit-Limit)",
		[]string{"RateLimit-Limit", "10, 10;w=1;burst=1000, 1000;w=3600", "RateLimit-Remaining", "9", "RateLimit-Reset", "1"},
		[]Limit{
			{Dimension: Requests, Quota: 10, Window: time.Second, Remaining: 9, HasRemaining: true, Reset: time.Second, HasReset: true, Dialect: "ratelimit"},
			{Dimension: Requests, Quota: 1000, Window: time.Hour, Dialect: "ratelimit"},
		}},
	{"ratelimit: limit with a policy field (draft-05, RateLimit-Policy)",
		[]string{"RateLimit-Policy", "100;w=10", "RateLimit-Limit", "100", "RateLimit-Remaining", "50", "RateLimit-Reset", "5"},
		[]Limit{{Dimension: Requests, Quota: 100, Window: 10 * time.Second, Remaining: 50, HasRemaining: true, Reset: 5 * time.Second, HasReset: true, Dialect: "ratelimit"}}},
	{"ratelimit: malformed fields are ignored, the others read",
		[]string{"RateLimit-Limit", "ten", "RateLimit-Remaining", "-1", "RateLimit-Reset", "7"},
		[]Limit{{Dimension: Requests, Reset: 7 * time.Second, HasReset: true, Dialect: "ratelimit"}}},
	{"ratelimit: named and unnamed policies side by side",
		[]string{"RateLimit-Policy", `"day";q=1000;w=86400, 10;w=1`},
		[]Limit{
			{Dimension: Requests, Policy: "day", Quota: 1000, Window: 24 * time.Hour, Dialect: "ietf"},
			{Dimension: Requests, Quota: 10, Window: time.Second, Dialect: "ratelimit"},
		}},

	// X-RateLimit-*.
	{"x-ratelimit: delta seconds",
		[]string{"X-RateLimit-Limit", "100", "X-RateLimit-Remaining", "5", "X-RateLimit-Reset", "30"},
		[]Limit{{Dimension: Requests, Quota: 100, Remaining: 5, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Dialect: "x-ratelimit"}}},
	{"x-ratelimit: unix milliseconds",
		[]string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1772366401500"},
		[]Limit{{Dimension: Requests, Remaining: 0, HasRemaining: true, Reset: 1500 * time.Millisecond, HasReset: true, Dialect: "x-ratelimit"}}},
	{"x-ratelimit: the same header in two spellings is one limit",
		[]string{"x-ratelimit-limit", "60", "X-RateLimit-Limit", "60", "x-ratelimit-remaining", "59"},
		[]Limit{{Dimension: Requests, Quota: 60, Remaining: 59, HasRemaining: true, Dialect: "x-ratelimit"}}},
	{"x-ratelimit: digits past float64 saturate",
		[]string{"X-RateLimit-Limit", "1" + strings.Repeat("0", 400), "X-RateLimit-Remaining", "-1" + strings.Repeat("0", 400)},
		[]Limit{{Dimension: Requests, Quota: math.MaxFloat64, Dialect: "x-ratelimit"}}},
	{"x-ratelimit: spaces and tabs around a value are not part of it (RFC 9110 5.5)",
		[]string{"X-RateLimit-Limit", " \t60 ", "X-RateLimit-Remaining", "\t59", "X-RateLimit-Reset", "30.5\t"},
		[]Limit{{Dimension: Requests, Quota: 60, Remaining: 59, HasRemaining: true, Reset: 30500 * time.Millisecond, HasReset: true, Dialect: "x-ratelimit"}}},
	{"x-ratelimit: malformed fields are ignored, the others read",
		[]string{"X-RateLimit-Limit", "-60", "X-RateLimit-Remaining", "NaN", "X-RateLimit-Reset", "1772366460"},
		[]Limit{{Dimension: Requests, Reset: time.Minute, HasReset: true, Dialect: "x-ratelimit"}}},

	// GitHub, https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api
	{"github: core, the docs' values (a reset long past)",
		[]string{"x-ratelimit-limit", "5000", "x-ratelimit-remaining", "4999", "x-ratelimit-used", "1", "x-ratelimit-reset", "1691591363", "x-ratelimit-resource", "core"},
		[]Limit{{Dimension: Requests, Policy: "core", Quota: 5000, Window: time.Hour, Remaining: 4999, HasRemaining: true, Reset: 0, HasReset: true, Dialect: "github"}}},
	{"github: core, reset in 45 minutes",
		[]string{"X-RateLimit-Limit", "5000", "X-RateLimit-Remaining", "4997", "X-RateLimit-Reset", "1772369100", "X-RateLimit-Used", "3", "X-RateLimit-Resource", "core"},
		[]Limit{{Dimension: Requests, Policy: "core", Quota: 5000, Window: time.Hour, Remaining: 4997, HasRemaining: true, Reset: 45 * time.Minute, HasReset: true, Dialect: "github"}}},
	{"github: search is per minute",
		[]string{"x-ratelimit-limit", "30", "x-ratelimit-remaining", "18", "x-ratelimit-used", "12", "x-ratelimit-reset", "1772366430", "x-ratelimit-resource", "search"},
		[]Limit{{Dimension: Requests, Policy: "search", Quota: 30, Window: time.Minute, Remaining: 18, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Dialect: "github"}}},
	{"github: graphql counts points per hour",
		[]string{"x-ratelimit-limit", "5000", "x-ratelimit-remaining", "4993", "x-ratelimit-used", "7", "x-ratelimit-reset", "1772370000", "x-ratelimit-resource", "graphql"},
		[]Limit{{Dimension: Points, Policy: "graphql", Quota: 5000, Window: time.Hour, Remaining: 4993, HasRemaining: true, Reset: time.Hour, HasReset: true, Dialect: "github"}}},
	{"github: a resource without a documented window",
		[]string{"x-ratelimit-limit", "5000", "x-ratelimit-remaining", "4999", "x-ratelimit-resource", "integration_manifest"},
		[]Limit{{Dimension: Requests, Policy: "integration_manifest", Quota: 5000, Remaining: 4999, HasRemaining: true, Dialect: "github"}}},
	{"github: used stands in for a missing remaining",
		[]string{"x-ratelimit-limit", "5000", "x-ratelimit-used", "5001", "x-ratelimit-resource", "core"},
		[]Limit{{Dimension: Requests, Policy: "core", Quota: 5000, Window: time.Hour, Remaining: 0, HasRemaining: true, Dialect: "github"}}},
	{"github: primary limit exceeded (403, remaining 0)",
		[]string{"x-ratelimit-limit", "60", "x-ratelimit-remaining", "0", "x-ratelimit-used", "60", "x-ratelimit-reset", "1772366700", "x-ratelimit-resource", "core"},
		[]Limit{{Dimension: Requests, Policy: "core", Quota: 60, Window: time.Hour, Remaining: 0, HasRemaining: true, Reset: 5 * time.Minute, HasReset: true, Dialect: "github"}}},
	{"github: a resource alone states no limit",
		[]string{"x-ratelimit-resource", "core", "retry-after", "60"}, nil},

	// OpenAI, https://platform.openai.com/docs/guides/rate-limits ("Rate limits in headers").
	{"openai: the docs' example",
		[]string{"x-ratelimit-limit-requests", "60", "x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-requests", "59",
			"x-ratelimit-remaining-tokens", "149984", "x-ratelimit-reset-requests", "1s", "x-ratelimit-reset-tokens", "6m0s"},
		[]Limit{
			{Dimension: Requests, Quota: 60, Window: time.Minute, Remaining: 59, HasRemaining: true, Reset: time.Second, HasReset: true, Dialect: "openai"},
			{Dimension: Tokens, Quota: 150000, Window: time.Minute, Remaining: 149984, HasRemaining: true, Reset: 6 * time.Minute, HasReset: true, Dialect: "openai"},
		}},
	{"openai: millisecond resets",
		[]string{"x-ratelimit-limit-requests", "5000", "x-ratelimit-limit-tokens", "160000", "x-ratelimit-remaining-requests", "4999",
			"x-ratelimit-remaining-tokens", "159976", "x-ratelimit-reset-requests", "12ms", "x-ratelimit-reset-tokens", "9ms"},
		[]Limit{
			{Dimension: Requests, Quota: 5000, Window: time.Minute, Remaining: 4999, HasRemaining: true, Reset: 12 * time.Millisecond, HasReset: true, Dialect: "openai"},
			{Dimension: Tokens, Quota: 160000, Window: time.Minute, Remaining: 159976, HasRemaining: true, Reset: 9 * time.Millisecond, HasReset: true, Dialect: "openai"},
		}},
	{"openai: fractional and compound resets",
		[]string{"x-ratelimit-reset-requests", "59.724s", "x-ratelimit-reset-tokens", "1h2m3.5s"},
		[]Limit{
			{Dimension: Requests, Window: time.Minute, Reset: 59724 * time.Millisecond, HasReset: true, Dialect: "openai"},
			{Dimension: Tokens, Window: time.Minute, Reset: time.Hour + 2*time.Minute + 3500*time.Millisecond, HasReset: true, Dialect: "openai"},
		}},
	{"openai: bare seconds (Azure OpenAI)",
		[]string{"x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "12"},
		[]Limit{{Dimension: Tokens, Window: time.Minute, Remaining: 0, HasRemaining: true, Reset: 12 * time.Second, HasReset: true, Dialect: "openai"}}},
	{"openai: malformed fields are ignored, the others read",
		[]string{"x-ratelimit-limit-tokens", "-1", "x-ratelimit-remaining-tokens", "-1", "x-ratelimit-reset-tokens", "0",
			"x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "many", "x-ratelimit-reset-requests", "-1s"},
		[]Limit{
			{Dimension: Requests, Quota: 60, Window: time.Minute, Dialect: "openai"},
			{Dimension: Tokens, Window: time.Minute, Reset: 0, HasReset: true, Dialect: "openai"},
		}},
	{"openai beside x-ratelimit: different headers, both read",
		[]string{"X-RateLimit-Limit", "10", "x-ratelimit-limit-requests", "60"},
		[]Limit{
			{Dimension: Requests, Quota: 10, Dialect: "x-ratelimit"},
			{Dimension: Requests, Quota: 60, Window: time.Minute, Dialect: "openai"},
		}},

	// Anthropic, https://docs.anthropic.com/en/api/rate-limits ("Response headers").
	{"anthropic: every dimension",
		[]string{
			"anthropic-ratelimit-requests-limit", "1000", "anthropic-ratelimit-requests-remaining", "999", "anthropic-ratelimit-requests-reset", "2026-03-01T12:00:01Z",
			"anthropic-ratelimit-tokens-limit", "96000", "anthropic-ratelimit-tokens-remaining", "96000", "anthropic-ratelimit-tokens-reset", "2026-03-01T12:00:00.5Z",
			"anthropic-ratelimit-input-tokens-limit", "80000", "anthropic-ratelimit-input-tokens-remaining", "79000", "anthropic-ratelimit-input-tokens-reset", "2026-03-01T13:00:30+01:00",
			"anthropic-ratelimit-output-tokens-limit", "16000", "anthropic-ratelimit-output-tokens-remaining", "16000", "anthropic-ratelimit-output-tokens-reset", "2026-03-01T11:59:00Z",
		},
		[]Limit{
			{Dimension: Requests, Quota: 1000, Window: time.Minute, Remaining: 999, HasRemaining: true, Reset: time.Second, HasReset: true, Dialect: "anthropic"},
			{Dimension: Tokens, Quota: 96000, Window: time.Minute, Remaining: 96000, HasRemaining: true, Reset: 500 * time.Millisecond, HasReset: true, Dialect: "anthropic"},
			{Dimension: InputTokens, Quota: 80000, Window: time.Minute, Remaining: 79000, HasRemaining: true, Reset: 30 * time.Second, HasReset: true, Dialect: "anthropic"},
			{Dimension: OutputTokens, Quota: 16000, Window: time.Minute, Remaining: 16000, HasRemaining: true, Reset: 0, HasReset: true, Dialect: "anthropic"},
		}},
	{"anthropic: 429 with retry-after",
		[]string{"retry-after", "17", "anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "0", "anthropic-ratelimit-requests-reset", "2026-03-01T12:00:17Z"},
		[]Limit{{Dimension: Requests, Quota: 50, Window: time.Minute, Remaining: 0, HasRemaining: true, Reset: 17 * time.Second, HasReset: true, Dialect: "anthropic"}}},
	{"anthropic: malformed fields are ignored, the others read",
		[]string{"anthropic-ratelimit-tokens-limit", "lots", "anthropic-ratelimit-tokens-remaining", "4000", "anthropic-ratelimit-tokens-reset", "1772366460",
			"anthropic-ratelimit-requests-reset", "2026-03-01 12:00:30"},
		[]Limit{{Dimension: Tokens, Window: time.Minute, Remaining: 4000, HasRemaining: true, Dialect: "anthropic"}}},

	{"every dialect at once, in order",
		[]string{
			"anthropic-ratelimit-requests-remaining", "1",
			"x-ratelimit-remaining-tokens", "2",
			"X-RateLimit-Remaining", "3",
			"RateLimit-Remaining", "4",
			"RateLimit", `"p";r=5`,
		},
		[]Limit{
			{Dimension: Requests, Policy: "p", Remaining: 5, HasRemaining: true, Dialect: "ietf"},
			{Dimension: Requests, Remaining: 4, HasRemaining: true, Dialect: "ratelimit"},
			{Dimension: Requests, Remaining: 3, HasRemaining: true, Dialect: "x-ratelimit"},
			{Dimension: Tokens, Window: time.Minute, Remaining: 2, HasRemaining: true, Dialect: "openai"},
			{Dimension: Requests, Window: time.Minute, Remaining: 1, HasRemaining: true, Dialect: "anthropic"},
		}},
}

func TestParseLimits(t *testing.T) {
	t.Parallel()
	for _, c := range limitCases {
		got := ParseLimits(header(c.kv...), now)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %s\nwant %s", c.name, fmtLimits(got), fmtLimits(c.want))
		}
	}
}

func fmtLimits(ls []Limit) string {
	if ls == nil {
		return "nil"
	}
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "\n\t%+v", l)
	}
	return b.String()
}

func TestLimitResetDuration(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1s", time.Second, true},
		{"6m0s", 6 * time.Minute, true},
		{"12ms", 12 * time.Millisecond, true},
		{"59.724s", 59724 * time.Millisecond, true},
		{"1h2m3.5s", time.Hour + 2*time.Minute + 3500*time.Millisecond, true},
		{"0s", 0, true},
		{"0", 0, true},
		{" 7s ", 7 * time.Second, true},
		{"1.5µs", 1500 * time.Nanosecond, true},
		{"3us", 3 * time.Microsecond, true},
		{"17ns", 17, true},
		{"0.000000001s", 1, true},
		{"0.0000000001s", 0, true},
		{"30", 30 * time.Second, true},
		{"2.5", 2500 * time.Millisecond, true},
		{"99999999999h", math.MaxInt64, true},
		{"2562047h47m16.854775807s", math.MaxInt64, true},
		{"2562047h47m16.854775808s", math.MaxInt64, true},
		{"99999999999999999999999s", math.MaxInt64, true},
		{"", 0, false},
		{"-1s", 0, false},
		{"+1s", 0, false},
		{"1", time.Second, true},
		{"1x", 0, false},
		{"s", 0, false},
		{"1s1s", 0, false},
		{"1s1m", 0, false},
		{"1us1µs", 0, false},
		{"1.s", 0, false},
		{".5s", 0, false},
		{"1..5s", 0, false},
		{"1 s", 0, false},
		{"1m30", 0, false},
		{"soon", 0, false},
		{"1e3s", 0, false},
		{"NaN", 0, false},
	} {
		got, ok := parseResetDuration(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("parseResetDuration(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestLimitRate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		l    Limit
		want float64
		ok   bool
	}{
		{Limit{Quota: 60, Window: time.Minute}, 1, true},
		{Limit{Quota: 5000, Window: time.Hour}, 5000.0 / 3600, true},
		{Limit{Quota: 10, Window: 500 * time.Millisecond}, 20, true},
		{Limit{Quota: 0, Window: time.Minute}, 0, false},
		{Limit{Quota: 60}, 0, false},
		{Limit{Quota: 60, Window: -time.Second}, 0, false},
		{Limit{Quota: math.NaN(), Window: time.Second}, 0, false},
		{Limit{Quota: math.Inf(1), Window: time.Second}, 0, false},
		{Limit{Quota: -1, Window: time.Second}, 0, false},
		{Limit{Quota: math.MaxFloat64, Window: 1}, math.MaxFloat64, true},
		{Limit{Quota: math.SmallestNonzeroFloat64, Window: math.MaxInt64}, math.SmallestNonzeroFloat64, true},
	} {
		got, ok := c.l.Rate()
		if got != c.want || ok != c.ok {
			t.Errorf("%+v.Rate() = %v, %v; want %v, %v", c.l, got, ok, c.want, c.ok)
		}
	}
}

func TestLimitsRetryAfter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"none", header(), 0, false},
		{"seconds", header("Retry-After", "120"), 2 * time.Minute, true},
		{"date", header("Retry-After", "Sun, 01 Mar 2026 12:00:30 GMT"), 30 * time.Second, true},
		{"milliseconds", header("retry-after-ms", "1500"), 1500 * time.Millisecond, true},
		{"fractional milliseconds", header("retry-after-ms", "12.5"), 12500 * time.Microsecond, true},
		{"zero", header("retry-after-ms", "0"), 0, true},
		{"both: milliseconds longer", header("Retry-After", "1", "retry-after-ms", "1500"), 1500 * time.Millisecond, true},
		{"both: seconds longer", header("Retry-After", "2", "retry-after-ms", "1500"), 2 * time.Second, true},
		{"seconds malformed, milliseconds read", header("Retry-After", "soon", "retry-after-ms", "250"), 250 * time.Millisecond, true},
		{"milliseconds malformed, seconds read", header("Retry-After", "3", "retry-after-ms", "-5"), 3 * time.Second, true},
		{"both malformed", header("Retry-After", "-3", "retry-after-ms", "x"), 0, false},
		{"milliseconds saturate", header("retry-after-ms", "1"+strings.Repeat("0", 300)), math.MaxInt64, true},
		{"milliseconds past float64 saturate", header("retry-after-ms", "1"+strings.Repeat("0", 400)), math.MaxInt64, true},
		{"an exponent is not a number", header("retry-after-ms", "1e3"), 0, false},
		{"infinity is not a number", header("retry-after-ms", "+Inf"), 0, false},
		{"seconds saturate", header("Retry-After", "99999999999999999999999", "retry-after-ms", "5"), math.MaxInt64, true},
	} {
		got, ok := RetryAfter(c.h, now)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %v, %v; want %v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// limitFields are the header names the fuzz targets pick from.
var limitFields = []string{
	"RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
	"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Used", "X-RateLimit-Resource",
	"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
	"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
	"anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset",
	"anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset",
	"anthropic-ratelimit-input-tokens-limit", "anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset",
	"anthropic-ratelimit-output-tokens-limit", "anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset",
	"Retry-After", "Retry-After-Ms",
}

// fuzzHeader builds a header from field indexes into limitFields and
// newline-separated values, the i-th value for the i-th field.
func fuzzHeader(fields []byte, values string) http.Header {
	h := http.Header{}
	for i, v := range strings.Split(values, "\n") {
		if i >= len(fields) {
			break
		}
		h.Add(limitFields[int(fields[i])%len(limitFields)], v)
	}
	return h
}

// encodeLimitCase turns a table case into fuzzHeader's arguments.
func encodeLimitCase(kv []string) ([]byte, string) {
	var fields []byte
	var values []string
	for i := 0; i+1 < len(kv); i += 2 {
		j := -1
		for k, f := range limitFields {
			if http.CanonicalHeaderKey(f) == http.CanonicalHeaderKey(kv[i]) {
				j = k
			}
		}
		if j < 0 {
			continue // not a rate-limit field
		}
		fields = append(fields, byte(j))
		values = append(values, kv[i+1])
	}
	return fields, strings.Join(values, "\n")
}

func TestLimitFuzzSeedsRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range limitCases {
		fields, values := encodeLimitCase(c.kv)
		if got := ParseLimits(fuzzHeader(fields, values), now); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: the fuzz seed reads as %s", c.name, fmtLimits(got))
		}
	}
}

var knownDialects = map[string]bool{"ietf": true, "ratelimit": true, "x-ratelimit": true, "github": true, "openai": true, "anthropic": true}

func finiteNonNeg(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }

// witnesses returns the numbers a grammar of ParseLimits could read in
// the values: every run of digits and points that is an RFC 9651 number,
// and every whole value that is a plain count or plain seconds
// (saturating past float64). Each number ParseLimits reads must be one of
// them (or, for a Reset or a Window, seconds of one).
func witnesses(h http.Header) map[float64]bool {
	out := map[float64]bool{}
	digitRuns := regexp.MustCompile(`-?[0-9.]+`)
	for _, vs := range h {
		for _, v := range vs {
			for _, run := range digitRuns.FindAllString(v, -1) {
				if sfGrammar.MatchString(run) {
					x, _ := strconv.ParseFloat(run, 64)
					out[x] = true
				}
			}
			if decimalGrammar.MatchString(v) {
				x, _ := strconv.ParseFloat(strings.Trim(v, " \t"), 64)
				out[min(x, math.MaxFloat64)] = true
			}
		}
	}
	return out
}

// witnessed reports whether every number l states comes from one of the
// witnesses: Quota and Remaining as they are (an X-RateLimit Remaining
// may be Quota less X-RateLimit-Used), Reset and Window of the
// Structured Field dialects as seconds of one (the other dialects' resets
// are durations and times: FuzzLimitResetDuration, FuzzRFC3339,
// FuzzNumberGrammar).
func witnessed(l Limit, w map[float64]bool) bool {
	asSeconds := func(d time.Duration) bool {
		for x := range w {
			if seconds(x) == d {
				return true
			}
		}
		return false
	}
	if l.Quota != 0 && !w[l.Quota] {
		return false
	}
	if l.HasRemaining && !w[l.Remaining] {
		derived := false
		for used := range w {
			derived = derived || (l.Dialect == dialectGitHub || l.Dialect == dialectX) && w[l.Quota] && l.Remaining == nonNegZero(max(0, l.Quota-used))
		}
		if !derived {
			return false
		}
	}
	if l.Dialect == dialectIETF || l.Dialect == dialectRateLimit {
		if l.HasReset && l.Reset != 0 && !asSeconds(l.Reset) || l.Window != 0 && !asSeconds(l.Window) {
			return false
		}
	}
	return true
}

// FuzzParseLimits: never panics; every limit is finite, non-negative, of a
// known dialect, with a finite positive rate when it has one; every number
// it states is one a dialect's grammar reads in the headers (witnessed);
// the same headers always give the same limits, and never the same limit
// twice.
func FuzzParseLimits(f *testing.F) {
	for _, c := range limitCases {
		fields, values := encodeLimitCase(c.kv)
		f.Add(fields, values)
	}
	f.Add([]byte{1, 0}, `"a";r=1e3;t=1, "a";r=1, ("x" "y");r=1`+"\n"+`"a";q=1;w=1;pk=:=:`)
	f.Add([]byte{12, 15}, "1h1h\n2562047h47m16.854775808s")
	f.Add([]byte{5, 6, 1, 0}, "0x1p4\n1_000\n\"p\";r=1234567890123456\n\"p\";q=1.2345;w=1")
	f.Fuzz(func(t *testing.T, fields []byte, values string) {
		h := fuzzHeader(fields, values)
		got := ParseLimits(h, now)
		w := witnesses(h)
		for i, l := range got {
			if !witnessed(l, w) {
				t.Fatalf("limit %d of %q states a number no grammar reads there: %+v", i, values, l)
			}
			if !finiteNonNeg(l.Quota) || !finiteNonNeg(l.Remaining) || l.Window < 0 || l.Reset < 0 ||
				!knownDialects[l.Dialect] || l.Dimension == "" ||
				!l.HasRemaining && l.Remaining != 0 || !l.HasReset && l.Reset != 0 {
				t.Fatalf("limit %d of %q: %+v", i, values, l)
			}
			if r, ok := l.Rate(); ok && !(r > 0 && !math.IsInf(r, 0)) || !ok && r != 0 {
				t.Fatalf("limit %d of %q: %+v.Rate() = %v, %v", i, values, l, r, ok)
			}
			for j := range i {
				if reflect.DeepEqual(got[j], l) {
					t.Fatalf("limits %d and %d of %q are the same: %+v", j, i, values, l)
				}
			}
		}
		if again := ParseLimits(h.Clone(), now); !reflect.DeepEqual(got, again) {
			t.Fatalf("ParseLimits(%q) is not deterministic:%s\nthen%s", values, fmtLimits(got), fmtLimits(again))
		}
	})
}

// FuzzRetryAfter: never panics, never negative; the longer of the two
// fields wins, and one valid field is enough.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range [][2]string{{"120", ""}, {"", "1500"}, {"1", "1500.5"}, {"Sun, 01 Mar 2026 12:00:30 GMT", "20"}, {"-1", "-1"}, {"99999999999999999999", "1e400"}, {"", "NaN"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, ra, ms string) {
		h := http.Header{}
		if ra != "" {
			h.Set("Retry-After", ra)
		}
		if ms != "" {
			h.Set("Retry-After-Ms", ms)
		}
		d, ok := RetryAfter(h, now)
		if d < 0 || !ok && d != 0 {
			t.Fatalf("RetryAfter(%q, %q) = %v, %v", ra, ms, d, ok)
		}
		s, okS := ParseRetryAfter(ra, now)
		_, okMs := plainDecimal(ms)
		if ok != (okS || okMs) || okS && d < s {
			t.Fatalf("RetryAfter(%q, %q) = %v, %v; Retry-After alone %v, %v; ms valid %v", ra, ms, d, ok, s, okS, okMs)
		}
	})
}

// FuzzLimitResetDuration: what parseResetDuration reads with units,
// time.ParseDuration reads the same (to the nanosecond per component it
// rounds differently); nothing it reads is negative.
func FuzzLimitResetDuration(f *testing.F) {
	for _, s := range []string{"1s", "6m0s", "12ms", "59.724s", "1h2m3.5s", "1.5µs", "0.3333333333h", "30", "-1s", "1s1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := parseResetDuration(s)
		if d < 0 || !ok && d != 0 {
			t.Fatalf("parseResetDuration(%q) = %v, %v", s, d, ok)
		}
		v := strings.TrimSpace(s)
		if !ok || isDecimal(v) || d == math.MaxInt64 {
			return
		}
		want, err := time.ParseDuration(v)
		if err != nil || d-want > 8 || want-d > 8 {
			t.Fatalf("parseResetDuration(%q) = %v; time.ParseDuration: %v, %v", s, d, want, err)
		}
	})
}

// scanIETFLimits is appendIETFLimits as 0d46bc9 wrote it, scanning the
// policies for every member (on the lines and members ParseLimits reads):
// the reference policyIndex must agree with.
func scanIETFLimits(h http.Header) []Limit {
	return scanIETFLines(parseSFField(h, "RateLimit-Policy"), parseSFField(h, "RateLimit"))
}

func scanIETFLines(policyLines, ratelimitLines []sfLine) []Limit {
	indexLimit := func(ls []Limit, name, pk string, exact bool) int {
		for i, l := range ls {
			if l.Policy == name && (l.Partition == pk || !exact && (pk == "" || l.Partition == "")) {
				return i
			}
		}
		return -1
	}
	var policies []Limit
	for _, line := range policyLines {
		for _, it := range line.items {
			if it.kind != sfString && it.kind != sfToken {
				continue
			}
			if l, ok := ietfPolicy(it); ok && indexLimit(policies, l.Policy, l.Partition, true) < 0 {
				policies = append(policies, l)
			}
		}
	}
	matched := make([]bool, len(policies))
	var unmatched []Limit
	for _, line := range ratelimitLines {
		for _, it := range line.items {
			if it.kind != sfString && it.kind != sfToken {
				continue
			}
			r, tr, hasT, pk, ok := ietfServiceLimit(it)
			if !ok {
				continue
			}
			i := indexLimit(policies, it.str, pk, true)
			if i < 0 {
				i = indexLimit(policies, it.str, pk, false)
			}
			if i >= 0 {
				if matched[i] {
					continue
				}
				matched[i] = true
				p := &policies[i]
				p.Remaining, p.HasRemaining = r, true
				p.Reset, p.HasReset = tr, hasT
				if p.Partition == "" {
					p.Partition = pk
				}
				continue
			}
			if indexLimit(unmatched, it.str, pk, true) >= 0 {
				continue
			}
			unmatched = append(unmatched, Limit{Dimension: Requests, Policy: it.str, Remaining: r, HasRemaining: true,
				Reset: tr, HasReset: hasT, Partition: pk, Dialect: dialectIETF})
		}
	}
	return append(policies, unmatched...)
}

// FuzzIETFIndexMatchesTheScan: the constant-time policyIndex pairs
// policies and service limits as scanning the list did (partition keys
// matched exactly, then a missing key on either side, a policy taking its
// service limit's key).
func FuzzIETFIndexMatchesTheScan(f *testing.F) {
	f.Add(`"u";q=10;w=1, "u";q=20;w=1;pk=:YQ==:, "u";q=30;w=1, "v";q=1`, `"u";r=7;pk=:YQ==:, "u";r=1;pk=:Yg==:, "u";r=2;pk=:Yw==:, "u";r=3, "u";r=4;pk=:Yg==:, "w";r=5, "w";r=6`)
	f.Add(`"a";q=1, "a";q=2;pk=:QQ==:`, `"a";r=1;pk=:Qg==:, "a";r=2;pk=:QQ==:, "a";r=3`)
	for _, c := range limitCases {
		var pol, rl []string
		for i := 0; i+1 < len(c.kv); i += 2 {
			switch http.CanonicalHeaderKey(c.kv[i]) {
			case "Ratelimit-Policy":
				pol = append(pol, c.kv[i+1])
			case "Ratelimit":
				rl = append(rl, c.kv[i+1])
			}
		}
		f.Add(strings.Join(pol, ", "), strings.Join(rl, ", "))
	}
	f.Fuzz(func(t *testing.T, policy, ratelimit string) {
		h := header("RateLimit-Policy", policy, "RateLimit", ratelimit)
		got, want := appendIETFLimits(nil, parseSFField(h, "RateLimit-Policy"), parseSFField(h, "RateLimit")), scanIETFLimits(h)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("RateLimit-Policy %q, RateLimit %q:\n got %s\nwant %s", policy, ratelimit, fmtLimits(got), fmtLimits(want))
		}
	})
}
