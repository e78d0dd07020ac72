package nginxtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/freeport"
)

// Config is the partner's rate limit, as nginx's limit_req_zone and
// limit_req directives state it.
type Config struct {
	// Rate is the zone's rate in nginx's syntax: requests per second or per
	// minute, a whole number, such as "25r/s" or "600r/m". Required.
	Rate string
	// Burst is limit_req's burst: how many requests beyond the rate nginx
	// queues (or, with NoDelay, serves at once) before it refuses. 0 (the
	// default) refuses every request that comes sooner than 1/Rate after
	// the last accepted one.
	Burst int
	// NoDelay serves requests within Burst at once instead of delaying
	// them to the rate (limit_req's nodelay).
	NoDelay bool
	// RetryAfter, when set, is the value of a Retry-After header on every
	// 429 response, such as "1" (seconds) or an HTTP date. Unset, 429
	// responses carry no Retry-After.
	RetryAfter string
}

// Entry is one request in nginx's access log.
type Entry struct {
	// At is when nginx began reading the request ($msec less
	// $request_time), to the millisecond: when limit_req judged it, give
	// or take the time nginx took to read the request headers.
	At time.Time
	// Done is when nginx finished the response and logged it ($msec).
	// For a request limit_req delayed (Burst without NoDelay) it is later
	// than At by the delay.
	Done time.Time
	// Status is the HTTP status nginx answered: 200 or 429.
	Status int
}

// Server is one nginx process owned by a test.
type Server struct {
	t      testing.TB
	port   int
	dir    string
	token  string // the ping location's answer: tells our nginx from a stranger on the port
	client *http.Client

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited and been waited for
	stopped bool
}

// pingPath is a location outside the limit and the access log: readiness
// checks and Log's synchronisation use it.
const pingPath = "/_nginxtest/ping"

// sbinNginx is where Debian installs nginx, outside a non-root user's PATH.
const sbinNginx = "/usr/sbin/nginx"

// binary returns the nginx executable, or fails t saying how to install it.
func binary(t testing.TB) string {
	t.Helper()
	if path, err := exec.LookPath("nginx"); err == nil {
		return path
	}
	if fi, err := os.Stat(sbinNginx); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
		return sbinNginx
	}
	t.Fatalf("nginxtest: nginx not found on PATH or at %s: the tests need a real nginx. Install it with `apt-get install nginx-light` (Debian; .ci/run does this), or put nginx on PATH", sbinNginx)
	return ""
}

var (
	rateSyntax       = regexp.MustCompile(`^[1-9][0-9]*r/[sm]$`)
	retryAfterSyntax = regexp.MustCompile(`^[A-Za-z0-9 ,:+\-]+$`)
)

// Start starts nginx on a free loopback port with limit c, waits until it
// answers, and stops it (killed and waited for) when the test ends. It
// fails t if nginx is not installed, if c is invalid, or if nginx does not
// start; it never skips.
func Start(t testing.TB, c Config) *Server {
	t.Helper()
	if !rateSyntax.MatchString(c.Rate) {
		t.Fatalf("nginxtest: Config.Rate %q is not an nginx rate such as \"25r/s\" or \"600r/m\"", c.Rate)
	}
	if c.Burst < 0 {
		t.Fatalf("nginxtest: Config.Burst %d is negative", c.Burst)
	}
	if c.RetryAfter != "" && !retryAfterSyntax.MatchString(c.RetryAfter) {
		t.Fatalf("nginxtest: Config.RetryAfter %q is not a number of seconds or an HTTP date", c.RetryAfter)
	}
	bin := binary(t)
	without := missingModules(t, bin)
	for _, m := range []string{"http_limit_req_module", "http_rewrite_module"} {
		if without[m] {
			t.Fatalf("nginxtest: %s was built --without-%s, which the tests need; install Debian's nginx-light", bin, m)
		}
	}
	s := &Server{
		t:      t,
		dir:    t.TempDir(),
		token:  strconv.FormatUint(rand.Uint64(), 36),
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}},
	}
	t.Cleanup(s.stop)
	// A port found free may be taken before nginx binds it (other tests
	// pick ports too): then nginx exits with EADDRINUSE, and we try another.
	for attempt := 1; ; attempt++ {
		s.port = freePort(t)
		conf := filepath.Join(s.dir, "nginx.conf")
		if err := os.WriteFile(conf, []byte(config(s.dir, s.port, s.token, c, without)), 0o600); err != nil {
			t.Fatal(err)
		}
		err := s.launch(bin, conf)
		if err == nil {
			return s
		}
		if !strings.Contains(err.Error(), "Address already in use") || attempt == 10 {
			t.Fatalf("nginxtest: %v", err)
		}
	}
}

// missingModules reads `nginx -V` and returns the modules nginx was
// configured without (such as "http_uwsgi_module"): their directives would
// be unknown to it.
func missingModules(t testing.TB, bin string) map[string]bool {
	t.Helper()
	out, err := exec.Command(bin, "-V").CombinedOutput()
	if err != nil {
		t.Fatalf("nginxtest: %s -V: %v\n%s", bin, err, out)
	}
	without := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		if m, ok := strings.CutPrefix(f, "--without-"); ok {
			without[m] = true
		}
	}
	return without
}

// config returns nginx.conf for a server in dir on port. Every path nginx
// writes is in dir, so that nginx needs no root and leaves nothing behind.
func config(dir string, port int, token string, c Config, without map[string]bool) string {
	p := func(name string) string { return strconv.Quote(filepath.Join(dir, name)) }
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# Written by internal/nginxtest for one test.")
	w("daemon off;")
	w("master_process off;")
	w("worker_processes 1;")
	w("pid %s;", p("nginx.pid"))
	w("lock_file %s;", p("nginx.lock"))
	w("error_log %s warn;", p("error.log"))
	w("events { worker_connections 1024; }")
	w("http {")
	w("    client_body_temp_path %s;", p("client_body_temp"))
	for _, m := range []string{"proxy", "fastcgi", "uwsgi", "scgi"} {
		if !without["http_"+m+"_module"] {
			w("    %s_temp_path %s;", m, p(m+"_temp"))
		}
	}
	w("    default_type text/plain;")
	w("    server_tokens off;")
	w("    keepalive_requests 100000;")
	// No buffer= and no flush=: nginx writes each line as the request ends.
	w("    log_format nginxtest '$msec $request_time $status';")
	// $server_name is the same for every request: one shared limit.
	w("    limit_req_zone $server_name zone=partner:1m rate=%s;", c.Rate)
	w("    limit_req_status 429;")
	// Refusals are the point of the exercise, not errors worth a log line.
	w("    limit_req_log_level info;")
	w("    server {")
	w("        listen 127.0.0.1:%d;", port)
	w("        server_name nginxtest;")
	w("        root %s;", p("empty"))
	w("        access_log %s nginxtest;", p("access.log"))
	w("        location / {")
	limit := "zone=partner"
	if c.Burst > 0 { // nginx refuses "burst=0"; no burst is burst 0
		limit += " burst=" + strconv.Itoa(c.Burst)
	}
	if c.NoDelay {
		limit += " nodelay"
	}
	w("            limit_req %s;", limit)
	if c.RetryAfter != "" {
		w("            error_page 429 = @limited;")
	}
	// `return` runs in the rewrite phase, before limit_req (preaccess):
	// try_files (precontent, after it) finds no file and goes on to
	// @accepted, whose return answers any method.
	w("            try_files /.nginxtest-none @accepted;")
	w("        }")
	w("        location @accepted {")
	w("            return 200 \"ok\\n\";")
	w("        }")
	if c.RetryAfter != "" {
		w("        location @limited {")
		w("            add_header Retry-After \"%s\" always;", c.RetryAfter)
		w("            return 429 \"too many requests\\n\";")
		w("        }")
	}
	w("        location = %s {", pingPath)
	w("            access_log off;")
	w("            return 200 %q;", token)
	w("        }")
	w("    }")
	w("}")
	return b.String()
}

// launch starts nginx with conf and waits until it answers the ping with
// this server's token. It returns an error, with nginx's logs, if nginx
// exits or does not answer within 10 s.
func (s *Server) launch(bin, conf string) error {
	out, err := os.Create(filepath.Join(s.dir, "nginx.out"))
	if err != nil {
		return err
	}
	defer out.Close()
	_ = os.Remove(filepath.Join(s.dir, "error.log")) // a failed attempt's
	cmd := exec.Command(bin, "-p", s.dir+"/", "-c", conf, "-e", filepath.Join(s.dir, "error.log"))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(10 * time.Second)
	for {
		if s.ping() {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("nginx on %s exited at start (%v)%s", s.addr(), cmd.ProcessState, s.logs())
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("nginx on %s did not answer within 10 s%s", s.addr(), s.logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping reports whether our nginx answers on the port.
func (s *Server) ping() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+pingPath, nil)
	if err != nil {
		return false
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK && string(body) == s.token
}

// logs returns nginx's output and error log, for failure messages.
func (s *Server) logs() string {
	var b strings.Builder
	for _, name := range []string{"nginx.out", "error.log", "nginx.conf"} {
		if data, err := os.ReadFile(filepath.Join(s.dir, name)); err == nil && len(data) > 0 {
			fmt.Fprintf(&b, "\n--- %s:\n%s", name, data)
		}
	}
	return b.String()
}

// stop kills nginx and waits for it; the test's cleanup calls it.
func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.cmd = nil
	}
	s.client.CloseIdleConnections()
}

func (s *Server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL returns the server's base URL, http://127.0.0.1:port, with no
// trailing slash. Every path under it is rate limited.
func (s *Server) URL() string { return "http://" + s.addr() }

// Log returns the requests nginx has logged, in the order they arrived
// (by At; requests arriving in the same millisecond in the order nginx
// logged them). Every request whose response the caller has received is
// in it: Log first makes an unlogged request of its own, which the single
// nginx process handles only after it has logged every response it sent
// before. A last line nginx has not finished writing is left out.
func (s *Server) Log() []Entry {
	s.mu.Lock()
	running := !s.stopped
	s.mu.Unlock()
	if running && !s.ping() {
		s.t.Errorf("nginxtest: nginx on %s does not answer; the log may lack the last requests", s.addr())
	}
	data, err := os.ReadFile(filepath.Join(s.dir, "access.log"))
	if err != nil && !os.IsNotExist(err) {
		s.t.Errorf("nginxtest: reading the access log: %v", err)
		return nil
	}
	entries, err := parseLog(data)
	if err != nil {
		s.t.Errorf("nginxtest: %v", err)
	}
	return entries
}

// parseLog parses access log lines "$msec $request_time $status", such as
// "1767225600.123 0.000 429", ignoring a last line with no newline yet.
// It returns the entries it could parse, sorted stably by At, and an error
// naming the first malformed line.
func parseLog(data []byte) ([]Entry, error) {
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	var entries []Entry
	var bad error
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSuffix(line, "\n")
		e, err := parseLine(line)
		if err != nil {
			if bad == nil {
				bad = fmt.Errorf("malformed access log line %q: %v", line, err)
			}
			continue
		}
		entries = append(entries, e)
	}
	slices.SortStableFunc(entries, func(a, b Entry) int { return a.At.Compare(b.At) })
	return entries, bad
}

func parseLine(line string) (Entry, error) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return Entry{}, fmt.Errorf("%d fields, want 3", len(f))
	}
	done, err := millis(f[0])
	if err != nil {
		return Entry{}, err
	}
	took, err := millis(f[1])
	if err != nil {
		return Entry{}, err
	}
	status, err := strconv.Atoi(f[2])
	if err != nil {
		return Entry{}, err
	}
	return Entry{At: time.UnixMilli(done - took), Done: time.UnixMilli(done), Status: status}, nil
}

// millis parses nginx's seconds with three decimals, "1767225600.123",
// into milliseconds, exactly.
func millis(s string) (int64, error) {
	sec, frac, ok := strings.Cut(s, ".")
	if !ok || len(frac) != 3 {
		return 0, fmt.Errorf("%q is not seconds with 3 decimals", s)
	}
	n, err := strconv.ParseUint(sec+frac, 10, 63)
	if err != nil {
		return 0, fmt.Errorf("%q is not seconds with 3 decimals", s)
	}
	return int64(n), nil
}

// freePort returns a loopback port outside the ephemeral range that is
// free now.
func freePort(t testing.TB) int {
	t.Helper()
	p, err := freeport.Pick(0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
