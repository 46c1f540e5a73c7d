// Package runtime defines what the node needs from a sandbox runtime backend (gVisor today,
// Firecracker on KVM hosts later). It owns only the contract; backends live in subpackages and must
// never touch node records, the API, or network policy.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrUnsupported is returned (wrapped) by backends that cannot run on this host or OS.
var ErrUnsupported = errors.New("runtime not supported on this host")

// Mount is a host path exposed inside the sandbox.
type Mount struct {
	HostPath  string
	GuestPath string
	ReadOnly  bool
}

// Spec is everything a backend needs to boot one sandbox. The node prepares every host resource it
// names (root filesystem, network namespace, agent directory) and owns their teardown; the backend
// only runs the isolation boundary on top of them.
type Spec struct {
	// ID is the sandbox id; backends use it as their container/VM id.
	ID string
	// RootDir is the sandbox's own writable root filesystem (an overlay over a read-only template).
	// With RootImage it is instead the host directory that holds the sandbox's writable layer: a
	// file of its own there, so sandboxes may share the directory (a restore must name the
	// directory its checkpoint did).
	RootDir string
	// RootImage, when set, is a read-only EROFS image of the root filesystem (a template's, shared
	// by all its sandboxes) that the runtime mounts itself. The guest's writes to its root go to
	// a host file the runtime keeps in RootDir, up to RootSizeBytes. A sandbox with a RootImage
	// and no Mounts needs no file server beside it on the host (gVisor's gofer), which is most of
	// an idle sandbox's host memory after its kernel's. The image's /tmp must not be empty, or
	// the guest's /tmp is memory rather than disk.
	RootImage string
	// RootSizeBytes bounds what the guest may write over RootImage: past it writes fail with
	// ENOSPC, and df in the guest shows this size. Zero: no bound but the host's disk.
	RootSizeBytes int64
	// StateDir is a per-sandbox host directory the backend may use for logs and bundle files.
	StateDir string
	Hostname string
	// NetNSPath is the sandbox's network namespace. The node owns the link inside it (the seam for
	// per-sandbox networking): the backend must use it as is.
	NetNSPath string
	// Mounts are bind mounts, e.g. the agent directory holding the agent socket and the envd binary.
	Mounts []Mount
	// Args is the guest init command (envd).
	Args []string
	// Files are host files the guest's init gets as its descriptors FirstFile, FirstFile+1, ...
	// A checkpoint saves them by number, not the host files behind them: a Restore's spec must
	// give a file for each of them again (a new one), and the restored processes find it behind
	// the number they held. The backend leaves the caller's copies open.
	Files []*os.File `json:"-"`
	Env   []string
	// Resource limits.
	CPUs     int
	MemoryMB int
	// Limits bound what the guest can exhaust besides CPU and memory (zero values: no limit).
	Limits Limits
}

// FirstFile is the guest descriptor of Spec.Files[0] (after stdin, stdout and stderr).
const FirstFile = 3

// Limits are the per-sandbox bounds on resources a guest could otherwise exhaust on the host.
// The node derives them from the template's resources (internal/limits); backends apply them.
type Limits struct {
	// GuestTasks bounds the processes and threads inside the guest: forks past it fail with
	// EAGAIN in the guest, whoever runs them.
	GuestTasks int
	// HostTasks bounds the host tasks the runtime may use for the sandbox (a pids cgroup). It sits
	// above GuestTasks with room for the runtime's own threads: reaching it stops the sandbox.
	HostTasks int
	// NProc is RLIMIT_NPROC for the guest's processes (binding unprivileged users).
	NProc int
	// NoFile is RLIMIT_NOFILE for the guest's processes.
	NoFile int
	// ShmBytes sizes the guest's /dev/shm.
	ShmBytes int64
	// HostMemoryMB is the host's memory limit for the sandbox when it is above the memory the
	// guest sees (Spec.MemoryMB): the runtime's own memory comes on top of the guest's, and the
	// guest's out-of-memory killer needs room to act before the host's stops the whole sandbox.
	HostMemoryMB int
}

// Status of a sandbox as the backend sees it.
type Status int

const (
	StatusUnknown Status = iota
	StatusRunning
	StatusStopped
	StatusNotFound
)

func (s Status) String() string {
	switch s {
	case StatusRunning:
		return "running"
	case StatusStopped:
		return "stopped"
	case StatusNotFound:
		return "not-found"
	default:
		return "unknown"
	}
}

// ExitReason classifies how a sandbox's runtime ended without the node asking.
type ExitReason string

const (
	// ExitInit: the guest's init process exited (or was killed from inside the guest).
	ExitInit ExitReason = "exited"
	// ExitOOM: the sandbox went over its memory limit and the host killed it.
	ExitOOM ExitReason = "oom"
	// ExitTaskLimit: the sandbox went over its host task limit and could not go on.
	ExitTaskLimit ExitReason = "task-limit"
	// ExitKilled: something on the host killed the runtime with a signal.
	ExitKilled ExitReason = "killed"
	// ExitUnknown: the runtime is gone and the backend cannot tell why (e.g. it was started by a
	// previous node process, so its exit status is not ours to collect).
	ExitUnknown ExitReason = "stopped"
)

// Exit describes a sandbox's end as the backend observed it.
type Exit struct {
	Reason ExitReason
	// Code is the runtime's exit status when it exited (ExitInit), -1 otherwise.
	Code int
	// Signal names the signal that killed the runtime (ExitKilled, ExitOOM), if known.
	Signal string
}

// String says why the sandbox ended, for records, logs and `vmon sandbox ls`.
func (e Exit) String() string {
	switch e.Reason {
	case ExitInit:
		if e.Code > 128 && e.Code < 128+65 {
			sig := syscall.Signal(e.Code - 128)
			return fmt.Sprintf("exited: the sandbox's init was killed by signal %d (%s)", int(sig), sig)
		}
		return fmt.Sprintf("exited: the sandbox's init exited with status %d", e.Code)
	case ExitOOM:
		return "oom: the sandbox ran out of memory and was killed"
	case ExitTaskLimit:
		return "task-limit: the sandbox reached its host task limit and was stopped"
	case ExitKilled:
		if e.Signal != "" {
			return "killed: the sandbox's runtime was killed by " + e.Signal
		}
		return "killed: the sandbox's runtime was killed"
	default:
		return "stopped: the sandbox's runtime stopped (its exit status was not observed)"
	}
}

// Runtime runs sandboxes. Implementations must be safe for concurrent use with distinct ids.
type Runtime interface {
	// Start boots the sandbox described by spec and returns once its init process is running.
	// A failed Start leaves nothing running.
	Start(ctx context.Context, spec Spec) error
	// Status reports the backend's view of sandbox id.
	Status(ctx context.Context, id string) (Status, error)
	// Destroy stops and removes sandbox id; an already gone sandbox is success.
	Destroy(ctx context.Context, id string) error
	// List returns the ids of every sandbox the backend knows, for crash recovery.
	List(ctx context.Context) ([]string, error)
	// Wait blocks until sandbox id stops, for whatever reason, and says why; it returns ctx's
	// error if ctx ends first. It must not hold an OS thread per waiting sandbox, and it must be
	// safe to call for a sandbox this process did not start (after a restart).
	Wait(ctx context.Context, id string) (Exit, error)
}

// Reattacher is implemented by backends that can find a sandbox a previous node process started
// from what Start left in its state directory, without asking the backend's tools. A node that
// restarts beside hundreds of sandboxes needs that: each question to runsc is a process of its
// own, and the answer waits for the sandbox to wake.
type Reattacher interface {
	// Reattach reports whether sandbox id, started with spec.StateDir == stateDir by an earlier
	// process, still runs, and when it does watches it as if this process had started it (Wait
	// then asks nothing more). A sandbox it cannot find alive is StatusStopped: what is left of
	// it is for Destroy.
	Reattach(ctx context.Context, id, stateDir string) (Status, error)
}

// FileExecer is implemented by backends that can run a command in a running sandbox with host
// files as its descriptors FirstFile, FirstFile+1, ..., as Spec.Files gives them to init. Unlike
// init's, these do not survive a restore: the backend drops them from what it restores.
type FileExecer interface {
	// ExecFiles runs args in sandbox id as root with files, and returns its combined output.
	ExecFiles(ctx context.Context, id string, files []*os.File, args ...string) ([]byte, error)
}

// Checkpointer is implemented by backends that can save a running sandbox (memory, processes,
// open files and sockets, kernel state) and bring it back later, possibly many times.
type Checkpointer interface {
	// Checkpoint saves sandbox id into imageDir, which must not exist yet (the backend creates
	// it). With leaveRunning the sandbox goes on afterwards (snapshots, fork); without it the
	// sandbox is stopped once Checkpoint returns and runs nothing more, but what the backend
	// keeps of it (state, cgroups, processes on their way out) lasts until Destroy, which the
	// caller may put off (a pause answers first). A failed Checkpoint with leaveRunning leaves
	// the sandbox running; without it the sandbox may be gone either way.
	//
	// A checkpoint outlives the process that asked for it: if that process dies (kill -9 of the
	// node), the runtime still finishes writing imageDir, and AwaitCheckpoint tells the next
	// process whether it did.
	Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error
	// AwaitCheckpoint waits until no checkpoint of sandbox id into imageDir is being written any
	// more (one a previous node process started may still be) and reports whether imageDir holds
	// a complete checkpoint.
	AwaitCheckpoint(ctx context.Context, id, imageDir string) (complete bool, err error)
	// Restore starts the sandbox described by spec from imageDir instead of booting its init.
	// spec must describe the same root filesystem content and mounts as the checkpointed
	// sandbox; its id, state directory and network namespace may differ. A failed Restore
	// leaves nothing running.
	Restore(ctx context.Context, spec Spec, imageDir string) error
}
