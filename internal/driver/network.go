package driver

import (
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Network is a sandbox's network configuration as E2B clients send it (SandboxNetworkConfig). The
// driver validates and stores it; enforcing egress is the node's job.
type Network struct {
	// AllowPublicTraffic false means ingress requires the traffic access token. Default true.
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
	// AllowOut entries are CIDRs, IPs or domain names ("example.com", "*.example.com").
	AllowOut []string `json:"allowOut,omitempty"`
	// DenyOut entries are CIDRs or IPs.
	DenyOut         []string                 `json:"denyOut,omitempty"`
	MaskRequestHost *string                  `json:"maskRequestHost,omitempty"`
	Rules           map[string][]NetworkRule `json:"rules,omitempty"`
	EgressProxy     *EgressProxy             `json:"egressProxy,omitempty"`
	HTTPSPorts      []int                    `json:"httpsPorts,omitempty"`
}

// NetworkRule is a per-domain transform applied to egress HTTP(S) requests.
type NetworkRule struct {
	Transform *NetworkTransform `json:"transform,omitempty"`
}

// NetworkTransform lists headers to set on matching requests.
type NetworkTransform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// EgressProxy routes the sandbox's egress through an upstream proxy.
type EgressProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// PublicTraffic reports whether ingress is open without a traffic token (the default).
func (n *Network) PublicTraffic() bool {
	return n == nil || n.AllowPublicTraffic == nil || *n.AllowPublicTraffic
}

// Validate checks every entry and returns an InvalidArgument error naming the first bad one.
func (n *Network) Validate() error {
	if n == nil {
		return nil
	}
	for i, e := range n.AllowOut {
		if !validCIDROrIP(e) && !validDomainPattern(e) {
			return errdefs.InvalidArgument("network.allowOut[%d]: %q is not a CIDR, IP address or domain name", i, e)
		}
	}
	for i, e := range n.DenyOut {
		if !validCIDROrIP(e) {
			return errdefs.InvalidArgument("network.denyOut[%d]: %q is not a CIDR or IP address (domains are not supported in denyOut)", i, e)
		}
	}
	for domain, rules := range n.Rules {
		if !validDomainPattern(domain) {
			return errdefs.InvalidArgument("network.rules: %q is not a domain name", domain)
		}
		for _, r := range rules {
			if r.Transform == nil {
				continue
			}
			for h := range r.Transform.Headers {
				if !validHeaderName(h) {
					return errdefs.InvalidArgument("network.rules[%q]: invalid header name %q", domain, h)
				}
			}
		}
	}
	if p := n.EgressProxy; p != nil {
		host, port, err := net.SplitHostPort(p.Address)
		if err != nil || host == "" || !validPort(port) {
			return errdefs.InvalidArgument("network.egressProxy.address: %q is not host:port", p.Address)
		}
	}
	for i, p := range n.HTTPSPorts {
		if p < 1 || p > 65535 {
			return errdefs.InvalidArgument("network.httpsPorts[%d]: %d is not a port number", i, p)
		}
	}
	return nil
}

func validCIDROrIP(s string) bool {
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// validDomainPattern accepts "example.com" and "*.example.com" with RFC 1123 labels.
func validDomainPattern(s string) bool {
	s = strings.TrimPrefix(strings.ToLower(s), "*.")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '_' {
				return false
			}
		}
	}
	return true
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		// RFC 9110 token characters.
		if c > 0x7e || c <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	return true
}

func validPort(s string) bool {
	p, err := strconv.Atoi(s)
	return err == nil && p >= 1 && p <= 65535
}
