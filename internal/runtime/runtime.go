// Package runtime defines what the node needs from a sandbox runtime backend (gVisor today,
// Firecracker on KVM hosts later). It owns only the contract; backends live in subpackages and must
// never touch node records, the API, or network policy.
package runtime

import (
	"context"
	"errors"
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
	RootDir string
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
	Env  []string
	// Resource limits.
	CPUs     int
	MemoryMB int
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
}
