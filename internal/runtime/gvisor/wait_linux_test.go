package gvisor

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/runtime"
)

// waitFor starts the sandbox, runs provoke, and returns what Wait reports (within a minute).
func waitFor(t *testing.T, rt *Runtime, s *sandbox, provoke func(id string)) runtime.Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rt.Start(ctx, s.spec); err != nil {
		t.Fatal(err)
	}
	got := make(chan runtime.Exit, 1)
	errc := make(chan error, 1)
	go func() {
		e, err := rt.Wait(ctx, s.spec.ID)
		if err != nil {
			errc <- err
			return
		}
		got <- e
	}()
	if provoke != nil {
		provoke(s.spec.ID)
	}
	select {
	case e := <-got:
		return e
	case err := <-errc:
		t.Fatalf("Wait: %v", err)
	case <-ctx.Done():
		t.Fatal("Wait did not return after the sandbox stopped")
	}
	return runtime.Exit{}
}

func sentryPid(t *testing.T, s *sandbox) int {
	t.Helper()
	b, err := os.ReadFile(s.spec.StateDir + "/" + pidFileName)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// Wait tells why a sandbox stopped: its init's exit status, a signal from the host, its memory
// limit, its host task limit.
func TestWaitClassifiesExits(t *testing.T) {
	rt, fx := setup(t)
	opts := fx.opts
	opts.Adopt = true // as vmon serve: the sentry becomes our child, its status ours to read
	adopting, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("init exits", func(t *testing.T) {
		s := newSandbox(t, fx, adopting, func(s *runtime.Spec) {
			s.Args = []string{"/bin/busybox", "sh", "-c", "sleep 1; exit 3"}
		})
		if e := waitFor(t, adopting, s, nil); e.Reason != runtime.ExitInit || e.Code != 3 {
			t.Fatalf("init exiting 3 reported as %+v (%s)", e, e)
		}
	})
	t.Run("killed from the host", func(t *testing.T) {
		s := newSandbox(t, fx, adopting, nil)
		e := waitFor(t, adopting, s, func(string) { _ = syscall.Kill(sentryPid(t, s), syscall.SIGKILL) })
		if e.Reason != runtime.ExitKilled || e.Signal != "SIGKILL" {
			t.Fatalf("SIGKILL of the sentry reported as %+v", e)
		}
	})
	t.Run("out of memory", func(t *testing.T) {
		s := newSandbox(t, fx, adopting, func(s *runtime.Spec) { s.MemoryMB = 128 })
		e := waitFor(t, adopting, s, func(id string) {
			_, _ = adopting.Exec(context.Background(), id, "/bin/busybox", "dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=256")
		})
		if e.Reason != runtime.ExitOOM {
			t.Fatalf("memory limit reported as %+v", e)
		}
	})
	t.Run("host task limit", func(t *testing.T) {
		s := newSandbox(t, fx, adopting, func(s *runtime.Spec) { s.Limits.HostTasks = 120 })
		e := waitFor(t, adopting, s, func(id string) {
			_, _ = adopting.Exec(context.Background(), id, "/bin/busybox", "sh", "-c",
				"for i in $(seq 200); do /bin/busybox sleep 100 & done; wait")
		})
		if e.Reason != runtime.ExitTaskLimit {
			t.Fatalf("host task limit reported as %+v", e)
		}
	})
	// A sandbox this runtime did not adopt (as after a restart): it stopped, cause unknown.
	t.Run("not adopted", func(t *testing.T) {
		s := newSandbox(t, fx, rt, nil)
		if err := rt.Start(context.Background(), s.spec); err != nil {
			t.Fatal(err)
		}
		other, err := New(fx.opts) // a fresh runtime knows the sandbox only through runsc state
		if err != nil {
			t.Fatal(err)
		}
		if e := killAndWait(t, other, s); e.Reason != runtime.ExitUnknown {
			t.Fatalf("a sandbox we did not adopt reported as %+v", e)
		}
	})
	// A destroyed sandbox's runsc helpers (its gofer), reparented to this process, are reaped
	// soon after, without leaving zombies behind.
	t.Run("helpers reaped", func(t *testing.T) {
		s := newSandbox(t, fx, adopting, nil)
		if err := adopting.Start(context.Background(), s.spec); err != nil {
			t.Fatal(err)
		}
		if err := adopting.Destroy(context.Background(), s.spec.ID); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			z := zombieHelpers()
			if len(z) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("runsc helpers left as zombies: %v", z)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	// Wait returns when its context ends, and a later Wait still works.
	t.Run("context", func(t *testing.T) {
		s := newSandbox(t, fx, adopting, nil)
		if err := adopting.Start(context.Background(), s.spec); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if _, err := adopting.Wait(ctx, s.spec.ID); err != context.DeadlineExceeded {
			t.Fatalf("Wait with an ended context: %v", err)
		}
		e := killAndWait(t, adopting, s)
		if e.Reason != runtime.ExitKilled {
			t.Fatalf("after a cancelled wait: %+v", e)
		}
	})
}

// killAndWait kills an already started sandbox's sentry and returns what rt's Wait reports.
func killAndWait(t *testing.T, rt *Runtime, s *sandbox) runtime.Exit {
	t.Helper()
	got := make(chan runtime.Exit, 1)
	go func() {
		e, _ := rt.Wait(context.Background(), s.spec.ID)
		got <- e
	}()
	time.Sleep(100 * time.Millisecond)
	_ = syscall.Kill(sentryPid(t, s), syscall.SIGKILL)
	select {
	case e := <-got:
		return e
	case <-time.After(time.Minute):
		t.Fatal("Wait did not return")
	}
	return runtime.Exit{}
}

// zombieHelpers lists this process's exited, unreaped runsc helpers.
func zombieHelpers() []int {
	var z []int
	for _, pid := range childPIDs() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		if comm, state, _, ok := parseStat(b); ok && state == 'Z' && comm == "exe" {
			z = append(z, pid)
		}
	}
	return z
}
