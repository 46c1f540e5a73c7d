package egress

import (
	"fmt"
	"net/netip"
)

// DecisionCase is one flow and the verdict every backend must reach for it.
type DecisionCase struct {
	Name string
	// Config is the policy as a client sends it (to drive a real sandbox through the API);
	// Policy is Parse(Config).
	Config Config
	Policy Policy
	// Env is the node's environment; InternalAllow is what `--egress-internal-allow` must be set to.
	Env   Env
	Proto Proto
	Dst   netip.Addr
	Port  uint16
	Want  Verdict
}

// DecisionTable returns the shared decision table: every rule of the seed's address precedence,
// its edges, and each always-denied range, for TCP, UDP and ICMP. The iptables renderer's tests
// replay it against rendered rules and the namespace tests replay it as real traffic, so it uses
// only documentation addresses (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32)
// and, for the always-denied cases, addresses inside those ranges. The slice is new on every call.
//
// Domain-allowed flows are not in it: Decide does not judge them (see Decide).
func DecisionTable() []DecisionCase {
	f := false
	var (
		allowAll   = Config{}
		noInternet = Config{AllowInternetAccess: &f}
		denyAll    = Config{DenyOut: []string{AllTraffic}}
		denyAllExc = Config{AllowOut: []string{"203.0.113.0/24", "2001:db8:a::/48"}, DenyOut: []string{AllTraffic}}
		denyOne    = Config{DenyOut: []string{"198.51.100.7", "2001:db8:b::7"}}
		deny24     = Config{DenyOut: []string{"198.51.100.0/24", "2001:db8:b::/64"}}
		allowWins  = Config{AllowOut: []string{"198.51.100.7", "2001:db8:b::7"}, DenyOut: []string{"198.51.100.0/24", "2001:db8:b::/64"}}
		v4Only     = Config{DenyOut: []string{"192.0.2.0/24"}}
		v6Only     = Config{DenyOut: []string{"2001:db8::/32"}}
		allowEvery = Config{AllowOut: []string{AllTraffic}, DenyOut: []string{AllTraffic}}
		allowPriv  = Config{AllowOut: []string{"10.0.0.0/8", "192.168.0.0/16", "fd00::/8"}, DenyOut: []string{AllTraffic}}
		domains    = Config{AllowOut: []string{"example.com", "*.example.org"}, DenyOut: []string{AllTraffic}}
		mappedDeny = Config{DenyOut: []string{"::ffff:198.51.100.0/120"}}
		denyInt    = Config{DenyOut: []string{"10.20.0.0/24"}}
		allowInt   = Config{AllowOut: []string{"10.20.0.0/16"}, DenyOut: []string{AllTraffic}}
	)
	def := NewEnv(nil)
	internal := NewEnv([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd00:20::/32")})

	type c struct {
		name  string
		cfg   Config
		env   Env
		proto Proto
		dst   string
		port  uint16
		want  Verdict
	}
	cases := []c{
		// 5. Otherwise allowed: the default policy reaches the internet over every protocol.
		{"allow-all tcp v4", allowAll, def, TCP, "203.0.113.10", 80, Allow},
		{"allow-all udp v4", allowAll, def, UDP, "198.51.100.10", 53, Allow},
		{"allow-all icmp v4", allowAll, def, ICMP, "192.0.2.10", 0, Allow},
		{"allow-all tcp v6", allowAll, def, TCP, "2001:db8::10", 443, Allow},
		{"allow-all udp v6", allowAll, def, UDP, "2001:db8::10", 53, Allow},
		{"allow-all icmp v6", allowAll, def, ICMP, "2001:db8::10", 0, Allow},

		// 2. Always-denied ranges, one address in each, under the default policy.
		{"always-denied 10/8", allowAll, def, TCP, "10.0.0.5", 80, Deny},
		{"always-denied 10/8 udp", allowAll, def, UDP, "10.255.255.254", 53, Deny},
		{"always-denied 100.64/10", allowAll, def, TCP, "100.64.0.5", 80, Deny},
		{"always-denied 100.64/10 top", allowAll, def, ICMP, "100.127.255.254", 0, Deny},
		{"always-denied 127/8", allowAll, def, TCP, "127.0.0.1", 80, Deny},
		{"always-denied 169.254/16 metadata", allowAll, def, TCP, "169.254.169.254", 80, Deny},
		{"always-denied 172.16/12", allowAll, def, TCP, "172.16.0.5", 443, Deny},
		{"always-denied 172.16/12 top", allowAll, def, UDP, "172.31.255.254", 53, Deny},
		{"always-denied 192.168/16", allowAll, def, ICMP, "192.168.1.5", 0, Deny},
		{"always-denied ::1", allowAll, def, TCP, "::1", 80, Deny},
		{"always-denied fc00::/7", allowAll, def, TCP, "fd00::5", 80, Deny},
		{"always-denied fc00::/7 low", allowAll, def, UDP, "fc00::5", 53, Deny},
		{"always-denied fe80::/10", allowAll, def, ICMP, "fe80::5", 0, Deny},
		{"always-denied mapped v4", allowAll, def, TCP, "::ffff:10.0.0.5", 80, Deny},
		{"always-denied mapped v4 192.168", allowAll, def, UDP, "::ffff:192.168.1.5", 53, Deny},

		// allow_internet_access:false ≡ denyOut 0.0.0.0/0, which denies IPv6 as well.
		{"no-internet tcp v4", noInternet, def, TCP, "203.0.113.10", 443, Deny},
		{"no-internet udp v4", noInternet, def, UDP, "198.51.100.10", 53, Deny},
		{"no-internet icmp v4", noInternet, def, ICMP, "192.0.2.10", 0, Deny},
		{"no-internet tcp v6", noInternet, def, TCP, "2001:db8::10", 443, Deny},
		{"no-internet icmp v6", noInternet, def, ICMP, "2001:db8::10", 0, Deny},
		{"deny-all tcp v4", denyAll, def, TCP, "203.0.113.10", 80, Deny},
		{"deny-all udp v6", denyAll, def, UDP, "2001:db8::10", 53, Deny},
		{"deny-all always-denied", denyAll, def, TCP, "10.0.0.5", 80, Deny},

		// 3. allowOut CIDR under deny-all, with its edges.
		{"deny-all+allowOut inside", denyAllExc, def, TCP, "203.0.113.10", 443, Allow},
		{"deny-all+allowOut first", denyAllExc, def, UDP, "203.0.113.0", 53, Allow},
		{"deny-all+allowOut last", denyAllExc, def, ICMP, "203.0.113.255", 0, Allow},
		{"deny-all+allowOut outside", denyAllExc, def, TCP, "198.51.100.10", 443, Deny},
		{"deny-all+allowOut v6 inside", denyAllExc, def, TCP, "2001:db8:a::10", 443, Allow},
		{"deny-all+allowOut v6 outside", denyAllExc, def, TCP, "2001:db8:b::10", 443, Deny},
		{"deny-all+allowOut mapped inside", denyAllExc, def, TCP, "::ffff:203.0.113.10", 443, Allow},

		// 4. denyOut: a single address (/32, /128) and a /24 (/64), with their edges.
		{"deny /32 hit", denyOne, def, TCP, "198.51.100.7", 80, Deny},
		{"deny /32 hit udp", denyOne, def, UDP, "198.51.100.7", 53, Deny},
		{"deny /32 hit icmp", denyOne, def, ICMP, "198.51.100.7", 0, Deny},
		{"deny /32 neighbour below", denyOne, def, TCP, "198.51.100.6", 80, Allow},
		{"deny /32 neighbour above", denyOne, def, TCP, "198.51.100.8", 80, Allow},
		{"deny /32 mapped", denyOne, def, TCP, "::ffff:198.51.100.7", 80, Deny},
		{"deny /128 hit", denyOne, def, TCP, "2001:db8:b::7", 80, Deny},
		{"deny /128 neighbour", denyOne, def, TCP, "2001:db8:b::8", 80, Allow},
		{"deny /24 first", deny24, def, TCP, "198.51.100.0", 80, Deny},
		{"deny /24 last", deny24, def, UDP, "198.51.100.255", 53, Deny},
		{"deny /24 outside", deny24, def, TCP, "203.0.113.10", 80, Allow},
		{"deny /64 inside", deny24, def, ICMP, "2001:db8:b::ffff", 0, Deny},
		{"deny /64 outside", deny24, def, ICMP, "2001:db8:b:1::1", 0, Allow},

		// 3 before 4: allowOut wins over a denyOut that covers it.
		{"allowOut beats denyOut v4", allowWins, def, TCP, "198.51.100.7", 443, Allow},
		{"allowOut beats denyOut v4 rest denied", allowWins, def, TCP, "198.51.100.8", 443, Deny},
		{"allowOut beats denyOut v6", allowWins, def, UDP, "2001:db8:b::7", 53, Allow},
		{"allowOut beats denyOut v6 rest denied", allowWins, def, UDP, "2001:db8:b::8", 53, Deny},

		// Families never match each other.
		{"v4 denyOut leaves v6 alone", v4Only, def, TCP, "2001:db8::10", 80, Allow},
		{"v4 denyOut denies v4", v4Only, def, TCP, "192.0.2.10", 80, Deny},
		{"v6 denyOut leaves v4 alone", v6Only, def, TCP, "192.0.2.10", 80, Allow},
		{"v6 denyOut denies v6", v6Only, def, TCP, "2001:db8::10", 80, Deny},
		{"mapped denyOut entry is v4", mappedDeny, def, TCP, "198.51.100.10", 80, Deny},
		{"mapped denyOut entry leaves v6 alone", mappedDeny, def, TCP, "2001:db8::10", 80, Allow},

		// ALL_TRAFFIC in allowOut allows both families and still not the always-denied ranges.
		{"allowOut all v4", allowEvery, def, TCP, "203.0.113.10", 80, Allow},
		{"allowOut all v6", allowEvery, def, TCP, "2001:db8::10", 80, Allow},
		{"allowOut all never lifts always-denied", allowEvery, def, TCP, "10.0.0.5", 80, Deny},

		// 2 before 3: allowOut never lifts the always-denied block.
		{"allowOut 10/8 still denied", allowPriv, def, TCP, "10.0.0.5", 80, Deny},
		{"allowOut 192.168/16 still denied", allowPriv, def, UDP, "192.168.1.5", 53, Deny},
		{"allowOut fd00::/8 still denied", allowPriv, def, TCP, "fd00::5", 80, Deny},

		// Domain entries: without the proxy a flow matches no domain, so only CIDR rules apply.
		{"domains: address flow denied", domains, def, TCP, "203.0.113.10", 443, Deny},
		{"domains: udp denied", domains, def, UDP, "198.51.100.10", 53, Deny},

		// --egress-internal-allow lifts only the always-denied block.
		{"internal-allow lifts block", allowAll, internal, TCP, "10.20.0.5", 80, Allow},
		{"internal-allow lifts block udp", allowAll, internal, UDP, "10.20.255.254", 53, Allow},
		{"internal-allow lifts block v6", allowAll, internal, TCP, "fd00:20::5", 80, Allow},
		{"internal-allow mapped", allowAll, internal, TCP, "::ffff:10.20.0.5", 80, Allow},
		{"internal-allow outside exemption", allowAll, internal, TCP, "10.21.0.5", 80, Deny},
		{"internal-allow other range", allowAll, internal, TCP, "192.168.1.5", 80, Deny},
		{"internal-allow denyOut all applies", denyAll, internal, TCP, "10.20.0.5", 80, Deny},
		{"internal-allow no-internet applies", noInternet, internal, ICMP, "10.20.0.5", 0, Deny},
		{"internal-allow denyOut covers", denyInt, internal, TCP, "10.20.0.5", 80, Deny},
		{"internal-allow denyOut misses", denyInt, internal, TCP, "10.20.1.5", 80, Allow},
		{"internal-allow allowOut under deny-all", allowInt, internal, TCP, "10.20.0.5", 80, Allow},
		{"internal-allow allowOut beyond exemption", allowInt, def, TCP, "10.20.0.5", 80, Deny},
		{"internal-allow public still allowed", allowAll, internal, TCP, "203.0.113.10", 80, Allow},
	}
	out := make([]DecisionCase, 0, len(cases))
	for _, tc := range cases {
		p, err := Parse(tc.cfg)
		if err != nil {
			// The table is constant: a bad entry is a bug in this file, caught by its tests.
			panic(fmt.Sprintf("egress: decision table case %q: %v", tc.name, err))
		}
		out = append(out, DecisionCase{Name: tc.name, Config: tc.cfg, Policy: p, Env: tc.env,
			Proto: tc.proto, Dst: netip.MustParseAddr(tc.dst), Port: tc.port, Want: tc.want})
	}
	return out
}
