package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// A node's record follows its reports; the time of its state moves only when the state changes,
// and an operator's drain survives the reports that follow.
func testNodes(t *testing.T, s *Store) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	n := Node{Name: "node-a", RPC: "10.0.0.2:3001", Gossip: "10.0.0.2:7946", State: NodeReady,
		Features: []string{"net-tap", "egress-domains"}, Templates: []string{"base"}, FreeSlots: 3, FreeMemoryMB: 100,
		FreeDiskMB: 200, Load: 0.25, SeenAt: t0, Since: t0}
	if err := s.UpsertNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeDrain(ctx, "node-a", DrainPause); err != nil {
		t.Fatal(err)
	}
	n.FreeSlots, n.SeenAt, n.Since = 2, t0.Add(time.Minute), t0.Add(time.Minute)
	if err := s.UpsertNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetNode(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if got.FreeSlots != 2 || !got.SeenAt.Equal(t0.Add(time.Minute)) || !got.Since.Equal(t0) || got.Drain != DrainPause ||
		!slices.Equal(got.Features, n.Features) || got.Load != 0.25 || got.RPC != n.RPC {
		t.Fatalf("node after a second report: %+v", got)
	}
	if err := s.SetNodeState(ctx, "node-a", NodeLost, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetNode(ctx, "node-a"); got.State != NodeLost || !got.Since.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("lost: %+v", got)
	}
	for _, err := range []error{
		s.SetNodeDrain(ctx, "nobody", DrainStop),
		s.SetNodeState(ctx, "nobody", NodeLost, t0),
		func() error { _, err := s.GetNode(ctx, "nobody"); return err }(),
	} {
		if !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("an unknown node: %v", err)
		}
	}
	if err := s.SetNodeDrain(ctx, "node-a", "sideways"); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Errorf("a bad drain mode: %v", err)
	}
	if ns, err := s.ListNodes(ctx); err != nil || len(ns) != 1 {
		t.Fatalf("list: %v %v", ns, err)
	}
}
