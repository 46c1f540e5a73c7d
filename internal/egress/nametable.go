package egress

import (
	"fmt"
	"net/netip"
)

// TestZone is the DNS zone the name table assumes: the fake internet of the networking tests
// serves exactly these records (test/nettopo), and the proxy's unit tests resolve through it. Only
// documentation addresses and addresses inside the always-denied ranges appear.
func TestZone() map[string][]netip.Addr {
	a := func(ss ...string) []netip.Addr {
		out := make([]netip.Addr, len(ss))
		for i, s := range ss {
			out[i] = netip.MustParseAddr(s)
		}
		return out
	}
	return map[string][]netip.Addr{
		"a.test":        a("203.0.113.10"),
		"b.test":        a("198.51.100.8"),
		"x.b.test":      a("203.0.113.11"),
		"deep.x.b.test": a("198.51.100.7"),
		"other.test":    a("198.51.100.8"),
		"private.test":  a("10.1.2.3"),
		"mixed.test":    a("10.1.2.3", "203.0.113.11"),
		"meta.test":     a("169.254.169.254"),
	}
}

// NameCase is one flow the transparent proxy judges by name, and its end result: the verdict,
// the stage that decided, and for an allowed flow the address the node dials.
type NameCase struct {
	Name   string
	Config Config
	Policy Policy
	Env    Env
	// Dst and Port are where the guest connected; Host is the HTTP Host (port 80) or TLS SNI
	// (port 443) it sent ("" for none).
	Dst  netip.Addr
	Port uint16
	Host string
	Want Verdict
	// Stage decided the flow; for a refusal of a domain whose every address is always-denied it
	// is StageAlwaysDenied.
	Stage Stage
	// Dial is the address an allowed flow reaches: Dst for address rules, the name's first
	// dialable address in TestZone for domain flows.
	Dial netip.Addr
}

// NameTable returns the cases every name-aware backend must reach: each precedence step on ports
// 80 and 443, wildcard edges, case and trailing dots, names that are not names (IP literals,
// empty), and names resolving into always-denied ranges with and without an exemption. The slice
// is new on every call.
func NameTable() []NameCase {
	var (
		domains  = Config{AllowOut: []string{"a.test", "*.b.test", "private.test", "mixed.test", "meta.test"}, DenyOut: []string{AllTraffic}}
		withCIDR = Config{AllowOut: []string{"a.test", "198.51.100.0/24"}, DenyOut: []string{AllTraffic}}
		every    = Config{AllowOut: []string{"*"}, DenyOut: []string{AllTraffic}}
	)
	def := NewEnv(nil)
	exempt := NewEnv([]netip.Prefix{netip.MustParsePrefix("10.1.2.0/24")})
	type c struct {
		name  string
		cfg   Config
		env   Env
		dst   string
		port  uint16
		host  string
		want  Verdict
		stage Stage
		dial  string
	}
	cases := []c{
		// 1. A domain allows the flow whatever address the guest chose; the node dials the name.
		{"exact host", domains, def, "198.51.100.8", 80, "a.test", Allow, StageDomain, "203.0.113.10"},
		{"exact host with port", domains, def, "198.51.100.8", 80, "a.test:80", Allow, StageDomain, "203.0.113.10"},
		{"exact sni", domains, def, "198.51.100.8", 443, "a.test", Allow, StageDomain, "203.0.113.10"},
		{"upper case", domains, def, "203.0.113.10", 80, "A.Test", Allow, StageDomain, "203.0.113.10"},
		{"trailing dot", domains, def, "203.0.113.10", 80, "a.test.", Allow, StageDomain, "203.0.113.10"},
		{"wildcard subdomain", domains, def, "203.0.113.11", 443, "x.b.test", Allow, StageDomain, "203.0.113.11"},
		{"wildcard deep subdomain", domains, def, "203.0.113.11", 80, "deep.x.b.test", Allow, StageDomain, "198.51.100.7"},
		{"wildcard is not the apex", domains, def, "198.51.100.8", 80, "b.test", Deny, StageDenyOut, ""},
		{"exact is not a subdomain", domains, def, "203.0.113.10", 443, "www.a.test", Deny, StageDenyOut, ""},
		{"other name", domains, def, "198.51.100.8", 443, "other.test", Deny, StageDenyOut, ""},
		{"star covers every name", every, def, "198.51.100.8", 443, "other.test", Allow, StageDomain, "198.51.100.8"},

		// Names that are not names never match a domain, even under "*".
		{"ip literal host", every, def, "203.0.113.10", 80, "203.0.113.10", Deny, StageDenyOut, ""},
		{"ip literal host with port", every, def, "203.0.113.10", 80, "203.0.113.10:80", Deny, StageDenyOut, ""},
		{"bracketed v6 host", every, def, "203.0.113.10", 80, "[2001:db8::10]", Deny, StageDenyOut, ""},
		{"no sni", every, def, "203.0.113.10", 443, "", Deny, StageDenyOut, ""},

		// 1 before 2: a domain that resolves into an always-denied range is never dialed.
		{"name resolves to private", domains, def, "203.0.113.10", 80, "private.test", Deny, StageAlwaysDenied, ""},
		{"name resolves to metadata", domains, def, "203.0.113.10", 443, "meta.test", Deny, StageAlwaysDenied, ""},
		{"private address skipped", domains, def, "203.0.113.10", 443, "mixed.test", Allow, StageDomain, "203.0.113.11"},
		{"exemption lets the name reach it", domains, exempt, "203.0.113.10", 80, "private.test", Allow, StageDomain, "10.1.2.3"},
		{"exemption is not the domain", domains, exempt, "10.1.2.3", 80, "other.test", Deny, StageDenyOut, ""},
		{"always-denied address, no name", domains, def, "10.1.2.3", 80, "other.test", Deny, StageAlwaysDenied, ""},

		// 3 and 4 for flows no domain matched: the address the guest chose decides, and is dialed.
		{"allowOut cidr without a name", withCIDR, def, "198.51.100.8", 443, "", Allow, StageAllowOut, "198.51.100.8"},
		{"allowOut cidr other name", withCIDR, def, "198.51.100.7", 80, "other.test", Allow, StageAllowOut, "198.51.100.7"},
		{"denyOut outside the cidr", withCIDR, def, "203.0.113.11", 80, "other.test", Deny, StageDenyOut, ""},
	}
	out := make([]NameCase, 0, len(cases))
	for _, tc := range cases {
		p, err := Parse(tc.cfg)
		if err != nil {
			panic(fmt.Sprintf("egress: name table case %q: %v", tc.name, err))
		}
		nc := NameCase{Name: tc.name, Config: tc.cfg, Policy: p, Env: tc.env, Dst: netip.MustParseAddr(tc.dst),
			Port: tc.port, Host: tc.host, Want: tc.want, Stage: tc.stage}
		if tc.dial != "" {
			nc.Dial = netip.MustParseAddr(tc.dial)
		}
		out = append(out, nc)
	}
	return out
}
