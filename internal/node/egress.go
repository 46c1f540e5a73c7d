package node

import (
	"context"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

// UpdateEgress replaces a running sandbox's egress policy. Until the node has per-sandbox links
// (netpool), sandboxes have loopback only and there is nothing to enforce a policy on, so the
// node refuses instead of pretending.
func (n *Node) UpdateEgress(_ context.Context, id string, _ egress.Policy) error {
	if _, ok := n.lookup(id); !ok {
		return errdefs.NotFound("sandbox %q not found", id)
	}
	return errdefs.Unavailable("this node cannot network sandboxes yet: egress policies are not enforced")
}
