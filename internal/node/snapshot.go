package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
	"github.com/vibemon/vmon/internal/snapshot"
)

// snapshotIDRe is what snapshot directory names look like (the driver's snapshot ids).
var snapshotIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

func (n *Node) snapshotDir(id string) string { return filepath.Join(n.opts.DataDir, "snapshots", id) }

// SnapshotDir is where the node keeps snapshot id (for carrying it to and from a cluster's store).
func (n *Node) SnapshotDir(id string) (string, error) {
	if !snapshotIDRe.MatchString(id) {
		return "", errdefs.InvalidArgument("invalid snapshot id")
	}
	return n.snapshotDir(id), nil
}

// ErrSandboxPaused is wrapped by a snapshot whose sandbox could not be started again after its
// checkpoint: it was kept as a paused sandbox instead, and its owner must record it as paused.
var ErrSandboxPaused = errors.New("the sandbox could not go on after its checkpoint and was paused")

// SnapshotSandbox saves running sandbox id as snapshot snapID (memory, processes and files) and
// lets it go on: the sandbox stops for the checkpoint and the copy of its writable layer, then
// runs again from that same checkpoint, with its link, lease and agent channel unchanged. Until
// the copy is done the checkpoint is a pause in progress, so a crash leaves the sandbox paused.
func (n *Node) SnapshotSandbox(ctx context.Context, id, snapID string) (PauseInfo, error) {
	if !idRe.MatchString(id) || !snapshotIDRe.MatchString(snapID) {
		return PauseInfo{}, errdefs.InvalidArgument("invalid sandbox or snapshot id")
	}
	sb, ok := n.lookup(id)
	if !ok {
		return PauseInfo{}, errdefs.NotFound("sandbox %q is not running on this node", id)
	}
	cp, canCheckpoint := n.opts.Runtime.(runtime.Checkpointer)
	if !canCheckpoint {
		return PauseInfo{}, errdefs.Unavailable("this node's runtime cannot take snapshots")
	}
	if err := n.waitFinished(ctx, id); err != nil {
		return PauseInfo{}, err
	}
	final := n.snapshotDir(snapID)
	if _, err := os.Stat(final); err == nil {
		return PauseInfo{}, errdefs.Conflict("snapshot %q already exists", snapID)
	}
	dir := n.sandboxDir(sb.runtimeID)
	rec, err := readBootRecord(dir)
	if err != nil {
		return PauseInfo{}, errdefs.Wrap(errdefs.KindUnavailable, err, "sandbox %q cannot be snapshotted", id)
	}
	release, err := n.checkSnapshotBudget(ctx, sb, true)
	if err != nil {
		return PauseInfo{}, err
	}
	defer release()
	began := time.Now()
	ptmp, err := snapshot.TempDir(n.pausedDir(id))
	if err != nil {
		return PauseInfo{}, err
	}
	stmp, err := snapshot.TempDir(final)
	if err != nil {
		_ = os.RemoveAll(ptmp)
		return PauseInfo{}, err
	}
	abandon := func() { _ = os.RemoveAll(ptmp); _ = os.RemoveAll(stmp) }
	if err := writeFileAtomic(filepath.Join(dir, pausingFile), []byte(markSnapshot)); err != nil {
		abandon()
		return PauseInfo{}, fmt.Errorf("mark snapshot: %w", err)
	}
	sb.stopping.Store(true)
	n.endStreams(ctx, sb, agentproto.EndStreamsSnapshot)
	err = n.park(ctx, sb, rec.Channel)
	if err == nil {
		err = n.checkpoint(ctx, cp, sb, ptmp)
	}
	if err != nil {
		abandon()
		if st, serr := n.opts.Runtime.Status(context.WithoutCancel(ctx), sb.runtimeID); serr == nil && st == runtime.StatusRunning {
			n.unpark(sb, rec.Channel)
			sb.stopping.Store(false)
			_ = os.Remove(filepath.Join(dir, pausingFile))
			return PauseInfo{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
		}
		return PauseInfo{}, n.keepAsPaused(ctx, sb, dir, rec, fmt.Errorf("snapshot sandbox %s: checkpoint: %w", id, err))
	}
	// The stopped runtime's remains go while the layer is copied; the restart waits for them.
	destroyed := make(chan error, 1)
	go func() { destroyed <- n.opts.Runtime.Destroy(context.WithoutCancel(ctx), sb.runtimeID) }()
	layer := filepath.Join(stmp, snapshot.LayerDir)
	err = os.Mkdir(layer, 0o700)
	if err == nil && !rec.onImage() { // else the files are in the checkpoint
		err = n.opts.RootFS.CopyWritable(ctx, dir, layer)
	}
	if err != nil {
		_ = os.RemoveAll(stmp)
		// The checkpoint is whole: the sandbox goes on from it, and the snapshot fails.
		if rerr := n.restartFrom(ctx, cp, sb, rec, ptmp, destroyed); rerr != nil {
			return PauseInfo{}, n.keepAsPaused(ctx, sb, dir, rec, errors.Join(err, rerr))
		}
		_ = os.RemoveAll(ptmp)
		return PauseInfo{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	if err := n.restartFrom(ctx, cp, sb, rec, ptmp, destroyed); err != nil {
		_ = os.RemoveAll(stmp)
		return PauseInfo{}, n.keepAsPaused(ctx, sb, dir, rec, err)
	}
	stopped := time.Since(began)
	// The sandbox runs again: the checkpoint now belongs to the snapshot alone.
	if err := os.Rename(filepath.Join(ptmp, snapshot.CheckpointDir), filepath.Join(stmp, snapshot.CheckpointDir)); err != nil {
		abandon()
		return PauseInfo{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	_ = os.RemoveAll(ptmp)
	meta := snapshot.Meta{SandboxID: id, CreatedAt: time.Now().UTC(), TemplateID: rec.TemplateID,
		Lowers: rec.Lowers, CPUs: rec.CPUs, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB, Memory: true,
		Envd: rec.Envd, Channel: rec.Channel, RootImage: n.relImage(rec), RootImageDigest: rec.RootImageDigest, EnvdToken: sb.token}
	if err := snapshot.Seal(stmp, meta); err != nil {
		_ = os.RemoveAll(stmp)
		return PauseInfo{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	if err := snapshot.Publish(stmp, final); err != nil {
		_ = os.RemoveAll(stmp)
		return PauseInfo{}, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	bytes := snapshot.Bytes(final)
	n.log.Info("sandbox snapshotted", "sandbox", id, "snapshot", snapID, "bytes", bytes,
		"stopped", stopped.Round(time.Millisecond), "took", time.Since(began).Round(time.Millisecond))
	return PauseInfo{Memory: true, Bytes: bytes}, nil
}

// restartFrom starts sb's runtime again from the checkpoint in tmp, with the spec and agent
// channel of its boot record rec (on its own root and link), and clears the pausing mark. It
// first waits for the stopped runtime's removal, reported on destroyed.
func (n *Node) restartFrom(ctx context.Context, cp runtime.Checkpointer, sb *sandbox, rec bootRecord, tmp string, destroyed <-chan error) error {
	ctx = context.WithoutCancel(ctx)
	rspec := rec.Runtime
	var ctl *agentctl.Conn
	if rec.Channel == channelControl {
		host, guest, err := agentctl.Pair()
		if err != nil {
			return fmt.Errorf("restart sandbox after its checkpoint: %w", err)
		}
		defer guest.Close()
		rspec.Files, ctl = []*os.File{guest}, host
	}
	if err := <-destroyed; err != nil {
		return fmt.Errorf("restart sandbox after its checkpoint: remove the stopped runtime: %w", err)
	}
	if sb.link != nil {
		// runsc took the link's addresses when it first started; it adopts only a link that has one.
		if err := n.opts.Network.Prepare(ctx, sb.link); err != nil {
			return fmt.Errorf("restart sandbox after its checkpoint: %w", err)
		}
	}
	if err := cp.Restore(ctx, rspec, filepath.Join(tmp, snapshot.CheckpointDir)); err != nil {
		if ctl != nil {
			ctl.Close()
		}
		return fmt.Errorf("restart sandbox after its checkpoint: %w", err)
	}
	if err := n.rebind(ctx, sb, rec, ctl); err != nil {
		return fmt.Errorf("restart sandbox after its checkpoint: agent channel: %w", err)
	}
	sb.stopping.Store(false)
	n.watch(sb)
	_ = os.Remove(filepath.Join(n.sandboxDir(sb.runtimeID), pausingFile))
	wctx, cancel := context.WithTimeout(ctx, n.opts.BootTimeout)
	defer cancel()
	// The guest's interface came back with the placeholder address only: give it its lease again.
	if err := n.pushNetwork(wctx, sb); err != nil {
		n.log.Warn("envd did not take its network back after a snapshot", "sandbox", sb.id, "err", err)
	}
	return nil
}

// keepAsPaused turns a sandbox that stopped for a snapshot and cannot run again into a paused one
// (its files are whole; its memory too when the checkpoint completed), and says so in the error.
func (n *Node) keepAsPaused(ctx context.Context, sb *sandbox, dir string, rec bootRecord, cause error) error {
	ctx = context.WithoutCancel(ctx)
	n.mu.Lock()
	if n.sandboxes[sb.id] == sb {
		delete(n.sandboxes, sb.id)
	}
	n.mu.Unlock()
	sb.stopFollowing()
	_ = n.opts.Runtime.Destroy(ctx, sb.runtimeID)
	if sb.ch != nil {
		_ = sb.ch.Close()
	}
	if sb.link != nil {
		n.opts.Network.ReleaseLater(sb.link)
	}
	if _, ok := n.finishInterruptedPause(ctx, sb.runtimeID); ok {
		n.log.Error("a snapshot left its sandbox stopped; it is paused", "sandbox", sb.id, "err", cause)
		return fmt.Errorf("%w: %w", ErrSandboxPaused, cause)
	}
	return fmt.Errorf("%w: %w", ErrSandboxLost, cause)
}

// CreateFromSnapshot starts a new sandbox (spec.ID, its own token, writable layer, link and lease)
// from snapshot snapID, or, when pausedID is set, from that paused sandbox's saved state (fork of
// a paused sandbox); the saved state stays for the next one. The snapshot is verified first.
func (n *Node) CreateFromSnapshot(ctx context.Context, spec CreateSpec, snapID, pausedID string) (Info, error) {
	if !idRe.MatchString(spec.ID) {
		return Info{}, errdefs.InvalidArgument("invalid sandbox id %q", spec.ID)
	}
	var src string
	switch {
	case pausedID != "" && idRe.MatchString(pausedID):
		if err := n.waitFinished(ctx, pausedID); err != nil {
			return Info{}, err
		}
		src = n.pausedDir(pausedID)
	case snapshotIDRe.MatchString(snapID):
		src = n.snapshotDir(snapID)
	default:
		return Info{}, errdefs.InvalidArgument("invalid snapshot id")
	}
	meta, err := snapshot.Read(src)
	if errdefs.Is(err, errdefs.KindNotFound) || errors.Is(err, os.ErrNotExist) {
		return Info{}, errdefs.NotFound("snapshot %q not found on this node", filepath.Base(src))
	}
	if err != nil {
		return Info{}, err
	}
	lowers := make([]string, len(meta.Lowers))
	for i, l := range meta.Lowers {
		lowers[i] = filepath.Join(n.opts.DataDir, l)
	}
	bs := bootSpec{runtimeID: spec.ID, templateID: meta.TemplateID, lowers: lowers, cpus: meta.CPUs,
		memoryMB: meta.MemoryMB, diskMB: meta.DiskMB, policy: &spec.Egress, volumes: spec.Volumes,
		layer: filepath.Join(src, snapshot.LayerDir), copyLayer: true,
		gate: func() error { _, err := snapshot.Verify(src); return err }}
	if meta.Memory {
		bs.checkpoint, bs.channel = filepath.Join(src, snapshot.CheckpointDir), meta.Channel
		if bs.envd, err = n.envdFor(meta); err != nil {
			return Info{}, err
		}
	}
	if err := n.fromSnapshot(ctx, &bs, meta); err != nil {
		return Info{}, err
	}
	sb, err := n.boot(ctx, bs)
	if err != nil {
		return Info{}, err
	}
	sb.envdToken = meta.EnvdToken
	var img Image
	if !meta.Memory {
		if img, err = n.opts.Templates.Image(ctx, meta.TemplateID, meta.BuildID); err != nil {
			img = Image{}
		}
	}
	return n.handOut(ctx, sb, spec, img)
}

// DeleteSnapshot removes snapshot snapID; one that is not there is success.
func (n *Node) DeleteSnapshot(_ context.Context, snapID string) error {
	if !snapshotIDRe.MatchString(snapID) {
		return errdefs.InvalidArgument("invalid snapshot id")
	}
	if err := os.RemoveAll(n.snapshotDir(snapID)); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", snapID, err)
	}
	return nil
}

// Snapshots lists the snapshots on this node (after removing unfinished ones).
func (n *Node) Snapshots() ([]string, error) {
	root := filepath.Join(n.opts.DataDir, "snapshots")
	if err := snapshot.Sweep(root); err != nil {
		return nil, err
	}
	return dirsMatching(root, snapshotIDRe)
}

// errStartDisk is why a sandbox whose disk size differs from its template's started snapshot's
// runs the start command itself.
var errStartDisk = errors.New("the started snapshot was taken on a root image with another disk size")

// createFromStart restores a new sandbox from its template build's started snapshot: the start
// command is running and ready in it from its first instruction, with the sandbox's own disk
// (the snapshot's files copied onto it), link, lease, token and variables.
func (n *Node) createFromStart(ctx context.Context, spec CreateSpec, img Image) (Info, error) {
	src := img.StartSnapshot
	meta, err := snapshot.Read(src)
	if err != nil {
		return Info{}, err
	}
	if meta.RootImage != "" && spec.DiskMB != meta.DiskMB {
		// runsc restores a checkpoint on a root image only with the root size it was taken with.
		return Info{}, fmt.Errorf("%w: the snapshot's disk is %d MiB, this sandbox's %d MiB", errStartDisk, meta.DiskMB, spec.DiskMB)
	}
	envd, err := n.envdFor(meta)
	if err != nil {
		return Info{}, err
	}
	lowers := make([]string, len(meta.Lowers))
	for i, l := range meta.Lowers {
		lowers[i] = filepath.Join(n.opts.DataDir, l)
	}
	bs := bootSpec{runtimeID: spec.ID, templateID: spec.TemplateID, lowers: lowers, envd: envd,
		cpus: meta.CPUs, memoryMB: meta.MemoryMB, diskMB: spec.DiskMB, policy: &spec.Egress,
		layer: filepath.Join(src, snapshot.LayerDir), copyLayer: true,
		checkpoint: filepath.Join(src, snapshot.CheckpointDir), channel: meta.Channel,
		gate: func() error { _, err := snapshot.Verify(src); return err }}
	if err := n.fromSnapshot(ctx, &bs, meta); err != nil {
		return Info{}, err
	}
	sb, err := n.boot(ctx, bs)
	if err != nil {
		return Info{}, err
	}
	img.StartCmd = "" // running already
	return n.handOut(ctx, sb, spec, img)
}
