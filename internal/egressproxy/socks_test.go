package egressproxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	socks5 "github.com/armon/go-socks5"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/tlsutil"
)

// socksServer is a SOCKS5 server on loopback that reaches the test origins and records what it
// was asked for: names it resolved (remote DNS) and addresses it dialed.
type socksServer struct {
	addr  string
	mu    sync.Mutex
	names []string
	dials []string
}

func (s *socksServer) Resolve(ctx context.Context, name string) (context.Context, net.IP, error) {
	s.mu.Lock()
	s.names = append(s.names, name)
	s.mu.Unlock()
	a, ok := egress.TestZone()[name]
	if !ok {
		return ctx, nil, fmt.Errorf("no such host %s", name)
	}
	return ctx, a[0].AsSlice(), nil
}

func (s *socksServer) asked() ([]string, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.names...), append([]string(nil), s.dials...)
}

// startSocks serves SOCKS5 on loopback, with user/password when user is set and TLS when cert is.
func startSocks(t *testing.T, o *origins, user, pass string, cert *tls.Certificate) *socksServer {
	t.Helper()
	s := &socksServer{}
	cfg := &socks5.Config{
		Resolver: s,
		Logger:   log.New(io.Discard, "", 0),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			s.mu.Lock()
			s.dials = append(s.dials, addr)
			s.mu.Unlock()
			return o.DialContext(ctx, network, addr)
		},
	}
	if user != "" {
		cfg.Credentials = socks5.StaticCredentials{user: pass}
	}
	srv, err := socks5.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cert != nil {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}})
	}
	s.addr = ln.Addr().String()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { ln.Close() })
	return s
}

// socksEnv exempts loopback, where the test SOCKS servers live, from the always-denied ranges.
var socksEnv = egress.NewEnv([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})

func socksPolicy(t *testing.T, px *egress.ProxyConfig, allowOut ...string) egress.Policy {
	t.Helper()
	return mustParse(t, egress.Config{AllowOut: allowOut, DenyOut: []string{egress.AllTraffic}, EgressProxy: px})
}

// Every allowed flow goes through the SOCKS5 proxy: domain flows by name (the server resolves),
// address flows by address, on every port; denied flows never reach it.
func TestSocksCarriesEveryAllowedFlow(t *testing.T) {
	h := newHarness(t, socksEnv)
	s := startSocks(t, h.origins, "u", "p", nil)
	p := socksPolicy(t, &egress.ProxyConfig{Address: s.addr, Username: "u", Password: "p"}, "a.test", "198.51.100.0/24")

	g := h.guest(2, p, netip.MustParseAddrPort("203.0.113.11:80"))
	if code, body := h.get(t, g, "a.test"); code != 200 || !strings.HasPrefix(body, "dialed=203.0.113.10 ") {
		t.Fatalf("domain flow: %d %q", code, body)
	}
	names, dials := s.asked()
	if len(names) != 1 || names[0] != "a.test" || len(dials) != 1 || dials[0] != "203.0.113.10:80" {
		t.Fatalf("the SOCKS server was asked names=%v dials=%v, want a.test resolved remotely", names, dials)
	}

	// An address flow on another port: judged by CIDR, sent by address.
	g2 := h.guest(3, p, netip.MustParseAddrPort("198.51.100.7:7"))
	c, err := h.dial(g2)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(c, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through SOCKS: %q %v", buf, err)
	}
	c.Close()
	if _, dials := s.asked(); dials[len(dials)-1] != "198.51.100.7:7" {
		t.Fatalf("address flow dialed %v", dials)
	}

	// Denied by address: reset, and the SOCKS server never hears of it.
	before := len(dials) + 1
	g3 := h.guest(4, p, netip.MustParseAddrPort("203.0.113.11:7"))
	c, err = h.dial(g3)
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("denied flow: %v, want a reset", err)
	}
	if _, dials := s.asked(); len(dials) != before {
		t.Fatalf("a denied flow reached the SOCKS server: %v", dials)
	}
}

// A proxy that refuses the credentials, or cannot be reached, fails the flow closed: the guest
// gets a refusal and the origin is never dialed directly.
func TestSocksFailsClosed(t *testing.T) {
	h := newHarness(t, socksEnv)
	s := startSocks(t, h.origins, "u", "right", nil)
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close()
	for name, px := range map[string]*egress.ProxyConfig{
		"wrong password": {Address: s.addr, Username: "u", Password: "wrong"},
		"unreachable":    {Address: deadAddr},
		"always-denied":  {Address: "10.1.2.3:1080"},
	} {
		t.Run(name, func(t *testing.T) {
			env := socksEnv
			if name == "always-denied" {
				env = egress.NewEnv(nil)
			}
			h2 := h
			if env.InternalAllow == nil {
				h2 = newHarness(t, env)
			}
			g := h2.guest(2, socksPolicy(t, px, "a.test"), netip.MustParseAddrPort("203.0.113.11:80"))
			direct := h2.origins.count()
			code, body := h2.get(t, g, "a.test")
			if code != http.StatusBadGateway {
				t.Fatalf("status %d %q, want 502", code, body)
			}
			if h2.origins.count() != direct {
				t.Fatal("the origin was dialed without the proxy")
			}
			// TLS and other ports are reset.
			g2 := h2.guest(3, socksPolicy(t, px, "a.test"), netip.MustParseAddrPort("203.0.113.11:443"))
			if _, err := h2.tlsGet(g2, "a.test"); err == nil {
				t.Fatal("TLS flow succeeded without its proxy")
			}
		})
	}
}

// The hop to the proxy in TLS, verified against the policy's caCert for serverName.
func TestSocksOverTLS(t *testing.T) {
	h := newHarness(t, socksEnv)
	caPEM, leaf := testCert(t, "socks.test")
	s := startSocks(t, h.origins, "", "", &leaf)
	ok := socksPolicy(t, &egress.ProxyConfig{Address: s.addr, TLS: &egress.ProxyTLS{Enabled: true, CACert: caPEM, ServerName: "socks.test"}}, "a.test")
	g := h.guest(2, ok, netip.MustParseAddrPort("203.0.113.11:80"))
	if code, body := h.get(t, g, "a.test"); code != 200 || !strings.HasPrefix(body, "dialed=203.0.113.10 ") {
		t.Fatalf("over TLS: %d %q", code, body)
	}
	// The wrong name, or no CA (system roots), fails the handshake and the flow.
	for _, tc := range []*egress.ProxyTLS{
		{Enabled: true, CACert: caPEM, ServerName: "other.test"},
		{Enabled: true},
	} {
		bad := socksPolicy(t, &egress.ProxyConfig{Address: s.addr, TLS: tc}, "a.test")
		g := h.guest(3, bad, netip.MustParseAddrPort("203.0.113.11:80"))
		if code, _ := h.get(t, g, "a.test"); code != http.StatusBadGateway {
			t.Fatalf("unverified TLS hop %+v: status %d", tc, code)
		}
	}
}

// testCert makes a CA (returned as PEM) and a leaf for name signed by it.
func testCert(t *testing.T, name string) (string, tls.Certificate) {
	t.Helper()
	ca, err := tlsutil.LoadOrCreateCA(t.TempDir(), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(ca.CertPEM), *leaf
}
