package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
	"github.com/vibemon/vmon/internal/snapshot"
)

// BuildSpec describes a template build sandbox: a throwaway sandbox over the layers built so far
// whose writes become the next layer. It has a link without egress hooks (seed 000: builds have
// unrestricted egress) and is never handed out to API clients.
type BuildSpec struct {
	// Lowers are the layers built so far, topmost first.
	Lowers         []string
	CPUs, MemoryMB int
	// Env is the build's environment at this step (image ENV and the steps' ENV).
	Env map[string]string
	// Start marks the finalize step's start check, whose sandbox may be saved as the template's
	// started snapshot (CheckpointStart): on a node with root images it boots as the template's
	// sandboxes do, on the template's image with the node's disk size, so that the snapshot
	// restores without an overlay.
	Start bool
}

// BuildRuntimePrefix starts the runtime ids of build sandboxes.
const BuildRuntimePrefix = "build"

// BuildSandbox is a running build sandbox. Exactly one of Commit and Discard must be called.
type BuildSandbox struct {
	n     *Node
	sb    *sandbox
	shell []string
	env   map[string]string
}

// StartBuild boots a build sandbox.
func (n *Node) StartBuild(ctx context.Context, spec BuildSpec) (*BuildSandbox, error) {
	// The runtime id marks it as a build: "build" and 20 characters, a length no API sandbox id
	// has. Without a sandbox-id file, recovery after a crash removes it like any unclaimed one.
	id := BuildRuntimePrefix + newRuntimeID()
	bs := bootSpec{runtimeID: id, templateID: "build", lowers: spec.Lowers,
		cpus: spec.CPUs, memoryMB: spec.MemoryMB, unrestricted: true}
	if spec.Start && n.opts.RootImages != nil {
		img, err := n.opts.RootImages.Build(ctx, spec.Lowers, n.envdDir(bs))
		if err != nil {
			// The check and its snapshot still work on an overlay, as without root images.
			n.log.Warn("the template's root image could not be built; its start check runs on an overlay", "err", err)
		} else {
			bs.rootImage, bs.diskMB = img, n.opts.DiskMB
		}
	}
	sb, err := n.boot(ctx, bs)
	if err != nil {
		return nil, err
	}
	// No token: envd without one serves only the node, which alone reaches the agent channel.
	initCtx, cancel := context.WithTimeout(ctx, n.opts.BootTimeout)
	err = n.initEnvd(initCtx, sb, CreateSpec{EnvVars: spec.Env, DefaultUser: "root", DefaultWorkdir: "/"})
	cancel()
	if err != nil {
		_ = n.teardown(context.WithoutCancel(ctx), sb)
		return nil, errdefs.Wrap(errdefs.KindUnavailable, err, "build sandbox did not start")
	}
	return &BuildSandbox{n: n, sb: sb, shell: sb.guestShell(), env: spec.Env}, nil
}

// Shell is the shell build commands run in (bash as a login shell when the image has it).
func (b *BuildSandbox) Shell() []string { return b.shell }

// Root is the sandbox's merged root on the host, to inspect the image (never to write to while
// the sandbox runs: the runtime assumes it owns the files).
func (b *BuildSandbox) Root() string { return b.sb.root }

// Run runs script as user in cwd with env added to the build's, and returns its exit code.
func (b *BuildSandbox) Run(ctx context.Context, script, user, cwd string, env map[string]string,
	out func(stderr bool, data []byte)) (int, error) {
	return runGuest(ctx, b.sb.ch, "", guestCmd{Shell: b.shell, Script: script, User: user, Cwd: cwd, Env: env}, out)
}

// CheckStart starts the template's start command and waits up to timeout for its ready command,
// as every sandbox of the template will. attempt sees each failed ready attempt.
func (b *BuildSandbox) CheckStart(ctx context.Context, start, ready, user, cwd string, timeout time.Duration,
	attempt func(exit int, output []byte)) error {
	if start != "" {
		if _, err := startGuest(ctx, b.sb.ch, "", guestCmd{Shell: b.shell, Script: start, User: user, Cwd: cwd, Tag: agentproto.StartCmdTag}); err != nil {
			return err
		}
	}
	if ready == "" {
		return nil
	}
	return waitReady(ctx, b.sb.ch, "", guestCmd{Shell: b.shell, Script: ready, User: user, Cwd: cwd, Tag: agentproto.InternalTagPrefix + "ready-cmd"}, timeout, attempt)
}

// Commit stops the sandbox and moves everything it wrote to dst (a new directory on the data
// dir's filesystem), then removes the rest of the sandbox.
func (b *BuildSandbox) Commit(ctx context.Context, dst string) error {
	ctx = context.WithoutCancel(ctx)
	dir := b.n.sandboxDir(b.sb.runtimeID)
	// The runtime must be gone before the layer is taken: it may still be flushing writes.
	if err := b.n.opts.Runtime.Destroy(ctx, b.sb.runtimeID); err != nil {
		return errors.Join(fmt.Errorf("stop build sandbox: %w", err), b.n.teardown(ctx, b.sb))
	}
	if err := b.n.opts.RootFS.Commit(ctx, dir, dst); err != nil {
		return errors.Join(fmt.Errorf("commit build layer: %w", err), b.n.teardown(ctx, b.sb))
	}
	return b.n.teardown(ctx, b.sb)
}

// Discard stops the sandbox and removes it with everything it wrote.
func (b *BuildSandbox) Discard(ctx context.Context) error {
	return b.n.teardown(context.WithoutCancel(ctx), b.sb)
}

// CheckpointStart saves the build sandbox, with its start command running and ready, as a
// snapshot in dir (which it creates): every sandbox of the template is then restored from it
// instead of running the start command again (seed 001: a template is a paused running
// machine). The sandbox is gone afterwards, as after Discard.
func (b *BuildSandbox) CheckpointStart(ctx context.Context, dir string) (err error) {
	ctx = context.WithoutCancel(ctx)
	n := b.n
	defer func() { err = errors.Join(err, n.teardown(ctx, b.sb)) }()
	cp, ok := n.opts.Runtime.(runtime.Checkpointer)
	if !ok {
		return errdefs.Unavailable("this node's runtime cannot checkpoint")
	}
	sdir := n.sandboxDir(b.sb.runtimeID)
	rec, err := readBootRecord(sdir)
	if err != nil {
		return fmt.Errorf("checkpoint the started template: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := n.park(ctx, b.sb, rec.Channel); err != nil {
		return fmt.Errorf("checkpoint the started template: %w", err)
	}
	b.sb.stopping.Store(true)
	if err := cp.Checkpoint(ctx, b.sb.runtimeID, filepath.Join(dir, snapshot.CheckpointDir), false); err != nil {
		return fmt.Errorf("checkpoint the started template: %w", err)
	}
	if err := n.opts.Runtime.Destroy(ctx, b.sb.runtimeID); err != nil {
		return fmt.Errorf("checkpoint the started template: %w", err)
	}
	layer := filepath.Join(dir, snapshot.LayerDir)
	if err := os.Mkdir(layer, 0o700); err != nil {
		return err
	}
	// On a root image the files it wrote are in the checkpoint.
	if !rec.onImage() {
		if err := n.opts.RootFS.Stash(ctx, sdir, layer); err != nil {
			return fmt.Errorf("keep the started template's files: %w", err)
		}
	}
	return snapshot.Seal(dir, snapshot.Meta{SandboxID: b.sb.runtimeID, CreatedAt: time.Now().UTC(),
		TemplateID: "build", Lowers: rec.Lowers, CPUs: rec.CPUs, MemoryMB: rec.MemoryMB, DiskMB: rec.DiskMB, Memory: true,
		Envd: rec.Envd, Channel: rec.Channel, RootImage: n.relImage(rec), RootImageDigest: rec.RootImageDigest})
}
