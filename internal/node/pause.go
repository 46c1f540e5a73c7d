package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/rootimage"
	"github.com/vibemon/vmon/internal/runtime"
	"github.com/vibemon/vmon/internal/snapshot"
)

// ErrSandboxLost is wrapped by a pause that stopped the sandbox but could not keep it: it is
// neither running nor paused, and its owner must record it as gone.
var ErrSandboxLost = errors.New("the sandbox stopped and its state could not be saved")

// ErrDiskBusy is wrapped by a RootFS's Stash when the sandbox's disk is still mounted elsewhere
// after its unmount: nothing was moved, and the image may yet change (the filesystem writes to
// it when the last mount goes), so no snapshot may seal it yet. Stash may be called again.
var ErrDiskBusy = errors.New("the sandbox's disk is still mounted elsewhere")

// DiskHolders is implemented by a RootFS that can tell where else a sandbox's disk is mounted
// (a copy in another mount namespace, a bind mount): anywhere but the sandbox's own mounts.
type DiskHolders interface {
	DiskHolders(sandboxDir string) ([]string, error)
}

// stashPatience bounds how long a pause's background work waits for a sandbox disk that is still
// mounted elsewhere after the runtime stopped. Until then the snapshot is not sealed (nor can a
// resume start); past it the pause is left to the next start's recovery.
var stashPatience = 2 * time.Minute

// holderPatience is how long a pause waits for other mounts of a sandbox's disk to go before it
// refuses: a runtime starting another sandbox (a warm pool refilling) copies the node's mounts
// into the namespaces it makes, for the moment until it has switched to the sandbox's root.
var holderPatience = 2 * time.Second

// diskHeld refuses to pause sandbox id while its disk is mounted anywhere but in the sandbox
// itself: the snapshot would seal an image that changes when that mount goes.
func (n *Node) diskHeld(ctx context.Context, id, dir string) error {
	h, ok := n.opts.RootFS.(DiskHolders)
	if !ok {
		return nil
	}
	var holders []string
	for deadline := time.Now().Add(holderPatience); ; {
		var err error
		holders, err = h.DiskHolders(dir)
		if err != nil {
			// Stash's wait is still there to keep a snapshot from sealing a held disk.
			n.log.Warn("cannot tell whether a sandbox's disk is mounted elsewhere", "sandbox", id, "err", err)
			return nil
		}
		if len(holders) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	n.log.Error("refusing to pause a sandbox whose disk is mounted elsewhere", "sandbox", id, "mounts", strings.Join(holders, "; "))
	return errdefs.Unavailable("sandbox %q cannot be paused now: its disk is also mounted outside the sandbox on the host (see the server log), so its snapshot would not stay intact; it keeps running", id)
}

// Files in a sandbox directory that make pause and resume crash-safe.
const (
	// bootFile records what the sandbox was booted from (template layers, resources, the runtime
	// spec), so a pause or a snapshot after a node restart still knows them.
	bootFile = "boot.json"
	// pausingFile marks a pause in progress: recovery finishes it or calls it off.
	pausingFile = "pausing"
	// resumingFile marks a resume in progress: recovery either keeps the resumed sandbox (its
	// runtime runs) or gives the writable layer back to the paused snapshot.
	resumingFile = "resuming"
	// markSnapshot is the pausing mark's content while a snapshot (or fork) stops the sandbox:
	// recovery finishes it as a pause the sandbox's owner did not ask for, so it resumes it.
	markSnapshot = "snapshot"
)

// bootRecord is bootFile's content.
type bootRecord struct {
	TemplateID string `json:"templateID"`
	// Lowers are relative to the data directory.
	Lowers   []string `json:"lowers"`
	CPUs     int      `json:"cpus"`
	MemoryMB int      `json:"memoryMB"`
	DiskMB   int      `json:"diskMB"`
	// Envd is the envd build's directory relative to the data directory ("" when outside it).
	Envd string `json:"envd,omitempty"`
	// Runtime is the spec the runtime started with: a snapshot restores the sandbox in place
	// with it.
	Runtime runtime.Spec `json:"runtime"`
	// Channel is how its envd gets the agent channel (channelControl, ...); a checkpoint of the
	// sandbox is restored the same way.
	Channel string `json:"channel,omitempty"`
	// RootImageDigest is the digest of Runtime.RootImage, for the sandbox's checkpoints.
	RootImageDigest string `json:"rootImageDigest,omitempty"`
	// Shell is what the node runs its own commands in (bash when the root has it): a sandbox
	// adopted after a restart has no root on the host to look in.
	Shell []string `json:"shell,omitempty"`
}

// writeBootRecord is one small file written on every boot (the create path).
func writeBootRecord(dir, dataDir, envdDir string, bs bootSpec, rspec runtime.Spec, channel, imageDigest string, shell []string) error {
	rec := bootRecord{TemplateID: bs.templateID, CPUs: bs.cpus, MemoryMB: bs.memoryMB, DiskMB: bs.diskMB,
		Envd: relEnvd(dataDir, envdDir), Runtime: rspec, Channel: channel, RootImageDigest: imageDigest, Shell: shell}
	for _, l := range bs.lowers {
		rel, err := filepath.Rel(dataDir, l)
		if err != nil || !filepath.IsLocal(rel) {
			// Template builds may stack layers from elsewhere; such a sandbox cannot be paused.
			rec.Lowers = nil
			break
		}
		rec.Lowers = append(rec.Lowers, rel)
	}
	return writeBootRecordFile(dir, rec)
}

func writeBootRecordFile(dir string, rec bootRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, bootFile), b); err != nil {
		return fmt.Errorf("record what the sandbox booted from: %w", err)
	}
	return nil
}

// onImage says the sandbox booted from a root image: its writable layer is inside its runtime,
// and only a checkpoint keeps it.
func (r bootRecord) onImage() bool { return r.Runtime.RootImage != "" }

// relImage is the sandbox's root image relative to the data directory, for a snapshot's record.
func (n *Node) relImage(r bootRecord) string {
	if !r.onImage() {
		return ""
	}
	rel, err := filepath.Rel(n.opts.DataDir, r.Runtime.RootImage)
	if err != nil || !filepath.IsLocal(rel) {
		return r.Runtime.RootImage
	}
	return filepath.ToSlash(rel)
}

// fromSnapshot makes bs restore the checkpoint in meta on the root image it was taken on, if it
// was: the writable layer is then inside the checkpoint, not beside it. A node with root images
// builds the image if it is missing (the snapshot came from another node); a node without them
// restores it only on an image that is there.
func (n *Node) fromSnapshot(ctx context.Context, bs *bootSpec, meta snapshot.Meta) error {
	if meta.RootImage == "" {
		return nil
	}
	path := filepath.FromSlash(meta.RootImage)
	if !filepath.IsAbs(path) {
		path = filepath.Join(n.opts.DataDir, path)
	}
	img := rootimage.Image{Path: path}
	if n.opts.RootImages != nil {
		var err error
		if img, err = n.opts.RootImages.ForRestore(ctx, path, bs.lowers, n.envdDir(*bs)); err != nil {
			return errdefs.Unavailable("snapshot %s was taken on root image %s, which this node does not have: %v", meta.SandboxID, filepath.Base(path), err)
		}
	} else if _, err := os.Stat(path); err != nil {
		return errdefs.Unavailable("snapshot %s was taken on root image %s, which this node does not have (a node started with --root-images builds it)",
			meta.SandboxID, filepath.Base(path))
	}
	// A checkpoint restored on another image would map its files' pages by the wrong offsets.
	if meta.RootImageDigest != "" && img.Digest != "" && img.Digest != meta.RootImageDigest {
		return errdefs.Unavailable("snapshot %s was taken on root image %s (%s), and this node's differs (%s)",
			meta.SandboxID, filepath.Base(path), meta.RootImageDigest, img.Digest)
	}
	if img.Path != path && (meta.RootImageDigest == "" || img.Digest == "") {
		// Another image of the same template, and no digests to say it holds the same bytes.
		return errdefs.Unavailable("snapshot %s was taken on root image %s, which this node does not have", meta.SandboxID, filepath.Base(path))
	}
	bs.rootImage, bs.layer, bs.copyLayer = img, "", false
	return nil
}

// readBootRecord reads the boot record of a sandbox that can be paused or snapshotted.
func readBootRecord(dir string) (bootRecord, error) {
	rec, err := readBootFile(dir)
	if err == nil && len(rec.Lowers) == 0 {
		err = errors.New("its template layers are outside the data directory")
	}
	return rec, err
}

// readBootFile reads any sandbox's boot record.
func readBootFile(dir string) (bootRecord, error) {
	var rec bootRecord
	b, err := os.ReadFile(filepath.Join(dir, bootFile))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	return rec, err
}

// pausedDir is where a paused sandbox's snapshot lives.
func (n *Node) pausedDir(id string) string { return filepath.Join(n.opts.DataDir, "paused", id) }

// PausedDir is where the node keeps paused sandbox id: a cluster's store carries it from there to
// another node's.
func (n *Node) PausedDir(id string) string { return n.pausedDir(id) }

// Settled waits until what a pause, resume or snapshot of sandbox id does in the background is
// done: a paused sandbox's directory is then whole.
func (n *Node) Settled(ctx context.Context, id string) error { return n.waitFinished(ctx, id) }

// PauseInfo describes a paused sandbox.
type PauseInfo struct {
	// Memory says the sandbox's memory and processes were kept (else only its files).
	Memory bool
	// Bytes is the disk space the paused sandbox takes.
	Bytes int64
	// stash and seal time the steps after the runtime stopped, for the log.
	stash, seal time.Duration
}

// PauseSandbox stops sandbox id and keeps it in a snapshot: with memory, a checkpoint of its
// memory, processes and open sockets plus its writable layer; without, the layer alone (after the
// guest flushed its writes). Afterwards the sandbox holds no runtime, no memory and no link (it
// went back to the pool). A sandbox whose checkpoint fails keeps running and the error says why.
func (n *Node) PauseSandbox(ctx context.Context, id string, memory bool) (PauseInfo, error) {
	if !idRe.MatchString(id) {
		return PauseInfo{}, errdefs.InvalidArgument("invalid sandbox id %q", id)
	}
	// A resume's spent snapshot may still be going away in the background.
	if err := n.waitFinished(ctx, id); err != nil {
		return PauseInfo{}, err
	}
	final := n.pausedDir(id)
	if _, err := os.Stat(final); err == nil {
		return PauseInfo{}, errdefs.Conflict("sandbox %q is already paused", id)
	}
	sb, ok := n.lookup(id)
	if !ok {
		return PauseInfo{}, errdefs.NotFound("sandbox %q is not running on this node", id)
	}
	cp, canCheckpoint := n.opts.Runtime.(runtime.Checkpointer)
	if memory && !canCheckpoint {
		return PauseInfo{}, errdefs.Unavailable("this node's runtime cannot keep a sandbox's memory; pause it with memory:false")
	}
	dir := n.sandboxDir(sb.runtimeID)
	rec, err := readBootRecord(dir)
	if err != nil {
		return PauseInfo{}, errdefs.Wrap(errdefs.KindUnavailable, err, "sandbox %q cannot be paused", id)
	}
	if rec.onImage() && !memory {
		// Its files live in the runtime (a root image's writable layer): only a checkpoint keeps
		// them, and it keeps the memory too.
		if !canCheckpoint {
			return PauseInfo{}, errdefs.Unavailable("this node's runtime cannot keep a sandbox's files")
		}
		n.log.Info("pausing a sandbox on a root image with its memory: only a checkpoint keeps its files", "sandbox", id)
		memory = true
	}
	release, err := n.checkSnapshotBudget(ctx, sb, memory)
	if err != nil {
		return PauseInfo{}, err
	}
	// Released when the snapshot is published, in the background, or at once if the pause stops
	// short of it.
	handedOff := false
	defer func() {
		if !handedOff {
			release()
		}
	}()
	if err := n.diskHeld(ctx, id, dir); err != nil {
		return PauseInfo{}, err
	}
	began := time.Now()
	tmp, err := snapshot.TempDir(final)
	if err != nil {
		return PauseInfo{}, err
	}
	if err := writeFileAtomic(filepath.Join(dir, pausingFile), nil); err != nil {
		_ = os.RemoveAll(tmp)
		return PauseInfo{}, fmt.Errorf("mark pause: %w", err)
	}
	// From here the runtime's exit is expected.
	sb.stopping.Store(true)
	// A checkpoint leaves the stopped runtime's remains (runsc state, cgroups) to Destroy, which
	// runs after the answer with the rest of the snapshot's writing.
	destroyLater := memory
	if memory {
		n.endStreams(ctx, sb, agentproto.EndStreamsPause)
		if err = n.park(ctx, sb, rec.Channel); err == nil {
			err = n.checkpoint(ctx, cp, sb, tmp)
		}
		if err == nil {
			if herr := n.diskHeld(context.WithoutCancel(ctx), id, dir); herr != nil {
				// Mounted elsewhere while the checkpoint ran: the sandbox goes on from the
				// checkpoint it just took (as after a snapshot) and the pause fails.
				destroyed := make(chan error, 1)
				go func() { destroyed <- n.opts.Runtime.Destroy(context.WithoutCancel(ctx), sb.runtimeID) }()
				rerr := n.restartFrom(ctx, cp, sb, rec, tmp, destroyed)
				if rerr == nil {
					_ = os.RemoveAll(tmp)
					return PauseInfo{}, herr
				}
				// Stopped for good: the pause goes on, and its snapshot waits for the disk.
				n.log.Error("a sandbox could not go on after a refused pause; pausing it", "sandbox", id, "err", rerr)
			}
		}
	} else {
		n.endStreams(ctx, sb, agentproto.EndStreamsPauseFiles)
		n.flushGuest(ctx, sb)
		err = n.opts.Runtime.Destroy(ctx, sb.runtimeID)
	}
	if err != nil {
		if st, serr := n.opts.Runtime.Status(context.WithoutCancel(ctx), sb.runtimeID); serr == nil && st == runtime.StatusRunning {
			// Nothing was lost: the sandbox goes on as it was.
			n.unpark(sb, rec.Channel)
			sb.stopping.Store(false)
			_ = os.Remove(filepath.Join(dir, pausingFile))
			_ = os.RemoveAll(tmp)
			return PauseInfo{}, fmt.Errorf("pause sandbox %s: %w", id, err)
		}
		if rec.onImage() {
			// Its files were in the runtime that is gone.
			_ = os.RemoveAll(tmp)
			n.mu.Lock()
			if n.sandboxes[id] == sb {
				delete(n.sandboxes, id)
			}
			n.mu.Unlock()
			return PauseInfo{}, fmt.Errorf("pause sandbox %s: %w: %w", id, ErrSandboxLost, errors.Join(err, n.teardown(context.WithoutCancel(ctx), sb)))
		}
		// The runtime is gone with its memory; its files are still whole, so the pause goes on
		// without memory rather than losing the sandbox.
		n.log.Error("checkpoint failed and the sandbox stopped; keeping its files only", "sandbox", id, "err", err)
		_ = os.RemoveAll(filepath.Join(tmp, snapshot.CheckpointDir))
		memory = false
	}
	n.mu.Lock()
	if n.sandboxes[id] == sb {
		delete(n.sandboxes, id)
	}
	n.mu.Unlock()
	sb.stopFollowing()
	if sb.ch != nil {
		_ = sb.ch.Close()
	}
	if sb.link != nil {
		// The runtime is gone: the link goes back to the pool closed and flushed, as on kill.
		n.opts.Network.ReleaseLater(sb.link)
		sb.link = nil
	}
	stopped := time.Since(began)
	// The sandbox is stopped and its memory saved: the pause has happened. Writing the snapshot
	// (moving the disk image, checksums, syncing it all to disk) goes on in the background, and
	// everything that reads a paused sandbox waits for it (waitFinished). A crash meanwhile is
	// finished by recovery from the pausing mark, as for a pause interrupted at any other point.
	estimate := snapshot.Bytes(tmp) + layerBytes(dir)
	handedOff = true
	n.inBackground(id, func() {
		defer release()
		bctx := context.WithoutCancel(ctx)
		if destroyLater {
			if err := n.opts.Runtime.Destroy(bctx, sb.runtimeID); err != nil {
				// Its files may still be held; recovery removes the runtime at the next start.
				n.log.Error("remove the runtime of a paused sandbox", "sandbox", id, "err", err)
			}
		}
		info, err := n.finishPause(bctx, id, dir, tmp, rec, memory)
		if err != nil {
			// The next start's recovery tries again from the pausing mark; until then a resume
			// finds no snapshot and the sandbox is reported gone.
			n.log.Error("writing a paused sandbox's snapshot failed", "sandbox", id, "err", err)
			return
		}
		n.log.Info("sandbox paused", "sandbox", id, "memory", memory, "bytes", info.Bytes,
			"stopped", stopped.Round(time.Millisecond), "stash", info.stash.Round(time.Millisecond),
			"seal", info.seal.Round(time.Millisecond), "took", time.Since(began).Round(time.Millisecond))
	})
	return PauseInfo{Memory: memory, Bytes: estimate}, nil
}

// inBackground runs fn, work on sandbox id's saved state that the caller need not wait for;
// waitFinished(id) waits for it, and Close for all of them.
func (n *Node) inBackground(id string, fn func()) {
	done := make(chan struct{})
	n.mu.Lock()
	n.finishing[id] = done
	n.mu.Unlock()
	n.finishWG.Add(1)
	go func() {
		defer n.finishWG.Done()
		defer func() {
			n.mu.Lock()
			delete(n.finishing, id)
			n.mu.Unlock()
			close(done)
		}()
		fn()
	}()
}

// waitFinished waits until the background work on sandbox id's saved state is done: a pause's
// snapshot being written, or a resume's spent snapshot being removed.
func (n *Node) waitFinished(ctx context.Context, id string) error {
	n.mu.Lock()
	done := n.finishing[id]
	n.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the pause of %s to be written: %w", id, ctx.Err())
	}
}

// checkpoint saves sb's runtime into tmp's checkpoint directory. The runtime marks it complete
// itself, even if this process dies before it is done (AwaitCheckpoint).
func (n *Node) checkpoint(ctx context.Context, cp runtime.Checkpointer, sb *sandbox, tmp string) error {
	return cp.Checkpoint(ctx, sb.runtimeID, filepath.Join(tmp, snapshot.CheckpointDir), false)
}

// endStreams asks envd to end every open process event stream with reason (an
// agentproto.EndStreams* value) before the sandbox is frozen, so a client streaming a command
// reads that the sandbox was paused or snapshotted instead of a cut connection it would take for
// a dead sandbox. It is best effort: envd answers once the streams ended (it bounds that itself),
// and an envd too old to know the endpoint answers 404.
func (n *Node) endStreams(ctx context.Context, sb *sandbox, reason string) {
	if sb.ch == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	status, err := n.postEnvd(ctx, sb, agentproto.EndStreamsPath, agentproto.EndStreamsRequest{Reason: reason})
	if err != nil {
		n.log.Warn("envd did not end the process streams before a pause", "sandbox", sb.id, "err", err)
		return
	}
	if status != http.StatusNoContent {
		n.log.Debug("envd did not end the process streams before a pause", "sandbox", sb.id, "status", status)
	}
}

// postEnvd posts body as JSON to one of envd's vmon endpoints over sb's agent channel, with the
// sandbox's access token, and returns the answer's status.
func (n *Node) postEnvd(ctx context.Context, sb *sandbox, path string, body any) (int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, envdURL(path), bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if sb.token != "" {
		req.Header.Set("X-Access-Token", sb.token)
	}
	resp, err := (&http.Client{Transport: sb.ch.Transport()}).Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return resp.StatusCode, nil
}

// flushGuest asks the guest to write its cached file data back before its runtime is stopped
// without a checkpoint. It is best effort: a guest that does not answer loses only what it had
// not written yet, as a machine does at power-off.
func (n *Node) flushGuest(ctx context.Context, sb *sandbox) {
	if sb.ch == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	code, err := runGuest(ctx, sb.ch, sb.token, guestCmd{Shell: []string{"/bin/sh"}, Script: "sync", User: "root", Tag: agentproto.InternalTagPrefix + "sync"}, nil)
	if err != nil || code != 0 {
		n.log.Warn("guest did not flush its files before a pause", "sandbox", sb.id, "exit", code, "err", err)
	}
}

// finishPause moves the stopped sandbox's writable layer into the snapshot, seals and publishes
// it and removes what is left of the sandbox directory. Recovery calls it to finish a pause a
// crash interrupted.
func (n *Node) finishPause(ctx context.Context, id, dir, tmp string, rec bootRecord, memory bool) (PauseInfo, error) {
	layer := filepath.Join(tmp, snapshot.LayerDir)
	if err := os.MkdirAll(layer, 0o700); err != nil {
		return PauseInfo{}, err
	}
	t0 := time.Now()
	if ents, _ := os.ReadDir(layer); len(ents) == 0 && !rec.onImage() {
		// A disk still mounted elsewhere (each Stash waits a while) is never sealed: its image
		// changes when that mount goes.
		for {
			err := n.opts.RootFS.Stash(ctx, dir, layer)
			if err == nil {
				break
			}
			if !errors.Is(err, ErrDiskBusy) || time.Since(t0) > stashPatience {
				return PauseInfo{}, fmt.Errorf("pause sandbox %s: keep its files: %w", id, err)
			}
			n.log.Warn("a paused sandbox's disk is still mounted elsewhere; its snapshot waits", "sandbox", id, "err", err)
		}
	}
	t1 := time.Now()
	// The token envd holds: forks of the paused sandbox prove it to envd to install their own.
	token, _ := os.ReadFile(filepath.Join(dir, accessTokenFile))
	meta := snapshot.Meta{SandboxID: id, CreatedAt: time.Now().UTC(), TemplateID: rec.TemplateID,
		Lowers: rec.Lowers, CPUs: rec.CPUs, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB, Memory: memory,
		EnvdToken: string(token)}
	if memory {
		meta.Envd, meta.Channel, meta.RootImage, meta.RootImageDigest = rec.Envd, rec.Channel, n.relImage(rec), rec.RootImageDigest
	}
	final := n.pausedDir(id)
	if err := snapshot.Seal(tmp, meta); err != nil {
		return PauseInfo{}, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	if err := snapshot.Publish(tmp, final); err != nil {
		return PauseInfo{}, fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	t2 := time.Now()
	// The snapshot is whole; the rest of the sandbox directory owns nothing any more.
	if err := n.opts.RootFS.Release(ctx, dir); err != nil {
		n.log.Warn("release the root of a paused sandbox", "sandbox", id, "err", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		n.log.Warn("remove the directory of a paused sandbox", "sandbox", id, "err", err)
	}
	return PauseInfo{Memory: memory, Bytes: snapshot.Bytes(final), stash: t1.Sub(t0), seal: t2.Sub(t1)}, nil
}

// ResumeSandbox brings paused sandbox spec.ID back on this node. With memory (and a snapshot
// that kept it) its processes go on where they stopped; otherwise it boots afresh over its files
// and the template's start command runs again. Either way it gets a link from the pool with
// spec.Egress attached before its first instruction, and its lease, token and variables through
// envd's /init before ResumeSandbox returns. A failed resume leaves the sandbox paused.
func (n *Node) ResumeSandbox(ctx context.Context, spec CreateSpec, memory bool) (Info, error) {
	if !idRe.MatchString(spec.ID) {
		return Info{}, errdefs.InvalidArgument("invalid sandbox id %q", spec.ID)
	}
	if _, ok := n.lookup(spec.ID); ok {
		return Info{}, errdefs.Conflict("sandbox %q is already running", spec.ID)
	}
	if err := n.waitFinished(ctx, spec.ID); err != nil {
		return Info{}, err
	}
	final := n.pausedDir(spec.ID)
	began := time.Now()
	meta, err := snapshot.Read(final)
	if errdefs.Is(err, errdefs.KindNotFound) || errors.Is(err, os.ErrNotExist) {
		return Info{}, errdefs.NotFound("paused sandbox %q not found on this node", spec.ID)
	}
	if err != nil {
		return Info{}, err
	}
	var verified time.Duration
	verifyFailed := false
	// A snapshot on a root image holds its files only in its checkpoint.
	useMemory := (memory && meta.Memory) || meta.RootImage != ""
	lowers := make([]string, len(meta.Lowers))
	for i, l := range meta.Lowers {
		lowers[i] = filepath.Join(n.opts.DataDir, l)
	}
	bs := bootSpec{runtimeID: spec.ID, templateID: meta.TemplateID, lowers: lowers, cpus: meta.CPUs,
		memoryMB: meta.MemoryMB, diskMB: meta.DiskMB, policy: &spec.Egress, volumes: spec.Volumes,
		layer: filepath.Join(final, snapshot.LayerDir),
		gate: func() error {
			t := time.Now()
			_, err := snapshot.Verify(final)
			verified, verifyFailed = time.Since(t), err != nil
			return err
		}}
	if useMemory {
		bs.checkpoint, bs.channel = filepath.Join(final, snapshot.CheckpointDir), meta.Channel
		if bs.envd, err = n.envdFor(meta); err != nil {
			return Info{}, err
		}
	}
	if err := n.fromSnapshot(ctx, &bs, meta); err != nil {
		return Info{}, err
	}
	spec.TemplateID, spec.CPUs, spec.MemoryMB, spec.DiskMB = meta.TemplateID, meta.CPUs, meta.MemoryMB, meta.DiskMB
	sb, err := n.bootMarked(ctx, bs)
	if err != nil {
		if !verifyFailed {
			// The layer may have been mounted; a damaged snapshot must stay refused.
			n.reseal(final, meta)
		}
		return Info{}, err
	}
	booted := time.Since(began)
	var img Image
	if !useMemory {
		// A reboot runs the template's start command again: the image of the build it came from.
		if img, err = n.opts.Templates.Image(ctx, meta.TemplateID, meta.BuildID); err != nil {
			n.log.Warn("template of a resumed sandbox is gone; resuming without its start command", "sandbox", spec.ID, "err", err)
			img = Image{}
		}
	}
	info, err := n.handOut(ctx, sb, spec, img)
	if err != nil {
		// handOut's teardown gave the layer back (releaseRoot).
		n.reseal(final, meta)
		return Info{}, err
	}
	// The sandbox runs on its own files now; the snapshot is spent. Deleting its memory image
	// takes a while (hundreds of MiB on a journaling filesystem): it is renamed out of the way,
	// so a pause right after this one need not wait, and deleted in the background (a crash
	// leaves it to Sweep). The mark goes once the snapshot is gone from its place.
	if trash, err := snapshot.Discard(final); err == nil {
		_ = os.Remove(filepath.Join(n.sandboxDir(spec.ID), resumingFile))
		n.finishWG.Add(1)
		go func() {
			defer n.finishWG.Done()
			if err := os.RemoveAll(trash); err != nil {
				n.log.Warn("remove the snapshot of a resumed sandbox", "sandbox", spec.ID, "err", err)
			}
		}()
	} else {
		n.inBackground(spec.ID, func() {
			if err := os.RemoveAll(final); err != nil {
				n.log.Warn("remove the snapshot of a resumed sandbox", "sandbox", spec.ID, "err", err)
				return
			}
			_ = os.Remove(filepath.Join(n.sandboxDir(spec.ID), resumingFile))
		})
	}
	n.log.Info("sandbox resumed", "sandbox", spec.ID, "memory", useMemory, "verify", verified.Round(time.Millisecond),
		"booted", booted.Round(time.Millisecond), "took", time.Since(began).Round(time.Millisecond))
	return info, nil
}

// bootMarked is boot for a resume: the sandbox directory carries resumingFile from before the
// layer moves until the resume is complete.
func (n *Node) bootMarked(ctx context.Context, bs bootSpec) (*sandbox, error) {
	bs.mark = resumingFile
	return n.boot(ctx, bs)
}

// releaseRoot releases a stopped sandbox's root and removes its directory. The writable layer of
// a resume that did not complete (resumingFile) is the paused sandbox's only copy of its files:
// it goes back into the snapshot first, and if that fails the directory stays for recovery.
func (n *Node) releaseRoot(ctx context.Context, runtimeID string) error {
	dir := n.sandboxDir(runtimeID)
	if _, err := os.Stat(filepath.Join(dir, resumingFile)); err == nil {
		// A snapshot on a root image has no layer beside its checkpoint: an empty one is no sign
		// that the resume took it.
		meta, merr := snapshot.Read(n.pausedDir(runtimeID))
		layer := filepath.Join(n.pausedDir(runtimeID), snapshot.LayerDir)
		if ents, err := os.ReadDir(layer); err == nil && len(ents) == 0 && (merr != nil || meta.RootImage == "") {
			if err := n.opts.RootFS.Stash(ctx, dir, layer); err != nil {
				return fmt.Errorf("return the writable layer of an unfinished resume: %w", err)
			}
			if merr == nil {
				n.reseal(n.pausedDir(runtimeID), meta)
			}
		}
	}
	if err := n.opts.RootFS.Release(ctx, dir); err != nil {
		return fmt.Errorf("release root filesystem: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove sandbox dir: %w", err)
	}
	return nil
}

// reseal refreshes a paused snapshot's checksums after a failed resume mounted its layer (mounting
// alone rewrites a filesystem's superblock); no guest instruction ran on it.
func (n *Node) reseal(final string, meta snapshot.Meta) {
	if err := snapshot.Seal(final, meta); err != nil {
		n.log.Error("reseal a paused sandbox after a failed resume", "dir", final, "err", err)
	}
}

// DeletePaused removes paused sandbox id's snapshot (a kill of a paused sandbox). A sandbox that is
// not paused here is success.
func (n *Node) DeletePaused(ctx context.Context, id string) error {
	if !idRe.MatchString(id) {
		return errdefs.InvalidArgument("invalid sandbox id %q", id)
	}
	if err := n.waitFinished(ctx, id); err != nil {
		return err
	}
	if err := os.RemoveAll(n.pausedDir(id)); err != nil {
		return fmt.Errorf("delete paused sandbox %s: %w", id, err)
	}
	return nil
}

// Paused lists the sandboxes paused on this node.
func (n *Node) Paused() ([]string, error) {
	return dirsMatching(filepath.Join(n.opts.DataDir, "paused"), idRe)
}

// dirsMatching lists the subdirectories of root whose names match re (none if root is missing).
func dirsMatching(root string, re *regexp.Regexp) ([]string, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && re.MatchString(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// settleAdopted clears what a crash left of a pause, snapshot or resume of a sandbox that is
// running: a pause or snapshot whose runtime still runs (it had not stopped yet, or was restored
// from its checkpoint already) is called off, and a resume whose runtime came up is complete, so
// its spent snapshot goes.
func (n *Node) settleAdopted(ctx context.Context, sb *sandbox, hadMark bool) {
	dir := n.sandboxDir(sb.runtimeID)
	if hadMark {
		// A runtime restored in place comes back with the placeholder address only; giving the
		// guest its lease again is harmless when it never stopped.
		wctx, cancel := context.WithTimeout(ctx, n.opts.BootTimeout)
		if err := n.pushNetwork(wctx, sb); err != nil {
			n.log.Warn("envd did not take its network back after recovery", "sandbox", sb.id, "err", err)
		}
		cancel()
		_ = os.Remove(filepath.Join(dir, pausingFile))
		n.log.Info("a pause or snapshot was interrupted while the sandbox ran; it keeps running", "sandbox", sb.id)
	}
	if err := os.Remove(filepath.Join(dir, resumingFile)); err == nil {
		n.log.Info("a resume was interrupted after the sandbox started; it keeps running", "sandbox", sb.id)
		_ = os.RemoveAll(n.pausedDir(sb.id))
	}
}

// finishInterruptedPause completes the pause of a sandbox whose runtime a crash (or a failed
// snapshot) left stopped half-way: its files are still whole, so it becomes paused, with memory
// when its checkpoint completed, instead of lost. It reports whether rid was such a sandbox and
// is now paused, and whether with memory.
func (n *Node) finishInterruptedPause(ctx context.Context, rid string) (memory, ok bool) {
	dir := n.sandboxDir(rid)
	if _, err := os.Stat(filepath.Join(dir, pausingFile)); err != nil {
		return false, false
	}
	b, err := os.ReadFile(filepath.Join(dir, sandboxIDFile))
	id := string(b)
	if err != nil || !idRe.MatchString(id) {
		return false, false
	}
	final := n.pausedDir(id)
	if meta, err := snapshot.Read(final); err == nil {
		// Published already; only the sandbox directory was left.
		if err := n.releaseRoot(ctx, rid); err != nil {
			n.log.Warn("remove the directory of a paused sandbox", "sandbox", id, "err", err)
		}
		return meta.Memory, true
	}
	rec, err := readBootRecord(dir)
	if err != nil {
		n.log.Error("cannot finish an interrupted pause", "sandbox", id, "err", err)
		return false, false
	}
	// Among the unfinished snapshots of this sandbox, one whose checkpoint completed keeps memory.
	tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(final), ".tmp-"+id+"-*"))
	tmp := ""
	if cp, can := n.opts.Runtime.(runtime.Checkpointer); can {
		for _, t := range tmps {
			if done, err := cp.AwaitCheckpoint(ctx, rid, filepath.Join(t, snapshot.CheckpointDir)); err == nil && done {
				tmp, memory = t, true
				break
			}
		}
	}
	if tmp == "" && rec.onImage() {
		// Its files were in the runtime, and no checkpoint of it completed.
		n.log.Error("an interrupted pause or snapshot kept nothing of a sandbox on a root image; it is gone", "sandbox", id)
		_ = n.opts.Runtime.Destroy(ctx, rid)
		if err := n.releaseRoot(ctx, rid); err != nil {
			n.log.Warn("remove the directory of a lost sandbox", "sandbox", id, "err", err)
		}
		return false, false
	}
	if tmp == "" {
		if tmp, err = snapshot.TempDir(final); err != nil {
			n.log.Error("cannot finish an interrupted pause", "sandbox", id, "err", err)
			return false, false
		}
	}
	// The runtime may be stopped but still registered: remove it before moving its files.
	_ = n.opts.Runtime.Destroy(ctx, rid)
	if _, err := n.finishPause(ctx, id, dir, tmp, rec, memory); err != nil {
		n.log.Error("cannot finish an interrupted pause", "sandbox", id, "err", err)
		return false, false
	}
	n.log.Info("finished a pause a crash interrupted", "sandbox", id, "memory", memory)
	return memory, true
}

// checkSnapshotBudget refuses a pause or snapshot that would take the node's saved state past
// MaxSnapshotBytes, before anything is stopped or written. The estimate is what the pause writes
// at most: its writable layer's allocated blocks, plus the guest's file cache (written back into
// the layer before the stop) and, with memory, the memory in use (the checkpoint's pages). It
// counts the paused sandboxes and the snapshots together. What it lets through is reserved until release is
// called, once the snapshot is published or abandoned: concurrent pauses count each other's
// snapshots before they are written (what one has written so far is counted twice meanwhile,
// which errs on the side of the budget).
func (n *Node) checkSnapshotBudget(ctx context.Context, sb *sandbox, memory bool) (release func(), err error) {
	limit := n.opts.MaxSnapshotBytes
	if limit <= 0 {
		return func() {}, nil
	}
	need := layerBytes(n.sandboxDir(sb.runtimeID))
	if m, err := n.SandboxMetrics(ctx, sb.id); err == nil {
		// The guest's view of its disk is ahead of the image's blocks: the host writes a loop
		// device's data back into the image later.
		need = max(need, m.DiskUsed) + m.MemCache
		if memory {
			need += m.MemUsed
		}
	} else {
		// No sample: assume the worst the sandbox's memory allows.
		need += int64(sb.memoryMB) << 20
	}
	n.snapMu.Lock()
	defer n.snapMu.Unlock()
	used := n.pausedUsage.Bytes(filepath.Join(n.opts.DataDir, "paused")) +
		n.snapsUsage.Bytes(filepath.Join(n.opts.DataDir, "snapshots"))
	if used+n.snapReserved+need > limit {
		return nil, errdefs.InsufficientStorage("not enough snapshot storage to pause sandbox %q: paused sandboxes and snapshots use %d MiB of the node's %d MiB (--max-snapshot-disk), pauses under way may write %d MiB more, and this one needs up to %d MiB; it keeps running",
			sb.id, used>>20, limit>>20, (n.snapReserved+(1<<20)-1)>>20, (need+(1<<20)-1)>>20)
	}
	n.snapReserved += need
	var once sync.Once
	return func() {
		once.Do(func() {
			n.snapMu.Lock()
			n.snapReserved -= need
			n.snapMu.Unlock()
		})
	}, nil
}

// layerBytes is the disk a sandbox's writable layer takes: its disk image's allocated blocks, or
// its upper directory's.
func layerBytes(dir string) int64 {
	if fi, err := os.Stat(filepath.Join(dir, "disk.img")); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			return st.Blocks * 512
		}
	}
	return snapshot.Bytes(filepath.Join(dir, "upper"))
}
