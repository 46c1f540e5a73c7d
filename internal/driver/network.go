package driver

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

// Network is a sandbox's network configuration as E2B clients send it (SandboxNetworkConfig). The
// driver validates and normalises it and stores the normal form on the record; the egress part
// becomes an egress.Policy that the node enforces.
type Network struct {
	// AllowPublicTraffic false means ingress requires the traffic access token. Default true.
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
	// AllowOut entries are CIDRs, IPs or domain names ("example.com", "*.example.com", "*").
	AllowOut []string `json:"allowOut,omitempty"`
	// DenyOut entries are CIDRs or IPs.
	DenyOut         []string                 `json:"denyOut,omitempty"`
	MaskRequestHost *string                  `json:"maskRequestHost,omitempty"`
	Rules           map[string][]NetworkRule `json:"rules,omitempty"`
	EgressProxy     *EgressProxy             `json:"egressProxy,omitempty"`
	HTTPSPorts      []int                    `json:"httpsPorts,omitempty"`
}

// The egress parts of the wire format are egress's own types, so that the API edge never needs
// to import egress to decode them.
type (
	// NetworkRule is a per-domain transform applied to HTTPS requests.
	NetworkRule = egress.Rule
	// NetworkTransform lists headers to set on matching requests.
	NetworkTransform = egress.Transform
	// EgressProxy tunnels the sandbox's egress through a SOCKS5 proxy.
	EgressProxy = egress.ProxyConfig
	// EgressProxyTLS wraps the hop to the proxy in TLS.
	EgressProxyTLS = egress.ProxyTLS
	// NetworkUpdate is the body of PUT /sandboxes/{id}/network (SandboxNetworkUpdateConfig): the
	// whole egress configuration, replacing the previous one.
	NetworkUpdate = egress.Config
)

// Node features the driver checks before placing a sandbox. The egress ones are
// egress.FeatureDomains and egress.FeatureProxy.
const (
	// FeatureNetTap: a Linux node with CAP_NET_ADMIN that gives sandboxes TAP/veth links.
	FeatureNetTap = "net-tap"
	// FeatureNetUser: a node whose VMMs network sandboxes in user mode (macOS).
	FeatureNetUser = "net-user"
)

// NoCompatibleNodeErrorCode is E2B's error_code when no node can run a sandbox as asked.
const NoCompatibleNodeErrorCode = "sandbox_no_compatible_node"

// noNetworkMessage is the seed's text for a node started without CAP_NET_ADMIN, so that the
// operator sees the same words in the start-up warning and in every refused create.
const noNetworkMessage = "no CAP_NET_ADMIN: this node cannot network sandboxes and will reject creates"

// PublicTraffic reports whether ingress is open without a traffic token (the default).
func (n *Network) PublicTraffic() bool {
	return n == nil || n.AllowPublicTraffic == nil || *n.AllowPublicTraffic
}

// egressConfig is the egress part of n, with the create body's allow_internet_access.
func (n *Network) egressConfig(allowInternetAccess *bool) egress.Config {
	c := egress.Config{AllowInternetAccess: allowInternetAccess}
	if n != nil {
		c.AllowOut, c.DenyOut, c.Rules, c.EgressProxy = n.AllowOut, n.DenyOut, n.Rules, n.EgressProxy
	}
	return c
}

// withEgress returns n with its egress fields replaced by c's (ingress settings kept).
func (n Network) withEgress(c egress.Config) Network {
	n.AllowOut, n.DenyOut, n.Rules, n.EgressProxy = c.AllowOut, c.DenyOut, c.Rules, c.EgressProxy
	return n
}

// normalizeNetwork validates a create's network settings and returns the normal form to store
// (nil when the client sent none) and the policy the node must enforce.
func normalizeNetwork(n *Network, allowInternetAccess *bool) (*Network, egress.Policy, error) {
	norm, err := egress.Normalize(n.egressConfig(allowInternetAccess))
	if err != nil {
		return nil, egress.Policy{}, err
	}
	p, err := egress.Parse(norm)
	if err != nil {
		return nil, egress.Policy{}, fmt.Errorf("re-parse normalised egress config: %w", err)
	}
	if n == nil {
		return nil, p, nil
	}
	for i, port := range n.HTTPSPorts {
		if port < 1 || port > 65535 {
			return nil, egress.Policy{}, errdefs.InvalidArgument("network.httpsPorts[%d]: %d is not a port number", i, port)
		}
	}
	out := n.withEgress(norm)
	return &out, p, nil
}

// decodeNetwork reads a record's stored network configuration ("{}" or empty when none).
func decodeNetwork(raw json.RawMessage) (Network, error) {
	var n Network
	if len(raw) == 0 {
		return n, nil
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return Network{}, errdefs.Wrap(errdefs.KindUnknown, err, "failed to read the sandbox's network configuration")
	}
	return n, nil
}

// NetworkOf returns a sandbox's network configuration as GET /sandboxes/{id} shows it: the
// normal form stored at create or by the last live update, with allowPublicTraffic always set
// and without the proxy password and CA bundle.
func NetworkOf(sb Sandbox) (Network, error) {
	n, err := decodeNetwork(sb.Network)
	if err != nil {
		return Network{}, err
	}
	public := sb.AllowPublicTraffic
	n.AllowPublicTraffic = &public
	return n.withEgress(n.egressConfig(nil).Redacted()), nil
}

// policyOf rebuilds the policy a record stands for.
func policyOf(sb Sandbox) (egress.Policy, error) {
	n, err := decodeNetwork(sb.Network)
	if err != nil {
		return egress.Policy{}, err
	}
	return egress.Parse(n.egressConfig(sb.AllowInternetAccess))
}

func (d *Driver) features() []string {
	if d.opts.FeaturesNow != nil {
		return d.opts.FeaturesNow()
	}
	return d.opts.Features
}

func (d *Driver) hasFeature(f string) bool { return slices.Contains(d.features(), f) }

// NodeFeatures is the optional part of a Node that says what one node of several can do (a
// cluster's router): a live update must be enforceable where the sandbox runs, not somewhere.
type NodeFeatures interface {
	NodeFeatures(name string) ([]string, bool)
}

// featuresOn is what node can do: the cluster's node's own features when known, else the
// driver's.
func (d *Driver) featuresOn(node string) []string {
	if nf, ok := d.node.(NodeFeatures); ok && node != "" {
		if fs, ok := nf.NodeFeatures(node); ok {
			return fs
		}
	}
	return d.features()
}

// missingFeaturesOn lists what p needs that node ("": any) lacks.
func (d *Driver) missingFeaturesOn(node string, p egress.Policy) []string {
	have := d.featuresOn(node)
	var out []string
	for _, f := range p.RequiredFeatures() {
		if !slices.Contains(have, f) {
			out = append(out, f)
		}
	}
	return out
}

// describeMissingOn explains which parts of a policy need the missing features and what node
// offers instead.
func (d *Driver) describeMissingOn(node string, missing []string) string {
	uses := make([]string, len(missing))
	for i, f := range missing {
		uses[i] = featureUse(f)
	}
	offers := "none"
	if fs := d.featuresOn(node); len(fs) > 0 {
		offers = strings.Join(fs, ", ")
	}
	return strings.Join(uses, "; ") + " (node features: " + offers + ")"
}

// featureUse says what in a policy needs a feature, for error messages.
func featureUse(f string) string {
	switch f {
	case egress.FeatureDomains:
		return "domain entries in network.allowOut need the " + f + " feature"
	case egress.FeatureProxy:
		return "network.rules and network.egressProxy need the " + f + " feature"
	default:
		return "the network policy needs the " + f + " feature"
	}
}

// checkPlacement refuses a create no node can serve (503 sandbox_no_compatible_node): a node that
// cannot network sandboxes at all (seed "Network modes"), or one that lacks a feature the policy
// needs (seed "Platform support").
func (d *Driver) checkPlacement(p egress.Policy) error {
	if !d.hasFeature(FeatureNetTap) && !d.hasFeature(FeatureNetUser) {
		return errdefs.WithCode(errdefs.Unavailable("%s", noNetworkMessage), NoCompatibleNodeErrorCode)
	}
	if missing := d.missingFeaturesOn("", p); len(missing) > 0 {
		return errdefs.WithCode(errdefs.Unavailable("no node can enforce this network policy: %s",
			d.describeMissingOn("", missing)), NoCompatibleNodeErrorCode)
	}
	return nil
}
