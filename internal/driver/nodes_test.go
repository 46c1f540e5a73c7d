package driver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

// A node out of reach: its sandboxes' traffic fails at once, a kill is recorded without it, and
// when it is back the records and what it holds are made to agree; one that stays away has its
// sandboxes ended.
func TestNodeOutBackAndLost(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	kept, vanished, killedMeanwhile := e.create(t, CreateRequest{}), e.create(t, CreateRequest{}), e.create(t, CreateRequest{})
	node := kept.NodeID
	if node == "" {
		t.Fatal("records name no node")
	}
	e.d.NodeOut(node)
	if _, err := e.d.SandboxByID(ctx, kept.ID); !errdefs.Is(err, errdefs.KindNotFound) || !strings.Contains(err.Error(), "out of reach") {
		t.Fatalf("traffic to a sandbox of an absent node: %v", err)
	}
	if err := e.d.Kill(ctx, killedMeanwhile.ID); err != nil {
		t.Fatalf("a kill while its node is away: %v", err)
	}
	if slices.Contains(e.node.Destroys(), killedMeanwhile.ID) {
		t.Fatal("the absent node was asked to destroy")
	}
	var destroyed []string
	destroy := func(_ context.Context, id string) error { destroyed = append(destroyed, id); return nil }
	if err := e.d.NodeBack(ctx, node, []string{kept.ID, killedMeanwhile.ID, "strayfromanother0001"}, destroy); err != nil {
		t.Fatal(err)
	}
	want := []string{killedMeanwhile.ID, "strayfromanother0001"}
	slices.Sort(destroyed)
	slices.Sort(want)
	if !slices.Equal(destroyed, want) {
		t.Fatalf("destroyed on the node that came back: %v", destroyed)
	}
	if rec, _ := e.store.GetSandbox(ctx, vanished.ID); rec.State != store.StateKilled || rec.KillReason != ReasonGoneFromNode {
		t.Errorf("a sandbox the node no longer holds: %s %q", rec.State, rec.KillReason)
	}
	if r, err := e.d.SandboxByID(ctx, kept.ID); err != nil || r.ID != kept.ID {
		t.Fatalf("the survivor is not served again: %v", err)
	}

	late := e.create(t, CreateRequest{})
	e.d.NodeOut(node)
	if err := e.d.NodeLost(ctx, node); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{kept.ID, late.ID} {
		if rec, _ := e.store.GetSandbox(ctx, id); rec.State != store.StateKilled || rec.KillReason != ReasonNodeLost {
			t.Errorf("%s after its node was lost: %s %q", id, rec.State, rec.KillReason)
		}
	}
	if ids, _ := e.d.RunningOn(ctx, node); len(ids) != 0 {
		t.Errorf("still running on the lost node: %v", ids)
	}
}
