package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Pauses under way count against --max-snapshot-disk before their snapshot exists: two that pass
// the check at once cannot both overshoot, and a finished or abandoned one gives its share back.
func TestSnapshotBudgetReserves(t *testing.T) {
	e := newEnv(t)
	n := e.node(t, nil)
	ctx := context.Background()
	var sbs []*sandbox
	for _, id := range []string{"aaa", "bbb", "ccc"} {
		e.rt.setMem(id, 100)
		if _, err := n.CreateSandbox(ctx, spec(id)); err != nil {
			t.Fatal(err)
		}
		sb, ok := n.lookup(id)
		if !ok {
			t.Fatalf("%s not running", id)
		}
		sbs = append(sbs, sb)
	}
	one := func(sb *sandbox) int64 {
		release, err := n.checkSnapshotBudget(ctx, sb, true)
		if err != nil {
			t.Fatal(err)
		}
		n.snapMu.Lock()
		got := n.snapReserved
		n.snapMu.Unlock()
		release()
		return got
	}
	n.opts.MaxSnapshotBytes = 1 << 50
	need := one(sbs[0])
	if need <= 0 {
		t.Fatalf("a pause reserves %d bytes", need)
	}
	// Room for two pauses, not three.
	n.opts.MaxSnapshotBytes = 2*need + need/2
	r1, err := n.checkSnapshotBudget(ctx, sbs[0], true)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := n.checkSnapshotBudget(ctx, sbs[1], true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.checkSnapshotBudget(ctx, sbs[2], true); !errdefs.Is(err, errdefs.KindInsufficientStorage) {
		t.Fatalf("a third pause while two are under way: %v, want insufficient storage", err)
	}
	r1()
	r1() // twice is once
	r3, err := n.checkSnapshotBudget(ctx, sbs[2], true)
	if err != nil {
		t.Fatalf("after one pause gave its share back: %v", err)
	}
	r2()
	r3()
	n.snapMu.Lock()
	left := n.snapReserved
	n.snapMu.Unlock()
	if left != 0 {
		t.Fatalf("%d bytes still reserved", left)
	}

	// Snapshots count with the paused sandboxes: one pause fits until a 1 MiB snapshot exists.
	n.opts.MaxSnapshotBytes = need + 512<<10
	one(sbs[0])
	snap := filepath.Join(e.dir, "snapshots", "snap1")
	if err := os.MkdirAll(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(snap, "disk.img"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := n.checkSnapshotBudget(ctx, sbs[0], true); !errdefs.Is(err, errdefs.KindInsufficientStorage) {
		t.Fatalf("a pause past the budget with a snapshot counted: %v", err)
	}
}
