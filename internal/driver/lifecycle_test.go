package driver

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
)

func TestKill(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(t, CreateRequest{})
	if err := e.d.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if e.node.Alive(sb.ID) {
		t.Fatal("node still runs the sandbox")
	}
	rec, _ := e.store.GetSandbox(ctx, sb.ID)
	if rec.State != store.StateKilled || rec.KillReason != ReasonUser || rec.KilledAt.IsZero() {
		t.Fatalf("record = %+v", rec)
	}
	for name, err := range map[string]error{
		"kill again":    e.d.Kill(ctx, sb.ID),
		"kill unknown":  e.d.Kill(ctx, "nonexistingsandbox"),
		"get killed":    func() error { _, err := e.d.Get(ctx, sb.ID); return err }(),
		"route killed":  func() error { _, err := e.d.SandboxByID(ctx, sb.ID); return err }(),
		"timeout":       e.d.SetTimeout(ctx, sb.ID, time.Minute),
		"refresh":       e.d.Refresh(ctx, sb.ID, time.Minute),
		"connect":       func() error { _, _, err := e.d.Connect(ctx, sb.ID, nil, true); return err }(),
		"metrics":       func() error { _, err := e.d.Metrics(ctx, sb.ID); return err }(),
		"get unknown":   func() error { _, err := e.d.Get(ctx, "nope"); return err }(),
		"route unknown": func() error { _, err := e.d.SandboxByID(ctx, "nope"); return err }(),
	} {
		if !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("%s: %v, want NotFound", name, err)
		}
	}
}

func TestKillNodeFailureKeepsRecord(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(t, CreateRequest{})
	e.node.Set(func(n *drivertest.Node) { n.DestroyErr = errors.New("umount: busy") })
	if err := e.d.Kill(ctx, sb.ID); err == nil || errdefs.PublicMessage(err) == "umount: busy" {
		t.Fatalf("Kill = %v", err)
	}
	if _, err := e.d.Get(ctx, sb.ID); err != nil {
		t.Fatalf("record lost after failed kill: %v", err)
	}
	e.node.Set(func(n *drivertest.Node) { n.DestroyErr = nil })
	if err := e.d.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

func TestTimeoutExpiry(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(t, CreateRequest{Timeout: dur(10 * time.Second)})
	other := e.create(t, CreateRequest{Timeout: dur(time.Hour)})
	e.clock.Advance(9 * time.Second)
	settle()
	if !e.node.Alive(sb.ID) {
		t.Fatal("killed before its end")
	}
	e.clock.Advance(2 * time.Second)
	e.waitDestroyed(t, sb.ID)
	rec := e.waitState(t, sb.ID, store.StateKilled)
	if rec.KillReason != ReasonTimeout {
		t.Fatalf("reason = %q", rec.KillReason)
	}
	if _, err := e.d.SandboxByID(context.Background(), sb.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatal("expired sandbox still routed")
	}
	if !e.node.Alive(other.ID) {
		t.Fatal("expiry killed the wrong sandbox")
	}
}

func TestZeroTimeoutExpiresAtOnce(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.create(t, CreateRequest{Timeout: dur(0)})
	e.waitDestroyed(t, sb.ID)
	e.waitState(t, sb.ID, store.StateKilled)
}

func TestSetTimeout(t *testing.T) {
	ctx := context.Background()
	t.Run("shortens", func(t *testing.T) {
		e := newEnv(t, nil)
		sb := e.create(t, CreateRequest{})
		if err := e.d.SetTimeout(ctx, sb.ID, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		got, _ := e.d.Get(ctx, sb.ID)
		if !got.EndAt.Equal(t0.Add(5 * time.Second)) {
			t.Fatalf("end = %v", got.EndAt)
		}
		e.clock.Advance(6 * time.Second)
		e.waitDestroyed(t, sb.ID)
	})
	t.Run("extends", func(t *testing.T) {
		e := newEnv(t, nil)
		sb := e.create(t, CreateRequest{Timeout: dur(10 * time.Second)})
		e.clock.Advance(5 * time.Second)
		if err := e.d.SetTimeout(ctx, sb.ID, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(10 * time.Second)
		settle()
		if !e.node.Alive(sb.ID) {
			t.Fatal("killed at the superseded deadline")
		}
		e.clock.Advance(60 * time.Second)
		e.waitDestroyed(t, sb.ID)
	})
	t.Run("validation", func(t *testing.T) {
		e := newEnv(t, func(o *Options) { o.MaxTimeout = time.Hour })
		sb := e.create(t, CreateRequest{})
		wantKind(t, e.d.SetTimeout(ctx, sb.ID, -time.Second), errdefs.KindInvalidArgument)
		wantKind(t, e.d.SetTimeout(ctx, sb.ID, time.Hour+time.Second), errdefs.KindInvalidArgument)
		wantKind(t, e.d.SetTimeout(ctx, "nope", time.Second), errdefs.KindNotFound)
	})
}

func TestConnectAndRefreshOnlyExtend(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	sb := e.create(t, CreateRequest{Timeout: dur(100 * time.Second)})

	got, resumed, err := e.d.Connect(ctx, sb.ID, dur(10*time.Second), true)
	if err != nil || resumed || !got.EndAt.Equal(sb.EndAt) {
		t.Fatalf("Connect shorter = %v, %v, %v (end %v)", got.EndAt, resumed, err, sb.EndAt)
	}
	if err := e.d.Refresh(ctx, sb.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	got, _ = e.d.Get(ctx, sb.ID)
	if !got.EndAt.Equal(sb.EndAt) {
		t.Fatalf("Refresh shortened: %v", got.EndAt)
	}

	got, _, err = e.d.Connect(ctx, sb.ID, dur(200*time.Second), true)
	if err != nil || !got.EndAt.Equal(t0.Add(200*time.Second)) {
		t.Fatalf("Connect longer = %v, %v", got.EndAt, err)
	}
	// nil timeout means the 300 s default.
	got, _, _ = e.d.Connect(ctx, sb.ID, nil, true)
	if !got.EndAt.Equal(t0.Add(300 * time.Second)) {
		t.Fatalf("Connect default = %v", got.EndAt)
	}
	if err := e.d.Refresh(ctx, sb.ID, 400*time.Second); err != nil {
		t.Fatal(err)
	}
	got, _ = e.d.Get(ctx, sb.ID)
	if !got.EndAt.Equal(t0.Add(400 * time.Second)) {
		t.Fatalf("Refresh longer = %v", got.EndAt)
	}
	_, _, err = e.d.Connect(ctx, sb.ID, dur(-time.Second), true)
	wantKind(t, err, errdefs.KindInvalidArgument)

	e.clock.Advance(401 * time.Second)
	e.waitDestroyed(t, sb.ID)
	_, _, err = e.d.Connect(ctx, sb.ID, nil, true)
	wantKind(t, err, errdefs.KindNotFound)
}

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	sb := e.create(t, CreateRequest{})
	m, err := e.d.Metrics(ctx, sb.ID)
	if err != nil || len(m) != 1 || m[0].CPUCount != 2 || m[0].MemTotal != 512<<20 ||
		m[0].DiskTotal != 2048<<20 || !m[0].Timestamp.Equal(t0) {
		t.Fatalf("Metrics = %+v, %v", m, err)
	}

	mn := &metricsNode{Node: e.node, m: Metric{CPUCount: 2, CPUUsedPct: 12.5, MemUsed: 1 << 20}}
	e.opts.Node = mn
	d := e.start(t)
	recoverAll(t, d, e.node.Alive, nil, sb.ID)
	m, err = d.Metrics(ctx, sb.ID)
	if err != nil || len(m) != 1 || m[0].CPUUsedPct != 12.5 || m[0].Timestamp.IsZero() {
		t.Fatalf("node metrics = %+v, %v", m, err)
	}
	mn.err = errdefs.NotFound("gone")
	_, err = d.Metrics(ctx, sb.ID)
	wantKind(t, err, errdefs.KindNotFound)
	mn.err = errors.New("cgroup read failed")
	if m, err = d.Metrics(ctx, sb.ID); err != nil || m[0].MemTotal != 512<<20 {
		t.Fatalf("fallback on sampling error = %+v, %v", m, err)
	}
}

type metricsNode struct {
	*drivertest.Node
	m   Metric
	err error
}

func (n *metricsNode) SandboxMetrics(context.Context, string) (Metric, error) { return n.m, n.err }

func TestRecover(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	alive := e.create(t, CreateRequest{Timeout: dur(50 * time.Second)})
	dead := e.create(t, CreateRequest{})
	expired := e.create(t, CreateRequest{Timeout: dur(10 * time.Second)})
	killed := e.create(t, CreateRequest{})
	if err := e.d.Kill(ctx, killed.ID); err != nil {
		t.Fatal(err)
	}
	// A create interrupted by the crash.
	creating := Sandbox{ID: "creatinginterrupted0", TemplateID: baseID, State: store.StateCreating,
		CPU: 1, MemoryMB: 1, StartedAt: t0, EndAt: t0.Add(time.Minute), NodeID: "node1"}
	if err := e.store.InsertSandbox(ctx, creating); err != nil {
		t.Fatal(err)
	}
	// Another node's sandbox is not ours to judge.
	foreign := Sandbox{ID: "othernodesandbox0000", TemplateID: baseID, State: store.StateRunning,
		CPU: 1, MemoryMB: 1, StartedAt: t0, EndAt: t0.Add(time.Minute), NodeID: "node2"}
	if err := e.store.InsertSandbox(ctx, foreign); err != nil {
		t.Fatal(err)
	}

	// "Crash": stop the driver, lose one runtime, let time pass, start again.
	e.d.Close()
	e.node.Forget(dead.ID)
	e.clock.Advance(20 * time.Second)
	for len(e.node.Destroyed) > 0 {
		<-e.node.Destroyed
	}
	d := e.start(t)
	if _, err := d.SandboxByID(ctx, alive.ID); err == nil {
		t.Fatal("routes restored before Recover")
	}
	if err := d.Recover(ctx, e.node.Alive, nil); err != nil {
		t.Fatal(err)
	}
	// Until the node has settled them, the sandboxes it found answer 503.
	for _, id := range []string{alive.ID, expired.ID} {
		_, err := d.SandboxByID(ctx, id)
		wantKind(t, err, errdefs.KindUnavailable)
		_, err = d.Get(ctx, id)
		wantKind(t, err, errdefs.KindUnavailable)
	}
	for _, id := range []string{alive.ID, expired.ID, killed.ID, "unknownruntime00000"} {
		d.Recovered(ctx, node.Recovered{ID: id, State: node.RecoveredRunning})
	}

	for id, reason := range map[string]string{dead.ID: ReasonRuntimeGone, creating.ID: ReasonInterrupted} {
		rec, _ := e.store.GetSandbox(ctx, id)
		if rec.State != store.StateKilled || rec.KillReason != reason {
			t.Errorf("%s: %s %q, want killed %q", id, rec.State, rec.KillReason, reason)
		}
	}
	destroyed := map[string]bool{}
	for _, id := range e.node.Destroys() {
		destroyed[id] = true
	}
	if !destroyed[dead.ID] || !destroyed[creating.ID] {
		t.Errorf("leftovers of dead sandboxes were not destroyed: %v", e.node.Destroys())
	}
	if rec, _ := e.store.GetSandbox(ctx, foreign.ID); rec.State != store.StateRunning {
		t.Errorf("foreign sandbox touched: %s", rec.State)
	}
	if rec, _ := e.store.GetSandbox(ctx, killed.ID); rec.KillReason != ReasonUser {
		t.Errorf("killed sandbox reason rewritten: %q", rec.KillReason)
	}

	// The expired one is killed by the re-armed timers at once, the alive one at its end.
	e.waitState(t, expired.ID, store.StateKilled)
	if r, err := d.SandboxByID(ctx, alive.ID); err != nil || r.EnvdAccessToken != alive.EnvdAccessToken {
		t.Fatalf("alive sandbox not routed: %+v, %v", r, err)
	}
	if !e.node.Alive(alive.ID) {
		t.Fatal("alive sandbox killed by recovery")
	}
	// Sandboxes the node still ran that no live record owns are destroyed.
	destroyed = map[string]bool{}
	for _, id := range e.node.Destroys() {
		destroyed[id] = true
	}
	if !destroyed[killed.ID] || !destroyed["unknownruntime00000"] || destroyed[alive.ID] {
		t.Fatalf("destroys after recovery = %v", e.node.Destroys())
	}
	e.clock.Advance(31 * time.Second)
	e.waitState(t, alive.ID, store.StateKilled)
	if err := d.Recover(ctx, nil, nil); err == nil {
		t.Fatal("Recover accepted a nil alive func")
	}
}

func TestSandboxStopped(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sb := e.create(t, CreateRequest{})
	other := e.create(t, CreateRequest{})
	const reason = "oom: the sandbox ran out of memory and was killed"
	e.d.SandboxStopped(ctx, sb.ID, reason)
	rec, _ := e.store.GetSandbox(ctx, sb.ID)
	if rec.State != store.StateKilled || rec.KillReason != reason {
		t.Fatalf("record after stop = %s %q", rec.State, rec.KillReason)
	}
	if e.node.Alive(sb.ID) {
		t.Fatal("the node was not told to clean up the stopped sandbox")
	}
	if _, err := e.d.SandboxByID(ctx, sb.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("ingress still routes a stopped sandbox: %v", err)
	}
	if _, err := e.d.Get(ctx, sb.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("GET of a stopped sandbox: %v", err)
	}
	// A second report, or one for a sandbox a kill already ended, changes nothing.
	e.d.SandboxStopped(ctx, sb.ID, "stopped: again")
	if rec, _ := e.store.GetSandbox(ctx, sb.ID); rec.KillReason != reason {
		t.Fatalf("reason overwritten: %q", rec.KillReason)
	}
	if _, err := e.d.Get(ctx, other.ID); err != nil {
		t.Fatalf("bystander affected: %v", err)
	}
}

// A cluster's driver restarting takes its records over as they are: running sandboxes are routed
// and timed again without asking a node, an expired one is killed by its timer, an interrupted
// create is destroyed and marked killed, a paused one stays paused.
func TestAdopt(t *testing.T) {
	ctx := context.Background()
	e, _ := newPausingEnv(t, nil)
	alive := e.create(t, CreateRequest{Timeout: dur(50 * time.Second)})
	expired := e.create(t, CreateRequest{Timeout: dur(10 * time.Second)})
	paused := e.create(t, CreateRequest{})
	if err := e.d.Pause(ctx, paused.ID, true); err != nil {
		t.Fatal(err)
	}
	creating := Sandbox{ID: "creatinginterrupted0", TemplateID: baseID, State: store.StateCreating,
		CPU: 1, MemoryMB: 1, StartedAt: t0, EndAt: t0.Add(time.Minute), NodeID: "node2"}
	if err := e.store.InsertSandbox(ctx, creating); err != nil {
		t.Fatal(err)
	}
	e.d.Close()
	e.clock.Advance(20 * time.Second)
	d := e.start(t)
	if err := d.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := d.SandboxByID(ctx, alive.ID); err != nil || r.EnvdAccessToken != alive.EnvdAccessToken {
		t.Fatalf("the running sandbox is not routed: %+v, %v", r, err)
	}
	e.waitState(t, expired.ID, store.StateKilled)
	if rec, _ := e.store.GetSandbox(ctx, creating.ID); rec.State != store.StateKilled || rec.KillReason != ReasonInterrupted {
		t.Errorf("interrupted create: %s %q", rec.State, rec.KillReason)
	}
	if !slices.Contains(e.node.Destroys(), creating.ID) {
		t.Errorf("the interrupted create was not destroyed: %v", e.node.Destroys())
	}
	if rec, _ := e.store.GetSandbox(ctx, paused.ID); rec.State != store.StatePaused {
		t.Errorf("paused sandbox: %s", rec.State)
	}
	if !e.node.Alive(alive.ID) {
		t.Fatal("the running sandbox was destroyed")
	}
}
