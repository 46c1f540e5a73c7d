package driver

import (
	"context"
	"fmt"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
)

// Recover reconciles records with what survived a restart. It must run once after New and before
// serving. recovering reports whether the node is still settling a sandbox it found (its runtime
// was alive, or a pause of it was under way); paused whether it holds a sandbox paused (nil: the
// node cannot pause).
//
//   - records of sandboxes the node is settling wait for Recovered; meanwhile the API answers
//     503 for them, since they may be back in a moment;
//   - paused records the node still holds stay paused, untracked (a paused sandbox has no timer),
//     and running ones it holds paused become paused (the pause was written, not recorded);
//   - everything else is destroyed on the node (removing leftovers such as directories and
//     links; "already gone" is success) and marked killed; records still creating belong to a
//     create the restart interrupted.
//
// Paused sandboxes on the node that no record owns are deleted (PausedOrphans).
func (d *Driver) Recover(ctx context.Context, recovering, paused func(id string) bool) error {
	if recovering == nil {
		return fmt.Errorf("driver: Recover needs a recovering function")
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
	var waiting, killed, held int
	for _, sb := range recs {
		switch {
		case sb.State != store.StateCreating && recovering(sb.ID):
			d.mu.Lock()
			d.recovering[sb.ID] = true
			d.mu.Unlock()
			waiting++
			continue
		case sb.State == store.StateRunning && paused(sb.ID):
			// Its pause was written whole, but the restart came before the record said so.
			if err := d.store.MarkPaused(ctx, sb.ID, d.now(), false, 0); err != nil {
				return fmt.Errorf("mark sandbox %s paused: %w", sb.ID, err)
			}
			d.log.Info("sandbox paused by recovery (its pause was interrupted)", "sandbox", sb.ID)
			held++
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
		d.sbEnded(sb.ID, reason)
		killed++
	}
	d.log.Info("recovering sandboxes", "settling", waiting, "paused", held, "killed", killed)
	return nil
}

// checkRecovered answers 503 for a sandbox the node is still settling after a restart.
func (d *Driver) checkRecovered(id string) error {
	d.mu.Lock()
	r := d.recovering[id]
	d.mu.Unlock()
	if r {
		return errdefs.Unavailable("sandbox %q is being recovered after a restart of vmon; try again in a few seconds", id)
	}
	return nil
}

// Recovered records what the node made of a sandbox it found at a restart (node.Recovery.Run):
//
//   - running: a running record is tracked again (ingress routes, expiry timer; one already
//     past its end is killed at once by the expiry loop); a paused record becomes running (a
//     resume that got that far) with the default timeout; a sandbox no live record owns (killed
//     in the store, its destroy never reached the node) is destroyed;
//   - paused: the record becomes paused (a pause the restart interrupted), and is resumed at
//     once when only a snapshot or fork had stopped it (nobody asked for a pause);
//   - gone: the record is marked killed.
func (d *Driver) Recovered(ctx context.Context, r node.Recovered) {
	unlock := d.lock(r.ID)
	defer unlock()
	// Answered 503 until the end: a snapshot's source is paused, then resumed, and nobody may
	// see it paused in between.
	defer func() {
		d.mu.Lock()
		delete(d.recovering, r.ID)
		d.mu.Unlock()
	}()
	sb, err := d.store.GetSandbox(ctx, r.ID)
	if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		d.log.Error("load a recovered sandbox's record", "sandbox", r.ID, "err", err)
		return
	}
	owned := err == nil && live(sb)
	switch {
	case r.State == node.RecoveredRunning && !owned:
		d.log.Info("destroying sandbox no record owns", "sandbox", r.ID)
		d.destroyQuietly(ctx, r.ID)
	case r.State == node.RecoveredRunning:
		if sb.State == store.StatePaused {
			end := d.now().Add(d.opts.DefaultTimeout)
			if err := d.store.MarkResumed(ctx, sb.ID, end, sb.NodeID); err != nil {
				d.log.Error("mark a recovered sandbox running", "sandbox", sb.ID, "err", err)
				return
			}
			sb.State, sb.EndAt = store.StateRunning, end
			d.log.Info("sandbox running after recovery (its resume was interrupted)", "sandbox", sb.ID)
		}
		d.track(sb)
		d.log.Info("sandbox recovered", "sandbox", sb.ID)
	case r.State == node.RecoveredPaused && !owned:
		if p, ok := d.node.(Pauser); ok {
			_ = p.DeletePaused(ctx, r.ID)
		}
	case r.State == node.RecoveredPaused:
		if sb.State == store.StateRunning {
			if err := d.store.MarkPaused(ctx, sb.ID, d.now(), r.Memory, 0); err != nil {
				d.log.Error("mark a recovered sandbox paused", "sandbox", sb.ID, "err", err)
				return
			}
			sb.State, sb.PausedMemory = store.StatePaused, r.Memory
		}
		d.log.Info("sandbox paused by recovery (its pause was interrupted)", "sandbox", sb.ID, "memory", r.Memory)
		if !r.Resume {
			return
		}
		// A snapshot or fork stopped it: it goes on as the caller left it, for what was left
		// of its timeout (at least a minute, so its owner can reach it).
		t := max(sb.EndAt.Sub(d.now()), time.Minute)
		if _, err := d.resumeLocked(ctx, sb, t, true); err != nil {
			d.log.Error("resume a sandbox whose snapshot the restart interrupted; it stays paused", "sandbox", sb.ID, "err", err)
			return
		}
		d.log.Info("sandbox resumed after recovery (its snapshot was interrupted)", "sandbox", sb.ID, "memory", r.Memory)
	default:
		if !owned {
			return
		}
		d.destroyQuietly(ctx, sb.ID)
		if err := d.store.MarkKilled(ctx, sb.ID, d.now(), ReasonRuntimeGone); err != nil {
			d.log.Error("mark a sandbox that did not survive killed", "sandbox", sb.ID, "err", err)
			return
		}
		d.log.Info("sandbox not recovered", "sandbox", sb.ID, "reason", ReasonRuntimeGone)
		d.sbEnded(sb.ID, ReasonRuntimeGone)
	}
}

// PausedOrphans returns the ids in paused (what the node holds paused) that no paused record owns.
// Call it after Recover; the caller deletes them on the node.
func (d *Driver) PausedOrphans(ctx context.Context, paused []string) ([]string, error) {
	var out []string
	for _, id := range paused {
		if d.checkRecovered(id) != nil {
			continue // the node settles it; Recovered decides
		}
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

// Adopt takes over the records at a start of a driver whose nodes run elsewhere (a cluster's
// driver role): their sandboxes did not restart with it, so running ones are tracked again as
// they are (routes, expiry timers; one already past its end is killed by the expiry loop) and
// paused ones stay paused. Records still creating belong to a create the restart interrupted: the
// sandbox is destroyed wherever it got to and the record marked killed. What became of sandboxes
// on a node that is gone is not decided here: that is the nodes' membership's to report.
func (d *Driver) Adopt(ctx context.Context) error {
	recs, err := d.store.ListSandboxes(ctx, store.SandboxQuery{
		States: []store.SandboxState{store.StateCreating, store.StateRunning},
	})
	if err != nil {
		return fmt.Errorf("load sandboxes to adopt: %w", err)
	}
	var tracked, killed, others int
	for _, sb := range recs {
		if sb.State == store.StateRunning {
			d.track(sb)
			tracked++
			continue
		}
		if !d.interrupted(sb) {
			others++
			continue
		}
		if err := d.interrupt(ctx, sb); err != nil {
			return err
		}
		killed++
	}
	d.log.Info("adopted sandbox records", "running", tracked, "interrupted", killed, "other drivers' creates", others)
	return nil
}

// interrupted reports whether a creating record belongs to a create nobody is running any more:
// on a store of its own, every one; on a shared one, this driver's (it just started), one no
// driver was recorded for, or one older than any create may take (its driver went away).
func (d *Driver) interrupted(sb Sandbox) bool {
	if !d.store.Shared() {
		return true // alone on its store: every create under way was this process's
	}
	return sb.Driver == "" || sb.Driver == d.opts.Name || d.now().Sub(sb.StartedAt) > d.staleCreate()
}

// staleCreate is longer than any create can last: its wait for a boot slot, its node call, and
// a margin for the records around them.
func (d *Driver) staleCreate() time.Duration {
	return d.opts.BootQueueTimeout + d.opts.CreateTimeout + time.Minute
}

// interrupt ends the record of a create that will never finish: whatever the node got as far as
// starting goes, and the record is killed.
func (d *Driver) interrupt(ctx context.Context, sb Sandbox) error {
	d.destroyQuietly(ctx, sb.ID)
	if err := d.store.MarkKilled(ctx, sb.ID, d.now(), ReasonInterrupted); err != nil {
		return fmt.Errorf("mark sandbox %s killed: %w", sb.ID, err)
	}
	d.sbEnded(sb.ID, ReasonInterrupted)
	return nil
}

// SweepCreates ends the creates that drivers sharing the store left behind when they went away
// mid-create (Adopt does it for this driver's own at its start). The leader calls it now and then.
func (d *Driver) SweepCreates(ctx context.Context) (int, error) {
	recs, err := d.store.ListSandboxes(ctx, store.SandboxQuery{States: []store.SandboxState{store.StateCreating}})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, sb := range recs {
		if sb.Driver == d.opts.Name || d.now().Sub(sb.StartedAt) <= d.staleCreate() {
			continue // this driver's own are under way: it is running
		}
		if err := d.interrupt(ctx, sb); err != nil {
			return n, err
		}
		d.log.Warn("ended a create its driver left behind", "sandbox", sb.ID, "driver", sb.Driver)
		n++
	}
	return n, nil
}
