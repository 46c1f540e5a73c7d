package driver

import (
	"context"
	"fmt"

	"github.com/vibemon/vmon/internal/store"
)

// Recover reconciles records with what survived a restart. It must run once after New and before
// serving. alive reports whether the node still runs a sandbox's runtime.
//
//   - running records whose runtime is alive are tracked again: ingress routes and expiry timers
//     are restored (already expired ones are killed at once by the expiry loop);
//   - running records whose runtime is gone are destroyed on the node (removing leftovers such as
//     directories and links; "already gone" is success) and marked killed;
//   - records still creating belong to a create the restart interrupted: destroyed and marked killed.
func (d *Driver) Recover(ctx context.Context, alive func(id string) bool) error {
	if alive == nil {
		return fmt.Errorf("driver: Recover needs an alive function")
	}
	recs, err := d.store.ListSandboxes(ctx, store.SandboxQuery{
		States: []store.SandboxState{store.StateCreating, store.StateRunning},
		NodeID: d.opts.NodeID,
	})
	if err != nil {
		return fmt.Errorf("load sandboxes to recover: %w", err)
	}
	var kept, killed int
	for _, sb := range recs {
		if sb.State == store.StateRunning && alive(sb.ID) {
			d.track(sb)
			kept++
			continue
		}
		reason := ReasonRuntimeGone
		if sb.State == store.StateCreating {
			reason = ReasonInterrupted
		}
		d.destroyQuietly(ctx, sb.ID)
		if err := d.store.MarkKilled(ctx, sb.ID, d.now(), reason); err != nil {
			return fmt.Errorf("mark sandbox %s killed: %w", sb.ID, err)
		}
		d.log.Info("sandbox not recovered", "sandbox", sb.ID, "reason", reason)
		killed++
	}
	d.log.Info("recovered sandboxes", "running", kept, "killed", killed)
	return nil
}

// Orphans returns the ids in live (what the node found running after a restart) that no running
// record owns, e.g. a sandbox killed in the store whose destroy never reached the node. Call it
// after Recover; the caller destroys them on the node so nothing is left that no record owns.
func (d *Driver) Orphans(live []string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, id := range live {
		if _, ok := d.routes[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}
