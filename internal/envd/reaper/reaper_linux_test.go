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
// closely again; Alone says whether envd has any child; an idle reaper still reaps an orphan, at
// most MaxIdleInterval late, and one resting because envd was alone wakes at the next Start.
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
	if r.Alone() {
		t.Fatal("Alone with a child just started")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	r.Forget(cmd.Process.Pid)
	if r.sweep(1) != 0 || !r.Alone() {
		t.Fatal("not Alone once the only child was reaped")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	// Give Run time to find envd alone and rest: only a Start may wake it now.
	time.Sleep(200 * time.Millisecond)
	for round, script := range []string{"sleep 0.2 &", "sleep 2 &"} {
		// The tracked shell exits at once; its child becomes an orphan that exits later, while the
		// reaper idles (the second one after the sweeps have begun to slow down).
		sh := exec.Command("sh", "-c", script+` echo $!`)
		out, err := sh.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(sh); err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := sh.Wait(); err != nil {
			t.Fatal(err)
		}
		r.Forget(sh.Process.Pid)
		orphan := strings.TrimSpace(string(b))
		deadline := time.Now().Add(MaxIdleInterval + 5*time.Second)
		for {
			if _, err := os.Stat("/proc/" + orphan); os.IsNotExist(err) {
				break // reaped
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: an orphan was not reaped within MaxIdleInterval (%d zombies)", round, zombieChildren(t))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !r.Alone() {
		if time.Now().After(deadline) {
			t.Fatal("not Alone after every child was reaped")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
