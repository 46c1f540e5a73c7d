package driver

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

const baseID = "basetemplate00000001"

type env struct {
	d     *Driver
	node  *drivertest.Node
	clock *drivertest.Clock
	store *store.Store
	opts  Options
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newEnv builds a driver over a fresh store holding a ready "base" template and a building one.
func newEnv(t *testing.T, mod func(*Options)) *env {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, tpl := range []store.Template{
		{ID: baseID, Aliases: []string{"base", "base:v2"}, CPU: 2, MemoryMB: 512, DiskMB: 2048,
			EnvdVersion: "0.6.13", Status: store.TemplateReady, CreatedAt: t0, UpdatedAt: t0},
		{ID: "buildingtemplate0001", Aliases: []string{"wip"}, CPU: 1, MemoryMB: 256, DiskMB: 1024,
			Status: store.TemplateBuilding, CreatedAt: t0, UpdatedAt: t0},
	} {
		if err := st.PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{node: drivertest.NewNode(), clock: drivertest.NewClock(t0), store: st}
	e.opts = Options{Store: st, Node: e.node, Logger: discardLogger(), Clock: e.clock, NodeID: "node1",
		Features: []string{FeatureNetTap}}
	if mod != nil {
		mod(&e.opts)
	}
	e.d = e.start(t)
	return e
}

// start builds a driver over the env's store and node (a "restart" when called again).
func (e *env) start(t *testing.T) *Driver {
	t.Helper()
	d, err := New(e.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func (e *env) create(t *testing.T, req CreateRequest) Sandbox {
	t.Helper()
	if req.Template == "" {
		req.Template = "base"
	}
	sb, err := e.d.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return sb
}

// waitDestroyed waits until the node saw a destroy of id. The bound only guards against hangs;
// nothing here measures speed.
func (e *env) waitDestroyed(t *testing.T, id string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-e.node.Destroyed:
			if got == id {
				return
			}
		case <-deadline:
			t.Fatalf("sandbox %s was never destroyed", id)
		}
	}
}

// waitState polls the store until id reaches state.
func (e *env) waitState(t *testing.T, id string, state store.SandboxState) store.Sandbox {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sb, err := e.store.GetSandbox(context.Background(), id)
		if err == nil && sb.State == state {
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: state %s, err %v; want %s", id, sb.State, err, state)
		}
		time.Sleep(time.Millisecond)
	}
}

// settle gives the expiry loop a moment to act on a clock change, for assertions that something
// did NOT happen. It can only make such a test miss a bug, never fail a correct driver.
func settle() { time.Sleep(30 * time.Millisecond) }

func wantKind(t *testing.T, err error, k errdefs.Kind) {
	t.Helper()
	if errdefs.KindOf(err) != k {
		t.Fatalf("error %v: kind %v, want %v", err, errdefs.KindOf(err), k)
	}
}

func dur(d time.Duration) *time.Duration { return &d }

func (e *env) countRecords(t *testing.T) int {
	t.Helper()
	n, err := e.store.CountSandboxes(context.Background(), store.SandboxQuery{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// recoverAll is a restart's recovery as the node does it: Recover, then each sandbox the node
// still runs settled as running.
func recoverAll(t *testing.T, d *Driver, alive, paused func(string) bool, ids ...string) {
	t.Helper()
	ctx := context.Background()
	if err := d.Recover(ctx, alive, paused); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if alive(id) {
			d.Recovered(ctx, node.Recovered{ID: id, State: node.RecoveredRunning})
		}
	}
}
