package driver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

// Snapshotter is implemented by nodes that can snapshot running sandboxes and start new ones from
// a snapshot (or from a paused sandbox's saved state, for forks).
type Snapshotter interface {
	// SnapshotSandbox saves a running sandbox as snapID and lets it go on. An error wrapping
	// node.ErrSandboxPaused means the sandbox is paused now; node.ErrSandboxLost that it is gone.
	SnapshotSandbox(ctx context.Context, id, snapID string) (node.PauseInfo, error)
	CreateFromSnapshot(ctx context.Context, spec node.CreateSpec, snapID, pausedID string) (node.Info, error)
	DeleteSnapshot(ctx context.Context, snapID string) error
}

// SnapshotInfo is E2B's SnapshotInfo.
type SnapshotInfo struct {
	SnapshotID string
	Names      []string
}

// snapshotSuffix makes a snapshot id look like E2B's ("<id>:default"); lookups accept either form.
const snapshotSuffix = ":default"

var snapshotNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func infoOf(sn store.Snapshot) SnapshotInfo {
	info := SnapshotInfo{SnapshotID: sn.ID + snapshotSuffix, Names: []string{}}
	if sn.Name != "" {
		info.Names = append(info.Names, sn.Name)
	}
	return info
}

func (d *Driver) snapshotter() (Snapshotter, error) {
	s, ok := d.node.(Snapshotter)
	if !ok {
		return nil, fmt.Errorf("snapshots on this node are %w", ErrNotImplemented)
	}
	return s, nil
}

// CreateSnapshot saves running sandbox id (memory, processes and files) as a new snapshot, named
// name when given; the sandbox goes on after a brief stop. Unknown or killed sandboxes are
// NotFound, paused ones Conflict.
func (d *Driver) CreateSnapshot(ctx context.Context, id, name string) (SnapshotInfo, error) {
	s, err := d.snapshotter()
	if err != nil {
		return SnapshotInfo{}, err
	}
	name = strings.ToLower(strings.TrimSpace(name))
	if name != "" {
		name = strings.TrimSuffix(name, snapshotSuffix)
		if !snapshotNameRe.MatchString(name) {
			return SnapshotInfo{}, errdefs.InvalidArgument("invalid snapshot name %s: use 1 to 63 lowercase letters, digits, '-' and '_'", errdefs.Quote(name))
		}
		if _, _, err := d.LookupTemplate(ctx, name); err == nil {
			return SnapshotInfo{}, errdefs.Conflict("the name %q is taken by a template", name)
		}
		if _, err := d.store.GetSnapshot(ctx, name); err == nil {
			return SnapshotInfo{}, errdefs.Conflict("a snapshot named %q already exists", name)
		}
	}
	unlock := d.lock(id)
	defer unlock()
	sb, err := d.Get(ctx, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if sb.State != store.StateRunning {
		return SnapshotInfo{}, errdefs.Conflict("sandbox %q is paused; resume it to take a snapshot", id)
	}
	snapID, err := NewSandboxID()
	if err != nil {
		return SnapshotInfo{}, err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	defer cancel()
	info, err := s.SnapshotSandbox(sctx, id, snapID)
	if err != nil {
		d.afterFailedCheckpoint(sctx, sb, err)
		if errdefs.KindOf(err) != errdefs.KindUnknown {
			return SnapshotInfo{}, err
		}
		return SnapshotInfo{}, errdefs.Wrap(errdefs.KindUnknown, err, "failed to snapshot sandbox %q", id)
	}
	sn := store.Snapshot{ID: snapID, Name: name, SandboxID: id, TemplateID: sb.TemplateID, Alias: sb.Alias,
		CPU: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB, EnvVars: sb.EnvVars, EnvdVersion: sb.EnvdVersion,
		Bytes: info.Bytes, NodeID: cmp.Or(sb.NodeID, d.opts.NodeID), CreatedAt: d.now(), VolumeMounts: sb.VolumeMounts}
	if err := d.store.InsertSnapshot(sctx, sn); err != nil {
		_ = s.DeleteSnapshot(sctx, snapID)
		return SnapshotInfo{}, err
	}
	d.log.Info("snapshot created", "sandbox", id, "snapshot", snapID, "name", name, "bytes", info.Bytes)
	d.sbLog(id, sandboxlog.LevelInfo, "snapshot "+snapID+" created", "snapshot", snapID, "name", name)
	return infoOf(sn), nil
}

// afterFailedCheckpoint records what a failed snapshot left of sandbox sb.
func (d *Driver) afterFailedCheckpoint(ctx context.Context, sb Sandbox, err error) {
	switch {
	case errors.Is(err, node.ErrSandboxPaused):
		d.forget(sb.ID)
		if merr := d.store.MarkPaused(ctx, sb.ID, d.now(), false, 0); merr != nil {
			d.log.Error("mark sandbox paused", "sandbox", sb.ID, "err", merr)
		}
	case errors.Is(err, node.ErrSandboxLost):
		d.forget(sb.ID)
		if merr := d.store.MarkKilled(ctx, sb.ID, d.now(), ReasonPauseFailed+": "+err.Error()); merr != nil {
			d.log.Error("mark sandbox killed", "sandbox", sb.ID, "err", merr)
		}
		d.sbEnded(sb.ID, ReasonPauseFailed+": "+err.Error())
	}
}

// SnapshotListOptions filter and page GET /snapshots.
type SnapshotListOptions struct {
	SandboxID, Name string
	Limit           int
	NextToken       string
}

// ListSnapshots returns one page of snapshots, newest first, and the token of the next page.
func (d *Driver) ListSnapshots(ctx context.Context, o SnapshotListOptions) ([]SnapshotInfo, string, error) {
	limit := o.Limit
	if limit == 0 {
		limit = MaxListLimit
	}
	if limit < 0 || limit > MaxListLimit {
		return nil, "", errdefs.InvalidArgument("limit must be between 1 and %d", MaxListLimit)
	}
	q := store.SnapshotQuery{SandboxID: o.SandboxID, Name: strings.TrimSuffix(strings.ToLower(o.Name), snapshotSuffix), Limit: limit + 1}
	if o.NextToken != "" {
		c, err := decodeCursor(o.NextToken)
		if err != nil {
			return nil, "", err
		}
		q.After = &c
	}
	sns, err := d.store.ListSnapshots(ctx, q)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(sns) > limit {
		sns = sns[:limit]
		last := sns[len(sns)-1]
		next = encodeCursor(store.Cursor{StartedAt: last.CreatedAt, ID: last.ID})
	}
	out := make([]SnapshotInfo, 0, len(sns))
	for _, sn := range sns {
		out = append(out, infoOf(sn))
	}
	return out, next, nil
}

// lookupSnapshot finds a snapshot by id or name, with or without the ":default" tag.
func (d *Driver) lookupSnapshot(ctx context.Context, ref string) (store.Snapshot, error) {
	ref = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(ref)), snapshotSuffix)
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		ref = ref[i+1:] // a namespace: single-tenant vmon has one
	}
	return d.store.GetSnapshot(ctx, ref)
}

// DeleteSnapshot deletes a snapshot (DELETE /templates/{snapshotID}); unknown ones are NotFound.
func (d *Driver) DeleteSnapshot(ctx context.Context, ref string) error {
	s, err := d.snapshotter()
	if err != nil {
		return err
	}
	sn, err := d.lookupSnapshot(ctx, ref)
	if err != nil {
		return err
	}
	if err := s.DeleteSnapshot(ctx, sn.ID); err != nil {
		return err
	}
	return d.store.DeleteSnapshot(ctx, sn.ID)
}

// SnapshotOrphans returns the node's snapshots no record owns (unfinished forks' temporary
// snapshots, a crash between writing a snapshot and recording it).
func (d *Driver) SnapshotOrphans(ctx context.Context, onNode []string) ([]string, error) {
	var out []string
	for _, id := range onNode {
		if _, err := d.store.GetSnapshot(ctx, id); errdefs.Is(err, errdefs.KindNotFound) {
			out = append(out, id)
		} else if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// snapshotSource is where a create starts from when it does not boot a template.
type snapshotSource struct {
	snapID, pausedID string
}

// sandboxFromSnapshot fills a create's record from snapshot sn: its template and resources, its
// variables under the request's.
func sandboxFromSnapshot(sb *Sandbox, sn store.Snapshot) {
	sb.TemplateID, sb.Alias = sn.TemplateID, sn.Alias
	sb.CPU, sb.MemoryMB, sb.DiskMB, sb.EnvdVersion = sn.CPU, sn.MemoryMB, sn.DiskMB, sn.EnvdVersion
	env := maps.Clone(sn.EnvVars)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, sb.EnvVars)
	sb.EnvVars = env
}

// bootFromSnapshot asks the node to start sb from src, detached from the client like boot.
func (d *Driver) bootFromSnapshot(ctx context.Context, sb Sandbox, src snapshotSource, policy egress.Policy) (node.Info, error) {
	s, err := d.snapshotter()
	if err != nil {
		return node.Info{}, err
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.CreateTimeout)
	defer cancel()
	user, workdir := d.templateUser(ctx, sb.TemplateID)
	info, err := s.CreateFromSnapshot(bctx, node.CreateSpec{
		ID: sb.ID, TemplateID: sb.TemplateID, CPUs: sb.CPU, MemoryMB: sb.MemoryMB, DiskMB: sb.DiskMB,
		EnvVars: sb.EnvVars, AccessToken: sb.EnvdAccessToken, DefaultUser: user, DefaultWorkdir: workdir,
		Egress: policy, Volumes: nodeMounts(sb.VolumeMounts),
	}, src.snapID, src.pausedID)
	if err != nil {
		d.log.Error("node failed to start a sandbox from a snapshot", "sandbox", sb.ID, "err", err)
		if errdefs.KindOf(err) != errdefs.KindUnknown {
			return node.Info{}, err
		}
		return node.Info{}, errdefs.Wrap(errdefs.KindUnknown, err, "failed to start the sandbox from its snapshot")
	}
	return info, nil
}

// MaxForkCount is the most sandboxes one fork call may make.
const MaxForkCount = 100

// ForkResult is one entry of a fork's answer: a sandbox, or why it could not be made.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// Fork makes count new sandboxes from one checkpoint of sandbox id (a running one keeps running; a
// paused one's saved state is used as is). Each fork has its own id, tokens, writable layer, link
// and lease, the source's network policy and variables, and lives timeout (nil: the default).
// A fork that cannot be made (capacity, the node) is an entry with its error; the others stand.
func (d *Driver) Fork(ctx context.Context, id string, count int, timeout *time.Duration) ([]ForkResult, error) {
	start := time.Now()
	results, err := d.fork(ctx, id, count, timeout)
	template, made := "", 0
	for _, r := range results {
		if r.Err == nil && r.Sandbox != nil {
			template = r.Sandbox.TemplateID
			made++
		}
	}
	d.observe("fork", template, start, err)
	if d.opts.Observer != nil && made > 0 {
		d.opts.Observer.SandboxesMade(template, made)
	}
	return results, err
}

func (d *Driver) fork(ctx context.Context, id string, count int, timeout *time.Duration) ([]ForkResult, error) {
	s, ok := d.node.(Snapshotter)
	if !ok {
		return nil, fmt.Errorf("forking sandboxes on this node is %w", ErrNotImplemented)
	}
	if count == 0 {
		count = 1
	}
	if count < 1 || count > MaxForkCount {
		return nil, errdefs.InvalidArgument("count must be between 1 and %d, got %d", MaxForkCount, count)
	}
	t, err := d.timeoutOrDefault(timeout)
	if err != nil {
		return nil, err
	}
	unlock := d.lock(id)
	src, err := d.Get(ctx, id)
	if err != nil {
		unlock()
		return nil, err
	}
	from := snapshotSource{pausedID: id}
	if src.State == store.StateRunning {
		snapID, err := NewSandboxID()
		if err != nil {
			unlock()
			return nil, err
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
		_, err = s.SnapshotSandbox(sctx, id, snapID)
		if err != nil {
			d.afterFailedCheckpoint(sctx, src, err)
		}
		cancel()
		if err != nil {
			unlock()
			if errdefs.KindOf(err) != errdefs.KindUnknown {
				return nil, err
			}
			return nil, errdefs.Wrap(errdefs.KindUnknown, err, "failed to checkpoint sandbox %q for a fork", id)
		}
		// The fork's checkpoint is its own: nobody lists it, and it goes once the forks started
		// (a crash before that leaves an orphan the next start removes).
		from = snapshotSource{snapID: snapID}
		defer func() {
			if err := s.DeleteSnapshot(context.WithoutCancel(ctx), snapID); err != nil {
				d.log.Warn("delete a fork's checkpoint", "snapshot", snapID, "err", err)
			}
		}()
		unlock() // the source runs on; the forks need nothing more from it
	} else {
		// A paused source's saved state must stay put while the forks copy it.
		defer unlock()
	}
	policy, err := policyOf(src)
	if err != nil {
		return nil, err
	}
	results := make([]ForkResult, count)
	var forks []string
	for i := range results {
		sb, err := d.createFrom(ctx, src, from, policy, t)
		if err != nil {
			results[i].Err = err
			continue
		}
		results[i].Sandbox = &sb
		forks = append(forks, sb.ID)
		d.sbLog(sb.ID, sandboxlog.LevelInfo, "sandbox created as a fork of "+id, "forkOf", id, "template", sb.TemplateID, "cpu", itoa(sb.CPU), "memoryMB", itoa(sb.MemoryMB), "diskMB", itoa(sb.DiskMB), "timeout", secs(t))
	}
	if len(forks) > 0 {
		d.sbLog(id, sandboxlog.LevelInfo, "sandbox forked to "+strings.Join(forks, ", "), "forks", strings.Join(forks, ","), "count", itoa(len(forks)))
	}
	return results, nil
}

// createFrom makes one sandbox from src's saved state, with src's settings and new identities.
func (d *Driver) createFrom(ctx context.Context, src Sandbox, from snapshotSource, policy egress.Policy, t time.Duration) (Sandbox, error) {
	id, err := NewSandboxID()
	if err != nil {
		return Sandbox{}, err
	}
	sb := Sandbox{ID: id, TemplateID: src.TemplateID, Alias: src.Alias, State: store.StateCreating,
		Metadata: maps.Clone(src.Metadata), EnvVars: maps.Clone(src.EnvVars), AllowPublicTraffic: src.AllowPublicTraffic,
		AllowInternetAccess: src.AllowInternetAccess, CPU: src.CPU, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB,
		EnvdVersion: src.EnvdVersion, NodeID: cmp.Or(src.NodeID, d.opts.NodeID), Network: src.Network,
		AutoPause: src.AutoPause, AutoPauseMemory: src.AutoPauseMemory, AutoResume: src.AutoResume,
		VolumeMounts: src.VolumeMounts}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if sb.EnvVars == nil {
		sb.EnvVars = map[string]string{}
	}
	if sb.EnvdAccessToken, err = newToken(); err != nil {
		return Sandbox{}, err
	}
	if !sb.AllowPublicTraffic {
		if sb.TrafficAccessToken, err = newToken(); err != nil {
			return Sandbox{}, err
		}
	}
	return d.startRecord(ctx, sb, t, func() (node.Info, error) { return d.bootFromSnapshot(ctx, sb, from, policy) })
}
