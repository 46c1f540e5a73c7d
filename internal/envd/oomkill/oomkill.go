// Package oomkill is the guest's out-of-memory killer, run by envd as the sandbox's init.
//
// gVisor's sentry never refuses guest memory and has no OOM killer of its own: a guest that
// allocates past the sandbox's size grows the sentry until the host cgroup's limit kills the
// whole sandbox. So, as Linux does inside a VM, the guest kills one process instead: the node
// gives the host cgroup room beyond the memory the guest sees (internal/limits), and this package
// watches the guest's own account of its memory (/proc/meminfo, which the sentry keeps) and, when
// it is all but used up, SIGKILLs the process with the most resident memory, weighted by its
// oom_score_adj as Linux weighs it (-1000 never). It never kills PID 1 or its own process.
//
// It owns only that decision and the kill; it never touches the host, the network or files.
package oomkill

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Polling: the killer looks again before the guest could have taken what is left above Reserve
// at FillRate, so the sandbox's host headroom only has to cover the look itself and the kill.
// Far from the limit that is at most every IdleInterval, and one pread of /proc/meminfo costs
// nothing worth counting; close to it, every HotInterval.
const (
	IdleInterval = 250 * time.Millisecond
	HotInterval  = 10 * time.Millisecond
	// FillRate is the fastest the guest is taken to claim memory, in bytes a second. One thread
	// writing fresh pages claims about 1 GiB/s under gVisor on the machines measured (a Python
	// bytearray, dd from /dev/zero); four times that allows for several at once and faster hosts.
	FillRate = 4 << 30
	// FarInterval replaces the poll while the node says the sandbox is far from its memory
	// (Hint): the node watches the sandbox's host cgroup, which costs the guest nothing, and says
	// so before the guest can come near; this poll is only the net under that.
	FarInterval = 30 * time.Second
	// settle bounds the wait for a victim's memory to come back before judging again, so one
	// allocation spike does not cost two processes.
	settle = 2 * time.Second
)

// Hint is the node's word on whether the sandbox is near its memory. Polling /proc/meminfo every
// IdleInterval costs the sentry four wake-ups a second, which on a node of hundreds of idle
// sandboxes adds up to cores; the node's word lets an idle guest poll only every FarInterval.
// Until the node says otherwise the sandbox counts as near (a node that never says keeps the
// close watch).
type Hint struct {
	mu sync.Mutex
	// +checklocks:mu
	far  bool
	wake chan struct{}
}

// NewHint returns a hint that says near.
func NewHint() *Hint { return &Hint{wake: make(chan struct{}, 1)} }

// SetNear records the node's word and makes Run look at once.
func (h *Hint) SetNear(near bool) {
	h.mu.Lock()
	h.far = !near
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

func (h *Hint) isFar() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.far
}

func (h *Hint) woken() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.wake
}

// TaskCost is what one guest task costs the host beyond what the guest's own account shows:
// under gVisor's systrap platform every guest process has a stub process and shared message
// areas, and the sentry its task state. Measured on a 512 MiB sandbox: 400 sleeping processes
// added 45 MiB to the guest's MemTotal-MemAvailable and 198 MiB to the host cgroup, about 0.38
// MiB a task more than the guest sees. Linux charges a task's kernel memory (stacks, page
// tables) to its memory cgroup too, so counting it against the guest is fair.
const TaskCost = 384 << 10

// Memory is the guest's memory: /proc/meminfo's total and available, and its task count.
type Memory struct {
	Total, Free uint64 // bytes
	Tasks       uint64
}

// Available is what the guest may still take: free memory less what its tasks cost the host.
func (m Memory) Available() uint64 {
	if c := m.Tasks * TaskCost; c < m.Free {
		return m.Free - c
	}
	return 0
}

// Reserve is how much free memory is the floor: below it the killer acts. Linux acts when an
// allocation cannot be met at all; polling needs a little margin to act at about that point.
func Reserve(total uint64) uint64 {
	return max(2<<20, total/128)
}

// Interval is the next poll's delay for memory m: the time the guest needs, at FillRate, to take
// what it has left above Reserve, within [HotInterval, IdleInterval].
func Interval(m Memory) time.Duration {
	if m.Total == 0 {
		return IdleInterval
	}
	room := m.Available() - min(m.Available(), Reserve(m.Total))
	d := time.Duration(room * uint64(time.Second) / FillRate)
	return min(max(d, HotInterval), IdleInterval)
}

// Proc is a candidate victim.
type Proc struct {
	PID      int
	Comm     string
	RSS      uint64 // bytes
	ScoreAdj int    // -1000..1000
}

// Score is the process's badness as Linux computes it: resident memory plus oom_score_adj
// thousandths of the total; a process with -1000 is never chosen (negative).
func Score(p Proc, total uint64) int64 {
	if p.ScoreAdj <= -1000 {
		return -1
	}
	s := int64(p.RSS) + int64(p.ScoreAdj)*int64(total/1000)
	return max(s, 1)
}

// Victim picks the process to kill among procs, or false when none may be killed.
func Victim(procs []Proc, total uint64) (Proc, bool) {
	var best Proc
	bestScore := int64(-1)
	for _, p := range procs {
		if s := Score(p, total); s > bestScore || (s == bestScore && s > 0 && p.PID > best.PID) {
			best, bestScore = p, s
		}
	}
	return best, bestScore > 0
}

// Options configure Run.
type Options struct {
	// Proc is the procfs mount (default /proc).
	Proc string
	// TasksFile holds the guest's task count (the pids controller's pids.current of init's
	// cgroup); empty counts no task cost.
	TasksFile string
	// Kill sends SIGKILL (default syscall.Kill); tests replace it.
	Kill func(pid int) error
	Log  *slog.Logger
	// OnKill, when set, learns of every kill.
	OnKill func(Proc, Memory)
	// Hint, when set, is the node's word on whether the sandbox is near its memory; nil counts
	// as near for ever.
	Hint *Hint
	// Guest, when set, says whether envd runs any process: while it runs none there is nobody to
	// kill, and Run looks again only when one starts or the node's word changes.
	Guest Guest
}

// Guest is what envd's process starter (the reaper) tells about the guest's processes.
type Guest interface {
	// Activity returns a channel closed when envd next starts a process.
	Activity() <-chan struct{}
	// Alone reports whether envd has no child at all.
	Alone() bool
}

// Run watches the guest's memory until ctx ends.
func Run(ctx context.Context, o Options) error {
	if o.Proc == "" {
		o.Proc = "/proc"
	}
	if o.Kill == nil {
		o.Kill = func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	f, err := os.Open(filepath.Join(o.Proc, "meminfo"))
	if err != nil {
		return fmt.Errorf("oomkill: %w", err)
	}
	defer f.Close()
	self := os.Getpid()
	buf := make([]byte, 4096)
	look := func() (Memory, error) {
		// pread at 0 makes the sentry generate the file afresh: one syscall per look.
		n, err := f.ReadAt(buf, 0)
		if err != nil && n == 0 {
			return Memory{}, fmt.Errorf("oomkill: read meminfo: %w", err)
		}
		m, err := parseMeminfo(buf[:n])
		if err != nil {
			return Memory{}, fmt.Errorf("oomkill: %w", err)
		}
		if o.TasksFile != "" {
			// Best effort: without the count the killer still acts on the guest's own account.
			if b, err := os.ReadFile(o.TasksFile); err == nil {
				m.Tasks, _ = strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
			}
		}
		return m, nil
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		tick := t.C
		var activity <-chan struct{}
		if o.Guest != nil {
			activity = o.Guest.Activity()
			if o.Guest.Alone() {
				tick = nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
		case <-activity:
		case <-o.Hint.woken():
		}
		m, err := look()
		if err != nil {
			return err
		}
		if m.Total > 0 && m.Available() < Reserve(m.Total) {
			if v, ok := Victim(listProcs(o.Proc, self), m.Total); ok {
				if err := o.Kill(v.PID); err != nil && !errors.Is(err, syscall.ESRCH) {
					o.Log.Error("out of memory: kill failed", "pid", v.PID, "comm", v.Comm, "err", err)
				} else {
					o.Log.Warn("out of memory: killed process", "pid", v.PID, "comm", v.Comm,
						"rss_kib", v.RSS>>10, "oom_score_adj", v.ScoreAdj, "total_kib", m.Total>>10, "free_kib", m.Free>>10, "tasks", m.Tasks)
					if o.OnKill != nil {
						o.OnKill(v, m)
					}
					if m, err = settleAfterKill(ctx, o.Proc, v.PID, look); err != nil {
						return err
					}
				}
			} else {
				o.Log.Error("out of memory and nothing may be killed", "total_kib", m.Total>>10, "free_kib", m.Free>>10)
			}
		}
		next := Interval(m)
		if o.Hint.isFar() {
			next = FarInterval
		}
		t.Reset(next)
	}
}

// settleAfterKill waits, at most settle, for the victim's memory to come back before the killer
// judges again, and returns the memory it last saw. The victim's /proc entry goes once it is
// reaped (a zombie's state counts too), but the sentry returns a dead process's pages to its
// memory file in the background, later still on a loaded host: judged before that, the guest
// still looks full, and the next process to start (often the very command that follows the
// killed one) would be taken for the hog. The wait ends early when free memory shrinks instead,
// since then someone is allocating and the host's headroom is going; memory that does not come
// back within settle is held by someone else, who is next.
func settleAfterKill(ctx context.Context, proc string, pid int, look func() (Memory, error)) (Memory, error) {
	deadline := time.Now().Add(settle)
	for time.Now().Before(deadline) && ctx.Err() == nil && !gone(proc, pid) {
		time.Sleep(HotInterval)
	}
	var last uint64 // 0 at the first look: nothing to have shrunk from
	for {
		m, err := look()
		if err != nil || m.Total == 0 || ctx.Err() != nil || !time.Now().Before(deadline) {
			return m, err
		}
		a := m.Available()
		if a >= Reserve(m.Total) || a+shrink < last {
			return m, nil
		}
		last = a
		time.Sleep(HotInterval)
	}
}

// shrink is how much free memory may drift down between two looks while the killer waits for a
// victim's memory before it counts as someone allocating.
const shrink = 1 << 20

// gone reports whether pid no longer holds memory: reaped, or a zombie.
func gone(proc string, pid int) bool {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	_, rest, ok := bytes.Cut(b, []byte(") "))
	return ok && len(rest) > 0 && (rest[0] == 'Z' || rest[0] == 'X')
}

func parseMeminfo(b []byte) (Memory, error) {
	var m Memory
	var haveTotal, haveFree bool
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *uint64
		switch string(k) {
		case "MemTotal":
			dst, haveTotal = &m.Total, true
		case "MemAvailable":
			dst, haveFree = &m.Free, true
		default:
			continue
		}
		f := bytes.Fields(v)
		if len(f) == 0 {
			return Memory{}, fmt.Errorf("meminfo: no value for %s", k)
		}
		kib, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("meminfo: %s: %w", k, err)
		}
		*dst = kib << 10
	}
	if !haveTotal || !haveFree {
		return Memory{}, errors.New("meminfo: MemTotal or MemAvailable missing")
	}
	return m, nil
}

// listProcs reads every process but PID 1 and self: pid, comm, resident pages (statm) and
// oom_score_adj. Processes that vanish meanwhile are skipped.
func listProcs(proc string, self int) []Proc {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return nil
	}
	page := uint64(os.Getpagesize())
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 || pid == self {
			continue
		}
		dir := filepath.Join(proc, e.Name())
		statm, err := os.ReadFile(filepath.Join(dir, "statm"))
		if err != nil {
			continue
		}
		f := bytes.Fields(statm)
		if len(f) < 2 {
			continue
		}
		pages, err := strconv.ParseUint(string(f[1]), 10, 64)
		if err != nil || pages == 0 {
			continue // kernel threads and zombies hold no memory of their own
		}
		p := Proc{PID: pid, RSS: pages * page}
		if b, err := os.ReadFile(filepath.Join(dir, "oom_score_adj")); err == nil {
			p.ScoreAdj, _ = strconv.Atoi(string(bytes.TrimSpace(b)))
		}
		if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
			p.Comm = string(bytes.TrimSpace(b))
		}
		out = append(out, p)
	}
	return out
}
