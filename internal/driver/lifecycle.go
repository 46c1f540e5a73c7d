package driver

import (
	"context"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

// Kill reasons recorded on killed sandboxes.
const (
	ReasonUser        = "killed by request"
	ReasonTimeout     = "timeout"
	ReasonRuntimeGone = "runtime gone after restart"
	ReasonInterrupted = "interrupted while starting"

	killRetryAfterError = 30 * time.Second
	// destroyTimeout bounds one node destroy so a wedged runtime cannot hang a request or Close.
	destroyTimeout = time.Minute
)

func notFound(id string) error { return errdefs.NotFound("sandbox %q not found", id) }

// Get returns a live (running or paused) sandbox. Killed and starting sandboxes are NotFound, as
// E2B reports them.
func (d *Driver) Get(ctx context.Context, id string) (Sandbox, error) {
	if err := d.checkRecovered(id); err != nil {
		return Sandbox{}, err
	}
	sb, err := d.store.GetSandbox(ctx, id)
	if errdefs.Is(err, errdefs.KindNotFound) || (err == nil && !live(sb)) {
		return Sandbox{}, notFound(id)
	}
	return sb, err
}

func live(sb Sandbox) bool {
	return sb.State == store.StateRunning || sb.State == store.StatePaused
}

// Kill destroys a live sandbox and marks its record killed. Unknown or already killed sandboxes
// are NotFound (the SDK reads that as kill() == false).
func (d *Driver) Kill(ctx context.Context, id string) error {
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.Get(ctx, id)
	if err != nil {
		return err
	}
	// Detached from the client: a hang-up must not leave a half-destroyed sandbox.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
	defer cancel()
	return d.killLocked(kctx, sb, ReasonUser)
}

// killLocked destroys sb on the node and marks it killed; the caller holds sb's lock. The record
// is only marked once the node confirmed, so a failed destroy leaves a record that still owns
// whatever the node kept.
func (d *Driver) killLocked(ctx context.Context, sb Sandbox, reason string) error {
	if sb.State == store.StatePaused && d.NodeIsOut(sb.NodeID) {
		// Recorded now; the node drops its copy (and the store's) when it is back (NodeBack), as no
		// paused record places it there any more.
		d.log.Info("killing a paused sandbox whose node is out of reach", "sandbox", sb.ID, "node", sb.NodeID)
	} else if sb.State == store.StatePaused {
		if p, ok := d.node.(Pauser); ok {
			if err := p.DeletePaused(ctx, sb.ID); err != nil {
				d.log.Error("node failed to delete paused sandbox", "sandbox", sb.ID, "err", err)
				return errdefs.Wrap(errdefs.KindUnknown, err, "failed to kill sandbox %q", sb.ID)
			}
		}
	}
	if sb.State == store.StateRunning && d.NodeIsOut(sb.NodeID) {
		// Recorded now; the node destroys it when it is back (NodeBack), as no running record
		// places it there any more.
		d.log.Info("killing a sandbox whose node is out of reach", "sandbox", sb.ID, "node", sb.NodeID)
	} else if sb.State == store.StateRunning {
		if err := d.node.DestroySandbox(ctx, sb.ID); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			d.log.Error("node failed to destroy sandbox", "sandbox", sb.ID, "err", err)
			return errdefs.Wrap(errdefs.KindUnknown, err, "failed to kill sandbox %q", sb.ID)
		}
	}
	d.forget(sb.ID)
	if err := d.store.MarkKilled(ctx, sb.ID, d.now(), reason); err != nil {
		return err
	}
	d.log.Info("sandbox killed", "sandbox", sb.ID, "reason", reason)
	d.sbEnded(sb.ID, reason)
	return nil
}

// SetTimeout makes a running sandbox expire timeout from now; it may shorten its life.
func (d *Driver) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	if err := d.checkTimeout("timeout", timeout); err != nil {
		return err
	}
	_, err := d.extend(ctx, id, timeout, true)
	return err
}

// Refresh keeps a running sandbox alive for at least duration from now; it never shortens it.
func (d *Driver) Refresh(ctx context.Context, id string, duration time.Duration) error {
	if err := d.checkTimeout("duration", duration); err != nil {
		return err
	}
	_, err := d.extend(ctx, id, duration, false)
	return err
}

// Connect returns a running sandbox, resuming it first if it is paused, and makes it live at least
// timeout from now (nil means the default timeout); a running sandbox's life is only ever
// extended. memory false resumes a paused sandbox by booting it afresh over its files. resumed
// reports whether it had to be resumed.
func (d *Driver) Connect(ctx context.Context, id string, timeout *time.Duration, memory bool) (sb Sandbox, resumed bool, err error) {
	t, err := d.timeoutOrDefault(timeout)
	if err != nil {
		return Sandbox{}, false, err
	}
	unlock := d.lock(id)
	defer unlock()
	sb, err = d.Get(ctx, id)
	if err != nil {
		return Sandbox{}, false, err
	}
	if sb.State == store.StatePaused {
		sb, err = d.resumeLocked(ctx, sb, t, memory)
		return sb, err == nil, err
	}
	sb, err = d.extendLocked(ctx, sb, t, false)
	return sb, false, err
}

// extend sets a running sandbox's end to now+t, or to max(end, now+t) unless allowShorter.
func (d *Driver) extend(ctx context.Context, id string, t time.Duration, allowShorter bool) (Sandbox, error) {
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.Get(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	return d.extendLocked(ctx, sb, t, allowShorter)
}

func (d *Driver) extendLocked(ctx context.Context, sb Sandbox, t time.Duration, allowShorter bool) (Sandbox, error) {
	id := sb.ID
	if sb.State == store.StatePaused {
		// A paused sandbox has no timeout; connect (or resume) gives it one.
		return Sandbox{}, errdefs.Conflict("sandbox %q is paused; connect to resume it", id)
	}
	end := d.now().Add(t)
	if !allowShorter && !end.After(sb.EndAt) {
		return sb, nil
	}
	if err := d.store.SetEndAt(ctx, id, end); err != nil {
		if errdefs.Is(err, errdefs.KindConflict) {
			return Sandbox{}, notFound(id)
		}
		return Sandbox{}, err
	}
	sb.EndAt = end
	d.arm(id, end)
	d.sbLog(id, sandboxlog.LevelInfo, "sandbox timeout changed: it ends in "+secs(t)+" s", "timeout", secs(t), "endAt", end.Format(time.RFC3339))
	return sb, nil
}

// Metrics returns current resource samples of a running sandbox. Nodes that implement MetricsNode
// give real usage; otherwise the sample carries the configured limits so clients get a well-formed
// answer.
func (d *Driver) Metrics(ctx context.Context, id string) ([]Metric, error) {
	sb, err := d.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	fallback := Metric{
		Timestamp: d.now(),
		CPUCount:  sb.CPU,
		MemTotal:  int64(sb.MemoryMB) << 20,
		DiskTotal: int64(sb.DiskMB) << 20,
	}
	if sb.State == store.StatePaused {
		// A paused sandbox uses no CPU or memory; its disk is what its saved state takes.
		fallback.DiskUsed = sb.PausedBytes
		return []Metric{fallback}, nil
	}
	mn, ok := d.node.(MetricsNode)
	if !ok || sb.State != store.StateRunning {
		return []Metric{fallback}, nil
	}
	m, err := mn.SandboxMetrics(ctx, id)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return nil, notFound(id)
	}
	if err != nil {
		// Metrics are advisory; a sampling failure should not fail the call.
		d.log.Warn("sample sandbox metrics", "sandbox", id, "err", err)
		return []Metric{fallback}, nil
	}
	if m.Timestamp.IsZero() {
		m.Timestamp = fallback.Timestamp
	}
	return []Metric{m}, nil
}

// track makes a running sandbox reachable by ingress and arms its expiry.
func (d *Driver) track(sb Sandbox) {
	d.mu.Lock()
	d.routes[sb.ID] = routeOf(sb)
	d.mu.Unlock()
	d.arm(sb.ID, sb.EndAt)
}

// forget drops a sandbox from ingress and from the expiry schedule.
func (d *Driver) forget(id string) {
	d.mu.Lock()
	delete(d.routes, id)
	delete(d.deadlines, id)
	d.mu.Unlock()
}

// expire kills id if it is still running and past its end; called by the expiry loop.
func (d *Driver) expire(ctx context.Context, id string) {
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil || sb.State != store.StateRunning {
		if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			d.log.Error("load expiring sandbox", "sandbox", id, "err", err)
			d.arm(id, d.now().Add(killRetryAfterError))
		}
		return
	}
	if sb.EndAt.After(d.now()) {
		// Extended after its deadline was scheduled; follow the stored end.
		d.arm(id, sb.EndAt)
		return
	}
	if sb.AutoPause {
		if p, ok := d.node.(Pauser); ok {
			d.sbLog(id, sandboxlog.LevelInfo, "sandbox timeout reached: pausing it (lifecycle onTimeout pause)", "reason", ReasonTimeout)
			if err := d.pauseLocked(ctx, p, sb, sb.AutoPauseMemory); err != nil {
				d.log.Error("pause expired sandbox; will retry", "sandbox", id, "err", err)
				d.arm(id, d.now().Add(killRetryAfterError))
			}
			return
		}
	}
	// Detached from the loop's context so that Close waits for a kill in flight instead of
	// interrupting it half-way.
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
	defer cancel()
	if err := d.killLocked(kctx, sb, ReasonTimeout); err != nil {
		d.log.Error("kill expired sandbox; will retry", "sandbox", id, "err", err)
		d.arm(id, d.now().Add(killRetryAfterError))
	}
}

// SandboxStopped records that a running sandbox's runtime ended without being asked to (its
// init exited, it ran out of memory, the host killed it): ingress answers 502 for it at once,
// the record becomes killed with reason (the node's account, "oom: …", "exited: …") and the node
// removes what is left, so `vmon sandbox ls` and GET (404) tell the truth instead of "running".
func (d *Driver) SandboxStopped(ctx context.Context, id, reason string) {
	// Before taking the lock (a kill or timeout change may hold it for a while): from now on
	// ingress treats the sandbox as gone.
	d.forget(id)
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil || sb.State != store.StateRunning {
		if err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
			d.log.Error("load stopped sandbox", "sandbox", id, "err", err)
		}
		return
	}
	// The sandbox is dead already: the record says so first, then the node removes what is left.
	// Unlike a kill, a failed cleanup here must not keep the record "running"; what a failed
	// cleanup leaves is removed by the node's recovery at the next start.
	if err := d.store.MarkKilled(ctx, id, d.now(), reason); err != nil {
		d.log.Error("mark stopped sandbox killed", "sandbox", id, "err", err)
		return
	}
	d.log.Info("sandbox killed", "sandbox", id, "reason", reason)
	d.sbEnded(id, reason)
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), destroyTimeout)
	defer cancel()
	if err := d.node.DestroySandbox(kctx, id); err != nil && !errdefs.Is(err, errdefs.KindNotFound) {
		d.log.Error("clean up stopped sandbox", "sandbox", id, "err", err)
	}
}

// lock serialises one sandbox's lifecycle steps: within this driver, and across the drivers
// sharing its store (store.LockSandbox). Without the database the step could not be recorded
// anyway, so a failure to take the shared part is logged and the step goes on under the local
// lock; its store calls then fail and report why.
func (d *Driver) lock(id string) (unlock func()) {
	local := d.locks.Lock(id)
	shared, err := d.store.LockSandbox(context.Background(), id)
	if err != nil {
		d.log.Warn("sandbox lock across drivers", "sandbox", id, "err", err)
		return local
	}
	return func() {
		shared()
		local()
	}
}
