package driver

import (
	"context"
	"fmt"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

// Recover reconciles records with what survived a restart. It must run once after New and before
// serving. alive reports whether the node still runs a sandbox's runtime, paused whether it holds
// a sandbox paused (nil: the node cannot pause).
//
//   - running records whose runtime is alive are tracked again: ingress routes and expiry timers
//     are restored (already expired ones are killed at once by the expiry loop);
//   - running records the node holds paused (a pause the crash interrupted and recovery finished)
//     become paused; paused records whose runtime is alive (a resume that got that far) running;
//   - paused records the node still holds stay paused, untracked (a paused sandbox has no timer);
//   - everything else is destroyed on the node (removing leftovers such as directories and
//     links; "already gone" is success) and marked killed; records still creating belong to a
//     create the restart interrupted.
//
// Paused sandboxes on the node that no record owns are deleted.
func (d *Driver) Recover(ctx context.Context, alive, paused func(id string) bool) error {
	if alive == nil {
		return fmt.Errorf("driver: Recover needs an alive function")
	}
	if paused == nil {
		paused = func(string) bool { return false }
	}
	recs, err := d.store.ListSandboxes(ctx, store.SandboxQuery{
		States: []store.SandboxState{store.StateCreating, store.StateRunning, store.StatePaused},
		NodeID: d.opts.NodeID,
	})
	if err != nil {
		return fmt.Errorf("load sandboxes to recover: %w", err)
	}
	var kept, killed, held int
	for _, sb := range recs {
		switch {
		case sb.State == store.StateRunning && alive(sb.ID):
			d.track(sb)
			kept++
			continue
		case sb.State == store.StateRunning && paused(sb.ID):
			if err := d.store.MarkPaused(ctx, sb.ID, d.now(), false, 0); err != nil {
				return fmt.Errorf("mark sandbox %s paused: %w", sb.ID, err)
			}
			d.log.Info("sandbox paused by recovery (its pause was interrupted)", "sandbox", sb.ID)
			held++
			continue
		case sb.State == store.StatePaused && alive(sb.ID):
			end := d.now().Add(d.opts.DefaultTimeout)
			if err := d.store.MarkResumed(ctx, sb.ID, end); err != nil {
				return fmt.Errorf("mark sandbox %s running: %w", sb.ID, err)
			}
			sb.State, sb.EndAt = store.StateRunning, end
			d.track(sb)
			d.log.Info("sandbox running after recovery (its resume was interrupted)", "sandbox", sb.ID)
			kept++
			continue
		case sb.State == store.StatePaused && paused(sb.ID):
			held++
			continue
		}
		reason := ReasonRuntimeGone
		switch sb.State {
		case store.StateCreating:
			reason = ReasonInterrupted
		case store.StatePaused:
			reason = ReasonResumeFailed + ": its saved state is gone"
		}
		d.destroyQuietly(ctx, sb.ID)
		if err := d.store.MarkKilled(ctx, sb.ID, d.now(), reason); err != nil {
			return fmt.Errorf("mark sandbox %s killed: %w", sb.ID, err)
		}
		d.log.Info("sandbox not recovered", "sandbox", sb.ID, "reason", reason)
		killed++
	}
	d.log.Info("recovered sandboxes", "running", kept, "paused", held, "killed", killed)
	return nil
}

// PausedOrphans returns the ids in paused (what the node holds paused) that no paused record owns.
// Call it after Recover; the caller deletes them on the node.
func (d *Driver) PausedOrphans(ctx context.Context, paused []string) ([]string, error) {
	var out []string
	for _, id := range paused {
		sb, err := d.store.GetSandbox(ctx, id)
		if errdefs.Is(err, errdefs.KindNotFound) || (err == nil && sb.State != store.StatePaused) {
			out = append(out, id)
			continue
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
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
