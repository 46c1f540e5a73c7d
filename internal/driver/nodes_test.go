package driver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

// A node out of reach: its sandboxes' traffic fails at once, a kill is recorded without it, and
// when it is back the records and what it holds are made to agree; one that stays away has its
// sandboxes ended.
func TestNodeOutBackAndLost(t *testing.T) {
	ctx := context.Background()
	pn := drivertest.NewPausingNode()
	e := newEnv(t, func(o *Options) { o.Node = pn })
	kept, vanished, killedMeanwhile := e.create(t, CreateRequest{}), e.create(t, CreateRequest{}), e.create(t, CreateRequest{})
	pausedHere, movedAway, pausedKilled := e.create(t, CreateRequest{}), e.create(t, CreateRequest{}), e.create(t, CreateRequest{})
	// Paused on the node, though the pause's answer never reached the driver.
	pauseUnanswered := e.create(t, CreateRequest{})
	for _, sb := range []Sandbox{pausedHere, movedAway, pausedKilled} {
		if err := e.d.Pause(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
	}
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
	if slices.Contains(pn.Destroys(), killedMeanwhile.ID) {
		t.Fatal("the absent node was asked to destroy")
	}
	// A paused one too: recorded killed at once, its copy left for the node's return.
	if err := e.d.Kill(ctx, pausedKilled.ID); err != nil {
		t.Fatalf("a kill of a paused sandbox while its node is away: %v", err)
	}
	if !pn.Paused(pausedKilled.ID) {
		t.Fatal("the absent node was asked to delete a paused copy")
	}
	if rec, _ := e.store.GetSandbox(ctx, pausedKilled.ID); rec.State != store.StateKilled {
		t.Fatalf("a paused sandbox killed while its node is away: %s", rec.State)
	}
	// movedAway resumed on another node meanwhile: the copy here is stale.
	if _, err := e.d.Resume(ctx, movedAway.ID, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.store.SetSandboxNode(ctx, movedAway.ID, "node2"); err != nil {
		t.Fatal(err)
	}
	c := &cleaner{}
	held := Holdings{Running: []string{kept.ID, killedMeanwhile.ID, "strayfromanother0001"},
		Paused: []string{pausedHere.ID, movedAway.ID, "unrecordedcopy000001", pauseUnanswered.ID, pausedKilled.ID}}
	if err := e.d.NodeBack(ctx, node, held, c); err != nil {
		t.Fatal(err)
	}
	for what, got := range map[string][]string{"destroyed": c.destroyed, "deleted paused": c.deleted} {
		want := map[string][]string{"destroyed": {killedMeanwhile.ID, "strayfromanother0001"},
			"deleted paused": {movedAway.ID, "unrecordedcopy000001", pausedKilled.ID}}[what]
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s on the node that came back: %v, want %v", what, got, want)
		}
	}
	if rec, _ := e.store.GetSandbox(ctx, pauseUnanswered.ID); rec.State != store.StatePaused {
		t.Errorf("a sandbox its node holds paused, recorded running: now %s", rec.State)
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

type cleaner struct{ destroyed, deleted []string }

func (c *cleaner) DestroySandbox(_ context.Context, id string) error {
	c.destroyed = append(c.destroyed, id)
	return nil
}

func (c *cleaner) DeletePaused(_ context.Context, id string) error {
	c.deleted = append(c.deleted, id)
	return nil
}
