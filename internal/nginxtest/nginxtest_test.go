package nginxtest

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// client returns a client of its own, its idle connections closed when the
// test ends (goleak would otherwise see their goroutines).
func client(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 100}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

type result struct {
	status     int
	retryAfter string
	body       string
}

func get(t *testing.T, c *http.Client, method, url string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return result{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("%s %s: reading the body: %v", method, url, err)
	}
	return result{resp.StatusCode, resp.Header.Get("Retry-After"), string(body)}
}

// burst sends n requests at once and returns their results.
func burst(t *testing.T, c *http.Client, url string, n int) []result {
	t.Helper()
	out := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		method := http.MethodGet
		if i%2 == 1 {
			method = http.MethodPost // any method is limited and accepted alike
		}
		wg.Go(func() {
			<-start
			out[i] = get(t, c, method, url+"/v1/things")
		})
	}
	close(start)
	wg.Wait()
	return out
}

func count(statuses []int) map[int]int {
	m := map[int]int{}
	for _, s := range statuses {
		m[s]++
	}
	return m
}

// 20 requests at once against 10 r/s with no burst: nginx accepts the
// first and refuses most of the rest, and its log holds all 20.
func TestBurstIsRefused(t *testing.T) {
	t.Parallel()
	s := Start(t, Config{Rate: "10r/s"})
	results := burst(t, client(t), s.URL(), 20)
	var sent []int
	for _, r := range results {
		sent = append(sent, r.status)
		switch r.status {
		case http.StatusOK:
			if r.body != "ok\n" {
				t.Errorf("a 200 has body %q, want \"ok\\n\"", r.body)
			}
		case http.StatusTooManyRequests:
			if r.retryAfter != "" {
				t.Errorf("a 429 carries Retry-After %q with Config.RetryAfter unset", r.retryAfter)
			}
		default:
			t.Errorf("status %d, want 200 or 429", r.status)
		}
	}
	got := count(sent)
	t.Logf("statuses: %v", got)
	if got[http.StatusOK] < 1 || got[http.StatusTooManyRequests] < 15 {
		t.Errorf("statuses %v; want at least one 200 and most (15 or more) 429", got)
	}
	log := s.Log()
	var logged []int
	for i, e := range log {
		logged = append(logged, e.Status)
		if i > 0 && e.At.Before(log[i-1].At) {
			t.Errorf("entry %d at %v is before entry %d at %v", i, e.At, i-1, log[i-1].At)
		}
		if e.Done.Before(e.At) || time.Since(e.At) > time.Minute || time.Since(e.At) < 0 {
			t.Errorf("entry %d: At %v, Done %v: not a time of this test", i, e.At, e.Done)
		}
	}
	if len(log) != 20 || len(count(logged)) != len(got) || count(logged)[200] != got[200] || count(logged)[429] != got[429] {
		t.Errorf("the log has %d entries with statuses %v; want 20 with %v", len(log), count(logged), got)
	}
}

// With RetryAfter set, refusals carry it and acceptances do not.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	s := Start(t, Config{Rate: "1r/s", RetryAfter: "1"})
	c := client(t)
	results := burst(t, c, s.URL(), 5)
	limited := 0
	for _, r := range results {
		switch r.status {
		case http.StatusTooManyRequests:
			limited++
			if r.retryAfter != "1" {
				t.Errorf("a 429 carries Retry-After %q, want \"1\"", r.retryAfter)
			}
		case http.StatusOK:
			if r.retryAfter != "" {
				t.Errorf("a 200 carries Retry-After %q", r.retryAfter)
			}
		default:
			t.Errorf("status %d, want 200 or 429", r.status)
		}
	}
	if limited < 3 {
		t.Errorf("%d of 5 requests at once against 1 r/s were refused, want at least 3", limited)
	}
	if log := s.Log(); len(log) != 5 {
		t.Errorf("the log has %d entries, want 5", len(log))
	}
}

// Burst with NoDelay serves the burst at once; without it nginx delays the
// burst to the rate rather than refusing it.
func TestBurst(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		noDelay bool
	}{{"nodelay", true}, {"delay", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := Start(t, Config{Rate: "20r/s", Burst: 4, NoDelay: tc.noDelay})
			start := time.Now()
			results := burst(t, client(t), s.URL(), 5)
			took := time.Since(start)
			for _, r := range results {
				if r.status != http.StatusOK {
					t.Errorf("status %d within the burst, want 200", r.status)
				}
			}
			// Delayed, the fifth request waits 4/20 s.
			if tc.noDelay && took > 150*time.Millisecond || !tc.noDelay && took < 150*time.Millisecond {
				t.Errorf("5 requests took %v with nodelay %v", took, tc.noDelay)
			}
			log := s.Log()
			if len(log) != 5 {
				t.Fatalf("the log has %d entries, want 5", len(log))
			}
			if last := log[4]; !tc.noDelay && last.Done.Sub(last.At) < 100*time.Millisecond {
				t.Errorf("the last delayed request: At %v, Done %v; want it delayed", last.At, last.Done)
			}
		})
	}
}

func TestConfigRejected(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{{}, {Rate: "25"}, {Rate: "2.5r/s"}, {Rate: "10r/s", Burst: -1}, {Rate: "10r/s", RetryAfter: `1"; evil`}} {
		if msg := fatalOf(func(tb testing.TB) { Start(tb, c) }); !strings.Contains(msg, "nginxtest: Config.") {
			t.Errorf("Start(%+v) failed with %q, want a Config error", c, msg)
		}
	}
}

// fatalOf runs f with a testing.TB whose Fatal ends f's goroutine, and
// returns the message.
func fatalOf(f func(testing.TB)) string {
	tb := &fatalTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb.msg
}

type fatalTB struct {
	testing.TB
	msg string
}

func (*fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestParseLog(t *testing.T) {
	t.Parallel()
	data := "1767225600.123 0.000 200\n1767225600.100 0.050 429\n1767225600.2"
	got, err := parseLog([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{At: time.UnixMilli(1767225600050), Done: time.UnixMilli(1767225600100), Status: 429},
		{At: time.UnixMilli(1767225600123), Done: time.UnixMilli(1767225600123), Status: 200},
	}
	if len(got) != len(want) {
		t.Fatalf("parsed %v, want %v (the partial last line left out)", got, want)
	}
	for i := range want {
		if !got[i].At.Equal(want[i].At) || !got[i].Done.Equal(want[i].Done) || got[i].Status != want[i].Status {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if got, err := parseLog([]byte("1767225600.123 200\n")); err == nil || len(got) != 0 {
		t.Errorf("a line of 2 fields parsed as %v, %v; want an error", got, err)
	}
	if got, err := parseLog(nil); err != nil || len(got) != 0 {
		t.Errorf("an empty log parsed as %v, %v", got, err)
	}
}
