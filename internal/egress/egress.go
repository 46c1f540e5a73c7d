// Package egress owns the egress policy model: the normalised policy a node enforces, the ranges
// no sandbox may reach, and the reference decision engine every enforcement backend (iptables on
// Linux, a packet filter on macOS, eBPF later) is tested against. It is pure Go: it must never
// touch the OS, iptables or sockets.
package egress

import "net/netip"

// Policy is a sandbox's validated, normalised egress policy.
type Policy struct {
	// AllowOut are CIDRs that are allowed even when DenyOut covers them (never the always-denied
	// ranges). Bare addresses are normalised to /32 or /128.
	AllowOut []netip.Prefix
	// DenyOut are CIDRs that are denied. The literal 0.0.0.0/0 (E2B's ALL_TRAFFIC) denies every
	// IPv4 and IPv6 destination.
	DenyOut []netip.Prefix
	// AllowDomains are lower-case domain patterns ("example.com", "*.example.com", "*"), enforced
	// by the transparent proxy on ports 80/443 where a node has the egress-domains feature.
	AllowDomains []string
}

// Proto is a transport protocol as the policy sees it.
type Proto uint8

const (
	TCP Proto = iota + 1
	UDP
	ICMP
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case ICMP:
		return "icmp"
	default:
		return "unknown"
	}
}

// Verdict is the decision for a flow.
type Verdict uint8

const (
	Deny Verdict = iota
	Allow
)

func (v Verdict) String() string {
	if v == Allow {
		return "allow"
	}
	return "deny"
}
