package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/runtime"
)

// watcher turns a sandbox process's exit into an event. runsc starts the sandbox process and
// exits, so the process is not vmon's child unless vmon is a child subreaper (Options.Adopt):
// then it is reparented to vmon and its exit status can be collected. Either way its exit is
// observed through a pidfd polled by Go's network poller, so no OS thread waits per sandbox.
type watcher struct {
	adopt bool
	// reap asks the reaping goroutine (adopt only) for a look at this process's exited children.
	reap chan struct{}

	mu sync.Mutex
	// pidfds are the sandboxes this process started or waited on, by sandbox id.
	// +checklocks:mu
	pidfds map[string]*pidfd
}

type pidfd struct {
	pid int
	f   *os.File
}

func newWatcher(adopt bool) (*watcher, error) {
	if adopt {
		// Orphans of runsc (the sandbox and gofer processes) become our children, so their exit
		// status is ours to read and they never linger as zombies of init.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("become child subreaper: %w", err)
		}
	}
	w := &watcher{adopt: adopt, pidfds: map[string]*pidfd{}, reap: make(chan struct{}, 1)}
	if adopt {
		// One goroutine for the life of the process (a runtime is never closed): looks are
		// asked for at every sandbox's end and coalesce, so a burst of kills costs one look, and
		// no kill waits for it.
		go func() {
			for range w.reap {
				w.reapOrphansNow()
			}
		}()
	}
	return w, nil
}

// track opens a pidfd on sandbox id's process as soon as it exists, so its identity is fixed
// before anything could reap it or reuse its pid.
func (w *watcher) track(id string, pid int) (*pidfd, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	p := &pidfd{pid: pid, f: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))}
	w.mu.Lock()
	old := w.pidfds[id]
	w.pidfds[id] = p
	w.mu.Unlock()
	if old != nil {
		old.f.Close()
	}
	return p, nil
}

// forget drops id's pidfd (the sandbox was destroyed).
func (w *watcher) forget(id string) {
	w.mu.Lock()
	p := w.pidfds[id]
	delete(w.pidfds, id)
	w.mu.Unlock()
	if p != nil {
		p.f.Close()
	}
}

func (w *watcher) watched(pid int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.pidfds {
		if p.pid == pid {
			return true
		}
	}
	return false
}

func (w *watcher) lookup(id string) *pidfd {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pidfds[id]
}

// wait blocks until p's process has exited and returns its wait status when it is our child
// (ok false otherwise: it was started by an earlier vmon process and belongs to init).
func (w *watcher) wait(ctx context.Context, p *pidfd) (status waitStatus, ok bool, err error) {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	done := make(chan error, 1)
	go func() {
		done <- rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 0)
			return err == nil && n > 0
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			return 0, false, fmt.Errorf("wait for sandbox process %d: %w", p.pid, err)
		}
	case <-ctx.Done():
		// An expired deadline wakes the reader; clearing it afterwards keeps the pidfd usable
		// for a later Wait.
		_ = p.f.SetReadDeadline(time.Now())
		<-done
		_ = p.f.SetReadDeadline(time.Time{})
		return 0, false, ctx.Err()
	}
	if !w.adopt {
		return 0, false, nil
	}
	// A zombie's pid cannot be reused before it is reaped, so waiting on the pid is safe.
	var ws unix.WaitStatus
	got, err := unix.Wait4(p.pid, &ws, unix.WNOHANG, nil)
	if err != nil || got != p.pid {
		return 0, false, nil // not our child (started before a restart), or reaped elsewhere
	}
	return ws, true, nil
}

// reapRunscOrphans asks for exited runsc helper processes (gofers, sandboxes nobody waits for)
// that were reparented to this process to be reaped soon, without waiting for it.
func (w *watcher) reapRunscOrphans() {
	if !w.adopt {
		return
	}
	select {
	case w.reap <- struct{}{}:
	default: // a look is pending already and will see this one's orphans too
	}
}

// reapOrphansNow reaps the exited runsc helpers among this process's children. It only touches
// zombies whose command is runsc's re-exec ("exe", from /proc/self/exe) and whose pid no waiter
// owns, so it never steals the exit status of a child os/exec waits for. It reads the children
// lists, not all of /proc: on a node of 400 sandboxes /proc holds some 4000 processes, and
// reading each one's stat at every kill made kills slower the fuller the node.
func (w *watcher) reapOrphansNow() {
	self := os.Getpid()
	for _, pid := range childPIDs() {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		comm, state, ppid, ok := parseStat(b)
		if !ok || ppid != self || state != 'Z' || comm != "exe" || w.watched(pid) {
			continue
		}
		var ws unix.WaitStatus
		_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}

// childPIDs lists this process's children: each thread's /proc children file (an orphan is
// reparented to one of the subreaper's threads).
func childPIDs() []int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil
	}
	var pids []int
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", t.Name(), "children"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// parseStat reads comm, state and ppid from /proc/<pid>/stat ("pid (comm) S ppid ...").
func parseStat(b []byte) (comm string, state byte, ppid int, ok bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open || end+2 >= len(b) {
		return "", 0, 0, false
	}
	fields := strings.Fields(string(b[end+1:]))
	if len(fields) < 2 || len(fields[0]) != 1 {
		return "", 0, 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return "", 0, 0, false
	}
	return string(b[open+1 : end]), fields[0][0], ppid, true
}

// classify says why a sandbox process ended, from its wait status (when ours) and the counters
// of its host cgroup, which still exists until the sandbox is destroyed.
func classify(ws waitStatus, haveStatus bool, cg cgroupCounters) runtime.Exit {
	switch {
	case cg.oomKills > 0:
		e := runtime.Exit{Reason: runtime.ExitOOM, Code: -1}
		if haveStatus && ws.Signaled() {
			e.Signal = unix.SignalName(ws.Signal())
		}
		return e
	case cg.pidsMaxHits > 0:
		return runtime.Exit{Reason: runtime.ExitTaskLimit, Code: -1}
	case haveStatus && ws.Signaled():
		return runtime.Exit{Reason: runtime.ExitKilled, Code: -1, Signal: unix.SignalName(ws.Signal())}
	case haveStatus && ws.Exited():
		return runtime.Exit{Reason: runtime.ExitInit, Code: ws.ExitStatus()}
	default:
		return runtime.Exit{Reason: runtime.ExitUnknown, Code: -1}
	}
}

// cgroupCounters are the events of a sandbox's host cgroup that explain its death.
type cgroupCounters struct {
	oomKills    int64
	pidsMaxHits int64
}

// readCgroupCounters reads the OOM kill and pids.max counters of sandbox id's host cgroup in
// every mounted hierarchy (cgroup v1 controllers or v2).
func readCgroupCounters(parent, id string) cgroupCounters {
	var c cgroupCounters
	mounts, err := cgroupMounts()
	if err != nil {
		return c
	}
	for _, m := range mounts {
		dir := filepath.Join(m, parent, id)
		// v1: memory.oom_control has "oom_kill N"; v2: memory.events has "oom_kill N".
		for _, f := range []string{"memory.oom_control", "memory.events"} {
			if v, ok := counter(filepath.Join(dir, f), "oom_kill"); ok && v > c.oomKills {
				c.oomKills = v
			}
		}
		if v, ok := counter(filepath.Join(dir, "pids.events"), "max"); ok && v > c.pidsMaxHits {
			c.pidsMaxHits = v
		}
	}
	return c
}

// counter reads "key value" lines and returns key's value.
func counter(path, key string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// readPidFile returns the pid runsc wrote for the sandbox.
func readPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %s", path)
	}
	return pid, nil
}

type waitStatus = unix.WaitStatus
