package egress

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
)

// AllTraffic is E2B's ALL_TRAFFIC: the only form of an unspecified address a policy accepts. It
// stands for every IPv4 and IPv6 destination.
const AllTraffic = "0.0.0.0/0"

// implicitDNS is allowed whenever allowOut has domains, so that a guest under deny-all can still
// resolve the names it is allowed to reach (E2B does the same).
var implicitDNS = netip.MustParsePrefix("8.8.8.8/32")

// Config is a sandbox's egress configuration in E2B's API form: the egress fields of
// SandboxNetworkConfig plus allow_internet_access. Its JSON is exactly SandboxNetworkUpdateConfig,
// the body of PUT /sandboxes/{id}/network.
type Config struct {
	// AllowInternetAccess false is the same as denyOut [0.0.0.0/0], whatever denyOut says.
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
	// AllowOut entries are IPs, CIDRs or domains ("example.com", "*.example.com", "*").
	AllowOut []string `json:"allowOut,omitempty"`
	// DenyOut entries are IPs or CIDRs.
	DenyOut []string `json:"denyOut,omitempty"`
	// Rules maps a host ("example.com" or "*.example.com") to at most one rule.
	Rules       map[string][]Rule `json:"rules,omitempty"`
	EgressProxy *ProxyConfig      `json:"egressProxy,omitempty"`
}

// Rule is a per-domain transform applied to HTTPS requests (SandboxNetworkRule).
type Rule struct {
	Transform *Transform `json:"transform,omitempty"`
}

// Transform lists headers to set on matching requests.
type Transform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// ProxyConfig is E2B's egressProxy: a SOCKS5 proxy the sandbox's TCP egress is tunnelled through.
type ProxyConfig struct {
	Address  string    `json:"address"`
	Username string    `json:"username,omitempty"`
	Password string    `json:"password,omitempty"`
	TLS      *ProxyTLS `json:"tls,omitempty"`
}

// ProxyTLS wraps the hop to the proxy in TLS.
type ProxyTLS struct {
	Enabled    bool   `json:"enabled"`
	ServerName string `json:"serverName,omitempty"`
	// CACert is PEM, at most MaxCACertBytes; it replaces the system roots when set.
	CACert string `json:"caCert,omitempty"`
}

// Redacted returns c without what must never be read back: the proxy password and CA bundle
// (the bundle is public, but large, and E2B withholds it too).
func (c Config) Redacted() Config {
	if c.EgressProxy != nil {
		p := *c.EgressProxy
		p.Password = ""
		if p.TLS != nil {
			t := *p.TLS
			t.CACert = ""
			p.TLS = &t
		}
		c.EgressProxy = &p
	}
	return c
}

// Normalize validates c and returns it in normal form, which is what a sandbox record stores and
// what GET /sandboxes/{id} shows: entries trimmed, bare addresses as /32 or /128, CIDRs masked to
// their network, IPv4-mapped IPv6 entries as IPv4, domains lower-case without a trailing dot,
// duplicates dropped, rule domains lower-case, the proxy host lower-case. Errors are
// errdefs.InvalidArgument and name the first offending entry.
func Normalize(c Config) (Config, error) {
	n, _, err := parse(c)
	return n, err
}

// Parse validates c and returns the policy it means (see Policy for its invariants).
// Normalize(c) and c give the same policy.
func Parse(c Config) (Policy, error) {
	_, p, err := parse(c)
	return p, err
}

func parse(c Config) (Config, Policy, error) {
	var (
		n Config
		p Policy
	)
	n.AllowInternetAccess = c.AllowInternetAccess
	denyAll := c.AllowInternetAccess != nil && !*c.AllowInternetAccess

	seen := map[string]bool{}
	for i, raw := range c.AllowOut {
		e, pfx, domain, err := parseEntry(raw, true)
		if err != nil {
			return Config{}, Policy{}, errdefs.InvalidArgument("network.allowOut[%d]: %s: %s", i, quote(raw), err)
		}
		if seen[e] {
			continue
		}
		seen[e] = true
		n.AllowOut = append(n.AllowOut, e)
		switch {
		case domain:
			p.AllowDomains = append(p.AllowDomains, e)
		case e == AllTraffic:
			p.AllowOut = appendPrefix(appendPrefix(p.AllowOut, pfx), netip.PrefixFrom(netip.IPv6Unspecified(), 0))
		default:
			p.AllowOut = appendPrefix(p.AllowOut, pfx)
		}
	}

	clear(seen)
	for i, raw := range c.DenyOut {
		e, pfx, _, err := parseEntry(raw, false)
		if err != nil {
			return Config{}, Policy{}, errdefs.InvalidArgument("network.denyOut[%d]: %s: %s", i, quote(raw), err)
		}
		if seen[e] {
			continue
		}
		seen[e] = true
		n.DenyOut = append(n.DenyOut, e)
		if e == AllTraffic {
			denyAll = true
			continue
		}
		p.DenyOut = appendPrefix(p.DenyOut, pfx)
	}
	if denyAll {
		// Everything else in denyOut is covered; E2B replaces denyOut the same way.
		p.DenyOut = []netip.Prefix{netip.PrefixFrom(netip.IPv4Unspecified(), 0), netip.PrefixFrom(netip.IPv6Unspecified(), 0)}
	}

	if len(p.AllowDomains) > 0 {
		// A domain entry only means something under deny-all: without it every destination is
		// allowed anyway and the entry would silently do nothing. allow_internet_access:false is
		// deny-all too, so it satisfies the requirement.
		if !denyAll {
			return Config{}, Policy{}, errdefs.InvalidArgument(
				"network.allowOut: domain entries (%s) require network.denyOut to contain %s (ALL_TRAFFIC) or allow_internet_access to be false; otherwise every destination is allowed anyway",
				quote(p.AllowDomains[0]), AllTraffic)
		}
		p.AllowOut = appendPrefix(p.AllowOut, implicitDNS)
	}

	var err error
	if n.Rules, p.Rules, err = parseRules(c.Rules); err != nil {
		return Config{}, Policy{}, err
	}
	if n.EgressProxy, p.Proxy, err = parseProxy(c.EgressProxy); err != nil {
		return Config{}, Policy{}, err
	}
	return n, p, nil
}

// parseEntry parses one allowOut (domains allowed) or denyOut entry into its normal form and, for
// addresses, its prefix.
func parseEntry(raw string, domains bool) (norm string, p netip.Prefix, isDomain bool, err error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return "", netip.Prefix{}, false, errString("an empty entry is not allowed")
	}
	if looksLikeAddress(s) {
		p, err := parsePrefix(s)
		if err != nil {
			if hint := portHint(s); hint != "" {
				return "", netip.Prefix{}, false, errString(hint)
			}
			return "", netip.Prefix{}, false, err
		}
		p = p.Masked()
		if p.Addr().IsUnspecified() {
			if s != AllTraffic {
				return "", netip.Prefix{}, false, errString("an unspecified address is only accepted as " + AllTraffic)
			}
			return AllTraffic, p, false, nil
		}
		return p.String(), p, false, nil
	}
	if !domains {
		if hint := portHint(s); hint != "" {
			return "", netip.Prefix{}, false, errString(hint)
		}
		if _, err := normDomain(s, true); err == nil {
			return "", netip.Prefix{}, false, errString("domains are only supported in allowOut; denyOut takes IP addresses and CIDRs")
		}
		return "", netip.Prefix{}, false, errString("not a valid IP address or CIDR")
	}
	d, err := normDomain(s, true)
	if err != nil {
		if hint := portHint(s); hint != "" {
			return "", netip.Prefix{}, false, errString(hint)
		}
		return "", netip.Prefix{}, false, errString("not a valid IP address, CIDR or domain: " + err.Error())
	}
	return d, netip.Prefix{}, true, nil
}

// looksLikeAddress reports whether s should be read as an IP or CIDR rather than a domain: it
// has a '/', a ':' that is not a single host:port separator, or parses as an address. Domains
// never contain either character, so nothing that is meant as a domain is misread.
func looksLikeAddress(s string) bool {
	if strings.Contains(s, "/") || strings.Count(s, ":") > 1 {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// portHint explains an entry that carries a port, which E2B's newer API accepts but vmon's seed
// does not.
func portHint(s string) string {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return ""
	}
	for _, c := range s[i+1:] {
		if c < '0' || c > '9' {
			return ""
		}
	}
	host := strings.TrimSuffix(strings.TrimPrefix(s[:i], "["), "]")
	if _, err := parsePrefix(host); err == nil {
		return "ports are not supported: give an IP address or CIDR without a port"
	}
	if _, err := normDomain(host, true); err == nil {
		return "ports are not supported: give a domain without a port"
	}
	return ""
}

// errString is a validation reason; the caller adds which field it is about.
type errString string

func (e errString) Error() string { return string(e) }

// quote quotes s for an error message, shortened so that a huge entry cannot blow up the response.
func quote(s string) string {
	const limit = 80
	if r := []rune(s); len(r) > limit {
		return strconv.Quote(string(r[:limit])) + "…"
	}
	return strconv.Quote(s)
}
