// Package limits derives, from a sandbox's CPU, memory and disk, the bounds on everything else
// its guest could exhaust on the host: tasks, open files, shared memory, disk. It is pure
// arithmetic: it owns the policy (how much of what per MiB) and never applies anything; the node
// hands the result to the runtime and the root filesystem.
package limits

import (
	"fmt"

	"github.com/vibemon/vmon/internal/runtime"
)

// Per-MiB rates and bounds of the derived limits.
const (
	// TasksPerMiB: a guest process costs about half a MiB of host memory under gVisor's systrap
	// platform (its stub process), so a sandbox gets one task per MiB of memory and a process
	// bomb hits EAGAIN before the memory limit: 512 MiB gives 512.
	TasksPerMiB = 1
	MinTasks    = 128
	MaxTasks    = 32768
	// HostTaskHeadroom covers the sentry's own threads on top of the host tasks the guest's tasks
	// use (gVisor's systrap platform runs two host tasks per guest process, and more for a moment while a process forks and execs).
	HostTaskHeadroom = 512
	HostTasksPerTask = 3
	// NProcReserve: unprivileged users get all but 1/NProcReserve of the guest's tasks
	// (RLIMIT_NPROC), so a user's process bomb leaves root and envd room to start the commands
	// that clean it up.
	NProcReserve = 8
	// FilesPerMiB: open files per MiB of memory; 512 MiB gives 32768.
	FilesPerMiB = 64
	MinFiles    = 1024
	MaxFiles    = 1 << 20
	// ShmShare is the share of the sandbox's memory /dev/shm may hold (Linux's tmpfs default).
	ShmShare = 2
	// Host memory beyond what the guest sees: the sentry's and gofer's own memory (about 15 MiB
	// idle) and room for the guest's out-of-memory killer (envd, internal/envd/oomkill), which
	// polls, to act before the host cgroup's limit would stop the whole sandbox. The share grows
	// with the sandbox because the sentry's page tables and a fast allocator's overshoot do.
	HostMemoryHeadroomMiB = 64
	HostMemoryShare       = 32
)

// Overrides are a node's settings that replace the derived values (zero keeps the derived one).
type Overrides struct {
	// Tasks replaces the guest task limit (and so RLIMIT_NPROC and the host task limit).
	Tasks int
	// Files replaces RLIMIT_NOFILE.
	Files int
}

// Validate checks overrides against the bounds a sandbox can run with.
func (o Overrides) Validate() error {
	if o.Tasks != 0 && (o.Tasks < 64 || o.Tasks > 1<<22) {
		return fmt.Errorf("sandbox task limit must be between 64 and %d, or 0 to derive it from memory", 1<<22)
	}
	if o.Files != 0 && (o.Files < 64 || o.Files > MaxFiles) {
		return fmt.Errorf("sandbox open-file limit must be between 64 and %d, or 0 to derive it from memory", MaxFiles)
	}
	return nil
}

// Derive returns the limits of a sandbox with memoryMB of memory. A sandbox without a memory
// limit (0) gets the limits of 1 GiB.
func Derive(memoryMB int, o Overrides) runtime.Limits {
	if memoryMB <= 0 {
		memoryMB = 1024
	}
	tasks := clamp(memoryMB*TasksPerMiB, MinTasks, MaxTasks)
	if o.Tasks > 0 {
		tasks = o.Tasks
	}
	files := clamp(memoryMB*FilesPerMiB, MinFiles, MaxFiles)
	if o.Files > 0 {
		files = o.Files
	}
	return runtime.Limits{
		GuestTasks:   tasks,
		HostTasks:    tasks*HostTasksPerTask + HostTaskHeadroom,
		NProc:        tasks - tasks/NProcReserve,
		NoFile:       files,
		ShmBytes:     int64(memoryMB) << 20 / ShmShare,
		HostMemoryMB: memoryMB + HostMemoryHeadroomMiB + memoryMB/HostMemoryShare,
	}
}

func clamp(v, lo, hi int) int {
	return min(max(v, lo), hi)
}
