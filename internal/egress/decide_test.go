package egress

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestAlwaysDeniedIsTheSeedList(t *testing.T) {
	want := pfx("10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7", "fe80::/10")
	got := AlwaysDenied()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("AlwaysDenied() = %v", got)
	}
	got[0] = netip.MustParsePrefix("203.0.113.0/24")
	if AlwaysDenied()[0] != want[0] {
		t.Fatal("AlwaysDenied returns shared state")
	}
}

func TestDecisionTable(t *testing.T) {
	cases := DecisionTable()
	names := map[string]bool{}
	// Real-traffic replays run these addresses in namespaces; nothing may point at the real
	// internet.
	safe := append(pfx("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"), AlwaysDenied()...)
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			if names[tc.Name] {
				t.Fatal("duplicate case name")
			}
			names[tc.Name] = true
			if p, err := Parse(tc.Config); err != nil || !reflect.DeepEqual(p, tc.Policy) {
				t.Fatalf("Policy is not Parse(Config): %v", err)
			}
			if !covers(safe, tc.Dst.Unmap()) {
				t.Fatalf("destination %s is not a documentation or always-denied address", tc.Dst)
			}
			if got := Decide(tc.Policy, tc.Env, tc.Proto, tc.Dst, tc.Port); got != tc.Want {
				t.Fatalf("Decide(%s %s:%d) = %s, want %s", tc.Proto, tc.Dst, tc.Port, got, tc.Want)
			}
		})
	}
	// Every protocol and both verdicts are represented, so a backend cannot pass by ignoring one.
	seen := map[Proto]map[Verdict]bool{}
	for _, tc := range cases {
		if seen[tc.Proto] == nil {
			seen[tc.Proto] = map[Verdict]bool{}
		}
		seen[tc.Proto][tc.Want] = true
	}
	for _, p := range []Proto{TCP, UDP, ICMP} {
		if !seen[p][Allow] || !seen[p][Deny] {
			t.Errorf("%s lacks an allow or a deny case", p)
		}
	}
	// The table is new on every call.
	a := DecisionTable()
	a[0].Policy.DenyOut = pfx("0.0.0.0/0")
	if b := DecisionTable(); b[0].Policy.DenyOut != nil {
		t.Fatal("DecisionTable returns shared state")
	}
}

func TestDecideEdges(t *testing.T) {
	def := NewEnv(nil)
	mustParse := func(c Config) Policy {
		t.Helper()
		p, err := Parse(c)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	domains := mustParse(Config{AllowOut: []string{"example.com"}, DenyOut: []string{AllTraffic}})
	for _, tc := range []struct {
		name string
		p    Policy
		env  Env
		dst  string
		want Verdict
	}{
		// Just outside the always-denied ranges.
		{"172.32.0.1 is public", Policy{}, def, "172.32.0.1", Allow},
		{"172.15.255.255 is public", Policy{}, def, "172.15.255.255", Allow},
		{"100.128.0.1 is public", Policy{}, def, "100.128.0.1", Allow},
		{"100.63.255.255 is public", Policy{}, def, "100.63.255.255", Allow},
		{"169.255.0.1 is public", Policy{}, def, "169.255.0.1", Allow},
		{"fe00::1 is public", Policy{}, def, "fe00::1", Allow},
		{"fec0::1 is outside fe80::/10", Policy{}, def, "fec0::1", Allow},
		{"fbff::1 is outside fc00::/7", Policy{}, def, "fbff::1", Allow},
		{"::2 is not loopback", Policy{}, def, "::2", Allow},
		// The zero Env fails closed.
		{"zero env denies private", Policy{}, Env{}, "10.0.0.1", Deny},
		{"zero env allows public", Policy{}, Env{}, "203.0.113.1", Allow},
		// An explicitly empty always-denied list is honoured (a backend test may need it).
		{"empty always-denied", Policy{}, Env{AlwaysDenied: []netip.Prefix{}}, "10.0.0.1", Allow},
		// DNS under deny-all with domains.
		{"8.8.8.8 implicit", domains, def, "8.8.8.8", Allow},
		{"8.8.4.4 not implicit", domains, def, "8.8.4.4", Deny},
		// A hand-built policy with mapped or unmasked prefixes still matches.
		{"mapped prefix in a hand-built policy", Policy{DenyOut: pfx("::ffff:203.0.113.0/120")}, def, "203.0.113.9", Deny},
		{"unmasked prefix in a hand-built policy", Policy{DenyOut: pfx("203.0.113.9/24")}, def, "203.0.113.200", Deny},
		{"mapped destination against mapped prefix", Policy{DenyOut: pfx("::ffff:203.0.113.0/120")}, def, "::ffff:203.0.113.9", Deny},
		{"zone on destination ignored", Policy{DenyOut: pfx("2001:db8::/32")}, def, "2001:db8::1%eth0", Deny},
		// Internal-allow of a mapped destination and a mapped exemption.
		{"mapped exemption", Policy{}, NewEnv(pfx("::ffff:10.20.0.0/112")), "10.20.0.1", Allow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, proto := range []Proto{TCP, UDP, ICMP} {
				if got := Decide(tc.p, tc.env, proto, netip.MustParseAddr(tc.dst), 443); got != tc.want {
					t.Fatalf("%s: %s, want %s", proto, got, tc.want)
				}
			}
		})
	}
	if Decide(Policy{}, def, TCP, netip.Addr{}, 80) != Deny {
		t.Fatal("an invalid destination was allowed")
	}
}

func TestParseInternalAllow(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []netip.Prefix
		err  string
	}{
		{in: "", want: nil},
		{in: "  ", want: nil},
		{in: "10.20.0.0/16,192.168.5.10/32", want: pfx("10.20.0.0/16", "192.168.5.10/32")},
		{in: " 10.20.0.0/16 , 192.168.5.10 ", want: pfx("10.20.0.0/16", "192.168.5.10/32")},
		{in: "fd00:20::/32,::ffff:10.1.0.0/112", want: pfx("fd00:20::/32", "10.1.0.0/16")},
		{in: "10.20.0.0/16,10.20.0.0/16", want: pfx("10.20.0.0/16")},
		{in: "10.20.0.1/16", err: "host bits are set (the network is 10.20.0.0/16)"},
		{in: "10.20.0.0/16,", err: "entry 2 is empty"},
		{in: "nope", err: `entry 1 "nope": not a valid IP address`},
		{in: "10.0.0.0/33", err: "not a valid CIDR"},
		{in: "0.0.0.0/0", err: "exempting every address"},
		{in: "::/0", err: "exempting every address"},
	} {
		got, err := ParseInternalAllow(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
