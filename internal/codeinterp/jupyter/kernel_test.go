package jupyter

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// python is Debian's interpreter, which has python3-ipykernel (a python3 earlier on PATH may not).
const python = "/usr/bin/python3"

// pythonKernel starts a real ipykernel (python3-ipykernel: .ci/run installs it).
func pythonKernel(t *testing.T) *Kernel {
	t.Helper()
	if _, err := exec.LookPath(python); err != nil {
		t.Fatal("python3 is required")
	}
	if err := exec.Command(python, "-c", "import ipykernel").Run(); err != nil {
		t.Fatal("python3-ipykernel is required (scripts/install.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k, err := Start(ctx, Spec{Argv: []string{python, "-m", "ipykernel_launcher", "-f", "{connection_file}"},
		RuntimeDir: t.TempDir(), Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Shutdown)
	return k
}

func run(t *testing.T, k *Kernel, ctx context.Context, code string) ([]Output, Reply, error) {
	t.Helper()
	var outs []Output
	r, err := k.Execute(ctx, code, false, func(o Output) { outs = append(outs, o) })
	return outs, r, err
}

func TestPythonKernel(t *testing.T) {
	k := pythonKernel(t)
	ctx := context.Background()

	// State across executions, the value as the main result, streams in order.
	if _, r, err := run(t, k, ctx, "x = 41"); err != nil || r.Status != "ok" {
		t.Fatalf("x = 41: %+v %v", r, err)
	}
	outs, r, err := run(t, k, ctx, "import sys\nprint('out1')\nprint('err1', file=sys.stderr)\nx + 1")
	if err != nil || r.Status != "ok" || r.Count != 2 {
		t.Fatalf("reply %+v %v", r, err)
	}
	var kinds []string
	var stdout, stderr, value string
	for _, o := range outs {
		kinds = append(kinds, o.Kind)
		switch {
		case o.Kind == "stream" && o.Stream == "stdout":
			stdout += o.Text
		case o.Kind == "stream" && o.Stream == "stderr":
			stderr += o.Text
		case o.Kind == "result" && o.Main:
			value, _ = o.Data["text/plain"].(string)
		}
	}
	if stdout != "out1\n" || stderr != "err1\n" || value != "42" || kinds[0] != "count" {
		t.Fatalf("outputs %v: stdout %q stderr %q value %q", kinds, stdout, stderr, value)
	}

	// An exception: name, value and traceback; the kernel goes on.
	outs, r, err = run(t, k, ctx, "1/0")
	if err != nil || r.Status != "error" {
		t.Fatalf("1/0: %+v %v", r, err)
	}
	var e *Output
	for i := range outs {
		if outs[i].Kind == "error" {
			e = &outs[i]
		}
	}
	if e == nil || e.EName != "ZeroDivisionError" || !strings.Contains(e.EValue, "division by zero") || len(e.Traceback) == 0 {
		t.Fatalf("error output %+v", e)
	}

	// A long run cut short by its context is interrupted; the kernel keeps its state.
	tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, r, err = run(t, k, tctx, "import time\ntime.sleep(30)")
	cancel()
	if err != nil || !r.Interrupted {
		t.Fatalf("interrupted run: %+v %v", r, err)
	}
	outs, _, err = run(t, k, ctx, "x")
	if err != nil || len(outs) == 0 || outs[len(outs)-1].Data["text/plain"] != "41" {
		t.Fatalf("state after interrupt: %+v %v", outs, err)
	}

	// A kernel that exits mid-run ends the execution with ErrDied.
	_, _, err = run(t, k, ctx, "import os\nos._exit(1)")
	if !errors.Is(err, ErrDied) {
		t.Fatalf("os._exit: err = %v, want ErrDied", err)
	}
}

// Kernel starts in progress never get the same port, although the OS may offer a port again as
// soon as freePorts has closed it.
func TestFreePortsNotSharedBetweenStarts(t *testing.T) {
	seen := map[int]bool{}
	var releases []func()
	for range 200 {
		ports, release, err := freePorts(5)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
		for _, p := range ports {
			if seen[p] {
				t.Fatalf("port %d handed to two kernel starts at once", p)
			}
			seen[p] = true
		}
	}
	for _, release := range releases {
		release()
	}
	handedOut.Lock()
	defer handedOut.Unlock()
	if len(handedOut.ports) != 0 {
		t.Fatalf("%d ports still reserved after every start released them", len(handedOut.ports))
	}
}

// TestInterruptAfterTheCell: an interrupt that reaches ipykernel after the cell ran, while it
// flushes the cell's output before its execute_reply, is caught by ipykernel itself
// ("KeyboardInterrupt caught in kernel."): no execute_reply comes, but the kernel goes idle and
// keeps its state. Execute ends then, rather than waiting out InterruptGrace and calling the
// kernel stuck (which restarted it, losing its state: issue 22 item 7, when ingress made the
// service see its clients leave).
func TestInterruptAfterTheCell(t *testing.T) {
	k := pythonKernel(t)
	ctx := context.Background()
	if _, r, err := run(t, k, ctx, "x = 41"); err != nil || r.Status != "ok" {
		t.Fatalf("x = 41: %+v %v", r, err)
	}
	// The cell holds ipykernel's output thread for 2 s and prints: the cell itself is over at
	// once, and the interrupt finds ipykernel waiting for the flush that precedes its reply.
	tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	outs, r, err := run(t, k, tctx, "import sys, time\nsys.stdout.pub_thread.schedule(lambda: time.sleep(2))\nprint('printed')")
	if err != nil || !r.Interrupted {
		t.Fatalf("interrupted after the cell: %+v %v (outputs %+v)", r, err, outs)
	}
	if last := outs[len(outs)-1]; last.Kind != "stream" || last.Text != "printed\n" {
		t.Fatalf("outputs %+v: the cell's output is still delivered", outs)
	}
	outs, _, err = run(t, k, ctx, "x")
	if err != nil || len(outs) == 0 || outs[len(outs)-1].Data["text/plain"] != "41" {
		t.Fatalf("state after the interrupt: %+v %v", outs, err)
	}
}
