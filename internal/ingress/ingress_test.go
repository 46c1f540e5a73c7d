package ingress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
)

type fakeSandboxes map[string]Target

func (f fakeSandboxes) Target(_ context.Context, id string) (Target, error) {
	t, ok := f[id]
	if !ok {
		return Target{}, errors.New("not found")
	}
	return t, nil
}

func (f fakeSandboxes) Targets(context.Context) []Target {
	var out []Target
	for _, t := range f {
		out = append(out, t)
	}
	return out
}

// upstream serves handler and returns a target whose envd and ports all reach it.
func upstream(t *testing.T, id, token, traffic string, handler http.HandlerFunc) Target {
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	dial := func(ctx context.Context, _ int) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}
	return Target{
		ID: id, AccessToken: token, TrafficToken: traffic,
		Envd: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, 0) }},
		Dial: dial,
	}
}

func echoHandler(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Upstream", name)
		w.Header().Set("X-Host", r.Host)
		w.Header().Set("X-Traffic", r.Header.Get(HeaderTrafficToken))
		io.WriteString(w, r.Method+" "+r.URL.RequestURI())
	}
}

func do(t *testing.T, h http.Handler, method, target, host string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestRouting(t *testing.T) {
	sbs := fakeSandboxes{
		"abc123": upstream(t, "abc123", "tok-a", "", echoHandler("a")),
		"def456": upstream(t, "def456", "tok-b", "secret", echoHandler("b")),
	}
	p := New(slog.New(slog.DiscardHandler), sbs, "localhost")

	cases := []struct {
		name       string
		method     string
		target     string
		host       string
		hdr        map[string]string
		wantStatus int
		wantUp     string
		wantBody   string
	}{
		{name: "headers to envd", method: "GET", target: "/health", host: "127.0.0.1:3000",
			hdr:        map[string]string{HeaderSandboxID: "abc123", HeaderSandboxPort: "49983"},
			wantStatus: 200, wantUp: "a", wantBody: "GET /health"},
		{name: "host name to envd", method: "POST", target: "/process.Process/Start?x=1", host: "49983-abc123.localhost",
			wantStatus: 200, wantUp: "a", wantBody: "POST /process.Process/Start?x=1"},
		{name: "host name to a guest port", method: "GET", target: "/index.html", host: "8000-abc123.localhost:443",
			wantStatus: 200, wantUp: "a", wantBody: "GET /index.html"},
		{name: "unknown sandbox", method: "GET", target: "/health", host: "49983-nope.localhost",
			wantStatus: 502},
		{name: "one header only", method: "GET", target: "/health",
			hdr: map[string]string{HeaderSandboxID: "abc123"}, wantStatus: 400},
		{name: "bad id", method: "GET", target: "/health",
			hdr: map[string]string{HeaderSandboxID: "ABC-1", HeaderSandboxPort: "49983"}, wantStatus: 400},
		{name: "init is node-only", method: "POST", target: "/init", host: "49983-abc123.localhost", wantStatus: 403},
		{name: "traffic token missing", method: "GET", target: "/", host: "8000-def456.localhost", wantStatus: 403},
		{name: "traffic token given", method: "GET", target: "/", host: "8000-def456.localhost",
			hdr: map[string]string{HeaderTrafficToken: "secret"}, wantStatus: 200, wantUp: "b", wantBody: "GET /"},
		{name: "traffic token not needed for envd", method: "GET", target: "/health", host: "49983-def456.localhost",
			wantStatus: 200, wantUp: "b"},
		{name: "code execution without the access token", method: "POST", target: "/execute", host: "49999-abc123.localhost",
			wantStatus: 401},
		{name: "code execution with a wrong access token", method: "POST", target: "/execute", host: "49999-abc123.localhost",
			hdr: map[string]string{"X-Access-Token": "tok-b"}, wantStatus: 401},
		{name: "code execution with the access token", method: "POST", target: "/execute", host: "49999-abc123.localhost",
			hdr: map[string]string{"X-Access-Token": "tok-a"}, wantStatus: 200, wantUp: "a", wantBody: "POST /execute"},
		{name: "code contexts need no access token", method: "GET", target: "/contexts", host: "49999-abc123.localhost",
			wantStatus: 200, wantUp: "a", wantBody: "GET /contexts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := do(t, p, tc.method, tc.target, tc.host, tc.hdr)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d; body %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if tc.wantUp != "" && rec.Header().Get("X-Upstream") != tc.wantUp {
				t.Fatalf("reached %q, want %q", rec.Header().Get("X-Upstream"), tc.wantUp)
			}
			if tc.wantBody != "" && rec.Body.String() != tc.wantBody {
				t.Fatalf("body %q, want %q", rec.Body, tc.wantBody)
			}
			if rec.Code == 200 && rec.Header().Get("X-Traffic") != "" {
				t.Fatal("traffic token leaked to the guest")
			}
		})
	}
}

func TestNotFoundBody(t *testing.T) {
	p := New(slog.New(slog.DiscardHandler), fakeSandboxes{}, "localhost")
	rec := do(t, p, "GET", "/health", "", map[string]string{HeaderSandboxID: "gone1", HeaderSandboxPort: "49983"})
	if rec.Code != http.StatusBadGateway {
		t.Fatalf("status %d", rec.Code)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body["sandboxId"] != "gone1" || body["message"] != "The sandbox was not found" || body["code"] != float64(502) {
		t.Fatalf("body %v", body)
	}
}

// A sandbox that will be back in a moment (recovering after a restart) is 503 with Retry-After,
// not the 502 the SDK reads as gone.
func TestRecoveringIs503(t *testing.T) {
	p := New(slog.New(slog.DiscardHandler), recoveringSandboxes{}, "localhost")
	rec := do(t, p, "GET", "/health", "", map[string]string{HeaderSandboxID: "back1", HeaderSandboxPort: "49983"})
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body["sandboxId"] != "back1" || !strings.Contains(fmt.Sprint(body["message"]), "recovered") || body["code"] != float64(503) {
		t.Fatalf("body %v", body)
	}
}

type recoveringSandboxes struct{ fakeSandboxes }

func (recoveringSandboxes) Target(_ context.Context, id string) (Target, error) {
	return Target{}, errdefs.Unavailable("sandbox %q is being recovered after a restart of vmon", id)
}

func TestClosedPortIs502(t *testing.T) {
	target := upstream(t, "abc123", "tok", "", echoHandler("a"))
	target.Dial = func(context.Context, int) (net.Conn, error) { return nil, errors.New("connection refused") }
	p := New(slog.New(slog.DiscardHandler), fakeSandboxes{"abc123": target}, "localhost")
	if rec := do(t, p, "GET", "/", "9999-abc123.localhost", nil); rec.Code != http.StatusBadGateway {
		t.Fatalf("status %d", rec.Code)
	}
}

func TestSignedURLWithoutHeaders(t *testing.T) {
	sbs := fakeSandboxes{
		"abc123": upstream(t, "abc123", "tok-a", "", echoHandler("a")),
		"def456": upstream(t, "def456", "tok-b", "", echoHandler("b")),
	}
	p := New(slog.New(slog.DiscardHandler), sbs, "localhost")
	sig := agentproto.FileSignature("hello.txt", "read", "user", "tok-b", 0)
	url := "/files?path=hello.txt&username=user&signature=" + strings.ReplaceAll(sig, "+", "%2B")
	req := httptest.NewRequest("GET", url, nil)
	req.Host = "127.0.0.1:3000"
	if !p.Match(req) {
		t.Fatal("signed URL not matched as ingress")
	}
	rec := do(t, p, "GET", url, "127.0.0.1:3000", nil)
	if rec.Code != 200 || rec.Header().Get("X-Upstream") != "b" {
		t.Fatalf("status %d upstream %q", rec.Code, rec.Header().Get("X-Upstream"))
	}
	// A write signature does not open a read, and a tampered one opens nothing.
	wsig := agentproto.FileSignature("hello.txt", "write", "user", "tok-b", 0)
	for _, s := range []string{wsig, sig[:len(sig)-2] + "AA"} {
		u := "/files?path=hello.txt&username=user&signature=" + strings.ReplaceAll(s, "+", "%2B")
		if rec := do(t, p, "GET", u, "127.0.0.1:3000", nil); rec.Code != http.StatusUnauthorized {
			t.Fatalf("signature %q: status %d", s, rec.Code)
		}
	}
	// Expired signatures are refused.
	esig := agentproto.FileSignature("hello.txt", "read", "user", "tok-b", 1000)
	u := "/files?path=hello.txt&username=user&signature_expiration=1000&signature=" + strings.ReplaceAll(esig, "+", "%2B")
	if rec := do(t, p, "GET", u, "127.0.0.1:3000", nil); rec.Code != http.StatusUnauthorized {
		t.Fatalf("expired: status %d", rec.Code)
	}
}

func TestMatch(t *testing.T) {
	p := New(slog.New(slog.DiscardHandler), fakeSandboxes{}, "localhost")
	for host, want := range map[string]bool{
		"127.0.0.1:3000":           false,
		"api.localhost":            false,
		"49983-abc.localhost":      true,
		"49983-abc.localhost:443":  true,
		"49983-abc.other.com":      false,
		"x-abc.localhost":          false,
		"99999999-abc.localhost":   false,
		"49983-abc.sub.localhost":  false,
		"8080-a1b2c3.LOCALHOST:80": true,
	} {
		req := httptest.NewRequest("GET", "/sandboxes", nil)
		req.Host = host
		if got := p.Match(req); got != want {
			t.Errorf("Match(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestFileSignatureVector(t *testing.T) {
	// The vector from the E2B SDK's own test suite.
	got := agentproto.FileSignature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0", 0)
	if want := "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E"; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}

func TestBufferRPCBody(t *testing.T) {
	// A Connect request's body is read ahead, so the upstream transport never depends on the
	// client's body once envd starts answering.
	r := httptest.NewRequest("POST", "/process.Process/Start", io.NopCloser(strings.NewReader("envelope")))
	r.ContentLength = -1
	r.TransferEncoding = []string{"chunked"}
	if err := bufferRPCBody(r); err != nil {
		t.Fatal(err)
	}
	if r.ContentLength != int64(len("envelope")) || r.TransferEncoding != nil {
		t.Fatalf("content length %d, transfer encoding %v", r.ContentLength, r.TransferEncoding)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != "envelope" {
		t.Fatalf("body %q", b)
	}
	// Uploads stream.
	up := httptest.NewRequest("POST", "/files?path=a", strings.NewReader("data"))
	orig := up.Body
	if err := bufferRPCBody(up); err != nil || up.Body != orig {
		t.Fatalf("upload body was buffered: %v", err)
	}
	// Over the limit: refused, not read without bound.
	big := httptest.NewRequest("POST", "/process.Process/SendInput", io.LimitReader(zeroReader{}, maxRPCBody+10))
	if err := bufferRPCBody(big); err == nil {
		t.Fatal("an oversized RPC body was accepted")
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// maskRequestHost: requests to the sandbox's ports carry the mask (with ${PORT} filled in) as
// their Host; envd's port keeps the client's.
func TestMaskRequestHost(t *testing.T) {
	tg := upstream(t, "abc123", "tok", "", echoHandler("a"))
	tg.MaskHost = "app-${PORT}.internal:${PORT}"
	p := New(slog.New(slog.DiscardHandler), fakeSandboxes{"abc123": tg}, "localhost")
	if rec := do(t, p, "GET", "/", "8000-abc123.localhost", nil); rec.Header().Get("X-Host") != "app-8000.internal:8000" {
		t.Fatalf("guest port Host %q", rec.Header().Get("X-Host"))
	}
	if rec := do(t, p, "GET", "/", "127.0.0.1:3000", map[string]string{HeaderSandboxID: "abc123", HeaderSandboxPort: "3001"}); rec.Header().Get("X-Host") != "app-3001.internal:3001" {
		t.Fatalf("header-addressed Host %q", rec.Header().Get("X-Host"))
	}
	if rec := do(t, p, "GET", "/health", "49983-abc123.localhost", nil); rec.Header().Get("X-Host") != "49983-abc123.localhost" {
		t.Fatalf("envd Host %q", rec.Header().Get("X-Host"))
	}
}

// A guest service that answers before the proxy has finished forwarding the client's body (the
// code-execution service streams /execute as soon as it has parsed the JSON) keeps its request
// until it ends. Before the fix, net/http's server consumed and closed the client's body when the
// proxy wrote the response headers; the upstream transport's final read of that body (the check
// that nothing follows Content-Length) then failed, and it dropped the connection: the guest saw
// its request canceled and the code-execution service interrupted the running cell.
func TestBodyAfterResponseStarted(t *testing.T) {
	canceled := make(chan bool, 1)
	tg := upstream(t, "abc123", "tok", "", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		gone := false
		for i := 0; i < 5 && !gone; i++ {
			select {
			case <-r.Context().Done():
				gone = true
			case <-time.After(20 * time.Millisecond):
				fmt.Fprintf(w, "line %d\n", i)
				_ = http.NewResponseController(w).Flush()
			}
		}
		canceled <- gone
	})
	// The transport's write of the body returns only once the client has the response headers,
	// which fixes the order the race needs.
	headersSeen := make(chan struct{}, 1)
	dial := tg.Dial
	tg.Dial = func(ctx context.Context, port int) (net.Conn, error) {
		c, err := dial(ctx, port)
		if err != nil {
			return nil, err
		}
		return &holdBodyConn{Conn: c, release: headersSeen}, nil
	}
	front := httptest.NewServer(New(slog.New(slog.DiscardHandler), fakeSandboxes{"abc123": tg}, ""))
	defer front.Close()

	const body = `{"code":"1"}`
	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Keep-alive, as the SDK's fetch: net/http's server only consumes an unread request body
	// when it means to read the connection's next request.
	fmt.Fprintf(c, "POST /execute HTTP/1.1\r\nHost: x\r\n%s: abc123\r\n%s: 8080\r\nContent-Length: %d\r\n\r\n%s",
		HeaderSandboxID, HeaderSandboxPort, len(body), body)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodPost})
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("response: %v %v", res, err)
	}
	headersSeen <- struct{}{}
	resp, err := io.ReadAll(res.Body)
	if gone := <-canceled; gone {
		t.Fatal("the guest saw its request canceled mid-response")
	}
	if err != nil || !strings.Contains(string(resp), "line 4") {
		t.Fatalf("response cut short: %q, %v", resp, err)
	}
}

// holdBodyConn passes every write through but holds the return of those after the request
// headers (the body) until release.
type holdBodyConn struct {
	net.Conn
	release <-chan struct{}
	writes  int
}

func (c *holdBodyConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.writes++; c.writes > 1 {
		select {
		case <-c.release:
		case <-time.After(5 * time.Second):
		}
	}
	return n, err
}
