package node

import (
	"context"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

// Feature names a node advertises for placement (seed 000, "Network modes").
const FeatureNetTap = "net-tap"

// Features lists what this node can do for placement.
func (n *Node) Features() []string {
	if n.opts.Network == nil {
		return nil
	}
	return []string{FeatureNetTap}
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
	return n.opts.Network.Update(ctx, sb.link, p)
}
