package driver

import (
	"context"
	"fmt"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

// Reasons for sandboxes a node's absence ended.
const (
	// ReasonNodeLost ends a sandbox whose node stayed out of reach past the grace period.
	ReasonNodeLost = "its node was lost"
	// ReasonGoneFromNode ends a sandbox its node no longer held when it came back.
	ReasonGoneFromNode = "gone from its node"
)

// NodeOut marks node out of reach (gossip lost it, or it left): traffic to its sandboxes fails
// at once with the edge's 502 rather than waiting on an address nobody answers, and a kill of
// one is recorded at once (the node destroys it when it is back: NodeBack). Its records stay as
// they are; NodeLost ends them.
func (d *Driver) NodeOut(node string) {
	if node == "" {
		return
	}
	d.mu.Lock()
	d.out[node] = true
	d.mu.Unlock()
}

// NodeIsOut reports whether node is marked out of reach.
func (d *Driver) NodeIsOut(node string) bool {
	if node == "" {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out[node]
}

// Holdings are what a node says it holds: the sandboxes it runs and those it keeps paused.
type Holdings struct {
	Running, Paused []string
}

// Cleaner removes from a node what no record places there.
type Cleaner interface {
	DestroySandbox(ctx context.Context, id string) error
	DeletePaused(ctx context.Context, id string) error
}

// NodeBack reconciles the records with what a node that was out of reach holds, then serves its
// sandboxes again:
//   - a running record on it whose sandbox it no longer holds is ended;
//   - a sandbox it runs that no running record places there (killed meanwhile, ended by
//     NodeLost, or run by another node since) is destroyed there, so none runs twice;
//   - a paused copy no paused record places there (the sandbox resumed elsewhere meanwhile, or
//     was killed) is deleted there, so a stale copy is never resumed.
func (d *Driver) NodeBack(ctx context.Context, node string, held Holdings, c Cleaner) error {
	running := map[string]bool{}
	for _, id := range held.Running {
		running[id] = true
	}
	recs, err := d.store.ListSandboxes(ctx, store.SandboxQuery{States: []store.SandboxState{store.StateRunning}, NodeID: node})
	if err != nil {
		return fmt.Errorf("sandboxes of node %s: %w", node, err)
	}
	pausedHere := map[string]bool{}
	for _, id := range held.Paused {
		pausedHere[id] = true
	}
	for _, sb := range recs {
		switch {
		case running[sb.ID]:
		case pausedHere[sb.ID]:
			// Paused there though its record says running (the pause's answer never came back):
			// the node's word is taken, so its saved state is kept.
			d.pausedOnNode(ctx, sb.ID, node)
		default:
			d.endOnNode(ctx, sb.ID, node, ReasonGoneFromNode)
		}
	}
	var strays, stale int
	for _, id := range held.Running {
		placed, err := d.placedOn(ctx, id, node, store.StateRunning, func() error { return c.DestroySandbox(ctx, id) })
		if err != nil {
			return err
		}
		if !placed {
			strays++
		}
	}
	for _, id := range held.Paused {
		placed, err := d.placedOn(ctx, id, node, store.StatePaused, func() error { return c.DeletePaused(ctx, id) })
		if err != nil {
			return err
		}
		if !placed {
			stale++
		}
	}
	d.mu.Lock()
	delete(d.out, node)
	d.mu.Unlock()
	d.log.Info("node back", "node", node, "running", len(held.Running), "paused", len(held.Paused),
		"strays destroyed", strays, "stale copies deleted", stale)
	return nil
}

// placedOn reports whether sandbox id's record places it on node in state; if not, it removes it
// from node with remove, under the sandbox's lock (a pause or resume of it in flight finishes
// first, and its record then says where it is).
func (d *Driver) placedOn(ctx context.Context, id, node string, state store.SandboxState, remove func() error) (bool, error) {
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.store.GetSandbox(ctx, id)
	if err == nil && sb.State == state && sb.NodeID == node {
		return true, nil
	}
	if err == nil && sb.State == store.StateCreating {
		// A create under way (this driver's, or another's sharing the store) that the node
		// already runs: it finishes, or its failure or interruption removes it.
		return true, nil
	}
	if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		return false, err
	}
	if err := remove(); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		d.log.Warn("removing a sandbox no record places on its node", "sandbox", id, "node", node, "state", state, "err", err)
	}
	return false, nil
}

// NodeLost ends the running records of a node that stayed out of reach: their sandboxes count as
// gone, and if the node comes back after all, NodeBack destroys what it still runs.
func (d *Driver) NodeLost(ctx context.Context, node string) error {
	recs, err := d.store.ListSandboxes(ctx, store.SandboxQuery{States: []store.SandboxState{store.StateRunning}, NodeID: node})
	if err != nil {
		return fmt.Errorf("sandboxes of node %s: %w", node, err)
	}
	for _, sb := range recs {
		d.endOnNode(ctx, sb.ID, node, ReasonNodeLost)
	}
	d.log.Warn("node lost: its running sandboxes ended", "node", node, "sandboxes", len(recs))
	return nil
}

// RunningOn lists the running sandboxes recorded on node.
func (d *Driver) RunningOn(ctx context.Context, node string) ([]string, error) {
	recs, err := d.store.ListSandboxes(ctx, store.SandboxQuery{States: []store.SandboxState{store.StateRunning}, NodeID: node})
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(recs))
	for i, sb := range recs {
		ids[i] = sb.ID
	}
	return ids, nil
}

// pausedOnNode records sandbox id paused if its record still says running on node.
func (d *Driver) pausedOnNode(ctx context.Context, id, node string) {
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil || sb.State != store.StateRunning || sb.NodeID != node {
		return
	}
	d.forget(id)
	// Memory is said kept: a resume finds out from the saved state whether it was.
	if err := d.store.MarkPaused(ctx, id, d.now(), true, 0); err != nil {
		d.log.Error("record a sandbox its node holds paused", "sandbox", id, "node", node, "err", err)
		return
	}
	d.log.Info("sandbox paused (its node holds it paused)", "sandbox", id, "node", node)
	d.sbLog(id, sandboxlog.LevelInfo, pausedMessage(true), "memory", "true", "node", node)
}

// endOnNode marks sandbox id killed for reason if it still runs on node, without asking the node.
func (d *Driver) endOnNode(ctx context.Context, id, node, reason string) {
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil || sb.State != store.StateRunning || sb.NodeID != node {
		return
	}
	d.forget(id)
	if err := d.store.MarkKilled(ctx, id, d.now(), reason); err != nil {
		d.log.Error("mark a sandbox of an absent node killed", "sandbox", id, "node", node, "err", err)
		return
	}
	d.log.Info("sandbox ended", "sandbox", id, "node", node, "reason", reason)
	d.sbEnded(id, reason)
}
