package node

import (
	"context"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/runtime"
)

// reattachingRuntime finds sandboxes a previous process started from their directories, as the
// gvisor runtime does from runsc's pid file, and counts the questions asked of the runtime
// itself (each one a runsc process in the real thing).
type reattachingRuntime struct {
	*fakeRuntime
	statuses, reattaches atomic.Int32
}

func (r *reattachingRuntime) Status(ctx context.Context, id string) (runtime.Status, error) {
	r.statuses.Add(1)
	return r.fakeRuntime.Status(ctx, id)
}

func (r *reattachingRuntime) Reattach(ctx context.Context, id, dir string) (runtime.Status, error) {
	r.reattaches.Add(1)
	if _, err := os.Stat(dir); err != nil {
		return runtime.StatusStopped, nil
	}
	return r.fakeRuntime.Status(ctx, id)
}

// A restart beside many sandboxes: recovery finds them without asking the runtime about each,
// and an envd slower to redial than one check interval is still adopted, not torn down.
func TestRecoverReattachesAndWaitsForASlowEnvd(t *testing.T) {
	defer func(w, c time.Duration) { adoptWait, adoptCheck = w, c }(adoptWait, adoptCheck)
	adoptWait, adoptCheck = 10*time.Second, 50*time.Millisecond

	e := newEnv(t)
	rt := &reattachingRuntime{fakeRuntime: e.rt}
	e.wrap = rt
	ctx := context.Background()
	n1 := e.node(t, nil)
	if _, err := n1.CreateSandbox(ctx, spec("slow")); err != nil {
		t.Fatal(err)
	}
	// The previous process dies; the guest will not redial for a while.
	release := e.rt.holdDials()
	sb, _ := n1.lookup("slow")
	sb.ch.Close()
	rt.statuses.Store(0)
	// The boot record keeps the shell picked at boot; an adopted sandbox has no root to look in.
	dir := n1.sandboxDir(sb.runtimeID)
	brec, err := readBootFile(dir)
	if err != nil || !slices.Equal(brec.Shell, sb.shell) || len(sb.shell) == 0 {
		t.Fatalf("boot record shell %q, the sandbox's %q (%v)", brec.Shell, sb.shell, err)
	}
	brec.Shell = loginShell(true)
	if err := writeBootRecordFile(dir, brec); err != nil {
		t.Fatal(err)
	}

	n2 := e.node(t, nil)
	rec, err := n2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan Recovered, 1)
	rec.Run(func(r Recovered) { done <- r })
	time.Sleep(6 * adoptCheck) // several checks go by with no envd
	select {
	case r := <-done:
		t.Fatalf("settled before its envd redialled: %+v", r)
	default:
	}
	release()
	select {
	case r := <-done:
		if r != (Recovered{ID: "slow", State: RecoveredRunning}) {
			t.Fatalf("outcome %+v, want slow running", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not adopted after its envd redialled")
	}
	if got := rt.statuses.Load(); got != 0 {
		t.Errorf("recovery asked the runtime for a status %d times; Reattach answers that", got)
	}
	if got := rt.reattaches.Load(); got < 3 {
		t.Errorf("Reattach asked %d times; want the find, the adopt and the checks while waiting", got)
	}
	adopted, ok := n2.lookup("slow")
	if !ok {
		t.Fatal("the adopted sandbox is not the node's")
	}
	if !slices.Equal(adopted.guestShell(), loginShell(true)) {
		t.Errorf("the adopted sandbox's shell is %q, its boot record's %q", adopted.guestShell(), loginShell(true))
	}
}
