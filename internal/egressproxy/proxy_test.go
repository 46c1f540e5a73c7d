package egressproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/tlsutil"
)

// zoneResolver answers from egress.TestZone.
type zoneResolver map[string][]netip.Addr

func (z zoneResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := z[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// origins stands in for the internet: whatever address the proxy dials on port 80 reaches one
// HTTP server, on 443 one TLS server; both answer with the address that was dialed.
type origins struct {
	http, tls *httptest.Server
	echo      net.Listener
	roots     *x509.CertPool
	mu        sync.Mutex
	dialed    map[string]string // origin-side remote address → address the proxy asked for
	dials     int
}

func (o *origins) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.dials
}

func newOrigins(t *testing.T) *origins {
	o := &origins{dialed: map[string]string{}}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		to := o.dialed[r.RemoteAddr]
		o.mu.Unlock()
		sni := ""
		if r.TLS != nil {
			sni = r.TLS.ServerName
		}
		if r.Header.Get("Upgrade") == "echo" {
			// A minimal upgrade: 101, then echo bytes, as a WebSocket would carry frames.
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "echo")
			w.WriteHeader(http.StatusSwitchingProtocols)
			c, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = io.Copy(c, buf)
			return
		}
		fmt.Fprintf(w, "dialed=%s host=%s sni=%s auth=%s extra=%s", to, r.Host, sni,
			r.Header.Get("Authorization"), r.Header.Get("X-Extra"))
	})
	o.http = httptest.NewServer(h)
	// The TLS origin shows a certificate for whatever name it is asked, from its own CA, which
	// the proxy trusts through OriginRoots (as the e2e node does through a test-only setting).
	originCA, err := tlsutil.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	o.roots = x509.NewCertPool()
	o.roots.AppendCertsFromPEM(originCA.CertPEM)
	o.tls = httptest.NewUnstartedServer(h)
	o.tls.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		name := hi.ServerName
		if name == "" {
			name = "no-sni.invalid"
		}
		return originCA.Leaf(name)
	}}
	o.tls.StartTLS()
	t.Cleanup(o.http.Close)
	t.Cleanup(o.tls.Close)
	var echo net.Listener
	echo, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.echo = echo
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return o
}

func (o *origins) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	ap := netip.MustParseAddrPort(address)
	if ap.Addr().IsLoopback() {
		// The test's own servers (SOCKS5 proxies) live on loopback: reach them as they are.
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	to := o.echo.Addr().String()
	switch ap.Port() {
	case 80:
		to = o.http.Listener.Addr().String()
	case 443:
		to = o.tls.Listener.Addr().String()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, to)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	o.dialed[c.LocalAddr().String()] = ap.Addr().String()
	o.dials++
	o.mu.Unlock()
	return c, nil
}

// harness is a proxy on loopback. Each test guest is a loopback source address 127.0.0.N whose
// original destination the test chooses.
type harness struct {
	p       *Proxy
	origins *origins
	ca      *tlsutil.CA
	addr    string
	mu      sync.Mutex
	dst     map[netip.Addr]netip.AddrPort
	refused []Refusal
}

var proxyHost = netip.MustParseAddr("127.0.0.1")

func newHarness(t *testing.T, env egress.Env) *harness {
	t.Helper()
	h := &harness{dst: map[netip.Addr]netip.AddrPort{}}
	o := newOrigins(t)
	h.origins = o
	ca, err := tlsutil.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	h.ca = ca
	h.p = New(Config{
		CA:          ca,
		OriginRoots: o.roots,
		Env:         env,
		Resolver:    zoneResolver(egress.TestZone()),
		Dialer:      o,
		OriginalDst: func(c net.Conn) (netip.AddrPort, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.dst[addrPortOf(c.RemoteAddr()).Addr()], nil
		},
		OnRefuse: func(r Refusal) {
			h.mu.Lock()
			h.refused = append(h.refused, r)
			h.mu.Unlock()
		},
		HandshakeTimeout: 5 * time.Second,
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- h.p.Serve(ln) }()
	t.Cleanup(func() {
		h.p.Close()
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

// guest registers a guest address with policy p whose flows were going to dst.
func (h *harness) guest(n int, p egress.Policy, dst netip.AddrPort) netip.Addr {
	g := netip.AddrFrom4([4]byte{127, 0, 0, byte(n)})
	h.mu.Lock()
	h.dst[g] = dst
	h.mu.Unlock()
	h.p.Set(g, proxyHost, p)
	return g
}

func (h *harness) dial(g netip.Addr) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: g.AsSlice()}, Timeout: 5 * time.Second}
	return d.Dial("tcp", h.addr)
}

func (h *harness) httpClient(g netip.Addr) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:       func(context.Context, string, string) (net.Conn, error) { return h.dial(g) },
		DisableKeepAlives: true,
	}, Timeout: 10 * time.Second}
}

// get sends GET / with host on port 80 and returns the status and body.
func (h *harness) get(t *testing.T, g netip.Addr, host string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://guest-chosen/", nil)
	req.Host = host
	resp, err := h.httpClient(g).Do(req)
	if err != nil {
		t.Fatalf("GET Host %q: %v", host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// tlsGet sends GET / over TLS with sni (none when "") and returns the body, or the handshake error.
func (h *harness) tlsGet(g netip.Addr, sni string) (string, error) {
	c, err := h.dial(g)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", sni)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), nil
}

// Every name case of the shared table, as real HTTP and TLS through the proxy.
func TestNameTable(t *testing.T) {
	for i, tc := range egress.NameTable() {
		t.Run(tc.Name, func(t *testing.T) {
			h := newHarness(t, tc.Env)
			g := h.guest(i%200+2, tc.Policy, netip.AddrPortFrom(tc.Dst, tc.Port))
			var body string
			var allowed bool
			switch tc.Port {
			case 80:
				code, b := h.get(t, g, tc.Host)
				body, allowed = b, code == http.StatusOK
				if !allowed && code != http.StatusForbidden {
					t.Fatalf("status %d: %s", code, b)
				}
			case 443:
				b, err := h.tlsGet(g, tc.Host)
				body, allowed = b, err == nil
				if err != nil && !strings.Contains(err.Error(), "access denied") {
					t.Fatalf("refusal is not an access_denied alert: %v", err)
				}
			}
			if allowed != (tc.Want == egress.Allow) {
				t.Fatalf("allowed=%v, want %s: %s", allowed, tc.Want, body)
			}
			if allowed {
				if want := "dialed=" + tc.Dial.String(); !strings.HasPrefix(body, want+" ") {
					t.Fatalf("origin saw %q, want %s", body, want)
				}
				return
			}
			if !strings.Contains(body, string(tc.Stage)) && tc.Port == 80 && tc.Stage != egress.StageDenyOut {
				t.Errorf("403 body does not name the stage %s: %q", tc.Stage, body)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if len(h.refused) != 1 || h.refused[0].Stage != tc.Stage || h.refused[0].Guest != g {
				t.Fatalf("refusal events %+v, want one at stage %s", h.refused, tc.Stage)
			}
		})
	}
}

func mustParse(t *testing.T, c egress.Config) egress.Policy {
	t.Helper()
	p, err := egress.Parse(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A kept-alive connection allowed for one host cannot carry a request for another, even an
// allowed one; an absolute-form request is judged by its URL's host.
func TestHostIsPinnedPerConnection(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	p := mustParse(t, egress.Config{AllowOut: []string{"a.test", "x.b.test"}, DenyOut: []string{egress.AllTraffic}})
	g := h.guest(2, p, netip.MustParseAddrPort("198.51.100.8:80"))
	c, err := h.dial(g)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	send := func(reqLine, host string) (int, string) {
		fmt.Fprintf(c, "%s\r\nHost: %s\r\n\r\n", reqLine, host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s Host %s: %v", reqLine, host, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	if code, b := send("GET / HTTP/1.1", "a.test"); code != 200 || !strings.Contains(b, "host=a.test") {
		t.Fatalf("first request: %d %q", code, b)
	}
	if code, b := send("GET / HTTP/1.1", "x.b.test"); code != http.StatusForbidden || !strings.Contains(b, "differs") {
		t.Fatalf("second host on the same connection: %d %q", code, b)
	}

	// Absolute form: the URL's host is what is judged and what the origin sees.
	c2, err := h.dial(g)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	fmt.Fprintf(c2, "GET http://other.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("absolute-form request for a denied host: %d", resp.StatusCode)
	}
}

// Set is the proxy's half of a live update: the next request is judged by the new policy.
func TestSetReplacesPolicy(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	dst := netip.MustParseAddrPort("198.51.100.8:80")
	g := h.guest(2, mustParse(t, egress.Config{AllowOut: []string{"a.test"}, DenyOut: []string{egress.AllTraffic}}), dst)
	if code, _ := h.get(t, g, "a.test"); code != 200 {
		t.Fatalf("before update: %d", code)
	}
	h.p.Set(g, proxyHost, mustParse(t, egress.Config{AllowOut: []string{"x.b.test"}, DenyOut: []string{egress.AllTraffic}}))
	if code, _ := h.get(t, g, "a.test"); code != http.StatusForbidden {
		t.Fatalf("removed domain still allowed: %d", code)
	}
	if code, _ := h.get(t, g, "x.b.test"); code != 200 {
		t.Fatalf("added domain refused: %d", code)
	}
	h.p.Remove(g)
	req, _ := http.NewRequest(http.MethodGet, "http://guest-chosen/", nil)
	req.Host = "x.b.test"
	if resp, err := h.httpClient(g).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a removed guest got an answer: %d", resp.StatusCode)
	}
}

// Connections from an address the proxy does not know, or from a guest's address on another
// link (a different local address), are reset at once.
func TestUnknownOrSpoofedGuestIsReset(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	p := mustParse(t, egress.Config{AllowOut: []string{"*"}, DenyOut: []string{egress.AllTraffic}})
	g := h.guest(2, p, netip.MustParseAddrPort("198.51.100.8:80"))
	h.p.Set(g, netip.MustParseAddr("127.0.0.99"), p) // its link ends elsewhere
	for _, src := range []netip.Addr{g, netip.MustParseAddr("127.0.0.3")} {
		c, err := h.dial(src)
		if err != nil {
			if !strings.Contains(err.Error(), "reset") {
				t.Fatal(err)
			}
			continue // reset before connect returned
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
		if _, err := c.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
			t.Fatalf("from %s: got %v, want a reset", src, err)
		}
		c.Close()
	}
}

// Bytes that are not a ClientHello on 443 are refused at once, not waited on.
func TestNotTLSIsRefused(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	p := mustParse(t, egress.Config{AllowOut: []string{"*"}, DenyOut: []string{egress.AllTraffic}})
	g := h.guest(2, p, netip.MustParseAddrPort("198.51.100.8:443"))
	c, err := h.dial(g)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if _, err := c.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("got %v, want a reset", err)
	}
}

// rebinding answers a public address and a private one in turn, as a hostile DNS server would
// between a guest's lookup and the node's.
type rebinding struct {
	mu sync.Mutex
	n  int
}

func (r *rebinding) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if r.n%2 == 0 {
		return []netip.Addr{netip.MustParseAddr("10.1.2.3")}, nil
	}
	return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
}

// DNS rebinding: the node dials exactly the addresses it resolved and checked for the flow, so a
// name that turns private between two lookups is refused, never dialed.
func TestRebindingNeverReachesPrivate(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	h.p.cfg.Resolver = &rebinding{}
	g := h.guest(2, mustParse(t, egress.Config{AllowOut: []string{"a.test"}, DenyOut: []string{egress.AllTraffic}}),
		netip.MustParseAddrPort("198.51.100.8:80"))
	ok, refused := 0, 0
	for range 10 {
		code, body := h.get(t, g, "a.test")
		switch {
		case code == 200 && strings.HasPrefix(body, "dialed=203.0.113.10 "):
			ok++
		case code == http.StatusForbidden && strings.Contains(body, "always-denied"):
			refused++
		default:
			t.Fatalf("status %d %q", code, body)
		}
	}
	if ok != 5 || refused != 5 {
		t.Fatalf("ok=%d refused=%d", ok, refused)
	}
}
