package driver

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
)

func newPausingEnv(t *testing.T, mod func(*Options)) (*env, *drivertest.PausingNode) {
	t.Helper()
	pn := drivertest.NewPausingNode()
	e := newEnv(t, func(o *Options) {
		o.Node = pn
		if mod != nil {
			mod(o)
		}
	})
	e.node = pn.Node
	return e, pn
}

func TestPauseAndConnect(t *testing.T) {
	e, pn := newPausingEnv(t, nil)
	ctx := context.Background()
	sb := e.create(t, CreateRequest{EnvVars: map[string]string{"A": "1"}})

	wantKind(t, e.d.Pause(ctx, "nosuchsandbox", true), errdefs.KindNotFound)
	if err := e.d.Pause(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	wantKind(t, e.d.Pause(ctx, sb.ID, true), errdefs.KindConflict)
	got := e.waitState(t, sb.ID, store.StatePaused)
	if !got.PausedMemory || got.PausedBytes != 1<<20 || got.PausedAt.IsZero() {
		t.Fatalf("paused record = %+v", got)
	}
	if _, err := e.d.SandboxByID(ctx, sb.ID); err == nil {
		t.Fatal("ingress still routes to a paused sandbox")
	}
	// A paused sandbox has no timer: time passing does not kill it, and setTimeout is refused.
	e.clock.Advance(time.Hour)
	settle()
	e.waitState(t, sb.ID, store.StatePaused)
	wantKind(t, e.d.SetTimeout(ctx, sb.ID, time.Minute), errdefs.KindConflict)
	if m, err := e.d.Metrics(ctx, sb.ID); err != nil || len(m) != 1 || m[0].DiskUsed != 1<<20 || m[0].MemUsed != 0 {
		t.Fatalf("metrics of a paused sandbox = %+v, %v; want its saved state's disk and no memory", m, err)
	}

	out, resumed, err := e.d.Connect(ctx, sb.ID, dur(90*time.Second), true)
	if err != nil || !resumed || out.State != store.StateRunning {
		t.Fatalf("Connect of a paused sandbox = %+v, %v, %v", out, resumed, err)
	}
	if !out.EndAt.Equal(e.clock.Now().Add(90 * time.Second)) {
		t.Fatalf("end after resume = %v", out.EndAt)
	}
	if n := len(pn.Resumes); n != 1 || pn.Resumes[0].Spec.EnvVars["A"] != "1" || !pn.Resumes[0].Memory ||
		pn.Resumes[0].Spec.AccessToken != sb.EnvdAccessToken {
		t.Fatalf("resume calls = %+v", pn.Resumes)
	}
	if _, err := e.d.SandboxByID(ctx, sb.ID); err != nil {
		t.Fatalf("ingress does not route to the resumed sandbox: %v", err)
	}
	// Running: connect only extends.
	if _, resumed, err := e.d.Connect(ctx, sb.ID, dur(time.Second), true); err != nil || resumed {
		t.Fatalf("Connect of a running sandbox = %v, %v", resumed, err)
	}
	// Files-only resume is passed on.
	if err := e.d.Pause(ctx, sb.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.d.Connect(ctx, sb.ID, nil, false); err != nil {
		t.Fatal(err)
	}
	if last := pn.Resumes[len(pn.Resumes)-1]; last.Memory {
		t.Fatal("connect with memory false resumed with memory")
	}
}

func TestPauseFailuresKeepState(t *testing.T) {
	e, pn := newPausingEnv(t, nil)
	ctx := context.Background()
	sb := e.create(t, CreateRequest{})
	pn.PauseErr = errors.New("checkpoint exploded")
	if err := e.d.Pause(ctx, sb.ID, true); err == nil {
		t.Fatal("pause succeeded with a failing node")
	}
	e.waitState(t, sb.ID, store.StateRunning)
	if _, err := e.d.SandboxByID(ctx, sb.ID); err != nil {
		t.Fatal("a failed pause took the sandbox off ingress")
	}
	// Lost in the attempt: recorded as killed with the reason.
	pn.PauseErr = fmt.Errorf("%w: disk full", node.ErrSandboxLost)
	if err := e.d.Pause(ctx, sb.ID, true); err == nil {
		t.Fatal("pause succeeded")
	}
	if got := e.waitState(t, sb.ID, store.StateKilled); got.KillReason == "" {
		t.Fatal("no kill reason")
	}

	sb2 := e.create(t, CreateRequest{})
	pn.PauseErr = nil
	if err := e.d.Pause(ctx, sb2.ID, true); err != nil {
		t.Fatal(err)
	}
	pn.ResumeErr = errdefs.DataLoss("snapshot is damaged")
	_, _, err := e.d.Connect(ctx, sb2.ID, nil, true)
	wantKind(t, err, errdefs.KindDataLoss)
	e.waitState(t, sb2.ID, store.StatePaused)
	// The node lost it entirely: the record follows, and the client sees not-found.
	pn.ResumeErr = nil
	if err := pn.DeletePaused(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	_, _, err = e.d.Connect(ctx, sb2.ID, nil, true)
	wantKind(t, err, errdefs.KindNotFound)
	e.waitState(t, sb2.ID, store.StateKilled)
}

func TestKillPaused(t *testing.T) {
	e, pn := newPausingEnv(t, nil)
	ctx := context.Background()
	sb := e.create(t, CreateRequest{})
	if err := e.d.Pause(ctx, sb.ID, false); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if pn.Paused(sb.ID) {
		t.Fatal("kill left the paused sandbox on the node")
	}
	e.waitState(t, sb.ID, store.StateKilled)
}

func TestAutoPauseAndResume(t *testing.T) {
	e, pn := newPausingEnv(t, nil)
	ctx := context.Background()
	memFalse := false
	keep := e.create(t, CreateRequest{Timeout: dur(time.Minute), AutoPause: true, AutoResume: true})
	files := e.create(t, CreateRequest{Timeout: dur(time.Minute), AutoPause: true, AutoPauseMemory: &memFalse})
	plain := e.create(t, CreateRequest{Timeout: dur(time.Minute)})
	e.clock.Advance(2 * time.Minute)
	e.waitState(t, keep.ID, store.StatePaused)
	if got := e.waitState(t, files.ID, store.StatePaused); got.PausedMemory {
		t.Fatal("autoPauseMemory false kept memory")
	}
	e.waitState(t, plain.ID, store.StateKilled)

	// Ingress resumes the memory pause of an autoResume sandbox, and nothing else.
	if _, err := e.d.RouteOrResume(ctx, keep.ID); err != nil {
		t.Fatalf("auto-resume: %v", err)
	}
	e.waitState(t, keep.ID, store.StateRunning)
	if _, err := e.d.RouteOrResume(ctx, files.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("auto-resume of a files-only pause = %v", err)
	}
	if !pn.Paused(files.ID) {
		t.Fatal("traffic resumed a files-only pause")
	}
	if _, err := e.d.RouteOrResume(ctx, "nosuchsandbox"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatal(err)
	}
	_, err := e.d.Create(ctx, CreateRequest{Template: "base", AutoPause: true, AutoPauseMemory: &memFalse, AutoResume: true})
	wantKind(t, err, errdefs.KindInvalidArgument)
}

func TestPauseNeedsAPausingNode(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(t, CreateRequest{})
	if err := e.d.Pause(context.Background(), sb.ID, true); !errors.Is(err, ErrNotImplemented) {
		t.Fatalf("Pause on a node that cannot = %v", err)
	}
	if _, err := e.d.Create(context.Background(), CreateRequest{Template: "base", AutoPause: true}); !errors.Is(err, ErrNotImplemented) {
		t.Fatalf("autoPause on a node that cannot = %v", err)
	}
}

// Recovery takes the node's word: a pause the crash interrupted and recovery finished is paused,
// a resume that got the runtime up is running, a paused record whose state is gone is killed.
func TestRecoverPaused(t *testing.T) {
	e, pn := newPausingEnv(t, nil)
	ctx := context.Background()
	pausedByNode := e.create(t, CreateRequest{})
	resumedByNode := e.create(t, CreateRequest{})
	lost := e.create(t, CreateRequest{})
	stays := e.create(t, CreateRequest{})
	for _, sb := range []Sandbox{resumedByNode, lost, stays} {
		if err := e.d.Pause(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
	}
	// What the node did behind the records' back before the "crash".
	if _, err := pn.PauseSandbox(ctx, pausedByNode.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := pn.ResumeSandbox(ctx, node.CreateSpec{ID: resumedByNode.ID}, true); err != nil {
		t.Fatal(err)
	}
	if err := pn.DeletePaused(ctx, lost.ID); err != nil {
		t.Fatal(err)
	}
	e.d.Close()
	d := e.start(t)
	recoverAll(t, d, pn.Alive, pn.Paused, resumedByNode.ID)
	e.waitState(t, pausedByNode.ID, store.StatePaused)
	e.waitState(t, resumedByNode.ID, store.StateRunning)
	e.waitState(t, lost.ID, store.StateKilled)
	e.waitState(t, stays.ID, store.StatePaused)
	if _, err := d.SandboxByID(ctx, resumedByNode.ID); err != nil {
		t.Fatal("a sandbox recovered as running is not routed")
	}
	orphans, err := d.PausedOrphans(ctx, []string{stays.ID, "nosuchsandbox", lost.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 2 {
		t.Fatalf("orphans = %v", orphans)
	}
}

// A sandbox whose snapshot (or fork) a restart interrupted comes back from the node paused, though
// nobody asked for a pause: the driver resumes it with its memory, for what is left of its
// timeout. One whose pause was asked for stays paused. Until then both answer 503.
func TestRecoveredSnapshotResumes(t *testing.T) {
	e, pn := newPausingEnv(t, nil)
	ctx := context.Background()
	snapped := e.create(t, CreateRequest{Timeout: dur(10 * time.Minute)})
	pausing := e.create(t, CreateRequest{})
	// What the node did behind the records' back: both stopped by an interrupted checkpoint.
	for _, id := range []string{snapped.ID, pausing.ID} {
		if _, err := pn.PauseSandbox(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	e.d.Close()
	d := e.start(t)
	settling := func(id string) bool { return id == snapped.ID || id == pausing.ID }
	if err := d.Recover(ctx, settling, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{snapped.ID, pausing.ID} {
		_, err := d.Get(ctx, id)
		wantKind(t, err, errdefs.KindUnavailable)
		_, err = d.RouteOrResume(ctx, id)
		wantKind(t, err, errdefs.KindUnavailable)
	}
	d.Recovered(ctx, node.Recovered{ID: snapped.ID, State: node.RecoveredPaused, Memory: true, Resume: true})
	d.Recovered(ctx, node.Recovered{ID: pausing.ID, State: node.RecoveredPaused, Memory: true})
	e.waitState(t, snapped.ID, store.StateRunning)
	e.waitState(t, pausing.ID, store.StatePaused)
	if len(pn.Resumes) != 1 || pn.Resumes[0].Spec.ID != snapped.ID || !pn.Resumes[0].Memory {
		t.Fatalf("resumes = %+v, want one with memory of %s", pn.Resumes, snapped.ID)
	}
	if r, err := d.SandboxByID(ctx, snapped.ID); err != nil || r.ID != snapped.ID {
		t.Fatalf("the resumed sandbox is not routed: %+v %v", r, err)
	}
	if rec, _ := e.store.GetSandbox(ctx, snapped.ID); !rec.EndAt.Equal(snapped.EndAt) {
		t.Errorf("resumed sandbox ends at %v, want its old end %v", rec.EndAt, snapped.EndAt)
	}
}
