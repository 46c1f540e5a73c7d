package gvisor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/runtime"
)

func supported() error { return nil }

// sysProcAttr puts runsc (and so the sandbox it forks) in its own session: a signal to vmon's
// process group or terminal never reaches a sandbox.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// sandboxAlive reports whether pid is the runsc sandbox process of id. The command line is checked
// so a recycled pid is not mistaken for the sandbox; a zombie has an empty command line.
func sandboxAlive(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return strings.HasPrefix(filepath.Base(args[0]), "runsc") && args[len(args)-1] == id
}

// killGroup kills the process group pid leads (a runsc command and what it started).
func killGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }

// checkpointRunning reports whether a process is still writing a checkpoint of sandbox id into
// imageDir: runsc checkpoint, or the shell that waits for it to mark the image complete.
func checkpointRunning(id, imageDir string) bool {
	for _, args := range processes() {
		if args[len(args)-1] == id && slices.Contains(args, "checkpoint") && slices.Contains(args, "--image-path="+imageDir) {
			return true
		}
	}
	return false
}

// processes yields every process on the host with its command line (never empty; kernel threads
// and processes that exit meanwhile are skipped).
func processes() iter.Seq2[int, []string] {
	return func(yield func(int, []string) bool) {
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
			if err != nil || len(b) == 0 {
				continue
			}
			if !yield(pid, strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) {
				return
			}
		}
	}
}

// removeCgroups removes what is left of sandbox id's cgroup in every mounted hierarchy (cgroup v2,
// or each v1 controller). runsc delete normally removes them; this covers a sandbox runsc lost
// track of (e.g. a crash inside runsc create): its processes are killed first, since a cgroup
// with members cannot be removed.
func removeCgroups(parent, id string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		dir := filepath.Join(m, parent, id)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := removeCgroup(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeCgroup(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(procs)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		// EBUSY until killed members have exited.
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cgroupMounts returns the mount points of every cgroup (v1) and cgroup2 hierarchy.
func cgroupMounts() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && (f[2] == "cgroup" || f[2] == "cgroup2") {
			out = append(out, f[1])
		}
	}
	return out, nil
}

// memoryUsageFile finds the file holding sandbox id's host memory use: v1 memory.usage_in_bytes
// or v2 memory.current.
func memoryUsageFile(parent, id string) (string, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return "", err
	}
	for _, m := range mounts {
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			p := filepath.Join(m, parent, id, f)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("no memory cgroup for sandbox %s: %w", id, os.ErrNotExist)
}

// raiseMemoryLimit sets the memory limit of sandbox id's host cgroup (v1 memory.limit_in_bytes
// or v2 memory.max) to bytes. runsc sized the guest's memory from the spec's limit when it
// started the sandbox; raising the host's afterwards gives the runtime's own memory and the
// guest's out-of-memory killer room without changing what the guest sees.
func raiseMemoryLimit(parent, id string, bytes int64) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	v := []byte(strconv.FormatInt(bytes, 10))
	for _, m := range mounts {
		dir := filepath.Join(m, parent, id)
		for _, f := range []string{"memory.limit_in_bytes", "memory.max"} {
			p := filepath.Join(dir, f)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if err := os.WriteFile(p, v, 0); err != nil {
				return fmt.Errorf("raise the memory limit of sandbox %s: %w", id, err)
			}
			return nil
		}
	}
	return fmt.Errorf("raise the memory limit of sandbox %s: no memory cgroup found", id)
}

// memoryThresholds asks the kernel to signal one eventfd each time sandbox id's host memory use
// crosses one of thresholds (bytes), either way, and once more when the cgroup is removed: cgroup
// v1's memory thresholds (cgroup.event_control). cgroup v2 has no such notice; there the answer
// is runtime.ErrUnsupported and the caller reads the use itself. The eventfd is non-blocking, so
// reads of the returned file wait in Go's poller and Close ends them.
func memoryThresholds(parent, id string, thresholds []uint64) (*os.File, error) {
	p, err := memoryUsageFile(parent, id)
	if err != nil {
		return nil, err
	}
	if filepath.Base(p) != "memory.usage_in_bytes" {
		return nil, fmt.Errorf("%w: cgroup v2 has no memory thresholds", runtime.ErrUnsupported)
	}
	usage, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	// The kernel keeps its own reference to what each registration names: usage may close after.
	defer usage.Close()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("memory thresholds of sandbox %s: eventfd: %w", id, err)
	}
	ev := os.NewFile(uintptr(efd), "memory-thresholds-"+id)
	ctl := filepath.Join(filepath.Dir(p), "cgroup.event_control")
	for _, t := range thresholds {
		line := fmt.Sprintf("%d %d %d", efd, usage.Fd(), t)
		if err := os.WriteFile(ctl, []byte(line), 0); err != nil {
			ev.Close()
			return nil, fmt.Errorf("memory thresholds of sandbox %s: %w", id, err)
		}
	}
	return ev, nil
}
