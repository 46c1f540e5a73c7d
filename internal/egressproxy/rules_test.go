package egressproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/egress"
)

// guestTLS opens TLS to sni through the proxy as a guest that trusts roots.
func (h *harness) guestTLS(t *testing.T, g netip.Addr, sni string, roots *x509.CertPool) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	c, err := h.dial(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: roots})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake for %s: %v", sni, err)
	}
	return tc, bufio.NewReader(tc)
}

func roundTrip(t *testing.T, tc *tls.Conn, br *bufio.Reader, raw string) (int, string) {
	t.Helper()
	if _, err := io.WriteString(tc, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("response: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func rulesPolicy(t *testing.T, rules map[string]map[string]string, allowOut ...string) egress.Policy {
	t.Helper()
	cfg := egress.Config{AllowOut: allowOut, DenyOut: []string{egress.AllTraffic}, Rules: map[string][]egress.Rule{}}
	for d, hs := range rules {
		cfg.Rules[d] = []egress.Rule{{Transform: &egress.Transform{Headers: hs}}}
	}
	return mustParse(t, cfg)
}

// Header rules: a flow whose SNI a rule covers is intercepted with a leaf from the node's CA, the
// most specific rule's headers replace the guest's on every request, rules never merge, flows no
// rule covers keep the origin's own certificate, and rules grant no access.
func TestHeaderRules(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	nodeRoots := x509.NewCertPool()
	nodeRoots.AppendCertsFromPEM(h.ca.CertPEM)
	p := rulesPolicy(t, map[string]map[string]string{
		"*.b.test":   {"Authorization": "Bearer wild"},
		"x.b.test":   {"Authorization": "Bearer exact", "X-Extra": "1"},
		"other.test": {"Authorization": "Bearer never"},
	}, "a.test", "*.b.test")
	g := h.guest(2, p, netip.MustParseAddrPort("198.51.100.8:443"))

	tc, br := h.guestTLS(t, g, "x.b.test", nodeRoots)
	code, body := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: x.b.test\r\nAuthorization: Bearer guest\r\n\r\n")
	if code != 200 || !strings.Contains(body, "dialed=203.0.113.11 ") || !strings.Contains(body, "sni=x.b.test auth=Bearer exact extra=1") {
		t.Fatalf("exact rule: %d %q", code, body)
	}
	// Keep-alive: the second request gets the headers too.
	if code, body := roundTrip(t, tc, br, "GET /2 HTTP/1.1\r\nHost: x.b.test\r\n\r\n"); code != 200 || !strings.Contains(body, "auth=Bearer exact") {
		t.Fatalf("second request: %d %q", code, body)
	}
	// A live update that drops the rule applies from the next request on the same connection.
	h.p.Set(g, proxyHost, rulesPolicy(t, map[string]map[string]string{"*.b.test": {"Authorization": "Bearer wild"}}, "*.b.test"))
	if code, body := roundTrip(t, tc, br, "GET /3 HTTP/1.1\r\nHost: x.b.test\r\n\r\n"); code != 200 || !strings.Contains(body, "auth=Bearer wild extra=") {
		t.Fatalf("after the update: %d %q", code, body)
	}
	// Fronting inside the intercepted flow.
	if code, body := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"); code != http.StatusForbidden || !strings.Contains(body, "differs from the TLS server name") {
		t.Fatalf("Host other than the SNI: %d %q", code, body)
	}
	h.p.Set(g, proxyHost, p)

	// The wildcard rule alone, no merge with the exact one.
	tc, br = h.guestTLS(t, g, "deep.x.b.test", nodeRoots)
	if code, body := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: deep.x.b.test\r\n\r\n"); code != 200 || !strings.Contains(body, "auth=Bearer wild extra=") || strings.Contains(body, "extra=1") {
		t.Fatalf("wildcard rule: %d %q", code, body)
	}

	// No rule: the guest sees the origin's own certificate (it would fail against the node CA).
	tc, br = h.guestTLS(t, g, "a.test", h.origins.roots)
	if code, body := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: a.test\r\nAuthorization: Bearer guest\r\n\r\n"); code != 200 || !strings.Contains(body, "auth=Bearer guest") {
		t.Fatalf("no rule: %d %q", code, body)
	}

	// A rule grants nothing: other.test is not allowed.
	if _, err := h.tlsGet(g, "other.test"); err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Fatalf("rule without access: %v", err)
	}
}

// Domain fronting inside an intercepted flow: a request's Host must name the TLS server name
// (any letter case, a trailing dot, no port or :443); any other name, even one the policy allows
// or one the same rule covers, another port, an address or an absolute-form URI naming another
// host is refused with a 403 naming why, before anything reaches an origin.
func TestHeaderRulesFronting(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	nodeRoots := x509.NewCertPool()
	nodeRoots.AppendCertsFromPEM(h.ca.CertPEM)
	g := h.guest(2, rulesPolicy(t, map[string]map[string]string{"*.b.test": {"Authorization": "Bearer wild"}}, "a.test", "*.b.test"),
		netip.MustParseAddrPort("198.51.100.8:443"))
	for _, c := range []struct {
		target, host string
		ok           bool
	}{
		{"/", "x.b.test", true},
		{"/", "X.B.Test", true},
		{"/", "x.b.test.", true},
		{"/", "x.b.test:443", true},
		{"/", "X.b.TEST.:443", true},
		{"https://x.b.test/", "x.b.test", true},
		{"/", "a.test", false},
		{"/", "other.test", false},
		{"/", "deep.x.b.test", false},
		{"/", "x.b.test:8443", false},
		{"/", "x.b.test:80", false},
		{"/", "203.0.113.11", false},
		{"/", "203.0.113.11:443", false},
		{"https://a.test/", "x.b.test", false},
	} {
		tc, br := h.guestTLS(t, g, "x.b.test", nodeRoots)
		code, body := roundTrip(t, tc, br, fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", c.target, c.host))
		if c.ok {
			if code != 200 || !strings.Contains(body, "sni=x.b.test auth=Bearer wild") {
				t.Errorf("GET %s Host %q: %d %q", c.target, c.host, code, body)
			}
			continue
		}
		if code != http.StatusForbidden || !strings.Contains(body, "differs from the TLS server name \"x.b.test\"") || strings.Contains(body, "dialed=") {
			t.Errorf("GET %s Host %q: %d %q, want a 403 naming the fronting", c.target, c.host, code, body)
		}
	}
}

// An Upgrade through an intercepted flow is spliced after the 101, as WebSocket needs.
func TestHeaderRulesUpgrade(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	nodeRoots := x509.NewCertPool()
	nodeRoots.AppendCertsFromPEM(h.ca.CertPEM)
	g := h.guest(2, rulesPolicy(t, map[string]map[string]string{"a.test": {"Authorization": "Bearer x"}}, "a.test"),
		netip.MustParseAddrPort("203.0.113.10:443"))
	tc, br := h.guestTLS(t, g, "a.test", nodeRoots)
	fmt.Fprint(tc, "GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprint(tc, "frame")
	buf := make([]byte, 5)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "frame" {
		t.Fatalf("echo after the 101: %q %v", buf, err)
	}
}

// Without a CA the node cannot intercept, and refuses rather than passing the flow unmodified.
func TestHeaderRulesWithoutCA(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	h.p.cfg.CA = nil
	g := h.guest(2, rulesPolicy(t, map[string]map[string]string{"a.test": {"Authorization": "Bearer x"}}, "a.test"),
		netip.MustParseAddrPort("203.0.113.10:443"))
	if _, err := h.tlsGet(g, "a.test"); err == nil {
		t.Fatal("a rule's flow passed without interception")
	}
}

type fakeSecrets struct {
	mu   sync.Mutex
	vals map[string]string
}

func (f *fakeSecrets) SecretValue(_ context.Context, name string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.vals[name]
	return v, ok
}

// ${e2b.secrets.NAME} in a rule is filled in per request on the node; a deleted secret stops
// being sent from the next request, and the guest's own header is not passed instead.
func TestSecretPlaceholders(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	sec := &fakeSecrets{vals: map[string]string{"openai": "sk-live"}}
	h.p.SetSecrets(sec)
	nodeRoots := x509.NewCertPool()
	nodeRoots.AppendCertsFromPEM(h.ca.CertPEM)
	g := h.guest(2, rulesPolicy(t, map[string]map[string]string{"a.test": {"Authorization": "Bearer ${e2b.secrets.OpenAI}"}}, "a.test"),
		netip.MustParseAddrPort("203.0.113.10:443"))
	tc, br := h.guestTLS(t, g, "a.test", nodeRoots)
	if code, body := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"); code != 200 || !strings.Contains(body, "auth=Bearer sk-live ") {
		t.Fatalf("filled: %d %q", code, body)
	}
	sec.mu.Lock()
	sec.vals["openai"] = "sk-rotated"
	sec.mu.Unlock()
	if code, body := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"); code != 200 || !strings.Contains(body, "auth=Bearer sk-rotated ") {
		t.Fatalf("rotated: %d %q", code, body)
	}
	sec.mu.Lock()
	delete(sec.vals, "openai")
	sec.mu.Unlock()
	if code, body := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: a.test\r\nAuthorization: Bearer guest\r\n\r\n"); code != 200 || !strings.Contains(body, "auth= ") {
		t.Fatalf("deleted: %d %q", code, body)
	}
}

// Relayed counts what goes to and from origins: an intercepted flow as it goes, a spliced one
// (no rule: the guest's TLS straight to the origin) once it ends.
func TestRelayedCounts(t *testing.T) {
	h := newHarness(t, egress.NewEnv(nil))
	nodeRoots := x509.NewCertPool()
	nodeRoots.AppendCertsFromPEM(h.ca.CertPEM)
	p := rulesPolicy(t, map[string]map[string]string{"x.b.test": {"Authorization": "Bearer exact"}}, "a.test", "*.b.test")
	g := h.guest(2, p, netip.MustParseAddrPort("198.51.100.8:443"))
	if s, r := h.p.Relayed(); s != 0 || r != 0 {
		t.Fatalf("before any flow: %d sent, %d received", s, r)
	}
	tc, br := h.guestTLS(t, g, "x.b.test", nodeRoots)
	if code, _ := roundTrip(t, tc, br, "GET / HTTP/1.1\r\nHost: x.b.test\r\n\r\n"); code != 200 {
		t.Fatalf("intercepted: %d", code)
	}
	s1, r1 := h.p.Relayed()
	if s1 == 0 || r1 == 0 {
		t.Fatalf("an intercepted request and its answer were not counted: %d sent, %d received", s1, r1)
	}
	tc.Close()
	// A spliced flow: its bytes show once it ends.
	if _, err := h.tlsGet(g, "a.test"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s2, r2 := h.p.Relayed()
		// At least a ClientHello out and a certificate back.
		if s2 > s1+200 && r2 > r1+500 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the spliced flow was not counted: %d→%d sent, %d→%d received", s1, s2, r1, r2)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
