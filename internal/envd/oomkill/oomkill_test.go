package oomkill

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/testutil/fakeguest"
)

func TestVictim(t *testing.T) {
	const total = 512 << 20
	for _, tc := range []struct {
		total, free uint64
		want        time.Duration
	}{
		{8 << 30, 8 << 30, IdleInterval},            // 2 s of room at FillRate: the poll's ceiling
		{total, total, 124023437 * time.Nanosecond}, // 508 MiB above the 4 MiB reserve: 124 ms
		{total, 260 << 20, 62500 * time.Microsecond},
		{total, 44 << 20, HotInterval}, // 40 MiB of room: under 10 ms
		{total, 2 << 20, HotInterval},
		{total, 0, HotInterval},
		{0, 0, IdleInterval}, // no account of memory: nothing to pace by
	} {
		if got := Interval(Memory{Total: tc.total, Free: tc.free}); got != tc.want {
			t.Errorf("free %d of %d MiB: interval %s, want %s", tc.free>>20, tc.total>>20, got, tc.want)
		}
	}
	// Whatever the memory, a guest claiming FillRate until the next look has not gone past the
	// reserve unless the look is already as soon as it gets.
	for free := uint64(0); free <= total; free += 1 << 20 {
		m := Memory{Total: total, Free: free}
		d := Interval(m)
		if taken := uint64(d) * FillRate / uint64(time.Second); d > HotInterval && m.Available()-taken < Reserve(total) {
			t.Fatalf("free %d MiB: after %s at FillRate the guest is under the reserve", free>>20, d)
		}
	}
	if got := Reserve(512 << 20); got != 4<<20 {
		t.Errorf("reserve of 512 MiB = %d", got)
	}
	if got := Reserve(128 << 20); got != 2<<20 {
		t.Errorf("reserve of 128 MiB = %d (the floor is 2 MiB)", got)
	}
}

func TestTaskCost(t *testing.T) {
	m := Memory{Total: 512 << 20, Free: 400 << 20, Tasks: 100}
	if got, want := m.Available(), uint64(400<<20-100*TaskCost); got != want {
		t.Fatalf("available %d, want %d", got, want)
	}
	if got := (Memory{Total: 512 << 20, Free: 10 << 20, Tasks: 1000}).Available(); got != 0 {
		t.Fatalf("available %d, want 0 when tasks cost more than what is free", got)
	}
}

func TestParseMeminfo(t *testing.T) {
	m, err := parseMeminfo([]byte("MemTotal:         524288 kB\nMemFree:          100 kB\nMemAvailable:     4096 kB\nCached: 1 kB\n"))
	if err != nil || m.Total != 512<<20 || m.Free != 4<<20 {
		t.Fatalf("got %+v, %v", m, err)
	}
	if _, err := parseMeminfo([]byte("MemTotal: 1 kB\n")); err == nil {
		t.Fatal("meminfo without MemAvailable parsed")
	}
	if _, err := parseMeminfo([]byte("MemTotal: x kB\nMemAvailable: 1 kB\n")); err == nil {
		t.Fatal("bad number parsed")
	}
}

// fakeProc is a procfs with meminfo and processes the test controls.
type fakeProc struct {
	dir string
	mu  sync.Mutex
	// lag is how long a killed process's memory takes to come back after it is gone, as the
	// sentry returns a dead process's pages in the background.
	lag time.Duration
}

func (f *fakeProc) meminfo(t *testing.T, totalKiB, freeKiB uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := fmt.Sprintf("MemTotal: %d kB\nMemFree: %d kB\nMemAvailable: %d kB\n", totalKiB, freeKiB, freeKiB)
	// Written in place (not renamed): Run keeps the file open and preads it, as it does /proc.
	if err := os.WriteFile(filepath.Join(f.dir, "meminfo"), []byte(fmt.Sprintf("%-200s", b)), 0o644); err != nil {
		t.Error(err)
	}
}

func (f *fakeProc) proc(t *testing.T, pid int, comm string, pages int, adj int) {
	d := filepath.Join(f.dir, strconv.Itoa(pid))
	for name, content := range map[string]string{
		"statm":         fmt.Sprintf("%d %d 0 0 0 0 0\n", pages*2, pages),
		"comm":          comm + "\n",
		"oom_score_adj": strconv.Itoa(adj) + "\n",
		"stat":          fmt.Sprintf("%d (%s) S 1\n", pid, comm),
	} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Run kills the biggest process once the guest is out of memory, waits for it to go, kills no
// second process once memory came back, and spares PID 1, itself and -1000.
func TestRunKillsTheBiggestOnce(t *testing.T) {
	f := &fakeProc{dir: t.TempDir()}
	f.meminfo(t, 512<<10, 300<<10)
	f.proc(t, 1, "envd", 100000, 0)           // init: never
	f.proc(t, os.Getpid(), "self", 100000, 0) // the killer itself: never
	f.proc(t, 40, "postgres", 100000, -1000)  // protected
	f.proc(t, 41, "python3", 90000, 0)        // the victim
	f.proc(t, 42, "bash", 500, 0)             // small
	tasks := filepath.Join(f.dir, "pids.current")
	if err := os.WriteFile(tasks, []byte("5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	killed, stop := f.runKiller(t, Options{TasksFile: tasks}, func() {
		// Its tasks go too.
		if err := os.WriteFile(tasks, []byte("5\n"), 0o644); err != nil {
			t.Error(err)
		}
	})
	defer stop()
	time.Sleep(3 * IdleInterval)
	select {
	case pid := <-killed:
		t.Fatalf("killed %d with 300 MiB free", pid)
	default:
	}
	// 300 MiB free, but 800 tasks cost the host 300 MiB: out of memory all the same.
	if err := os.WriteFile(tasks, []byte("800\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case pid := <-killed:
		if pid != 41 {
			t.Fatalf("killed %d, want 41 (python3)", pid)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing killed out of memory")
	}
	time.Sleep(3 * IdleInterval)
	select {
	case pid := <-killed:
		t.Fatalf("killed a second process (%d) after memory came back", pid)
	default:
	}
}

// runKiller runs Run over f with o until stop, which fails the test if Run failed. A kill frees
// the victim's memory and reaps it (then calls after, if set) and is reported on killed.
func (f *fakeProc) runKiller(t *testing.T, o Options, after func()) (killed <-chan int, stop func()) {
	t.Helper()
	ch := make(chan int, 10)
	o.Proc = f.dir
	o.Kill = func(pid int) error {
		if f.lag > 0 {
			time.AfterFunc(f.lag, func() { f.meminfo(t, 512<<10, 400<<10) })
		} else {
			f.meminfo(t, 512<<10, 400<<10)
		}
		if after != nil {
			after()
		}
		if err := os.RemoveAll(filepath.Join(f.dir, strconv.Itoa(pid))); err != nil {
			t.Error(err)
		}
		ch <- pid
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	return ch, func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// While the node says the sandbox is far from its memory the killer polls only every
// FarInterval; the node's word that it is near makes it look at once, and kill.
func TestRunFollowsTheNodesHint(t *testing.T) {
	f := &fakeProc{dir: t.TempDir()}
	f.meminfo(t, 512<<10, 400<<10)
	f.proc(t, 41, "python3", 90000, 0)
	hint := NewHint()
	hint.SetNear(false)
	killed, stop := f.runKiller(t, Options{Hint: hint}, nil)
	defer stop()
	time.Sleep(IdleInterval) // the first look, at once, found plenty free
	f.meminfo(t, 512<<10, 1<<10)
	// Near, the killer would have looked again within IdleInterval; far, not before FarInterval.
	time.Sleep(4 * IdleInterval)
	select {
	case pid := <-killed:
		t.Fatalf("killed %d while told far, before FarInterval", pid)
	default:
	}
	hint.SetNear(true)
	select {
	case pid := <-killed:
		if pid != 41 {
			t.Fatalf("killed %d, want 41", pid)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("told near, the killer did not look")
	}
}

// While envd runs no process there is nobody to kill, and Run does not look; a start brings it
// back at once.
func TestRunRestsWhileAlone(t *testing.T) {
	f := &fakeProc{dir: t.TempDir()}
	f.meminfo(t, 512<<10, 1<<10)
	f.proc(t, 41, "python3", 90000, 0)
	g := fakeguest.New(true)
	killed, stop := f.runKiller(t, Options{Guest: g}, nil)
	defer stop()
	// Near (no hint), a killer that looked would have done so at once and every IdleInterval.
	time.Sleep(4 * IdleInterval)
	select {
	case pid := <-killed:
		t.Fatalf("killed %d while envd ran no process", pid)
	default:
	}
	g.Start()
	select {
	case pid := <-killed:
		if pid != 41 {
			t.Fatalf("killed %d, want 41", pid)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a process start did not bring the killer back")
	}
}

// The victim is reaped before its memory comes back: the command that starts next (here at once,
// which wakes a killer that rested while envd ran nothing) must not be taken for the hog.
func TestRunWaitsForTheVictimsMemory(t *testing.T) {
	f := &fakeProc{dir: t.TempDir(), lag: settle / 4}
	f.meminfo(t, 512<<10, 1<<10)
	f.proc(t, 41, "python3", 90000, 0)
	g := fakeguest.New(false)
	killed, stop := f.runKiller(t, Options{Guest: g}, func() {
		f.proc(t, 42, "echo", 500, 0)
		g.Start()
	})
	defer stop()
	select {
	case pid := <-killed:
		if pid != 41 {
			t.Fatalf("killed %d, want 41", pid)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing killed out of memory")
	}
	select {
	case pid := <-killed:
		t.Fatalf("killed %d, the next command, while the victim's memory was coming back", pid)
	case <-time.After(settle + 2*IdleInterval):
	}
}

// While the killer waits for a victim's memory, free memory that shrinks further is a new hog
// allocating into the host's headroom: it is judged at once, not after settle.
func TestRunJudgesAtOnceWhenMemoryShrinks(t *testing.T) {
	f := &fakeProc{dir: t.TempDir(), lag: time.Hour}
	f.meminfo(t, 512<<10, 3<<10)
	f.proc(t, 41, "python3", 90000, 0)
	// Only after the first kill: one scheduled after the second would write to the test's
	// directory once the test is over.
	var once sync.Once
	killed, stop := f.runKiller(t, Options{}, func() {
		once.Do(func() {
			f.proc(t, 42, "hog", 80000, 0)
			time.AfterFunc(settle/10, func() { f.meminfo(t, 512<<10, 1<<10) })
		})
	})
	defer stop()
	for _, want := range []int{41, 42} {
		select {
		case pid := <-killed:
			if pid != want {
				t.Fatalf("killed %d, want %d", pid, want)
			}
		case <-time.After(settle / 2):
			t.Fatalf("%d not killed within %s", want, settle/2)
		}
	}
}
