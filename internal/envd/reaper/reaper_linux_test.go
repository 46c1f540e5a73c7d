package reaper

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// zombieChildren counts this process's children that exited and wait to be reaped.
func zombieChildren(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := strconv.Itoa(os.Getpid())
	n := 0
	for _, e := range entries {
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		s := string(status)
		if strings.Contains(s, "\nPPid:\t"+self+"\n") && strings.Contains(s, "\nState:\tZ") {
			n++
		}
	}
	return n
}

// A sweep reaps orphans up to its limit and leaves the rest as zombies for the next one: the bound
// that keeps a user's fork bomb from starving root (ReapsPerSecond).
func TestSweepIsBounded(t *testing.T) {
	r, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	const orphans = 40
	// The shell is tracked and waited for; its children outlive it and become this process's
	// (a subreaper's) orphans.
	cmd := exec.Command("/bin/sh", "-c", "for i in $(seq "+strconv.Itoa(orphans)+"); do sleep 0.2 & done")
	if err := r.Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	r.Forget(cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for zombieChildren(t) < orphans {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d orphans became zombies", zombieChildren(t), orphans)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := r.sweep(16); n != 16 {
		t.Fatalf("sweep(16) reaped %d", n)
	}
	if z := zombieChildren(t); z != orphans-16 {
		t.Fatalf("%d zombies left after sweep(16), want %d", z, orphans-16)
	}
	if n := r.sweep(100); n != orphans-16 {
		t.Fatalf("sweep(100) reaped %d, want %d", n, orphans-16)
	}
	if z := zombieChildren(t); z != 0 {
		t.Fatalf("%d zombies left", z)
	}
}

// Activity fires at every process envd starts, so watchers slowed down by an idle guest look
// closely again; an idle reaper still reaps an orphan, at most MaxIdleInterval late.
func TestActivityAndIdleSweeps(t *testing.T) {
	r, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	act := r.Activity()
	select {
	case <-act:
		t.Fatal("activity before any start")
	default:
	}
	cmd := exec.Command("true")
	if err := r.Start(cmd); err != nil {
		t.Fatal(err)
	}
	select {
	case <-act:
	case <-time.After(time.Second):
		t.Fatal("a start did not fire Activity")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	r.Forget(cmd.Process.Pid)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	// An untracked child (an orphan, as far as the reaper knows) exits while the reaper idles.
	orphan := exec.Command("sh", "-c", "sleep 2")
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(MaxIdleInterval + 5*time.Second)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(orphan.Process.Pid)); os.IsNotExist(err) {
			break // reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("an orphan was not reaped within MaxIdleInterval (%d zombies)", zombieChildren(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
