// Package limitwatch notices when the guest reaches one of its limits (the task limit of the whole
// guest, a user's RLIMIT_NPROC, a full disk) and reports it once per episode, for the sandbox's
// log: a command that fails with EAGAIN or ENOSPC says little by itself, and the log tells the
// user why.
//
// It only reads (the pids controller's counters, /proc, statfs); it never changes a limit or
// touches a process.
package limitwatch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Report receives one finding: a level ("warn"), a message and its fields.
type Report func(level, msg string, fields map[string]string)

// Options configure Run. Every source is optional: a missing one is not watched.
type Options struct {
	// TasksDir is the guest's pids cgroup directory (pids.current, pids.max).
	TasksDir string
	// NProc is the RLIMIT_NPROC of unprivileged users (0: not watched).
	NProc int
	// Proc is the proc filesystem (default /proc).
	Proc string
	// DiskPath is statfs'd for the sandbox's disk (default /).
	DiskPath string
	// Interval between checks (default Interval).
	Interval time.Duration
	// MaxInterval is the longest an idle guest goes between checks (default MaxIdleInterval);
	// each check that finds nothing changed doubles the interval up to it.
	MaxInterval time.Duration
	// Guest, when set, says when envd starts a process (checks are back to every Interval at
	// once) and whether it runs none (checks stop until it starts one).
	Guest  Guest
	Report Report
}

// Guest is what envd's process starter (the reaper) tells about the guest's processes.
type Guest interface {
	// Activity returns a channel closed when envd next starts a process.
	Activity() <-chan struct{}
	// Alone reports whether envd has no child at all: nothing else runs in the guest, so no
	// task count or disk use can move but by envd itself, until the next start.
	Alone() bool
}

// MaxIdleInterval: an idle guest is checked less and less often, down to this: each check wakes
// the sentry, and hundreds of idle sandboxes on a node would spend a core finding nothing.
const MaxIdleInterval = 16 * time.Second

// Checking once a second costs two small reads and a statfs; a limit hit for less than that is
// also one a user rarely needs explained.
const Interval = time.Second

// Episodes: a limit is reported when reached and again only after usage fell well below it, so a
// process bomb held at its limit for minutes is one entry, not hundreds.
const (
	// diskFull is the free space below which the disk counts as full; diskClear is the free space
	// that ends the episode.
	diskFull  = 1 << 20
	diskClear = 16 << 20
	// rearmShare: a task episode ends below this share (percent) of the limit.
	rearmShare = 90
	// userScanEvery bounds how often /proc is scanned for per-user counts while the guest is
	// near a user's limit (the scan is the only costly check).
	userScanEvery = 10 * time.Second
)

// Watcher holds the episode state between checks.
type Watcher struct {
	o            Options
	guestFull    bool
	diskFull     bool
	usersFull    map[int]bool
	lastUserScan time.Time
	// What the last check saw, to tell a quiet guest from a busy one.
	lastTasks int
	lastFree  uint64
}

// New returns a watcher with o's defaults filled in.
func New(o Options) *Watcher {
	if o.Proc == "" {
		o.Proc = "/proc"
	}
	if o.DiskPath == "" {
		o.DiskPath = "/"
	}
	if o.Interval == 0 {
		o.Interval = Interval
	}
	if o.MaxInterval < o.Interval {
		o.MaxInterval = max(MaxIdleInterval, o.Interval)
	}
	return &Watcher{o: o, usersFull: map[int]bool{}, lastTasks: -1}
}

// Run checks every Interval while the guest is busy, less often while it is quiet, and not at
// all while it is quiet and envd runs no process (Guest.Alone), until ctx ends. A guest resting
// so wakes for nothing; its next process start brings the checks back, the first at once. The
// one change a rest can hide, a disk that envd's own file writes fill, is then reported at that
// start, when a command is about to meet it.
func (w *Watcher) Run(ctx context.Context) {
	every := w.o.Interval
	t := time.NewTimer(every)
	defer t.Stop()
	quiet := false
	for {
		var activity <-chan struct{}
		tick := t.C
		if w.o.Guest != nil {
			activity = w.o.Guest.Activity()
			if quiet && w.o.Guest.Alone() {
				tick = nil
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-activity:
			every = w.o.Interval
			quiet = w.Check(time.Now())
			t.Reset(every)
		case now := <-tick:
			quiet = w.Check(now)
			if quiet {
				every = min(2*every, w.o.MaxInterval)
			} else {
				every = w.o.Interval
			}
			t.Reset(every)
		}
	}
}

// Check looks at every limit once and reports whether the guest was quiet: the same task count
// and about the same free disk as at the last check, and no limit reached.
func (w *Watcher) Check(now time.Time) (quiet bool) {
	tasks := w.checkTasks(now)
	free := w.checkDisk()
	quiet = tasks == w.lastTasks && free+(1<<20) >= w.lastFree && free <= w.lastFree+(1<<20) &&
		!w.guestFull && !w.diskFull && len(w.usersFull) == 0
	w.lastTasks, w.lastFree = tasks, free
	return quiet
}

// checkTasks returns the guest's task count (-1 when not watched).
func (w *Watcher) checkTasks(now time.Time) int {
	if w.o.TasksDir == "" {
		return -1
	}
	cur, err1 := readInt(filepath.Join(w.o.TasksDir, "pids.current"))
	limit, err2 := readInt(filepath.Join(w.o.TasksDir, "pids.max"))
	tasks := cur
	if err1 != nil {
		tasks = -1
	}
	if err1 == nil && err2 == nil && limit > 0 {
		switch {
		case !w.guestFull && cur >= limit:
			w.guestFull = true
			w.o.Report("warn", fmt.Sprintf("task limit reached: the sandbox runs %d of its %d processes and threads; new ones fail with EAGAIN", cur, limit),
				map[string]string{"reason": "task-limit", "tasks": strconv.Itoa(cur), "limit": strconv.Itoa(limit)})
		case w.guestFull && cur*100 < limit*rearmShare:
			w.guestFull = false
		}
	}
	if w.o.NProc <= 0 || err1 != nil {
		return tasks
	}
	anyFull := len(w.usersFull) > 0
	if cur < w.o.NProc*rearmShare/100 {
		clear(w.usersFull)
		return tasks
	}
	if !anyFull && cur < w.o.NProc {
		return tasks
	}
	if now.Sub(w.lastUserScan) < userScanEvery {
		return tasks
	}
	w.lastUserScan = now
	counts := taskCounts(w.o.Proc)
	for uid, n := range counts {
		if uid == 0 {
			continue
		}
		switch {
		case !w.usersFull[uid] && n >= w.o.NProc:
			w.usersFull[uid] = true
			name := strconv.Itoa(uid)
			if u, err := user.LookupId(name); err == nil {
				name = u.Username
			}
			w.o.Report("warn", fmt.Sprintf("user %s reached its task limit: %d processes and threads (RLIMIT_NPROC %d); its new ones fail with EAGAIN", name, n, w.o.NProc),
				map[string]string{"reason": "user-task-limit", "user": name, "uid": strconv.Itoa(uid), "tasks": strconv.Itoa(n), "limit": strconv.Itoa(w.o.NProc)})
		case w.usersFull[uid] && n*100 < w.o.NProc*rearmShare:
			delete(w.usersFull, uid)
		}
	}
	for uid := range w.usersFull {
		if _, ok := counts[uid]; !ok {
			delete(w.usersFull, uid)
		}
	}
	return tasks
}

// checkDisk returns the disk's free bytes (0 when it cannot tell).
func (w *Watcher) checkDisk() uint64 {
	var st unix.Statfs_t
	if err := unix.Statfs(w.o.DiskPath, &st); err != nil || st.Blocks == 0 {
		return 0
	}
	free := st.Bavail * uint64(st.Bsize)
	total := st.Blocks * uint64(st.Bsize)
	switch {
	case !w.diskFull && free < diskFull:
		w.diskFull = true
		w.o.Report("warn", fmt.Sprintf("disk full: %d KiB of the sandbox's %d MiB are free; writes fail with ENOSPC", free>>10, total>>20),
			map[string]string{"reason": "disk-full", "freeBytes": strconv.FormatUint(free, 10), "totalBytes": strconv.FormatUint(total, 10)})
	case w.diskFull && free >= diskClear:
		w.diskFull = false
	}
	return free
}

// taskCounts sums the threads of every process per real uid, as RLIMIT_NPROC counts them.
func taskCounts(proc string) map[int]int {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil
	}
	out := map[int]int{}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(proc, e.Name(), "status"))
		if err != nil {
			continue
		}
		uid, threads := -1, 1
		for _, ln := range bytes.Split(b, []byte("\n")) {
			switch {
			case bytes.HasPrefix(ln, []byte("Uid:")):
				if f := bytes.Fields(ln[4:]); len(f) > 0 {
					uid, _ = strconv.Atoi(string(f[0]))
				}
			case bytes.HasPrefix(ln, []byte("Threads:")):
				if n, err := strconv.Atoi(string(bytes.TrimSpace(ln[8:]))); err == nil {
					threads = n
				}
			}
		}
		if uid >= 0 {
			out[uid] += threads
		}
	}
	return out
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := string(bytes.TrimSpace(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.Atoi(s)
}
