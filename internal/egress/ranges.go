package egress

import (
	"fmt"
	"net/netip"
	"strings"
)

// alwaysDenied are the destinations no sandbox reaches by default (seed "Always-denied ranges"):
// the host's loopback, link-local (cloud metadata), private and CGNAT ranges, where the node, its
// peers and the operator's internal services live.
var alwaysDenied = [...]string{
	"10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7", "fe80::/10",
}

// AlwaysDenied returns the always-denied ranges. The slice is new on every call, so callers may
// keep or change it.
func AlwaysDenied() []netip.Prefix {
	out := make([]netip.Prefix, len(alwaysDenied))
	for i, s := range alwaysDenied {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Env is the node-wide part of every decision.
type Env struct {
	// AlwaysDenied are denied whatever the policy says. nil means AlwaysDenied(): a zero Env fails
	// closed rather than open.
	AlwaysDenied []netip.Prefix
	// InternalAllow (`--egress-internal-allow`) exempts destinations from the always-denied block
	// only: the sandbox's own denyOut still applies to them.
	InternalAllow []netip.Prefix
}

// NewEnv returns the default environment with the given internal-allow exemptions.
func NewEnv(internalAllow []netip.Prefix) Env {
	return Env{AlwaysDenied: AlwaysDenied(), InternalAllow: internalAllow}
}

func (e Env) alwaysDenied() []netip.Prefix {
	if e.AlwaysDenied == nil {
		return AlwaysDenied()
	}
	return e.AlwaysDenied
}

// ParseInternalAllow parses the value of `--egress-internal-allow`: comma-separated CIDRs (a bare
// address means /32 or /128). Unlike API entries, a CIDR with host bits set is an error here: an
// operator who writes 10.20.0.1/16 may have meant a /32, and widening an exemption from the
// always-denied block by guessing is the wrong way to fail. "" means no exemptions.
func ParseInternalAllow(s string) ([]netip.Prefix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []netip.Prefix
	for i, part := range strings.Split(s, ",") {
		e := strings.TrimSpace(part)
		if e == "" {
			return nil, fmt.Errorf("entry %d is empty", i+1)
		}
		p, err := parsePrefix(e)
		if err != nil {
			return nil, fmt.Errorf("entry %d %s: %w", i+1, quote(e), err)
		}
		if m := p.Masked(); m != p {
			return nil, fmt.Errorf("entry %d %s: host bits are set (the network is %s)", i+1, quote(e), m)
		}
		if p.Addr().IsUnspecified() {
			return nil, fmt.Errorf("entry %d %s: exempting every address from the always-denied ranges is not allowed", i+1, quote(e))
		}
		out = appendPrefix(out, p)
	}
	return out, nil
}

// parsePrefix parses a CIDR or a bare address (as /32 or /128) and turns IPv4-mapped IPv6 into
// IPv4, so that ::ffff:10.0.0.1 can never slip past a 10.0.0.0/8 rule. Host bits are kept: the
// caller decides whether they are an error. Zones are rejected: a policy names destinations, and
// a zone names an interface of the host.
func parsePrefix(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, fmt.Errorf("not a valid CIDR")
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not a valid IP address")
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("an IPv6 zone is not allowed")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	return unmapPrefix(p), nil
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix that lies inside ::ffff:0:0/96 into the IPv4
// prefix it covers.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// appendPrefix appends p unless out already holds it.
func appendPrefix(out []netip.Prefix, p netip.Prefix) []netip.Prefix {
	for _, q := range out {
		if q == p {
			return out
		}
	}
	return append(out, p)
}

// covers reports whether any prefix contains a. Prefixes are unmapped and masked first so that a
// hand-built Policy cannot smuggle in a form that never matches.
func covers(ps []netip.Prefix, a netip.Addr) bool {
	_, ok := covering(ps, a)
	return ok
}
