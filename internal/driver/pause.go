package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

// Pauser is implemented by nodes that can pause sandboxes and resume them. Without it, pause and
// resume answer 501 and lifecycle onTimeout 'pause' is refused at create.
type Pauser interface {
	// PauseSandbox stops a running sandbox and keeps it (its memory too, when memory is set and
	// the runtime can). On error the sandbox still runs, unless the error wraps
	// node.ErrSandboxLost.
	PauseSandbox(ctx context.Context, id string, memory bool) (node.PauseInfo, error)
	// ResumeSandbox brings a paused sandbox back under spec's id, token, variables and policy; on
	// error it is still paused.
	ResumeSandbox(ctx context.Context, spec node.CreateSpec, memory bool) (node.Info, error)
	// DeletePaused removes a paused sandbox's saved state; one that is not there is success.
	DeletePaused(ctx context.Context, id string) error
}

// Reasons recorded on sandboxes pause or resume could not keep.
const (
	ReasonPauseFailed  = "pause failed"
	ReasonResumeFailed = "resume failed"
)

// pauseTimeout bounds one pause or resume on the node (a checkpoint writes the sandbox's memory).
const pauseTimeout = 5 * time.Minute

func (d *Driver) pauser() (Pauser, error) {
	p, ok := d.node.(Pauser)
	if !ok {
		return nil, fmt.Errorf("pausing sandboxes on this node is %w", ErrNotImplemented)
	}
	return p, nil
}

// Pause pauses a running sandbox, keeping its memory unless memory is false. Unknown or killed
// sandboxes are NotFound, paused ones Conflict (the SDK reads 409 as "already paused").
func (d *Driver) Pause(ctx context.Context, id string, memory bool) error {
	p, err := d.pauser()
	if err != nil {
		return err
	}
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.Get(ctx, id)
	if err != nil {
		return err
	}
	if sb.State == store.StatePaused {
		return errdefs.Conflict("sandbox %q is already paused", id)
	}
	return d.pauseLocked(ctx, p, sb, memory)
}

// pauseLocked pauses a running sandbox; the caller holds its lock.
// pauseLocked pauses sb on its node, whoever asked (a client, the timeout's auto-pause), and
// tells the observer.
func (d *Driver) pauseLocked(ctx context.Context, p Pauser, sb Sandbox, memory bool) error {
	start := time.Now()
	err := d.pauseOnNode(ctx, p, sb, memory)
	d.observe("pause", sb.TemplateID, start, err)
	return err
}

func (d *Driver) pauseOnNode(ctx context.Context, p Pauser, sb Sandbox, memory bool) error {
	// Detached from the client: a hang-up must not leave a half-paused sandbox.
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	defer cancel()
	// Ingress stops routing to it first: a request during the checkpoint would be cut off anyway.
	d.forget(sb.ID)
	info, err := p.PauseSandbox(pctx, sb.ID, memory)
	if errors.Is(err, node.ErrSandboxLost) {
		d.log.Error("pause lost the sandbox", "sandbox", sb.ID, "err", err)
		if merr := d.store.MarkKilled(pctx, sb.ID, d.now(), ReasonPauseFailed+": "+err.Error()); merr != nil {
			d.log.Error("mark sandbox killed", "sandbox", sb.ID, "err", merr)
		}
		d.sbEnded(sb.ID, ReasonPauseFailed+": "+err.Error())
		return errdefs.Wrap(errdefs.KindUnknown, err, "pausing sandbox %q failed and it could not be kept", sb.ID)
	}
	if err != nil {
		d.track(sb)
		d.log.Error("node failed to pause sandbox", "sandbox", sb.ID, "err", err)
		if errdefs.KindOf(err) != errdefs.KindUnknown {
			return err
		}
		return errdefs.Wrap(errdefs.KindUnknown, err, "failed to pause sandbox %q; it is still running", sb.ID)
	}
	if err := d.store.MarkPaused(pctx, sb.ID, d.now(), info.Memory, info.Bytes); err != nil {
		// The node holds it paused; a restart reconciles the record from the node's state.
		return err
	}
	d.log.Info("sandbox paused", "sandbox", sb.ID, "memory", info.Memory, "bytes", info.Bytes)
	d.sbLog(sb.ID, sandboxlog.LevelInfo, pausedMessage(info.Memory), "memory", strconv.FormatBool(info.Memory), "bytes", strconv.FormatInt(info.Bytes, 10))
	return nil
}

// Resume resumes a paused sandbox with a timeout (nil: the default), through the deprecated
// POST /sandboxes/{id}/resume. A running sandbox is a Conflict there, as in E2B.
func (d *Driver) Resume(ctx context.Context, id string, timeout *time.Duration) (Sandbox, error) {
	t, err := d.timeoutOrDefault(timeout)
	if err != nil {
		return Sandbox{}, err
	}
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.Get(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	if sb.State == store.StateRunning {
		return Sandbox{}, errdefs.Conflict("sandbox %q is already running", id)
	}
	return d.resumeLocked(ctx, sb, t, true)
}

// resumeLocked brings a paused sandbox back and makes it expire t from now; memory false boots it
// afresh over its files even when its memory was kept. The caller holds its lock.
// resumeLocked resumes sb, whoever asked (a client's resume or connect, auto-resume), and tells
// the observer.
func (d *Driver) resumeLocked(ctx context.Context, sb Sandbox, t time.Duration, memory bool) (Sandbox, error) {
	start := time.Now()
	out, err := d.resumeOnNode(ctx, sb, t, memory)
	d.observe("resume", sb.TemplateID, start, err)
	return out, err
}

func (d *Driver) resumeOnNode(ctx context.Context, sb Sandbox, t time.Duration, memory bool) (Sandbox, error) {
	p, err := d.pauser()
	if err != nil {
		return Sandbox{}, err
	}
	began, keptMemory := time.Now(), memory && sb.PausedMemory
	policy, err := policyOf(sb)
	if err != nil {
		return Sandbox{}, err
	}
	if err := d.checkCapacity(ctx); err != nil {
		return Sandbox{}, err
	}
	release, err := d.acquireBootSlot(ctx)
	if err != nil {
		return Sandbox{}, err
	}
	defer release()
	user, workdir := d.templateUser(ctx, sb.TemplateID)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	defer cancel()
	prepared := time.Since(began)
	info, err := p.ResumeSandbox(rctx, node.CreateSpec{
		ID: sb.ID, TemplateID: sb.TemplateID, CPUs: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB,
		EnvVars: sb.EnvVars, AccessToken: sb.EnvdAccessToken, DefaultUser: user, DefaultWorkdir: workdir,
		Egress: policy, Volumes: nodeMounts(sb.VolumeMounts),
	}, memory)
	if errdefs.Is(err, errdefs.KindNotFound) {
		// The node has no saved state for it: the sandbox cannot come back, and must not stay
		// listed as paused.
		d.log.Error("paused sandbox has no saved state on its node", "sandbox", sb.ID, "err", err)
		if merr := d.store.MarkKilled(rctx, sb.ID, d.now(), ReasonResumeFailed+": its saved state is gone"); merr != nil {
			d.log.Error("mark sandbox killed", "sandbox", sb.ID, "err", merr)
		}
		d.sbEnded(sb.ID, ReasonResumeFailed+": its saved state is gone")
		return Sandbox{}, notFound(sb.ID)
	}
	if err != nil {
		d.log.Error("node failed to resume sandbox", "sandbox", sb.ID, "err", err)
		if errdefs.KindOf(err) != errdefs.KindUnknown {
			return Sandbox{}, err
		}
		return Sandbox{}, errdefs.Wrap(errdefs.KindUnknown, err, "failed to resume sandbox %q; it is still paused", sb.ID)
	}
	if info.Node != "" {
		// A cluster may resume it on another node than the one that paused it: later calls go there.
		sb.NodeID = info.Node
	}
	end := d.now().Add(t)
	if err := d.store.MarkResumed(rctx, sb.ID, end, sb.NodeID); err != nil {
		return Sandbox{}, err
	}
	sb.State, sb.EndAt = store.StateRunning, end
	sb.PausedAt, sb.PausedMemory, sb.PausedBytes = time.Time{}, false, 0
	if info.EnvdVersion != "" {
		sb.EnvdVersion = info.EnvdVersion
	}
	d.track(sb)
	d.log.Info("sandbox resumed", "sandbox", sb.ID, "timeout", t, "prepared", prepared.Round(time.Millisecond),
		"took", time.Since(began).Round(time.Millisecond))
	where := cmp.Or(sb.NodeID, "local")
	d.sbLog(sb.ID, sandboxlog.LevelInfo, "sandbox resumed on node "+where, "memory", strconv.FormatBool(keptMemory), "node", where, "timeout", secs(t))
	return sb, nil
}

// checkCapacity refuses a resume when the node already runs as many sandboxes as it may.
func (d *Driver) checkCapacity(ctx context.Context) error {
	d.createMu.Lock()
	defer d.createMu.Unlock()
	return d.capacityLeft(ctx, "to resume the sandbox")
}

func (d *Driver) timeoutOrDefault(timeout *time.Duration) (time.Duration, error) {
	if timeout == nil {
		return d.opts.DefaultTimeout, nil
	}
	if err := d.checkTimeout("timeout", *timeout); err != nil {
		return 0, err
	}
	return *timeout, nil
}

// RouteOrResume is SandboxByID for ingress requests: a sandbox paused with its memory and created
// with autoResume is resumed first (with the default timeout), transparently to the caller, as
// E2B does. Filesystem-only pauses are never resumed by traffic: they must be resumed explicitly.
func (d *Driver) RouteOrResume(ctx context.Context, id string) (Route, error) {
	r, err := d.SandboxByID(ctx, id)
	if err == nil || !errdefs.Is(err, errdefs.KindNotFound) {
		return r, err
	}
	sb, err := d.store.GetSandbox(ctx, id)
	if err != nil || sb.State != store.StatePaused || !sb.AutoResume || !sb.PausedMemory {
		return Route{}, notFound(id)
	}
	if _, _, err := d.Connect(ctx, id, nil, true); err != nil {
		d.log.Warn("auto-resume on an ingress request failed", "sandbox", id, "err", err)
		return Route{}, err
	}
	d.log.Info("sandbox auto-resumed by an ingress request", "sandbox", id)
	return d.SandboxByID(ctx, id)
}

// templateUser is the default user and workdir of a template, for sandboxes restored from saved
// state (the template may be gone since; its defaults then are E2B's).
func (d *Driver) templateUser(ctx context.Context, templateID string) (user, workdir string) {
	user = defaultUser
	if tpl, err := d.store.GetTemplate(ctx, templateID); err == nil {
		if tpl.DefaultUser != "" {
			user = tpl.DefaultUser
		}
		workdir = tpl.DefaultWorkdir
	}
	return user, workdir
}

// pausedMessage says what a pause kept, for the sandbox's log.
func pausedMessage(memory bool) string {
	if memory {
		return "sandbox paused with its memory"
	}
	return "sandbox paused (its files only; its processes start afresh on resume)"
}
