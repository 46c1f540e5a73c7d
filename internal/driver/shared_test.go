package driver

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// sharedDriver is one of several drivers on one PostgreSQL database, as `vmon serve --role
// driver --database` runs them: its own store handle, leadership and notification listener.
type sharedDriver struct {
	d      *Driver
	store  *store.Store
	leader *store.Leadership
	// resign ends this driver's bid for leadership (its process going away, as the database
	// sees it).
	resign context.CancelFunc
}

// newShared starts n drivers named d1..dn on one new database, sharing one node and one clock.
func newShared(t *testing.T, n int) ([]*sharedDriver, *drivertest.Node, *drivertest.Clock) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dsn := pgtest.DSN(t)
	nd, clock := drivertest.NewNode(), drivertest.NewClock(t0)
	var out []*sharedDriver
	for i := range n {
		st, err := store.OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if i == 0 {
			if err := st.PutTemplate(ctx, store.Template{ID: baseID, Aliases: []string{"base"}, CPU: 2, MemoryMB: 512,
				DiskMB: 2048, EnvdVersion: "0.6.13", Status: store.TemplateReady, CreatedAt: t0, UpdatedAt: t0}); err != nil {
				t.Fatal(err)
			}
		}
		lctx, resign := context.WithCancel(ctx)
		sd := &sharedDriver{store: st, leader: st.Leader(lctx, "expiry", discardLogger()), resign: resign}
		if i == 0 {
			// d1 leads from the start, so the cases know who does.
			waitFor(t, sd.leader.Leading)
		}
		d, err := New(Options{Store: st, Node: nd, Logger: discardLogger(), Clock: clock, NodeID: "node1",
			Features: []string{FeatureNetTap}, Name: "d" + string(rune('1'+i)), Leader: sd.leader})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		if err := d.Adopt(ctx); err != nil {
			t.Fatal(err)
		}
		sd.d = d
		listening := make(chan struct{})
		go st.Listen(ctx, discardLogger(), func(ctx context.Context) error {
			if _, err := d.Resync(ctx); err != nil {
				return err
			}
			select {
			case <-listening:
			default:
				close(listening)
			}
			return nil
		}, func(ctx context.Context, id string) { _, _, _ = d.Changed(ctx, id) })
		<-listening
		out = append(out, sd)
	}
	return out, nd, clock
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 15 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func routed(d *Driver, id string) func() bool {
	return func() bool { _, err := d.SandboxByID(context.Background(), id); return err == nil }
}

// destroys drains the node's destroy log and counts the calls per sandbox.
func destroys(nd *drivertest.Node) map[string]int {
	n := map[string]int{}
	for {
		select {
		case got := <-nd.Destroyed:
			n[got]++
		default:
			return n
		}
	}
}

func destroysOf(nd *drivertest.Node, id string) int { return destroys(nd)[id] }

// A sandbox made through one driver is reached and ended through another, and each driver's
// memory follows what the other did.
func TestSharedDriversSeeEachOther(t *testing.T) {
	ctx := context.Background()
	ds, nd, _ := newShared(t, 2)
	d1, d2 := ds[0].d, ds[1].d
	sb, err := d1.Create(ctx, CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, routed(d2, sb.ID))
	if got, err := d2.Get(ctx, sb.ID); err != nil || got.Driver != "d1" {
		t.Fatalf("Get through d2 = %+v, %v", got, err)
	}
	// A longer timeout set through d2 is d1's schedule too.
	if err := d2.SetTimeout(ctx, sb.ID, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := d2.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return !routed(d1, sb.ID)() })
	if _, err := d1.Get(ctx, sb.ID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("Get through d1 after a kill through d2 = %v", err)
	}
	if n := destroysOf(nd, sb.ID); n != 1 {
		t.Fatalf("%d destroys", n)
	}
}

// Every driver keeps every sandbox's expiry, but only the leader fires it: one kill per sandbox,
// and when the leader goes, another takes over the schedule.
func TestSharedDriversExpireOnce(t *testing.T) {
	ctx := context.Background()
	ds, nd, clock := newShared(t, 3)
	short := time.Minute
	var ids []string
	for i, sd := range ds {
		sb, err := sd.d.Create(ctx, CreateRequest{Template: "base", Timeout: &short})
		if err != nil {
			t.Fatalf("create through d%d: %v", i+1, err)
		}
		ids = append(ids, sb.ID)
	}
	for _, sd := range ds {
		for _, id := range ids {
			waitFor(t, routed(sd.d, id))
		}
	}
	clock.Advance(short + time.Second)
	for _, id := range ids {
		waitFor(t, func() bool {
			sb, err := ds[0].store.GetSandbox(ctx, id)
			return err == nil && sb.State == store.StateKilled
		})
	}
	settle()
	got := destroys(nd)
	for _, id := range ids {
		if n := got[id]; n != 1 {
			t.Fatalf("sandbox %s: %d destroys, want 1", id, n)
		}
	}

	// The leader goes away with a sandbox due: the next leader kills it, once.
	sb, err := ds[2].d.Create(ctx, CreateRequest{Template: "base", Timeout: &short})
	if err != nil {
		t.Fatal(err)
	}
	for _, sd := range ds {
		waitFor(t, routed(sd.d, sb.ID))
	}
	ds[0].resign()
	waitFor(t, func() bool { return ds[1].leader.Leading() || ds[2].leader.Leading() })
	clock.Advance(short + time.Second)
	waitFor(t, func() bool {
		got, err := ds[0].store.GetSandbox(ctx, sb.ID)
		return err == nil && got.State == store.StateKilled && got.KillReason == ReasonTimeout
	})
	settle()
	if n := destroysOf(nd, sb.ID); n != 1 {
		t.Fatalf("after the handover: %d destroys, want 1", n)
	}
}

// A driver starting while another creates leaves that create alone; the leader ends a create
// whose driver went away once no create can still be under way.
func TestSharedDriversLeaveOthersCreates(t *testing.T) {
	ctx := context.Background()
	ds, nd, clock := newShared(t, 1)
	inFlight := store.Sandbox{ID: "inflight00000000000a", TemplateID: baseID, State: store.StateCreating, CPU: 1, MemoryMB: 512,
		StartedAt: clock.Now(), EndAt: clock.Now().Add(time.Minute), Driver: "d9"}
	if err := ds[0].store.InsertSandbox(ctx, inFlight); err != nil {
		t.Fatal(err)
	}
	// d1 restarts: the record is another driver's create, under way.
	if err := ds[0].d.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := ds[0].d.SweepCreates(ctx); err != nil || n != 0 {
		t.Fatalf("SweepCreates = %d, %v", n, err)
	}
	if sb, _ := ds[0].store.GetSandbox(ctx, inFlight.ID); sb.State != store.StateCreating {
		t.Fatalf("another driver's create was ended: %+v", sb)
	}
	clock.Advance(ds[0].d.staleCreate() + time.Second)
	if n, err := ds[0].d.SweepCreates(ctx); err != nil || n != 1 {
		t.Fatalf("SweepCreates after the create's longest = %d, %v", n, err)
	}
	sb, _ := ds[0].store.GetSandbox(ctx, inFlight.ID)
	if sb.State != store.StateKilled || sb.KillReason != ReasonInterrupted || destroysOf(nd, inFlight.ID) != 1 {
		t.Fatalf("left-behind create: %+v", sb)
	}
}

type destroyOnly struct{ *drivertest.Node }

func (destroyOnly) DeletePaused(context.Context, string) error { return nil }

// A node back in reach runs a sandbox another driver is still creating there: its reconciliation
// leaves it alone.
func TestNodeBackLeavesCreatesUnderWay(t *testing.T) {
	ctx := context.Background()
	ds, nd, clock := newShared(t, 1)
	sb := store.Sandbox{ID: "inflight00000000000b", TemplateID: baseID, State: store.StateCreating, CPU: 1, MemoryMB: 512,
		StartedAt: clock.Now(), EndAt: clock.Now().Add(time.Minute), NodeID: "node1", Driver: "d2"}
	if err := ds[0].store.InsertSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := ds[0].d.NodeBack(ctx, "node1", Holdings{Running: []string{sb.ID, "stray000000000000000"}}, destroyOnly{nd}); err != nil {
		t.Fatal(err)
	}
	got := destroys(nd)
	if got[sb.ID] != 0 || got["stray000000000000000"] != 1 {
		t.Fatalf("destroys = %v: want the stray only", got)
	}
}

// Alone on SQLite, a driver restarted under another name (a pod's) still ends the creates a
// restart interrupted, whoever recorded them.
func TestAdoptAloneEndsEveryCreate(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, func(o *Options) { o.Name = "pod-2" })
	rec := store.Sandbox{ID: "inflight00000000000c", TemplateID: baseID, State: store.StateCreating, CPU: 1, MemoryMB: 512,
		StartedAt: e.clock.Now(), EndAt: e.clock.Now().Add(time.Minute), Driver: "pod-1"}
	if err := e.store.InsertSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Adopt(ctx); err != nil {
		t.Fatal(err)
	}
	if sb, _ := e.store.GetSandbox(ctx, rec.ID); sb.State != store.StateKilled || sb.KillReason != ReasonInterrupted {
		t.Fatalf("an interrupted create on a store of its own: %+v", sb)
	}
}
