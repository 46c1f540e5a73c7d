package limitwatch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/testutil/fakeguest"
)

type finding struct {
	msg    string
	fields map[string]string
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeProc makes a /proc with n processes of uid, each of threads threads.
func fakeProc(t *testing.T, dir string, first, n, uid, threads int) {
	for i := 0; i < n; i++ {
		write(t, filepath.Join(dir, fmt.Sprint(first+i), "status"),
			fmt.Sprintf("Name:\tbash\nUid:\t%d\t%d\t%d\t%d\nThreads:\t%d\n", uid, uid, uid, uid, threads))
	}
}

func TestTaskEpisodes(t *testing.T) {
	tasks, proc := t.TempDir(), t.TempDir()
	var got []finding
	w := New(Options{TasksDir: tasks, NProc: 100, Proc: proc, DiskPath: t.TempDir(),
		Report: func(level, msg string, f map[string]string) {
			if level != "warn" {
				t.Errorf("level %q", level)
			}
			got = append(got, finding{msg, f})
		}})
	now := time.Now()
	set := func(cur int) { write(t, filepath.Join(tasks, "pids.current"), fmt.Sprint(cur)) }
	write(t, filepath.Join(tasks, "pids.max"), "120")

	set(50)
	w.Check(now)
	if len(got) != 0 {
		t.Fatalf("reported below every limit: %+v", got)
	}
	// A user at its RLIMIT_NPROC: 60 processes of 2 threads of uid 1000, and root's.
	fakeProc(t, proc, 100, 60, 1000, 2)
	fakeProc(t, proc, 10, 5, 0, 1)
	set(105)
	w.Check(now)
	if len(got) != 1 || got[0].fields["reason"] != "user-task-limit" || got[0].fields["uid"] != "1000" || got[0].fields["tasks"] != "120" {
		t.Fatalf("user limit: %+v", got)
	}
	// Still there: one episode, one entry, even once the scan may run again.
	w.Check(now.Add(time.Minute))
	if len(got) != 1 {
		t.Fatalf("reported twice: %+v", got)
	}
	// The whole guest at its limit.
	set(120)
	w.Check(now.Add(2 * time.Minute))
	if len(got) != 2 || got[1].fields["reason"] != "task-limit" || !strings.Contains(got[1].msg, "120 of its 120") {
		t.Fatalf("guest limit: %+v", got)
	}
	w.Check(now.Add(3 * time.Minute))
	if len(got) != 2 {
		t.Fatalf("guest limit reported twice: %+v", got)
	}
	// Back well below: the next time is a new episode.
	set(10)
	w.Check(now.Add(4 * time.Minute))
	set(120)
	w.Check(now.Add(5 * time.Minute))
	if len(got) != 4 {
		t.Fatalf("new episodes not reported: %+v", got)
	}
}

func TestDiskFullOnARealFilesystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs (CI runs as root)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=32m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	var got []finding
	w := New(Options{DiskPath: dir, Report: func(level, msg string, f map[string]string) {
		if level != "warn" {
			t.Errorf("level %q", level)
		}
		got = append(got, finding{msg, f})
	}})
	fill := func(mib float64) {
		write(t, filepath.Join(dir, "fill"), strings.Repeat("x", int(mib*(1<<20))))
	}
	fill(30)
	w.Check(time.Now())
	if len(got) != 0 {
		t.Fatalf("2 MiB free counted as full: %+v", got)
	}
	fill(31.5)
	w.Check(time.Now())
	w.Check(time.Now())
	if len(got) != 1 || got[0].fields["reason"] != "disk-full" || got[0].fields["totalBytes"] != fmt.Sprint(32<<20) {
		t.Fatalf("full disk: %+v", got)
	}
	fill(10)
	w.Check(time.Now())
	fill(31.5)
	w.Check(time.Now())
	if len(got) != 2 {
		t.Fatalf("a second episode after room came back: %+v", got)
	}
}

// A check says whether the guest was quiet, so Run can slow down while nothing changes: the same
// task count (and disk) as last time and no limit reached; any change, or a limit reached, is busy.
func TestQuiet(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "pids.current"), "5\n")
	write(t, filepath.Join(dir, "pids.max"), "100\n")
	// /proc has no blocks: the disk stays out of it here.
	w := New(Options{TasksDir: dir, DiskPath: "/proc", Report: func(string, string, map[string]string) {}})
	now := time.Now()
	if w.Check(now) {
		t.Fatal("the first check is quiet (nothing to compare with)")
	}
	if !w.Check(now) {
		t.Fatal("nothing changed, not quiet")
	}
	write(t, filepath.Join(dir, "pids.current"), "6\n")
	if w.Check(now) {
		t.Fatal("a task more, still quiet")
	}
	if !w.Check(now) {
		t.Fatal("steady at 6 tasks, not quiet")
	}
	write(t, filepath.Join(dir, "pids.current"), "100\n")
	w.Check(now)
	if w.Check(now) {
		t.Fatal("at the task limit, quiet")
	}
}

// Run stops checking a quiet guest where envd runs nothing, and checks at once at the next start;
// a quiet guest with a process still gets checked.
func TestRunRestsWhileAlone(t *testing.T) {
	for _, alone := range []bool{true, false} {
		t.Run(fmt.Sprintf("alone=%v", alone), func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "pids.current"), "5\n")
			write(t, filepath.Join(dir, "pids.max"), "100\n")
			g := fakeguest.New(alone)
			found := make(chan string, 10)
			w := New(Options{TasksDir: dir, DiskPath: "/proc", Interval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, Guest: g,
				Report: func(_, msg string, _ map[string]string) { found <- msg }})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() { w.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			time.Sleep(300 * time.Millisecond) // two checks alike: quiet
			write(t, filepath.Join(dir, "pids.current"), "100\n")
			select {
			case msg := <-found:
				if alone {
					t.Fatalf("a resting watcher checked: %q", msg)
				}
				return
			case <-time.After(300 * time.Millisecond):
				if !alone {
					t.Fatal("a quiet guest with a process was not checked again")
				}
			}
			g.Start()
			select {
			case msg := <-found:
				if !strings.Contains(msg, "task limit reached") {
					t.Fatalf("finding %q", msg)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a start did not bring the checks back")
			}
		})
	}
}
