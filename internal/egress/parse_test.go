package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func boolp(b bool) *bool { return &b }

func TestParseNormalizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        Config
		wantAllow []string // normal form of allowOut
		wantDeny  []string
		policy    Policy
	}{
		{name: "empty", in: Config{}, policy: Policy{}},
		{
			name:      "bare addresses become /32 and /128",
			in:        Config{AllowOut: []string{"203.0.113.7"}, DenyOut: []string{"2001:db8::7"}},
			wantAllow: []string{"203.0.113.7/32"}, wantDeny: []string{"2001:db8::7/128"},
			policy: Policy{AllowOut: pfx("203.0.113.7/32"), DenyOut: pfx("2001:db8::7/128")},
		},
		{
			name:     "host bits are masked like E2B's nftables sets do",
			in:       Config{DenyOut: []string{"198.51.100.77/24", "2001:db8::1/32"}},
			wantDeny: []string{"198.51.100.0/24", "2001:db8::/32"},
			policy:   Policy{DenyOut: pfx("198.51.100.0/24", "2001:db8::/32")},
		},
		{
			name:     "IPv4-mapped entries are IPv4",
			in:       Config{DenyOut: []string{"::ffff:198.51.100.7", "::ffff:198.51.100.0/120"}},
			wantDeny: []string{"198.51.100.7/32", "198.51.100.0/24"},
			policy:   Policy{DenyOut: pfx("198.51.100.7/32", "198.51.100.0/24")},
		},
		{
			name:     "whitespace trimmed and duplicates dropped",
			in:       Config{DenyOut: []string{" 192.0.2.1 ", "192.0.2.1/32", "192.0.2.1"}},
			wantDeny: []string{"192.0.2.1/32"},
			policy:   Policy{DenyOut: pfx("192.0.2.1/32")},
		},
		{
			name:     "ALL_TRAFFIC in denyOut denies both families",
			in:       Config{DenyOut: []string{AllTraffic, "192.0.2.0/24"}},
			wantDeny: []string{AllTraffic, "192.0.2.0/24"},
			policy:   Policy{DenyOut: pfx("0.0.0.0/0", "::/0")},
		},
		{
			name:   "allow_internet_access false is deny-all",
			in:     Config{AllowInternetAccess: boolp(false)},
			policy: Policy{DenyOut: pfx("0.0.0.0/0", "::/0")},
		},
		{
			name:     "allow_internet_access true changes nothing",
			in:       Config{AllowInternetAccess: boolp(true), DenyOut: []string{"192.0.2.0/24"}},
			wantDeny: []string{"192.0.2.0/24"},
			policy:   Policy{DenyOut: pfx("192.0.2.0/24")},
		},
		{
			name: "allow_internet_access false keeps allowOut and replaces denyOut (E2B)",
			in: Config{AllowInternetAccess: boolp(false), AllowOut: []string{"203.0.113.0/24"},
				DenyOut: []string{"192.0.2.0/24"}},
			wantAllow: []string{"203.0.113.0/24"}, wantDeny: []string{"192.0.2.0/24"},
			policy: Policy{AllowOut: pfx("203.0.113.0/24"), DenyOut: pfx("0.0.0.0/0", "::/0")},
		},
		{
			name:      "ALL_TRAFFIC in allowOut allows both families",
			in:        Config{AllowOut: []string{AllTraffic}, DenyOut: []string{AllTraffic}},
			wantAllow: []string{AllTraffic}, wantDeny: []string{AllTraffic},
			policy: Policy{AllowOut: pfx("0.0.0.0/0", "::/0"), DenyOut: pfx("0.0.0.0/0", "::/0")},
		},
		{
			name: "domains lower-cased, trailing dot dropped, DNS implicitly allowed",
			in: Config{AllowOut: []string{"PyPI.org.", "*.PythonHosted.org", "*", "203.0.113.0/24"},
				DenyOut: []string{AllTraffic}},
			wantAllow: []string{"pypi.org", "*.pythonhosted.org", "*", "203.0.113.0/24"},
			wantDeny:  []string{AllTraffic},
			policy: Policy{AllowOut: pfx("203.0.113.0/24", "8.8.8.8/32"), DenyOut: pfx("0.0.0.0/0", "::/0"),
				AllowDomains: []string{"pypi.org", "*.pythonhosted.org", "*"}},
		},
		{
			name:      "domains under allow_internet_access false",
			in:        Config{AllowInternetAccess: boolp(false), AllowOut: []string{"example.com"}},
			wantAllow: []string{"example.com"},
			policy: Policy{AllowOut: pfx("8.8.8.8/32"), DenyOut: pfx("0.0.0.0/0", "::/0"),
				AllowDomains: []string{"example.com"}},
		},
		{
			name:      "domain-looking duplicates differ only in case",
			in:        Config{AllowOut: []string{"Example.com", "example.COM"}, DenyOut: []string{AllTraffic}},
			wantAllow: []string{"example.com"}, wantDeny: []string{AllTraffic},
			policy: Policy{AllowOut: pfx("8.8.8.8/32"), DenyOut: pfx("0.0.0.0/0", "::/0"),
				AllowDomains: []string{"example.com"}},
		},
		{
			name:      "8.8.8.8 given explicitly is not duplicated",
			in:        Config{AllowOut: []string{"8.8.8.8", "example.com"}, DenyOut: []string{AllTraffic}},
			wantAllow: []string{"8.8.8.8/32", "example.com"}, wantDeny: []string{AllTraffic},
			policy: Policy{AllowOut: pfx("8.8.8.8/32"), DenyOut: pfx("0.0.0.0/0", "::/0"),
				AllowDomains: []string{"example.com"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := Normalize(tc.in)
			if err != nil {
				t.Fatalf("Normalize: %v", err)
			}
			if !reflect.DeepEqual(n.AllowOut, tc.wantAllow) || !reflect.DeepEqual(n.DenyOut, tc.wantDeny) {
				t.Fatalf("normal form allowOut %q denyOut %q, want %q %q", n.AllowOut, n.DenyOut, tc.wantAllow, tc.wantDeny)
			}
			if !reflect.DeepEqual(n.AllowInternetAccess, tc.in.AllowInternetAccess) {
				t.Fatalf("allow_internet_access %v, want %v", n.AllowInternetAccess, tc.in.AllowInternetAccess)
			}
			p, err := Parse(tc.in)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(p, tc.policy) {
				t.Fatalf("policy\n got %+v\nwant %+v", p, tc.policy)
			}
			// The normal form is a fixed point and means the same policy.
			if n2, err := Normalize(n); err != nil || !reflect.DeepEqual(n2, n) {
				t.Fatalf("Normalize(normal form) = %+v, %v; want %+v", n2, err, n)
			}
			if p2, err := Parse(n); err != nil || !reflect.DeepEqual(p2, p) {
				t.Fatalf("Parse(normal form) = %+v, %v", p2, err)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Config
		msg  string
	}{
		{"unspecified /8 in denyOut", Config{DenyOut: []string{"192.0.2.1", "198.51.100.0/24", "0.0.0.0/8"}},
			`network.denyOut[2]: "0.0.0.0/8": an unspecified address is only accepted as 0.0.0.0/0`},
		{"bare 0.0.0.0 in denyOut", Config{DenyOut: []string{"0.0.0.0"}}, `network.denyOut[0]: "0.0.0.0": an unspecified address`},
		{"::/0 in denyOut", Config{DenyOut: []string{"::/0"}}, `network.denyOut[0]: "::/0": an unspecified address is only accepted as 0.0.0.0/0`},
		{"bare :: in denyOut", Config{DenyOut: []string{"::"}}, "an unspecified address"},
		{"host bits masking to 0.0.0.0/0", Config{DenyOut: []string{"1.2.3.4/0"}}, "an unspecified address"},
		{"0.0.0.0/1", Config{DenyOut: []string{"0.0.0.0/1"}}, "an unspecified address"},
		{"mapped unspecified", Config{DenyOut: []string{"::ffff:0.0.0.0/96"}}, "an unspecified address"},
		{"unspecified in allowOut", Config{AllowOut: []string{"::/0"}}, `network.allowOut[0]: "::/0": an unspecified address`},
		{"empty denyOut entry", Config{DenyOut: []string{" "}}, `network.denyOut[0]: " ": an empty entry`},
		{"empty allowOut entry", Config{AllowOut: []string{""}}, `network.allowOut[0]: "": an empty entry`},
		{"bad CIDR length", Config{DenyOut: []string{"192.0.2.0/33"}}, `network.denyOut[0]: "192.0.2.0/33": not a valid CIDR`},
		{"bad v6 CIDR", Config{DenyOut: []string{"2001:db8::/129"}}, "not a valid CIDR"},
		{"zone", Config{DenyOut: []string{"fe80::1%eth0"}}, "zone"},
		{"octal-looking v4", Config{DenyOut: []string{"010.0.0.1"}}, "not a valid IP address or CIDR"},
		{"domain in denyOut", Config{DenyOut: []string{"example.com"}}, `network.denyOut[0]: "example.com": domains are only supported in allowOut`},
		{"garbage in denyOut", Config{DenyOut: []string{"not an address"}}, "not a valid IP address or CIDR"},
		{"port on v4", Config{DenyOut: []string{"192.0.2.1:80"}}, "ports are not supported"},
		{"port on v6", Config{AllowOut: []string{"[2001:db8::1]:443"}}, "ports are not supported"},
		{"port on domain", Config{AllowOut: []string{"example.com:443"}, DenyOut: []string{AllTraffic}}, "ports are not supported"},
		{"garbage in allowOut", Config{AllowOut: []string{"not a host!"}}, `network.allowOut[0]: "not a host!": not a valid IP address, CIDR or domain`},
		{"wildcard in the middle", Config{AllowOut: []string{"a.*.example.com"}, DenyOut: []string{AllTraffic}}, "'*' is only allowed"},
		{"double wildcard", Config{AllowOut: []string{"*.*.example.com"}, DenyOut: []string{AllTraffic}}, "'*' is only allowed"},
		{"partial wildcard", Config{AllowOut: []string{"*example.com"}, DenyOut: []string{AllTraffic}}, "'*' is only allowed"},
		{"empty label", Config{AllowOut: []string{"example..com"}, DenyOut: []string{AllTraffic}}, "empty label"},
		{"leading hyphen", Config{AllowOut: []string{"-example.com"}, DenyOut: []string{AllTraffic}}, "starts or ends with '-'"},
		{"label too long", Config{AllowOut: []string{strings.Repeat("a", 64) + ".com"}, DenyOut: []string{AllTraffic}}, "longer than 63"},
		{"name too long", Config{AllowOut: []string{strings.Repeat(strings.Repeat("a", 63)+".", 4) + "com"}, DenyOut: []string{AllTraffic}}, "longer than 253"},
		{"numeric last label", Config{AllowOut: []string{"10.0.0"}, DenyOut: []string{AllTraffic}}, "all digits"},
		{"unicode domain", Config{AllowOut: []string{"bücher.example"}, DenyOut: []string{AllTraffic}}, "xn--"},
		{"domains without deny-all", Config{AllowOut: []string{"203.0.113.0/24", "example.com"}}, "require network.denyOut to contain 0.0.0.0/0"},
		{"domains with partial denyOut", Config{AllowOut: []string{"example.com"}, DenyOut: []string{"192.0.2.0/24"}}, "require network.denyOut"},
		{"domains with internet access true", Config{AllowInternetAccess: boolp(true), AllowOut: []string{"example.com"}}, "require network.denyOut"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.in)
			wantInvalid(t, err, tc.msg)
			if _, err := Normalize(tc.in); errdefs.PublicMessage(err) != errdefs.PublicMessage(wantErr(t, tc.in)) {
				t.Fatalf("Normalize and Parse disagree: %v", err)
			}
		})
	}
}

func wantErr(t *testing.T, c Config) error {
	t.Helper()
	_, err := Parse(c)
	return err
}

func wantInvalid(t *testing.T, err error, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want error containing %q", msg)
	}
	if errdefs.KindOf(err) != errdefs.KindInvalidArgument {
		t.Fatalf("error %v is not InvalidArgument", err)
	}
	if !strings.Contains(errdefs.PublicMessage(err), msg) {
		t.Fatalf("message %q does not contain %q", errdefs.PublicMessage(err), msg)
	}
}

func TestQuoteShortensHugeEntries(t *testing.T) {
	_, err := Parse(Config{DenyOut: []string{strings.Repeat("x", 1<<20)}})
	if err == nil || len(errdefs.PublicMessage(err)) > 300 {
		t.Fatalf("message of %d bytes", len(errdefs.PublicMessage(err)))
	}
}

// domainOfLen returns a valid domain of exactly n characters (n ≥ 5).
func domainOfLen(n int) string {
	var b strings.Builder
	for b.Len() < n-4 {
		l := min(63, n-4-b.Len())
		if b.Len() > 0 {
			b.WriteByte('.')
			l = min(63, n-4-b.Len())
		}
		if l <= 0 {
			break
		}
		b.WriteString(strings.Repeat("a", l))
	}
	s := b.String()
	if strings.HasSuffix(s, ".") {
		s = s[:len(s)-1] + "b"
	}
	return s + ".com"
}

func headersN(n int) map[string]string {
	h := map[string]string{}
	for i := range n {
		h[fmt.Sprintf("X-H%d", i)] = "v"
	}
	return h
}

func rulesN(n int) map[string][]Rule {
	r := map[string][]Rule{}
	for i := range n {
		r[fmt.Sprintf("api%d.example.com", i)] = []Rule{{Transform: &Transform{Headers: map[string]string{"X-A": "1"}}}}
	}
	return r
}

func oneRule(domain string, headers map[string]string) map[string][]Rule {
	return map[string][]Rule{domain: {{Transform: &Transform{Headers: headers}}}}
}

func TestRules(t *testing.T) {
	for _, n := range []int{5, 127, 128, 129} {
		if got := len(domainOfLen(n)); got != n {
			t.Fatalf("domainOfLen(%d) has %d characters", n, got)
		}
	}
	ok := []struct {
		name  string
		rules map[string][]Rule
	}{
		{"10 rule domains", rulesN(10)},
		{"128-character domain", oneRule(domainOfLen(128), map[string]string{"A": "b"})},
		{"wildcard domain", oneRule("*.example.com", map[string]string{"A": "b"})},
		{"20 headers", oneRule("api.example.com", headersN(20))},
		{"64-character header name", oneRule("api.example.com", map[string]string{strings.Repeat("h", 64): "v"})},
		{"2048-character value", oneRule("api.example.com", map[string]string{"A": strings.Repeat("v", 2048)})},
		{"tab in value", oneRule("api.example.com", map[string]string{"A": "a\tb"})},
		{"empty rule list", map[string][]Rule{"api.example.com": nil}},
		{"rule without transform", map[string][]Rule{"api.example.com": {{}}}},
		{"token symbols", oneRule("api.example.com", map[string]string{"X-!#$%&'*+-.^_`|~": "v"})},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse(Config{Rules: tc.rules}); err != nil {
				t.Fatal(err)
			}
		})
	}
	bad := []struct {
		name  string
		rules map[string][]Rule
		msg   string
	}{
		{"11 rule domains", rulesN(11), "network.rules: at most 10 rule domains are allowed, got 11"},
		{"129-character domain", oneRule(domainOfLen(129), nil), "a rule domain must be 1 to 128 characters long, got 129"},
		{"empty domain", oneRule("", nil), `network.rules[""]: a rule domain must be 1 to 128 characters long, got 0`},
		{"bare wildcard", oneRule("*", nil), `network.rules["*"]: a bare * is not a rule domain`},
		{"double wildcard", oneRule("*.*.example.com", nil), "not a valid domain"},
		{"not a domain", oneRule("bad domain", nil), `network.rules["bad domain"]: not a valid domain`},
		{"case duplicates", map[string][]Rule{"API.example.com": nil, "api.example.com": nil}, "one rule per domain"},
		{"two rules", map[string][]Rule{"api.example.com": {{}, {}}}, "at most 1 rule per domain is allowed, got 2"},
		{"21 headers", oneRule("api.example.com", headersN(21)), `network.rules["api.example.com"][0].transform.headers: at most 20 headers per rule are allowed, got 21`},
		{"65-character header name", oneRule("api.example.com", map[string]string{strings.Repeat("h", 65): "v"}), "a header name must be at most 64 characters, got 65"},
		{"2049-character value", oneRule("api.example.com", map[string]string{"A": strings.Repeat("v", 2049)}), "a header value must be at most 2048 characters, got 2049"},
		{"empty header name", oneRule("api.example.com", map[string]string{"": "v"}), "a header name must not be empty"},
		{"space in header name", oneRule("api.example.com", map[string]string{"bad header": "v"}), `headers["bad header"]: not a valid header name`},
		{"colon in header name", oneRule("api.example.com", map[string]string{"A:b": "v"}), "not a valid header name"},
		{"CRLF in value", oneRule("api.example.com", map[string]string{"A": "x\r\nEvil: 1"}), "control characters"},
		{"NUL in value", oneRule("api.example.com", map[string]string{"A": "x\x00"}), "control characters"},
		{"case-duplicate headers", oneRule("api.example.com", map[string]string{"Authorization": "a", "authorization": "b"}), "header names are case-insensitive"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(Config{Rules: tc.rules})
			wantInvalid(t, err, tc.msg)
		})
	}
}

func TestRulesPolicy(t *testing.T) {
	in := Config{Rules: map[string][]Rule{
		"*.Example.com":   {{Transform: &Transform{Headers: map[string]string{"X-Wild": "1"}}}},
		"API.example.com": {{Transform: &Transform{Headers: map[string]string{"Authorization": "Bearer t"}}}},
		"b.example.com":   nil,
	}}
	p, err := Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []HeaderRule{
		{Domain: "*.example.com", Headers: map[string]string{"X-Wild": "1"}},
		{Domain: "api.example.com", Headers: map[string]string{"Authorization": "Bearer t"}},
		{Domain: "b.example.com"},
	}
	if !reflect.DeepEqual(p.Rules, want) {
		t.Fatalf("rules %+v", p.Rules)
	}
	if got := p.RequiredFeatures(); !reflect.DeepEqual(got, []string{FeatureProxy}) {
		t.Fatalf("features %v", got)
	}
	n, _ := Normalize(in)
	if _, ok := n.Rules["api.example.com"]; !ok || len(n.Rules) != 3 {
		t.Fatalf("normal rules %+v", n.Rules)
	}
	// The policy does not alias the caller's maps.
	in.Rules["API.example.com"][0].Transform.Headers["Authorization"] = "changed"
	if p.Rules[1].Headers["Authorization"] != "Bearer t" {
		t.Fatal("policy shares the request's header map")
	}
}

// testCertPEM returns a freshly generated self-signed certificate in PEM.
func testCertPEM(t testing.TB) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "proxy CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// padTo pads a PEM bundle with trailing newlines to exactly n bytes.
func padTo(s string, n int) string { return s + strings.Repeat("\n", n-len(s)) }

func TestProxy(t *testing.T) {
	cert := testCertPEM(t)
	u255, u256 := strings.Repeat("u", 255), strings.Repeat("u", 256)
	ok := []struct {
		name string
		in   ProxyConfig
		want ProxyConfig
	}{
		{"host:port", ProxyConfig{Address: "Proxy.Example.com:1080"}, ProxyConfig{Address: "proxy.example.com:1080"}},
		{"ipv4", ProxyConfig{Address: " 192.0.2.1:01080 "}, ProxyConfig{Address: "192.0.2.1:1080"}},
		{"ipv6", ProxyConfig{Address: "[2001:DB8::1]:1080"}, ProxyConfig{Address: "[2001:db8::1]:1080"}},
		{"credentials at 255 bytes", ProxyConfig{Address: "p:1", Username: u255, Password: u255},
			ProxyConfig{Address: "p:1", Username: u255, Password: u255}},
		{"username alone", ProxyConfig{Address: "p:1", Username: "u"}, ProxyConfig{Address: "p:1", Username: "u"}},
		{"tls", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, ServerName: "Cert.Example", CACert: cert}},
			ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, ServerName: "cert.example", CACert: cert}}},
		{"tls server name IP", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, ServerName: "192.0.2.1"}},
			ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, ServerName: "192.0.2.1"}}},
		{"tls disabled", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{}}, ProxyConfig{Address: "p:1", TLS: &ProxyTLS{}}},
		{"caCert of exactly 8 KiB", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, CACert: padTo(cert, 8192)}},
			ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, CACert: padTo(cert, 8192)}}},
		{"caCert bundle with text", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, CACert: "Subject: x\n" + cert + cert}},
			ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, CACert: "Subject: x\n" + cert + cert}}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			n, err := Normalize(Config{EgressProxy: &tc.in})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*n.EgressProxy, tc.want) {
				t.Fatalf("normal form %+v, want %+v", *n.EgressProxy, tc.want)
			}
			p, _ := Parse(Config{EgressProxy: &tc.in})
			w := tc.want
			want := &Proxy{Address: w.Address, Username: w.Username, Password: w.Password}
			if w.TLS != nil {
				want.TLS, want.ServerName, want.CACert = w.TLS.Enabled, w.TLS.ServerName, w.TLS.CACert
			}
			if !reflect.DeepEqual(p.Proxy, want) {
				t.Fatalf("policy proxy %+v, want %+v", p.Proxy, want)
			}
			if got := p.RequiredFeatures(); !reflect.DeepEqual(got, []string{FeatureProxy}) {
				t.Fatalf("features %v", got)
			}
		})
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	keyPEM := string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	bad := []struct {
		name string
		in   ProxyConfig
		msg  string
	}{
		{"no port", ProxyConfig{Address: "nohost"}, `network.egressProxy.address: "nohost": not host:port`},
		{"empty", ProxyConfig{}, "network.egressProxy.address"},
		{"empty host", ProxyConfig{Address: ":1080"}, "not host:port"},
		{"port 0", ProxyConfig{Address: "p:0"}, "port must be a number from 1 to 65535"},
		{"port too big", ProxyConfig{Address: "p:65536"}, "port must be"},
		{"named port", ProxyConfig{Address: "p:socks"}, "port must be"},
		{"bad host", ProxyConfig{Address: "bad host:1080"}, "neither an IP address nor a valid hostname"},
		{"wildcard host", ProxyConfig{Address: "*.example.com:1080"}, "neither an IP address nor a valid hostname"},
		{"unbracketed v6", ProxyConfig{Address: "2001:db8::1:1080"}, "not host:port"},
		{"username 256 bytes", ProxyConfig{Address: "p:1", Username: u256}, "network.egressProxy.username: must be at most 255 bytes, got 256"},
		{"password 256 bytes", ProxyConfig{Address: "p:1", Username: "u", Password: u256}, "network.egressProxy.password: must be at most 255 bytes, got 256"},
		{"password without username", ProxyConfig{Address: "p:1", Password: "pw"}, "a password requires a username"},
		{"serverName without enabled", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{ServerName: "x.example"}}, "network.egressProxy.tls.serverName: requires tls.enabled: true"},
		{"caCert without enabled", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{CACert: cert}}, "network.egressProxy.tls.caCert: requires tls.enabled: true"},
		{"bad serverName", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, ServerName: "bad name"}}, "tls.serverName"},
		{"caCert over 8 KiB", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, CACert: padTo(cert, 8193)}}, "must be at most 8192 bytes, got 8193"},
		{"caCert not PEM", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, CACert: "hello"}}, "no PEM certificate found"},
		{"caCert garbage DER", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true,
			CACert: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("nope")}))}}, "does not parse"},
		{"caCert with a key", ProxyConfig{Address: "p:1", TLS: &ProxyTLS{Enabled: true, CACert: cert + keyPEM}}, `PEM block 2 is a "EC PRIVATE KEY"`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(Config{EgressProxy: &tc.in})
			wantInvalid(t, err, tc.msg)
		})
	}
}

func TestRedacted(t *testing.T) {
	cert := testCertPEM(t)
	c := Config{EgressProxy: &ProxyConfig{Address: "p:1", Username: "u", Password: "secret",
		TLS: &ProxyTLS{Enabled: true, ServerName: "s.example", CACert: cert}}}
	r := c.Redacted()
	if r.EgressProxy.Password != "" || r.EgressProxy.TLS.CACert != "" || r.EgressProxy.Username != "u" ||
		r.EgressProxy.TLS.ServerName != "s.example" || !r.EgressProxy.TLS.Enabled {
		t.Fatalf("redacted %+v %+v", r.EgressProxy, r.EgressProxy.TLS)
	}
	if c.EgressProxy.Password != "secret" || c.EgressProxy.TLS.CACert != cert {
		t.Fatal("Redacted changed its receiver")
	}
	if (Config{}).Redacted().EgressProxy != nil {
		t.Fatal("redacting no proxy made one")
	}
}

func TestRequiredFeatures(t *testing.T) {
	for _, tc := range []struct {
		in   Config
		want []string
	}{
		{Config{}, nil},
		{Config{AllowOut: []string{"203.0.113.0/24"}, DenyOut: []string{AllTraffic}}, nil},
		{Config{AllowOut: []string{"example.com"}, DenyOut: []string{AllTraffic}}, []string{FeatureDomains}},
		{Config{EgressProxy: &ProxyConfig{Address: "p:1"}}, []string{FeatureProxy}},
		{Config{AllowOut: []string{"*"}, DenyOut: []string{AllTraffic}, Rules: oneRule("a.example", nil)},
			[]string{FeatureDomains, FeatureProxy}},
	} {
		p, err := Parse(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.RequiredFeatures(); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%+v: features %v, want %v", tc.in, got, tc.want)
		}
	}
}
