package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// permitShaper returns a shaper on a fresh memory store whose only
// dimension is InFlight n, or, with a rate, that rate beside it.
func permitShaper(t *testing.T, n int64, rate ...shaper.Rate) *shaper.Shaper {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { _ = store.Close() })
	dims := []shaper.Dimension{{Name: "open", InFlight: n}}
	for _, r := range rate {
		dims = append(dims, shaper.Dimension{Name: "rate", Rate: r})
	}
	s, err := shaper.All(store, dims)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// held returns the permits held on key, and its waiters, as Status reads
// them.
func held(t *testing.T, r shaper.Reserver, key string) (inFlight int64, waiting int) {
	t.Helper()
	st, err := r.(shaper.StatusReader).Status(bg, key, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range st.Dimensions {
		if d.Name == "open" {
			return d.InFlight, d.Waiting
		}
	}
	t.Fatalf("no in-flight dimension in %+v", st)
	return 0, 0
}

func wantHeld(t *testing.T, r shaper.Reserver, key string, want int64, when string) {
	t.Helper()
	if n, _ := held(t, r, key); n != want {
		t.Fatalf("%s: %d permits held, want %d", when, n, want)
	}
}

// hostKey is the key the transport gives srv's requests by default.
func hostKey(srv *httptest.Server) string { return strings.TrimPrefix(srv.URL, "http://") }

// openCounter is a partner that counts the requests it is serving at once
// (and the most it ever served at once). With work, it streams its answer:
// the headers and a first chunk at once, the rest after work. It counts a
// request done before the handler returns, which is before the end of the
// chunked body is sent: by the time the client has read the body to its
// end, the partner no longer counts it; a client that let the request go
// when it had the headers would be seen.
type openCounter struct {
	open, most, served atomic.Int64
	arrived            atomic.Int64 // counted as a request arrives
	work               time.Duration
	body               []byte
}

func (p *openCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.arrived.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	n := p.open.Add(1)
	for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
	}
	if p.work > 0 {
		_, _ = w.Write([]byte("first part, "))
		http.NewResponseController(w).Flush()
		time.Sleep(p.work)
	}
	_, _ = w.Write(p.body)
	p.open.Add(-1)
	p.served.Add(1)
}

// 20 clients at once through a transport on InFlight 2: the partner never
// serves more than 2 at once, every request is served, and no permit is
// left held.
func TestInFlightCapsTheRequestsOpenAtThePartner(t *testing.T) {
	t.Parallel()
	p := &openCounter{work: 3 * time.Millisecond, body: []byte("done")}
	srv := httptest.NewServer(p)
	defer srv.Close()
	for _, withRate := range []bool{false, true} {
		p.most.Store(0)
		p.served.Store(0)
		var s *shaper.Shaper
		if withRate {
			s = permitShaper(t, 2, shaper.PerSecond(2000))
		} else {
			s = permitShaper(t, 2)
		}
		client := &http.Client{Transport: New(s, WithBase(srv.Client().Transport))}
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				for range 3 {
					resp, err := client.Get(srv.URL)
					if err != nil {
						t.Error(err)
						return
					}
					// Read to the end (a Close before it would leave the
					// partner still serving a request let go).
					if i%2 == 0 {
						_, err = io.Copy(io.Discard, resp.Body)
					} else {
						_, err = io.ReadAll(resp.Body)
					}
					if err != nil {
						t.Error(err)
					}
					_ = resp.Body.Close()
				}
			})
		}
		wg.Wait()
		if m := p.most.Load(); m > 2 || m < 1 {
			t.Fatalf("rate %v: the partner served %d requests at once, want at most 2", withRate, m)
		}
		if n := p.served.Load(); n != 60 {
			t.Fatalf("rate %v: the partner served %d requests, want 60", withRate, n)
		}
		wantHeld(t, s, hostKey(srv), 0, "after every response was closed")
	}
}

// bigBody is a partner response larger than any buffer: closing it unread
// cannot have read it to its end.
var bigBody = bytes.Repeat([]byte("x"), 1<<20)

// The permit comes back at the first of Close or a Read returning io.EOF
// (or WriteTo reading it all), once, and at once for a response without a
// body.
func TestThePermitIsHeldUntilTheBodyIsDone(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		case "/small":
			_, _ = w.Write([]byte("small"))
		default:
			_, _ = w.Write(bigBody)
		}
	}))
	defer srv.Close()
	s := permitShaper(t, 1)
	key := hostKey(srv)
	client := &http.Client{Transport: New(s, WithBase(srv.Client().Transport))}
	get := func(path string) *http.Response {
		t.Helper()
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	resp := get("/big")
	wantHeld(t, s, key, 1, "with the response body open")
	if _, ok := resp.Body.(io.WriterTo); ok {
		t.Fatal("the wrapped body of a net/http response offers io.WriterTo, which net/http's does not")
	}
	if _, ok := resp.Body.(io.ReadWriteCloser); ok {
		t.Fatal("the wrapped body of a 200 is an io.ReadWriteCloser")
	}
	buf := make([]byte, 10)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, s, key, 1, "after a partial read")
	_ = resp.Body.Close()
	wantHeld(t, s, key, 0, "after Close without reading to the end")
	_ = resp.Body.Close() // a second Close releases nothing more
	wantHeld(t, s, key, 0, "after a second Close")

	resp = get("/small")
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "small" {
		t.Fatalf("read %q, %v", b, err)
	}
	wantHeld(t, s, key, 0, "after reading to EOF without Close")
	// The permit is free: another request gets it at once, and holds it.
	other := get("/big")
	wantHeld(t, s, key, 1, "with another response open")
	_ = resp.Body.Close() // the first one's Close must not release the second's permit
	wantHeld(t, s, key, 1, "after closing the first body again")
	_ = other.Body.Close()
	wantHeld(t, s, key, 0, "after closing the second")

	resp = get("/empty")
	if resp.Body != http.NoBody {
		t.Fatalf("a 204's body is %T, want http.NoBody untouched", resp.Body)
	}
	wantHeld(t, s, key, 0, "after a response without a body")
	_ = resp.Body.Close()

	resp, err := client.Head(srv.URL + "/big")
	if err != nil {
		t.Fatal(err)
	}
	wantHeld(t, s, key, 0, "after a HEAD")
	_ = resp.Body.Close()
}

// bodyTransport answers every request with a body of its own, as a custom
// base transport may: a bytes.Reader in io.NopCloser, an io.WriterTo.
type bodyTransport struct{ body func() io.ReadCloser }

func (b bodyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: b.body(), Request: req}, nil
}

// A body that is an io.WriterTo stays one: io.Copy reading it all through
// WriteTo releases the permit.
func TestAWriterToBodyReleasesWhenWrittenOut(t *testing.T) {
	t.Parallel()
	s := permitShaper(t, 1)
	rt := New(s, WithBase(bodyTransport{func() io.ReadCloser { return io.NopCloser(bytes.NewReader(bigBody)) }}))
	req, _ := http.NewRequest(http.MethodGet, "http://partner.test/", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := resp.Body.(io.WriterTo); !ok {
		t.Fatalf("the wrapped body %T lost its io.WriterTo", resp.Body)
	}
	wantHeld(t, s, "partner.test", 1, "before the copy")
	var out bytes.Buffer
	if n, err := io.Copy(&out, resp.Body); err != nil || n != int64(len(bigBody)) {
		t.Fatalf("copied %d, %v", n, err)
	}
	wantHeld(t, s, "partner.test", 0, "after io.Copy wrote it all")
	_ = resp.Body.Close()
}

// failingTransport fails every round trip, as a base transport does when
// the partner cannot be reached.
type failingTransport struct{}

func (failingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return nil, errors.New("partner unreachable")
}

// badBody fails the upload of the request.
type badBody struct{}

func (badBody) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }
func (badBody) Close() error             { return nil }

// A round trip that fails gives the permit back: the base transport's
// error, a partner that refuses the connection, a request body that cannot
// be read.
func TestAFailedRoundTripReleases(t *testing.T) {
	t.Parallel()
	s := permitShaper(t, 1)
	req, _ := http.NewRequest(http.MethodGet, "http://partner.test/", nil)
	if _, err := New(s, WithBase(failingTransport{})).RoundTrip(req); err == nil {
		t.Fatal("the base transport's error was lost")
	}
	wantHeld(t, s, "partner.test", 0, "after the base transport failed")

	gone := httptest.NewServer(http.NotFoundHandler())
	url := gone.URL
	gone.Close()
	client := &http.Client{Transport: New(s)}
	if resp, err := client.Get(url); err == nil {
		_ = resp.Body.Close()
		t.Fatal("a closed server answered")
	}
	wantHeld(t, s, strings.TrimPrefix(url, "http://"), 0, "after the connection was refused")

	srv := httptest.NewServer(&openCounter{})
	defer srv.Close()
	client = &http.Client{Transport: New(s, WithBase(srv.Client().Transport))}
	req, _ = http.NewRequest(http.MethodPost, srv.URL, badBody{})
	req.ContentLength = 100
	if resp, err := client.Do(req); err == nil {
		_ = resp.Body.Close()
		t.Fatal("a request whose body fails was sent")
	}
	wantHeld(t, s, hostKey(srv), 0, "after the request body failed")
}

// go-retryablehttp drains and closes each failed attempt's body before the
// next: every attempt's permit comes back, so retries on InFlight 1 do not
// wait for a permit their own earlier attempt holds; and when it gives up
// it closes the last one.
func TestRetryableAttemptsGiveTheirPermitsBack(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/down" || n.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable) // no Retry-After: retried after the backoff
			_, _ = w.Write([]byte("try again"))
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	s := permitShaper(t, 1)
	c := NewRetryableClient(s, WithBase(srv.Client().Transport))
	c.RetryWaitMin, c.RetryWaitMax, c.RetryMax = time.Millisecond, 2*time.Millisecond, 3
	ctx, cancel := context.WithTimeout(bg, hangGuard) // a leaked permit would hang the retry
	defer cancel()
	req, _ := retryablehttpRequest(ctx, srv.URL+"/flaky")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || n.Load() != 3 {
		t.Fatalf("status %d after %d attempts, want 200 after 3", resp.StatusCode, n.Load())
	}
	wantHeld(t, s, hostKey(srv), 1, "with the last attempt's body open")
	_ = resp.Body.Close()
	wantHeld(t, s, hostKey(srv), 0, "after the last attempt's body was closed")

	req, _ = retryablehttpRequest(ctx, srv.URL+"/down")
	if resp, err := c.Do(req); err == nil {
		_ = resp.Body.Close()
		t.Fatal("a partner down for every attempt answered")
	}
	wantHeld(t, s, hostKey(srv), 0, "after the client gave up")
}

const hangGuard = 10 * time.Second

// The transport hands the body of a 101 Switching Protocols response on as
// the io.ReadWriteCloser net/http makes it, and the upgraded connection
// holds the permit until it is closed.
func TestAnUpgradedConnectionHoldsThePermitUntilClosed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		line, err := brw.ReadString('\n') // echo one line, then hang up
		if err != nil {
			return
		}
		_, _ = brw.WriteString(line)
		_ = brw.Flush()
	}))
	defer srv.Close()
	s := permitShaper(t, 1)
	client := &http.Client{Transport: New(s, WithBase(srv.Client().Transport))}
	for _, end := range []string{"close", "eof"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "echo")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("status %d, want 101", resp.StatusCode)
		}
		conn, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			t.Fatalf("the body of a 101 is %T, not an io.ReadWriteCloser", resp.Body)
		}
		if _, ok := resp.Body.(interface{ CloseWrite() error }); !ok {
			t.Fatalf("the body of a 101 lost its CloseWrite")
		}
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echoed %q, %v", line, err)
		}
		wantHeld(t, s, hostKey(srv), 1, end+": with the upgraded connection open")
		if end == "eof" {
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("after the partner hung up: %v, want io.EOF", err)
			}
			wantHeld(t, s, hostKey(srv), 0, "after the partner hung up")
		}
		_ = conn.Close()
		wantHeld(t, s, hostKey(srv), 0, end+": after Close")
	}
}

// reserveOnly is a custom Reserver that holds permits (it forwards
// HoldsPermits) but has no Acquire method.
type reserveOnly struct{ s *shaper.Shaper }

func (r reserveOnly) Reserve(ctx context.Context, key string, cost int64) (shaper.Reservation, error) {
	return r.s.Reserve(ctx, key, cost)
}
func (r reserveOnly) Wait(ctx context.Context, key string, cost int64) error {
	return r.s.Wait(ctx, key, cost)
}
func (r reserveOnly) Pause(ctx context.Context, key string, d time.Duration) error {
	return r.s.Pause(ctx, key, d)
}
func (r reserveOnly) HoldsPermits(key string) bool { return r.s.HoldsPermits(key) }

// A Reserver that holds permits but cannot Acquire: the transport reserves
// (a permit if one is free, else a QueueFullError at once, InFlight set)
// and releases as it does an acquired one. Route over it forwards Acquire
// to its Wait, which refuses: the request fails, nothing is sent or held.
func TestAReserverWithPermitsButNoAcquire(t *testing.T) {
	t.Parallel()
	p := &openCounter{body: bigBody}
	srv := httptest.NewServer(p)
	defer srv.Close()
	s := permitShaper(t, 1, shaper.PerSecond(1000))
	key := hostKey(srv)
	client := &http.Client{Transport: New(reserveOnly{s}, WithBase(srv.Client().Transport))}
	first, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	wantHeld(t, s, key, 1, "with the first body open")
	_, err = client.Get(srv.URL)
	var qf *shaper.QueueFullError
	if !errors.As(err, &qf) || !qf.InFlight {
		t.Fatalf("with the one permit held: %v, want a QueueFullError with InFlight", err)
	}
	_ = first.Body.Close()
	wantHeld(t, s, key, 0, "after the first body was closed")
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	wantHeld(t, s, key, 0, "after reading the second to EOF")
	_ = resp.Body.Close()

	arrived := p.arrived.Load()
	routed := &http.Client{Transport: New(route(reserveOnly{s}), WithBase(srv.Client().Transport))}
	if resp, err := routed.Get(srv.URL); !errors.Is(err, shaper.ErrInvalidConfig) {
		if err == nil {
			_ = resp.Body.Close()
		}
		t.Fatalf("Route over a Reserver without Acquire: %v, want its Wait's *shaper.ConfigError", err)
	}
	if p.arrived.Load() != arrived {
		t.Fatal("a refused request was sent")
	}
	wantHeld(t, s, key, 0, "after Route's refusal")
}

// WithMaxWait bounds the wait for a permit: with the only permit held, a
// request fails when it has passed, with a QueueFullError (InFlight set),
// and sends nothing.
func TestMaxWaitBoundsTheWaitForAPermit(t *testing.T) {
	t.Parallel()
	p := &openCounter{body: bigBody}
	srv := httptest.NewServer(p)
	defer srv.Close()
	s := permitShaper(t, 1)
	client := &http.Client{Transport: New(s, WithBase(srv.Client().Transport), WithMaxWait(30*time.Millisecond))}
	first, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = client.Get(srv.URL)
	var qf *shaper.QueueFullError
	if !errors.As(err, &qf) || !qf.InFlight || qf.MaxQueue != 30*time.Millisecond {
		t.Fatalf("waiting past MaxWait for a permit: %v, want a QueueFullError with InFlight and MaxQueue 30ms", err)
	}
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Fatalf("gave up after %v, before MaxWait", took)
	}
	if n, waiting := held(t, s, hostKey(srv)); n != 1 || waiting != 0 {
		t.Fatalf("%d held, %d waiting after the refusal; want 1 and 0", n, waiting)
	}
	_ = first.Body.Close()
	if n := p.arrived.Load(); n != 1 {
		t.Fatalf("the partner saw %d requests, want 1", n)
	}
	wantHeld(t, s, hostKey(srv), 0, "at the end")
}

// Through every decorator chain (Route, otelshaper.Wrap, nested) the
// transport acquires a permit and its body gives it back.
func TestPermitsThroughEveryDecoratorChain(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(&openCounter{body: bigBody})
	defer srv.Close()
	for _, c := range chains {
		s := permitShaper(t, 1, shaper.PerSecond(1000))
		r := c.wrap(s)
		if h, ok := r.(shaper.PermitHolder); !ok || !h.HoldsPermits(hostKey(srv)) {
			t.Fatalf("%s: does not tell that it holds permits", c.name)
		}
		client := &http.Client{Transport: New(r, WithBase(srv.Client().Transport))}
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		wantHeld(t, s, hostKey(srv), 1, c.name+": with the body open")
		_ = resp.Body.Close()
		wantHeld(t, s, hostKey(srv), 0, c.name+": after Close")
	}
}

func retryablehttpRequest(ctx context.Context, url string) (*retryablehttp.Request, error) {
	return retryablehttp.NewRequestWithContext(ctx, http.MethodGet, url, nil)
}
