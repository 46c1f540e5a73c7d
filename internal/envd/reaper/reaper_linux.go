// Package reaper lets envd serve as the sandbox's init (PID 1) without a second process: it reaps
// the zombies nobody waits for — background processes orphaned to PID 1 — while leaving envd's
// own children to the exec.Cmd.Wait calls that want their exit status. It owns only the reaping
// of untracked children; it never signals or starts processes itself.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reaper tracks the children envd starts and reaps every other exited child.
type Reaper struct {
	log *slog.Logger

	// mu is held while a tracked child is started and while zombies are inspected, so a child
	// that exits at once is tracked before the reaper can see it.
	mu sync.Mutex
	// +checklocks:mu
	tracked map[int]struct{}
	// alone is true while envd has no child at all (the last look found none); written under mu.
	alone atomic.Bool
	// kick asks Run for a sweep ahead of its next tick.
	kick chan struct{}

	actMu sync.Mutex
	// activity is closed at the next Start (Activity).
	// +checklocks:actMu
	activity chan struct{}
}

// New makes this process a reaper of orphans (PID 1 is one already; otherwise it becomes a child
// subreaper) and returns the Reaper; Run does the reaping.
func New(log *slog.Logger) (*Reaper, error) {
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("become subreaper: %w", err)
		}
	}
	return &Reaper{log: log, tracked: map[int]struct{}{}, kick: make(chan struct{}, 1), activity: make(chan struct{})}, nil
}

// Activity returns a channel closed when envd next starts a process: the guest is busy, and
// watchers that slowed down while it was idle look closely again.
func (r *Reaper) Activity() <-chan struct{} {
	r.actMu.Lock()
	defer r.actMu.Unlock()
	return r.activity
}

// Alone reports whether envd had no child process at all when the reaper last looked. Every
// process in the guest descends from envd (it is init, and starts processes only through Start),
// so a guest where envd is alone runs nothing but envd until the next Start: nothing there can
// fork, exit, grow its memory or fill the disk on its own, and watchers may rest until Activity
// fires. Read Activity's channel before Alone, so a Start between the two is not missed.
func (r *Reaper) Alone() bool { return r.alone.Load() }

func (r *Reaper) active() {
	r.actMu.Lock()
	close(r.activity)
	r.activity = make(chan struct{})
	r.actMu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Start starts cmd as a tracked child: its exit status stays for cmd.Wait. Call Forget after
// Wait returns.
func (r *Reaper) Start(cmd *exec.Cmd) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	r.tracked[cmd.Process.Pid] = struct{}{}
	r.alone.Store(false)
	r.active()
	return nil
}

// Forget stops tracking pid once its waiter has reaped it. A tracked child that exited may
// have left orphans behind, and it no longer hides other zombies from waitid, so sweep now.
func (r *Reaper) Forget(pid int) {
	r.mu.Lock()
	delete(r.tracked, pid)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// ReapsPerSecond bounds how many untracked children (orphans) a second the reaper reaps. An orphan
// waits as a zombie until then, and a zombie still counts against its user's RLIMIT_NPROC and the
// guest's task limit. A fork bomb's processes all end up orphans (each parent exits right after
// forking), so the bound is also the bomb's fork rate: unbounded, a user's bomb at its task limit
// kept gVisor's sentry so busy that root's `pkill` took 20-30 s (minutes with one sweep holding
// mu throughout); at 32 a second it takes well under a second. Real workloads reap their own
// children and orphan few.
const ReapsPerSecond = 32

// Run reaps untracked zombies every second and after every tracked child's exit, up to
// ReapsPerSecond a second, until ctx is done. It polls instead of handling SIGCHLD: with a
// SIGCHLD handler installed, gVisor occasionally broke envd's in-flight streams (about one
// command in 60 ended "canceled" at the SDK), and a zombie that waits up to a second costs
// nothing.
//
// An idle guest is swept less and less often, down to once every MaxIdleInterval: each wake-up
// costs the sentry a host context switch, and hundreds of idle sandboxes on a node would spend a
// core on sweeps that find nothing. A process envd starts, a tracked child's exit or an orphan
// reaped brings the sweeps back to once a second. While envd has no child at all (Alone) there is
// nothing to reap until the next Start, and Run does not wake until then.
func (r *Reaper) Run(ctx context.Context) {
	every := time.Second
	tick := time.NewTimer(every)
	defer tick.Stop()
	budget := ReapsPerSecond
	busy := false
	for {
		n := r.sweep(budget)
		budget -= n
		busy = busy || n > 0
		tickC := tick.C
		if r.alone.Load() {
			tickC = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
			busy = true
			if every > time.Second {
				every = time.Second
				tick.Reset(every)
			}
		case <-tickC:
			budget = ReapsPerSecond
			if busy {
				every = time.Second
			} else {
				every = min(2*every, MaxIdleInterval)
			}
			busy = false
			tick.Reset(every)
		}
	}
}

// MaxIdleInterval is the longest an idle guest goes between sweeps (an orphan that exits then
// waits at most this long as a zombie).
const MaxIdleInterval = 16 * time.Second

// sweep reaps up to limit exited untracked children, stopping early when none is left or a tracked
// one is next, and returns how many it reaped. It takes mu for one child at a time, so a Start
// (root's command to clean up, too) waits for one reap at most, not for a whole sweep.
func (r *Reaper) sweep(limit int) int {
	n := 0
	for n < limit && r.reapOne() {
		n++
	}
	return n
}

// reapOne reaps one exited untracked child and reports whether it did.
func (r *Reaper) reapOne() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := peekExited()
	r.alone.Store(errors.Is(err, unix.ECHILD))
	if err != nil {
		if !errors.Is(err, unix.ECHILD) {
			r.log.Warn("reaper: waitid", "err", err)
		}
		return false
	}
	if pid == 0 {
		return false
	}
	if _, ok := r.tracked[pid]; ok {
		return false
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil && !errors.Is(err, unix.ECHILD) {
		r.log.Warn("reaper: wait4", "pid", pid, "err", err)
		return false
	}
	return true
}

// peekExited returns the pid of an exited child without reaping it (WNOWAIT), or 0 if none.
func peekExited() (int, error) {
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		return 0, err
	}
	return siginfoPid(&info), nil
}

// siginfoPid reads si_pid, which x/sys keeps opaque: for SIGCHLD it follows si_signo, si_errno and
// si_code, padded to 8 bytes on 64-bit Linux (and unpadded on 32-bit).
func siginfoPid(info *unix.Siginfo) int {
	off := uintptr(12)
	if unsafe.Sizeof(uintptr(0)) == 8 {
		off = 16
	}
	return int(*(*int32)(unsafe.Add(unsafe.Pointer(info), off)))
}
