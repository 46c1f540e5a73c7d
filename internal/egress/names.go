package egress

import (
	"net"
	"net/netip"
	"strings"
)

// Stage names the precedence step that decided a flow: what a refusal event and a 403 body report.
type Stage string

const (
	// StageDomain: an allowOut domain matched the flow's HTTP Host or TLS SNI (step 1).
	StageDomain Stage = "domain"
	// StageAlwaysDenied: the destination, or every address a domain resolved to, is in an
	// always-denied range not exempted by --egress-internal-allow (step 2).
	StageAlwaysDenied Stage = "always-denied"
	// StageAllowOut: an allowOut CIDR covers the destination (step 3).
	StageAllowOut Stage = "allowOut"
	// StageDenyOut: a denyOut CIDR covers the destination (step 4).
	StageDenyOut Stage = "denyOut"
	// StageDefault: nothing matched; the flow is allowed (step 5).
	StageDefault Stage = "default"
)

// Decision is a verdict with the step and the rule that produced it.
type Decision struct {
	Verdict Verdict
	Stage   Stage
	// Rule is the entry that decided: a domain pattern, a CIDR, or "" for the default.
	Rule string
}

// Web ports are the only ones on which a domain is recognised (seed "Matching").
const (
	PortHTTP  uint16 = 80
	PortHTTPS uint16 = 443
)

// Judge is the reference engine with names: the decision for a new flow from a sandbox under
// policy p to dst:port, where name is the HTTP Host (port 80) or TLS SNI (port 443) the
// transparent proxy saw ("" when none). It follows the seed's precedence exactly:
//
//  1. TCP to port 80 or 443 whose name an allowOut domain covers → allow (the proxy re-dials by
//     name and never dials an always-denied address: Env.Dialable);
//  2. dst in an always-denied range, unless env.InternalAllow covers it → deny;
//  3. dst in an allowOut CIDR → allow;
//  4. dst in a denyOut CIDR → deny;
//  5. otherwise → allow.
//
// A name is only a name when HostName accepts it: an IP literal, an empty or malformed value
// never matches a domain, so a guest cannot unlock one with Host: 203.0.113.10 or an SNI-less
// ClientHello. UDP and ICMP start at step 2.
func Judge(p Policy, env Env, proto Proto, dst netip.Addr, port uint16, name string) Decision {
	if proto == TCP && (port == PortHTTP || port == PortHTTPS) {
		if host, ok := HostName(name); ok {
			if pat, ok := p.MatchDomain(host); ok {
				return Decision{Verdict: Allow, Stage: StageDomain, Rule: pat}
			}
		}
	}
	if !dst.IsValid() {
		return Decision{Verdict: Deny, Stage: StageAlwaysDenied, Rule: "invalid address"}
	}
	dst = dst.Unmap().WithZone("")
	if pfx, ok := covering(env.alwaysDenied(), dst); ok && !covers(env.InternalAllow, dst) {
		return Decision{Verdict: Deny, Stage: StageAlwaysDenied, Rule: pfx.String()}
	}
	if pfx, ok := covering(p.AllowOut, dst); ok {
		return Decision{Verdict: Allow, Stage: StageAllowOut, Rule: pfx.String()}
	}
	if pfx, ok := covering(p.DenyOut, dst); ok {
		return Decision{Verdict: Deny, Stage: StageDenyOut, Rule: pfx.String()}
	}
	return Decision{Verdict: Allow, Stage: StageDefault}
}

// Dialable reports whether the node may dial a for a domain-allowed flow: never an address in an
// always-denied range unless --egress-internal-allow exempts it (seed "Matching", step 1). The
// sandbox's denyOut does not apply: the domain already allowed the flow.
func (e Env) Dialable(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	a = a.Unmap().WithZone("")
	if a.IsUnspecified() || a.IsMulticast() {
		return false
	}
	return !covers(e.alwaysDenied(), a) || covers(e.InternalAllow, a)
}

// MatchDomain returns the allowOut domain pattern that covers host (already normalised by
// HostName): "*" covers every name, "*.example.com" strict subdomains at any depth (not the
// apex), "example.com" only itself.
func (p Policy) MatchDomain(host string) (string, bool) {
	for _, pat := range p.AllowDomains {
		if domainCovers(pat, host) {
			return pat, true
		}
	}
	return "", false
}

func domainCovers(pat, host string) bool {
	switch {
	case pat == "*":
		return true
	case strings.HasPrefix(pat, "*."):
		suffix := pat[1:] // ".example.com"
		return len(host) > len(suffix) && strings.HasSuffix(host, suffix)
	default:
		return host == pat
	}
}

// HostName turns an HTTP Host header or a TLS server name into the form domain patterns match:
// lower-case, without a port (Host) or a trailing dot. It reports false for anything that is not
// a hostname — an IP literal (bracketed or not), an empty value, a malformed name — so that such
// values can never match a domain.
func HostName(s string) (string, bool) {
	h := s
	if host, _, err := net.SplitHostPort(s); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "" || strings.ContainsAny(h, "[]:") {
		return "", false
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return "", false
	}
	if checkHostname(h) != nil {
		return "", false
	}
	return h, true
}

// covering returns the first prefix of ps that contains a, unmapped and masked as covers does.
func covering(ps []netip.Prefix, a netip.Addr) (netip.Prefix, bool) {
	for _, p := range ps {
		if q := unmapPrefix(p).Masked(); q.Contains(a) {
			return q, true
		}
	}
	return netip.Prefix{}, false
}

// DialTargets returns, in order, the addresses of a domain-allowed flow's name the node may dial
// (Dialable). Empty means the flow is refused at step 2: the name leads only into always-denied
// ranges.
func (e Env) DialTargets(addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if e.Dialable(a) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// MatchRule returns the header rule for host (normalised by HostName): the most specific key
// wins — an exact name over any wildcard, a longer wildcard suffix over a shorter one — and
// rules of several matching keys are never merged (seed "HTTPS header rules").
func (p Policy) MatchRule(host string) (HeaderRule, bool) {
	best, found := HeaderRule{}, false
	for _, r := range p.Rules {
		if !domainCovers(r.Domain, host) {
			continue
		}
		if !found || moreSpecific(r.Domain, best.Domain) {
			best, found = r, true
		}
	}
	return best, found
}

// moreSpecific reports whether rule key a beats b for a name both cover.
func moreSpecific(a, b string) bool {
	aw, bw := strings.HasPrefix(a, "*."), strings.HasPrefix(b, "*.")
	if aw != bw {
		return !aw
	}
	return len(a) > len(b)
}

// ReachesAnyAddress reports whether the policy lets a sandbox reach addresses it never named: no
// denyOut covers the whole IPv4 space, or an allowOut does. A filtering resolver gains nothing by
// refusing names to such a sandbox (seed 002, "Names").
func (p Policy) ReachesAnyAddress() bool {
	all := func(ps []netip.Prefix) bool {
		for _, q := range ps {
			if q.Bits() == 0 && q.Addr().Is4() {
				return true
			}
		}
		return false
	}
	return all(p.AllowOut) || !all(p.DenyOut)
}
