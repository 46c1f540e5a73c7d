package node

import (
	"net/netip"

	"github.com/vibemon/vmon/internal/denied"
	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

// DeniedEvent is one line of a sandbox's stream of refusals.
type DeniedEvent = denied.Event

// bySource finds the handed-out sandbox whose lease holds guest.
func (n *Node) bySource(guest netip.Addr) (*sandbox, bool) {
	guest = guest.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, sb := range n.sandboxes {
		if sb.id != "" && sb.link != nil && sb.link.Lease().Guest == guest {
			return sb, true
		}
	}
	return nil, false
}

// KernelRefused reports a packet the CIDR rules refused (NFLOG). Which rule refused it is
// recomputed with the reference engine from the sandbox's policy, which the rules were rendered
// from; a packet of no known sandbox (a pre-started one, or one just released) is dropped.
func (n *Node) KernelRefused(p denied.Packet) {
	if n.opts.Denied == nil {
		return
	}
	sb, ok := n.bySource(p.Src)
	if !ok {
		return
	}
	var pol egress.Policy
	if pp := sb.policy.Load(); pp != nil {
		pol = *pp
	}
	proto := map[string]egress.Proto{"tcp": egress.TCP, "udp": egress.UDP, "icmp": egress.ICMP}[p.Proto]
	d := egress.Judge(pol, n.opts.Env, proto, p.Dst, p.Port, "")
	stage, rule := string(d.Stage), d.Rule
	if d.Verdict == egress.Allow {
		// The policy allows it, so a rule outside the policy refused it: lease isolation.
		stage, rule = "isolation", "another sandbox or the node"
	}
	var name string
	if n.opts.Names != nil {
		name, _ = n.opts.Names.NameOf(p.Src, p.Dst)
	}
	n.publishDenied(denied.Event{SandboxID: sb.id, Proto: p.Proto, Dst: p.Dst.String(), Port: p.Port, Name: name, Stage: stage, Rule: rule})
}

// DNSRefused reports a question the filtering resolver refused.
func (n *Node) DNSRefused(guest netip.Addr, name, qtype string) {
	if n.opts.Denied == nil {
		return
	}
	sb, ok := n.bySource(guest)
	if !ok {
		return
	}
	n.publishDenied(denied.Event{SandboxID: sb.id, Proto: "dns", Dst: qtype, Port: 53, Name: name, Stage: "dns", Rule: "no allowOut domain covers the name"})
}

// ProxyRefused reports a flow the egress proxy refused (by name, or by address on a port it
// carries).
func (n *Node) ProxyRefused(guest netip.Addr, dst netip.Addr, port uint16, name, stage, rule string) {
	if n.opts.Denied == nil {
		return
	}
	sb, ok := n.bySource(guest)
	if !ok {
		return
	}
	n.publishDenied(denied.Event{SandboxID: sb.id, Proto: "tcp", Dst: dst.String(), Port: port, Name: name, Stage: stage, Rule: rule})
}

// WatchDenied returns the sandbox's recent refusals and a channel of the next ones; cancel ends
// the watch.
func (n *Node) WatchDenied(id string) ([]DeniedEvent, <-chan DeniedEvent, func(), error) {
	if n.opts.Denied == nil {
		return nil, nil, nil, errdefs.Unavailable("this node does not report refusals")
	}
	if _, ok := n.lookup(id); !ok {
		return nil, nil, nil, errdefs.NotFound("sandbox %q not found", id)
	}
	backlog, sub, cancel := n.opts.Denied.Subscribe(id)
	return backlog, sub.C(), cancel, nil
}

// forgetDenied drops an ended sandbox's backlog.
func (n *Node) forgetDenied(id string) {
	if n.opts.Denied != nil && id != "" {
		n.opts.Denied.Forget(id)
	}
}

// publishDenied puts a refusal on the sandbox's stream and, at debug level, in the log.
func (n *Node) publishDenied(e denied.Event) {
	n.log.Debug("egress refused", "sandbox", e.SandboxID, "proto", e.Proto, "dst", e.Dst, "port", e.Port,
		"name", e.Name, "stage", e.Stage, "rule", e.Rule)
	n.opts.Denied.Publish(e)
}
