// Package gvisor runs sandboxes with gVisor's runsc: one runsc sandbox (sentry + gofer) per vmon
// sandbox, created detached so it outlives the vmon process and is found again after a restart.
//
// It owns the runsc state directory (--root), the OCI bundle and console log it writes into a
// sandbox's StateDir, the host cgroup runsc creates for each sandbox, and (with Options.Adopt)
// the reaping of the sandbox and gofer processes runsc leaves to this process. It must never create or
// remove the sandbox's root filesystem, network namespace or agent directory (the node prepares
// and tears those down), nor read node records.
package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
)

// Options configure a Runtime.
type Options struct {
	// RunscPath is the runsc binary; empty means "runsc" from PATH.
	RunscPath string
	// RootDir is runsc's state directory (--root), e.g. <data-dir>/runsc. Every Runtime value
	// with the same RootDir sees the same sandboxes.
	RootDir string
	// Platform is runsc's --platform; empty means systrap (works without /dev/kvm).
	Platform string
	// CgroupParent is the host cgroup under which runsc creates one cgroup per sandbox
	// (/<CgroupParent>/<id>); empty means "vmon".
	CgroupParent string
	// IgnoreCgroups runs runsc with --ignore-cgroups: CPU and memory limits are then neither
	// enforced nor shown to the guest. Only for hosts where runsc cannot manage cgroups.
	IgnoreCgroups bool
	// DebugLogDir, if set, turns on runsc debug logs, one file per command, in that directory.
	DebugLogDir string
	// Adopt makes this process a child subreaper so the sandbox processes runsc starts become its
	// children: Wait then reports how they exited (init exit status vs. killed by a signal) and
	// their helpers are reaped here. It changes a process-wide attribute, so only the process
	// that owns the sandboxes (vmon serve) sets it.
	Adopt  bool
	Logger *slog.Logger
}

// Runtime implements runtime.Runtime with runsc. It keeps no state of its own: everything lives
// in runsc's root directory, so a fresh value after a restart sees every running sandbox.
type Runtime struct {
	cli          *runsc
	cgroupParent string
	ignoreCgs    bool
	// memFiles holds each sandbox's memory-use file open (MemoryUsage): id → *os.File.
	memFiles sync.Map
	log      *slog.Logger
	watch    *watcher
}

var (
	_ runtime.Runtime      = (*Runtime)(nil)
	_ runtime.Checkpointer = (*Runtime)(nil)
	_ runtime.Reattacher   = (*Runtime)(nil)
)

// Files the runtime writes into a sandbox's StateDir.
const (
	bundleConfig = "config.json"
	consoleLog   = "console.log" // the init process's stdout and stderr, and runsc create's errors
	pidFileName  = "sandbox.pid"
)

// ConsoleLog is the file holding a sandbox's init stdout and stderr (and runsc create's errors).
func ConsoleLog(stateDir string) string { return filepath.Join(stateDir, consoleLog) }

// New checks that runsc can run here and returns a Runtime. It returns an error wrapping
// runtime.ErrUnsupported when runsc is missing or the OS is not Linux.
func New(opts Options) (*Runtime, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	path := opts.RunscPath
	if path == "" {
		path = "runsc"
	}
	resolved, err := exec.LookPath(path)
	if err != nil {
		return nil, fmt.Errorf("%w: runsc binary %q not found (run scripts/install-runsc.sh): %v",
			runtime.ErrUnsupported, path, err)
	}
	if !filepath.IsAbs(opts.RootDir) {
		return nil, errors.New("gvisor: RootDir must be an absolute path")
	}
	if err := os.MkdirAll(opts.RootDir, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor: create runsc root: %w", err)
	}
	platform := opts.Platform
	if platform == "" {
		platform = "systrap"
	}
	parent := strings.Trim(opts.CgroupParent, "/")
	if parent == "" {
		parent = "vmon"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	flags := []string{
		"--root=" + opts.RootDir,
		"--platform=" + platform,
		// gVisor's own netstack on the link the node puts in the sandbox's namespace.
		"--network=sandbox",
		// The agent channel: envd dials a host socket bind-mounted into the guest. "open" only;
		// "create"/"all" make checkpoint fail on bound host sockets.
		"--host-uds=open",
		// The root is already a host overlayfs per sandbox (internal/rootfs); a second, in-memory
		// overlay would put the guest's writes in RAM instead of the upper dir.
		"--overlay2=none",
		// sudo in the guest (setuid binaries); the elevation stays inside the sentry.
		"--allow-suid",
	}
	if opts.IgnoreCgroups {
		flags = append(flags, "--ignore-cgroups")
	}
	if opts.DebugLogDir != "" {
		flags = append(flags, "--debug", "--debug-log="+filepath.Clean(opts.DebugLogDir)+"/")
	}
	w, err := newWatcher(opts.Adopt)
	if err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	return &Runtime{
		cli:          &runsc{path: resolved, flags: flags, log: log},
		cgroupParent: parent,
		ignoreCgs:    opts.IgnoreCgroups,
		log:          log,
		watch:        w,
	}, nil
}

// Start writes the OCI bundle into spec.StateDir and creates and starts the sandbox. It returns
// once the init process runs. A failed Start leaves no runsc state, process or cgroup behind.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) error {
	return r.launch(ctx, spec, "")
}

// Restore is Start from a checkpoint: runsc restores the saved kernel into a new sandbox built
// from spec (its mounts, root and namespace) instead of running the init process. The image's
// memory pages may still be loading when Restore returns: the image must stay readable (an
// unlinked file stays readable to the sandbox that has it open).
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if !filepath.IsAbs(imageDir) {
		return errdefs.InvalidArgument("checkpoint image directory must be an absolute path")
	}
	if _, err := os.Stat(filepath.Join(imageDir, checkpointStateFile)); err != nil {
		return fmt.Errorf("restore sandbox %s: checkpoint image: %w", spec.ID, err)
	}
	return r.launch(ctx, spec, imageDir)
}

// checkpointStateFile is the kernel state runsc writes into a checkpoint image directory (the
// memory pages go to pages files beside it).
const checkpointStateFile = "checkpoint.img"

// checkpointComplete, inside a checkpoint image directory, says runsc finished writing it. The
// process that waits for runsc writes it (see runsc.runMarked), so it appears even when the node
// that asked for the checkpoint died meanwhile.
const checkpointComplete = "complete"

// Checkpoint saves sandbox id into imageDir with runsc checkpoint. Uncompressed: on this kind of
// host compression costs far more time than the disk it saves (docs/benchmarks.md).
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	if err := validateID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(imageDir) {
		return errdefs.InvalidArgument("checkpoint image directory must be an absolute path")
	}
	if err := os.Mkdir(imageDir, 0o700); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	began := time.Now()
	args := []string{"--image-path=" + imageDir, "--compression=none"}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	if err := r.cli.runMarked(ctx, filepath.Join(imageDir, checkpointComplete), "checkpoint", append(args, id)...); err != nil {
		if errors.Is(err, errNotExist) {
			return errdefs.NotFound("sandbox %q is not running", id)
		}
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	r.log.Info("gvisor: sandbox checkpointed", "id", id, "leave_running", leaveRunning,
		"took", time.Since(began).Round(time.Millisecond))
	return nil
}

// AwaitCheckpoint waits for the runsc checkpoint of id into imageDir that a previous vmon may
// have left running, then reports whether it completed.
func (r *Runtime) AwaitCheckpoint(ctx context.Context, id, imageDir string) (bool, error) {
	if err := validateID(id); err != nil {
		return false, err
	}
	if !filepath.IsAbs(imageDir) {
		return false, errdefs.InvalidArgument("checkpoint image directory must be an absolute path")
	}
	for checkpointRunning(id, imageDir) {
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("wait for the checkpoint of sandbox %s: %w", id, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	_, err := os.Stat(filepath.Join(imageDir, checkpointComplete))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func (r *Runtime) launch(ctx context.Context, spec runtime.Spec, imageDir string) (err error) {
	began := time.Now()
	cgPath := ""
	if !r.ignoreCgs {
		cgPath = cgroupPath(r.cgroupParent, spec.ID)
	}
	oci, err := buildSpec(spec, cgPath)
	if err != nil {
		return err
	}
	if !filepath.IsAbs(spec.StateDir) {
		return errdefs.InvalidArgument("sandbox state directory must be an absolute path")
	}
	if spec.RootImage == "" {
		if err := checkTmpDir(spec.RootDir); err != nil {
			return err
		}
	} else if fi, err := os.Stat(spec.RootDir); err != nil {
		return fmt.Errorf("the directory for the sandbox's writable layer: %w", err)
	} else if !fi.IsDir() {
		return errdefs.InvalidArgument("the sandbox's writable layer goes in a directory, and %s is not one", spec.RootDir)
	}
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	if err := writeJSON(filepath.Join(spec.StateDir, bundleConfig), oci); err != nil {
		return err
	}
	logPath := filepath.Join(spec.StateDir, consoleLog)
	out, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open console log: %w", err)
	}
	defer out.Close() // the sandbox holds its own copy of the descriptor

	conflict := false
	defer func() {
		// Rolling back after a clash would destroy the sandbox that already has this id.
		if err == nil || conflict {
			return
		}
		// Teardown must run even when ctx is what failed Start.
		if derr := r.Destroy(context.WithoutCancel(ctx), spec.ID); derr != nil {
			r.log.Warn("gvisor: rollback of failed start", "id", spec.ID, "err", derr)
		}
	}()
	// runsc itself refuses an id it already has (it holds a lock per container), which spares
	// a `runsc state` round trip on every create.
	if err := r.cli.runDetached(ctx, rootUpperFlag(spec), spec.ID, spec.StateDir, filepath.Join(spec.StateDir, pidFileName), imageDir, out, spec.Files); err != nil {
		msg := tail(logPath, 2048)
		if strings.Contains(msg, "container already exists") {
			conflict = true
			return errdefs.Conflict("sandbox %q already exists", spec.ID)
		}
		return fmt.Errorf("%w: %s", err, msg)
	}
	if cgPath != "" && spec.MemoryMB > 0 && spec.Limits.HostMemoryMB > spec.MemoryMB {
		if err := raiseMemoryLimit(r.cgroupParent, spec.ID, int64(spec.Limits.HostMemoryMB)<<20); err != nil {
			return err
		}
	}
	// Fix the sandbox process's identity now, before it could exit and be reaped.
	pid, err := readPidFile(filepath.Join(spec.StateDir, pidFileName))
	if err == nil {
		_, err = r.watch.track(spec.ID, pid)
	}
	if err != nil {
		return fmt.Errorf("watch sandbox process: %w", err)
	}
	verb := "started"
	if imageDir != "" {
		verb = "restored"
	}
	r.log.Info("gvisor: sandbox "+verb, "id", spec.ID, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// Status reports running only when runsc says so and the sandbox process is really alive: runsc
// keeps reporting "running" for a sandbox whose sentry was killed (e.g. by the host OOM killer).
// A sandbox that was created but never started (a Start interrupted by a crash) is stopped.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	if err := validateID(id); err != nil {
		return runtime.StatusUnknown, err
	}
	st, err := r.cli.state(ctx, id)
	if errors.Is(err, errNotExist) {
		return runtime.StatusNotFound, nil
	}
	if err != nil {
		return runtime.StatusUnknown, err
	}
	switch st.Status {
	case "running", "paused":
		if sandboxAlive(st.Pid, id) {
			return runtime.StatusRunning, nil
		}
		return runtime.StatusStopped, nil
	case "created", "stopped":
		return runtime.StatusStopped, nil
	default:
		return runtime.StatusUnknown, nil
	}
}

// Reattach finds sandbox id from the pid file runsc wrote into stateDir when it started it: the
// process must still be that sandbox's runsc process (its command line names the id), and a
// pidfd fixes its identity from then on. Unlike Status it runs no runsc command, which would
// also wait for the sandbox to answer; at a restart among hundreds of sandboxes those commands
// took seconds each.
func (r *Runtime) Reattach(ctx context.Context, id, stateDir string) (runtime.Status, error) {
	if err := validateID(id); err != nil {
		return runtime.StatusUnknown, err
	}
	if p := r.watch.lookup(id); p != nil && sandboxAlive(p.pid, id) {
		return runtime.StatusRunning, nil
	}
	pid, err := readPidFile(filepath.Join(stateDir, pidFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return runtime.StatusStopped, nil
	}
	if err != nil {
		return runtime.StatusUnknown, fmt.Errorf("reattach sandbox %s: %w", id, err)
	}
	if !sandboxAlive(pid, id) {
		return runtime.StatusStopped, nil
	}
	if _, err := r.watch.track(id, pid); err != nil {
		return runtime.StatusStopped, nil // exited since
	}
	if !sandboxAlive(pid, id) {
		// Gone between the check and pidfd_open: the pidfd may name a process that reused the pid.
		r.watch.forget(id)
		return runtime.StatusStopped, nil
	}
	return runtime.StatusRunning, nil
}

// Destroy kills the sandbox, removes its runsc state and its host cgroup. A sandbox that is
// already gone is success; so is one runsc lost track of but whose cgroup still holds processes
// (those are killed).
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	// SIGKILL first so delete does not wait for a graceful stop; failure means it is not running.
	if err := r.cli.kill(ctx, id, "KILL"); err != nil && !errors.Is(err, errNotExist) {
		r.log.Debug("gvisor: kill before delete", "id", id, "err", err)
	}
	return r.remove(ctx, id)
}

// remove deletes a sandbox's runsc state (killing what still runs), its watch and its cgroups.
func (r *Runtime) remove(ctx context.Context, id string) error {
	if err := r.cli.deleteForce(ctx, id); err != nil && !errors.Is(err, errNotExist) {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	r.watch.forget(id)
	r.forgetMemoryFile(id)
	r.watch.reapRunscOrphans()
	if !r.ignoreCgs {
		if err := removeCgroups(r.cgroupParent, id); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
	}
	return nil
}

// Wait blocks until sandbox id's process exits and classifies why: the cgroup's OOM and pids.max
// counters first, then the exit status when this process adopted the sandbox (Options.Adopt).
// For a sandbox started before a restart it finds the process through runsc state.
func (r *Runtime) Wait(ctx context.Context, id string) (runtime.Exit, error) {
	if err := validateID(id); err != nil {
		return runtime.Exit{}, err
	}
	p := r.watch.lookup(id)
	if p == nil {
		st, err := r.cli.state(ctx, id)
		if err != nil {
			return runtime.Exit{}, fmt.Errorf("find sandbox process: %w", err)
		}
		if p, err = r.watch.track(id, st.Pid); err != nil {
			// The process is already gone: nothing to wait for, and no status to read.
			return r.exitOf(id, 0, false), nil
		}
		if !sandboxAlive(st.Pid, id) {
			// Gone between state and pidfd_open, and the pid may already be someone else's.
			r.watch.forget(id)
			return r.exitOf(id, 0, false), nil
		}
	}
	ws, ok, err := r.watch.wait(ctx, p)
	if err != nil {
		return runtime.Exit{}, err
	}
	exit := r.exitOf(id, ws, ok)
	r.watch.reapRunscOrphans()
	return exit, nil
}

func (r *Runtime) exitOf(id string, ws waitStatus, ok bool) runtime.Exit {
	var cg cgroupCounters
	if !r.ignoreCgs {
		cg = readCgroupCounters(r.cgroupParent, id)
	}
	return classify(ws, ok, cg)
}

// MemoryUsage is what sandbox id's host memory cgroup holds now: the guest's memory and the
// runtime's own. The file is opened once per sandbox and read in place: one pread, microseconds,
// and nothing in the sandbox wakes, so the node may ask often.
func (r *Runtime) MemoryUsage(id string) (uint64, error) {
	if r.ignoreCgs {
		return 0, fmt.Errorf("%w: sandboxes have no cgroups of their own here", runtime.ErrUnsupported)
	}
	v, ok := r.memFiles.Load(id)
	if !ok {
		if err := validateID(id); err != nil {
			return 0, err
		}
		p, err := memoryUsageFile(r.cgroupParent, id)
		if err != nil {
			return 0, err
		}
		f, err := os.Open(p)
		if err != nil {
			return 0, err
		}
		var loaded bool
		if v, loaded = r.memFiles.LoadOrStore(id, f); loaded {
			f.Close()
		}
	}
	f := v.(*os.File)
	var buf [32]byte
	n, err := f.ReadAt(buf[:], 0)
	if n == 0 && err != nil {
		r.forgetMemoryFile(id)
		return 0, err
	}
	used, err := strconv.ParseUint(strings.TrimSpace(string(buf[:n])), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory use of sandbox %s: %w", id, err)
	}
	return used, nil
}

// MemoryEvents returns a channel that receives each time sandbox id's host memory use crosses
// one of thresholds (bytes), either way, and when the sandbox's cgroup goes; it is closed when
// ctx ends. Nothing polls: the kernel signals the crossing (cgroup v1). Where the kernel cannot
// (cgroup v2, or runsc without cgroups) the error wraps runtime.ErrUnsupported.
func (r *Runtime) MemoryEvents(ctx context.Context, id string, thresholds ...uint64) (<-chan struct{}, error) {
	if r.ignoreCgs {
		return nil, fmt.Errorf("%w: sandboxes have no cgroups of their own here", runtime.ErrUnsupported)
	}
	if err := validateID(id); err != nil {
		return nil, err
	}
	f, err := memoryThresholds(r.cgroupParent, id, thresholds)
	if err != nil {
		return nil, err
	}
	ch := make(chan struct{}, 1)
	stop := context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		defer close(ch)
		defer stop()
		var buf [8]byte
		for {
			if _, err := f.Read(buf[:]); err != nil {
				f.Close()
				return
			}
			// Crossings that come while the last is unread say nothing new: the reader looks at
			// the use itself.
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}()
	return ch, nil
}

func (r *Runtime) forgetMemoryFile(id string) {
	if v, ok := r.memFiles.LoadAndDelete(id); ok {
		v.(*os.File).Close()
	}
}

// List returns the ids of every sandbox in runsc's root, running or not.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	sts, err := r.cli.list(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(sts))
	for _, s := range sts {
		ids = append(ids, s.ID)
	}
	return ids, nil
}

// Exec runs args in sandbox id as root and returns the combined output. It is for diagnostics,
// tests and the runtime benchmark; the node talks to the guest through envd, never through this.
func (r *Runtime) Exec(ctx context.Context, id string, args ...string) ([]byte, error) {
	return r.ExecFiles(ctx, id, nil, args...)
}

// ExecFiles is Exec with files as the command's descriptors from runtime.FirstFile on. runsc
// marks them not restorable: after a restore the guest finds them closed.
func (r *Runtime) ExecFiles(ctx context.Context, id string, files []*os.File, args ...string) ([]byte, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	if len(args) == 0 {
		return nil, errdefs.InvalidArgument("empty command")
	}
	return r.cli.exec(ctx, id, files, args)
}

// checkTmpDir makes sure the rootfs has a real /tmp directory to bind over the guest's /tmp. The
// guest writes the upper layer, so on a later start (restore, recovery) /tmp may be a symlink it
// planted: binding it would resolve on the host and expose a host directory. Refuse that.
func checkTmpDir(rootDir string) error {
	p := filepath.Join(rootDir, tmpDir)
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(p, 0o755); err != nil {
			return fmt.Errorf("create /tmp in rootfs: %w", err)
		}
		return os.Chmod(p, 0o777|os.ModeSticky) // Mkdir is subject to umask and drops the sticky bit
	}
	if err != nil {
		return fmt.Errorf("stat /tmp in rootfs: %w", err)
	}
	if !fi.IsDir() {
		return errdefs.InvalidArgument("the sandbox's /tmp is not a directory")
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// tail returns up to n trailing bytes of a file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}
