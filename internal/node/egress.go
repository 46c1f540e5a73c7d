package node

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

// Feature names a node advertises for placement (seed 000, "Network modes").
const FeatureNetTap = "net-tap"

// Features lists what this node can do for placement: net-tap with a network, egress-domains
// and egress-proxy when its transparent egress proxy runs.
func (n *Node) Features() []string {
	if n.opts.Network == nil {
		return nil
	}
	out := []string{FeatureNetTap}
	if n.opts.EgressProxy {
		out = append(out, egress.FeatureDomains, egress.FeatureProxy)
	}
	return out
}

// recordPolicy writes the sandbox's egress policy next to it (0600: an egress proxy's password
// may be in it), for recovery.
func (n *Node) recordPolicy(sb *sandbox, p egress.Policy) error {
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode egress policy: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(n.sandboxDir(sb.runtimeID), policyFile), b); err != nil {
		return fmt.Errorf("record egress policy: %w", err)
	}
	sb.policy.Store(&p)
	return nil
}

// restorePolicy puts a recovered sandbox's recorded policy back in force: the chains survived in
// the kernel, but the proxy lost its view of the sandbox with the process. A sandbox recorded
// before policies were kept has none, and its domain flows fail closed.
func (n *Node) restorePolicy(ctx context.Context, sb *sandbox) error {
	b, err := os.ReadFile(filepath.Join(n.sandboxDir(sb.runtimeID), policyFile))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var p egress.Policy
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("decode recorded egress policy of %s: %w", sb.id, err)
	}
	sb.policy.Store(&p)
	return n.opts.Network.Update(ctx, sb.link, p)
}

// UpdateEgress replaces a running sandbox's egress policy in one transaction; established TCP
// connections survive.
func (n *Node) UpdateEgress(ctx context.Context, id string, p egress.Policy) error {
	sb, ok := n.lookup(id)
	if !ok {
		return errdefs.NotFound("sandbox %q not found", id)
	}
	if sb.link == nil {
		return errdefs.Unavailable("this node cannot network sandboxes: no egress policy to update")
	}
	if len(p.RequiredFeatures()) > 0 && !n.opts.EgressProxy {
		return errdefs.InvalidArgument("this node cannot enforce this policy (it lacks %v)", p.RequiredFeatures())
	}
	if err := n.opts.Network.Update(ctx, sb.link, p); err != nil {
		return err
	}
	return n.recordPolicy(sb, p)
}
