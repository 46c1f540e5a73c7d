// Package egress owns the egress policy model: the E2B API form of a sandbox's egress settings
// and its validation (Config, Normalize, Parse), the normalised policy a node enforces (Policy),
// the ranges no sandbox may reach (AlwaysDenied, Env), and the reference decision engine every
// enforcement backend (iptables on Linux, a packet filter on macOS, eBPF later) is tested against
// (Decide, DecisionTable). It is pure Go: it must never touch the OS, iptables, DNS or sockets.
package egress

import "net/netip"

// Features a node advertises when it can enforce the parts of a policy beyond CIDRs. Placement
// only considers nodes with every feature a policy needs (Policy.RequiredFeatures).
const (
	// FeatureDomains: the node enforces domain entries of allowOut (transparent proxy on 80/443).
	FeatureDomains = "egress-domains"
	// FeatureProxy: the node applies header rules and tunnels through an egressProxy.
	FeatureProxy = "egress-proxy"
)

// Policy is a sandbox's validated, normalised egress policy: what a node enforces. Build it with
// Parse; a hand-built Policy is still judged safely by Decide, but only Parse guarantees the
// invariants below.
type Policy struct {
	// AllowOut are CIDRs that are allowed even when DenyOut covers them (never the always-denied
	// ranges). Bare addresses are /32 or /128, host bits are masked off and IPv4-mapped IPv6
	// entries are IPv4. E2B's ALL_TRAFFIC (0.0.0.0/0) appears as both 0.0.0.0/0 and ::/0, and
	// 8.8.8.8/32 is added when AllowDomains is non-empty so that DNS works under deny-all.
	AllowOut []netip.Prefix
	// DenyOut are CIDRs that are denied, normalised like AllowOut. ALL_TRAFFIC, and
	// allow_internet_access:false, appear as both 0.0.0.0/0 and ::/0, so a backend never needs to
	// know that the IPv4 literal also denies IPv6.
	DenyOut []netip.Prefix
	// AllowDomains are lower-case domain patterns ("example.com", "*.example.com", "*"), enforced
	// by the transparent proxy on ports 80/443 where a node has the egress-domains feature.
	AllowDomains []string
	// Rules inject or override request headers on HTTPS requests to matching hosts, sorted by
	// Domain. They never grant access.
	Rules []HeaderRule
	// Proxy, when set, tunnels every allowed outbound TCP flow through a SOCKS5 proxy.
	Proxy *Proxy
}

// HeaderRule is the header transform for one rule domain.
type HeaderRule struct {
	// Domain is "example.com" (exact) or "*.example.com" (strict subdomains), lower-case. The
	// most specific matching domain wins; rules of several matching domains are never merged.
	Domain string
	// Headers are set on every request, replacing any the guest sent. Empty means the matching
	// requests pass unchanged (which still shadows a less specific rule).
	Headers map[string]string
}

// Proxy is a SOCKS5 proxy for a sandbox's outbound TCP.
type Proxy struct {
	// Address is host:port with a lower-case host.
	Address  string
	Username string
	Password string
	// TLS wraps the hop to the proxy in TLS, verified against CACert (PEM) when set, else the
	// system roots, for ServerName when set, else the host of Address.
	TLS        bool
	ServerName string
	CACert     string
}

// RequiredFeatures lists the node features the policy needs beyond plain networking, in a fixed
// order: egress-domains for domain entries, egress-proxy for rules or an egress proxy.
func (p Policy) RequiredFeatures() []string {
	var out []string
	if len(p.AllowDomains) > 0 {
		out = append(out, FeatureDomains)
	}
	if len(p.Rules) > 0 || p.Proxy != nil {
		out = append(out, FeatureProxy)
	}
	return out
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
