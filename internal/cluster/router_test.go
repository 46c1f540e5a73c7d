package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/placement"
	"github.com/vibemon/vmon/internal/store"
)

type testNode struct {
	name     string
	fake     *drivertest.PausingNode
	features []string
	slots    int
}

// threeNodes runs three nodes behind real servers and a driver over a Router of them, which
// locates sandboxes through the driver's records.
func threeNodes(t *testing.T) (*driver.Driver, *Router, []*testNode) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t0 := time.Now().UTC()
	if err := st.PutTemplate(ctx, store.Template{ID: "basetemplate00000001", Aliases: []string{"base"}, CPU: 2, MemoryMB: 512,
		DiskMB: 2048, EnvdVersion: "0.6.13", Status: store.TemplateReady, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	r := NewRouter(func(ctx context.Context, id string) (string, error) {
		sb, err := st.GetSandbox(ctx, id)
		if err != nil {
			return "", err
		}
		return sb.NodeID, nil
	})
	nodes := []*testNode{
		{name: "node-a", fake: drivertest.NewPausingNode(), features: []string{driver.FeatureNetTap, egress.FeatureDomains}, slots: 100},
		{name: "node-b", fake: drivertest.NewPausingNode(), features: []string{driver.FeatureNetTap}, slots: 100},
		{name: "node-c", fake: drivertest.NewPausingNode(), features: []string{driver.FeatureNetTap}, slots: 100},
	}
	for _, n := range nodes {
		mux := http.NewServeMux()
		mux.Handle(nodeapi.NewServer(n.fake, func() nodeapi.Status {
			return nodeapi.Status{Features: n.features, FreeMemoryMB: 8192, FreeDiskMB: 1 << 20, FreeSlots: n.slots, Load: 0.1}
		}).Handler())
		ts := httptest.NewServer(mux)
		t.Cleanup(ts.Close)
		r.Upsert(n.name, membership.Meta{Role: membership.RoleNode, State: membership.StateReady, Features: n.features},
			nodeapi.NewClient(ts.Client(), ts.URL))
	}
	r.Refresh(ctx)
	d, err := driver.New(driver.Options{Store: st, Node: r, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Features: r.Features()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, r, nodes
}

func TestCreatesSpreadAndCallsFollowTheSandbox(t *testing.T) {
	ctx := context.Background()
	d, _, nodes := threeNodes(t)
	where := map[string]string{}
	for i := 0; i < 30; i++ {
		sb, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true})
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := d.Get(ctx, sb.ID)
		where[sb.ID] = rec.NodeID
	}
	per := map[string]int{}
	for id, name := range where {
		per[name]++
		for _, n := range nodes {
			if n.fake.Alive(id) != (n.name == name) {
				t.Fatalf("sandbox %s recorded on %s, running on %s: %v", id, name, n.name, n.fake.Alive(id))
			}
		}
	}
	for _, n := range nodes {
		if per[n.name] < 3 {
			t.Fatalf("30 creates spread as %v", per)
		}
	}
	// Every later call goes where the sandbox is.
	for id, name := range where {
		if err := d.UpdateNetwork(ctx, id, driver.NetworkUpdate{DenyOut: []string{"198.51.100.0/24"}}); err != nil {
			t.Fatal(err)
		}
		if err := d.Pause(ctx, id, true); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Resume(ctx, id, nil); err != nil {
			t.Fatal(err)
		}
		if err := d.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if n.name == name && (len(n.fake.Resumes) == 0 || n.fake.Alive(id)) {
				t.Fatalf("%s: calls did not reach %s", id, name)
			}
		}
	}
}

func TestPlacementByFeatureAndPastFullNodes(t *testing.T) {
	ctx := context.Background()
	d, r, nodes := threeNodes(t)
	// A domain policy only goes to the node that enforces domains.
	for i := 0; i < 5; i++ {
		sb, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true,
			Network: &driver.Network{AllowOut: []string{"example.com"}, DenyOut: []string{"0.0.0.0/0"}}})
		if err != nil {
			t.Fatal(err)
		}
		if !nodes[0].fake.Alive(sb.ID) {
			t.Fatalf("a domain policy went elsewhere than node-a")
		}
	}
	// node-a answers "full": domain policies have nowhere to go (429), others go elsewhere.
	nodes[0].fake.Set(func(n *drivertest.Node) {
		n.CreateErr = errdefs.WithCode(errdefs.ResourceExhausted("node-a is full"), placement.Capacity)
	})
	_, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true,
		Network: &driver.Network{AllowOut: []string{"example.com"}, DenyOut: []string{"0.0.0.0/0"}}})
	var e *errdefs.Error
	if !errors.As(err, &e) || e.Kind != errdefs.KindResourceExhausted || e.Code != placement.Capacity {
		t.Fatalf("a domain policy with its only node full: %v", err)
	}
	for i := 0; i < 10; i++ {
		sb, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true})
		if err != nil {
			t.Fatalf("a plain create with one node full: %v", err)
		}
		if nodes[0].fake.Alive(sb.ID) {
			t.Fatal("placed on the full node")
		}
	}
	// A live update is checked against the sandbox's own node: elsewhere than node-a, domains
	// cannot be enforced (400), though the cluster can enforce them.
	plain, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	err = d.UpdateNetwork(ctx, plain.ID, driver.NetworkUpdate{AllowOut: []string{"example.com"}, DenyOut: []string{"0.0.0.0/0"}})
	if errdefs.KindOf(err) != errdefs.KindInvalidArgument || !strings.Contains(err.Error(), "egress-domains") {
		t.Fatalf("a domain update for a sandbox on a node without domains: %v", err)
	}
	// With node-a gone no node enforces domains: 503 sandbox_no_compatible_node.
	r.Remove("node-a")
	r.Refresh(ctx)
	_, err = d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true,
		Network: &driver.Network{AllowOut: []string{"example.com"}, DenyOut: []string{"0.0.0.0/0"}}})
	if !errors.As(err, &e) || e.Code != placement.NoCompatibleNode {
		t.Fatalf("no capable node: %v", err)
	}
	// A node that left: its sandboxes' calls fail as Unavailable, not as a hang.
	sb, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := d.Get(ctx, sb.ID)
	r.Remove(rec.NodeID)
	if err := d.Pause(ctx, sb.ID, true); errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Fatalf("pause on a node that left: %v", err)
	}
}

// BenchmarkCreateWith1000Recorded is a create through the driver and the router over three nodes
// with 1,000 running sandboxes recorded (issue 20's placement decision time): the driver's and the
// router's work plus one Connect call over loopback; the fake nodes boot nothing.
func BenchmarkCreateWith1000Recorded(b *testing.B) {
	ctx := context.Background()
	st, err := store.Open(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	t0 := time.Now().UTC()
	if err := st.PutTemplate(ctx, store.Template{ID: "basetemplate00000001", Aliases: []string{"base"}, CPU: 2, MemoryMB: 512,
		DiskMB: 2048, EnvdVersion: "0.6.13", Status: store.TemplateReady, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		b.Fatal(err)
	}
	r := NewRouter(func(ctx context.Context, id string) (string, error) {
		sb, err := st.GetSandbox(ctx, id)
		if err != nil {
			return "", err
		}
		return sb.NodeID, nil
	})
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		mux := http.NewServeMux()
		mux.Handle(nodeapi.NewServer(drivertest.NewPausingNode(), func() nodeapi.Status {
			return nodeapi.Status{Features: []string{driver.FeatureNetTap}, FreeMemoryMB: 1 << 20, FreeDiskMB: 1 << 30, FreeSlots: 1 << 20, Load: 0.1}
		}).Handler())
		ts := httptest.NewServer(mux)
		defer ts.Close()
		r.Upsert(name, membership.Meta{Role: membership.RoleNode, State: membership.StateReady, Features: []string{driver.FeatureNetTap}},
			nodeapi.NewClient(ts.Client(), ts.URL))
	}
	r.Refresh(ctx)
	d, err := driver.New(driver.Options{Store: st, Node: r, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		FeaturesNow: r.Features, MaxSandboxes: 1 << 20, MaxTimeout: 48 * time.Hour, DefaultTimeout: 24 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	for i := 0; i < 1000; i++ {
		if _, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true}); err != nil {
			b.Fatal(err)
		}
	}
}

// A paused sandbox resumes on the node that paused it while that one takes it; on a drained or
// departed holder, it resumes on a node that has its copy (nodes without one are passed over),
// the record follows it, and the holder's stale copy is dropped. With no copy anywhere, the
// resume fails as unavailable and the sandbox stays paused.
func TestResumeElsewhere(t *testing.T) {
	ctx := context.Background()
	d, r, nodes := threeNodes(t)
	byName := map[string]*testNode{}
	for _, n := range nodes {
		byName[n.name] = n
	}
	// Placement tries nodes in a random order: enough sandboxes that a node without the copy
	// comes first for some.
	var last string
	var lastHolder *testNode
	for range 8 {
		sb, err := d.Create(ctx, driver.CreateRequest{Template: "base", Secure: true})
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := d.Get(ctx, sb.ID)
		holder := byName[rec.NodeID]
		var others []*testNode
		for _, n := range nodes {
			if n != holder {
				others = append(others, n)
			}
		}
		if err := d.Pause(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
		// Another node with a copy does not take it from a holder that can.
		others[1].fake.PutPaused(node.CreateSpec{ID: sb.ID}, true)
		if _, err := d.Resume(ctx, sb.ID, nil); err != nil {
			t.Fatal(err)
		}
		if rec, _ = d.Get(ctx, sb.ID); rec.NodeID != holder.name || !holder.fake.Alive(sb.ID) {
			t.Fatalf("resumed on %s, want its holder %s", rec.NodeID, holder.name)
		}
		if err := d.Pause(ctx, sb.ID, true); err != nil {
			t.Fatal(err)
		}
		r.SetDrained(holder.name, true)
		if _, err := d.Resume(ctx, sb.ID, nil); err != nil {
			t.Fatal(err)
		}
		r.SetDrained(holder.name, false)
		if rec, _ = d.Get(ctx, sb.ID); rec.NodeID != others[1].name || !others[1].fake.Alive(sb.ID) {
			t.Fatalf("resumed on %s, want %s, the node with its copy", rec.NodeID, others[1].name)
		}
		deadline := time.Now().Add(10 * time.Second)
		for holder.fake.Paused(sb.ID) {
			if time.Now().After(deadline) {
				t.Fatal("the drained holder keeps its stale copy")
			}
			time.Sleep(10 * time.Millisecond)
		}
		last, lastHolder = sb.ID, others[1]
	}
	// Its node departs with the only copy: the resume fails, and the record stays paused.
	if err := d.Pause(ctx, last, true); err != nil {
		t.Fatal(err)
	}
	r.Remove(lastHolder.name)
	_, err := d.Resume(ctx, last, nil)
	if errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Fatalf("resume with no copy in reach: %v, want unavailable", err)
	}
	if rec, _ := d.Get(ctx, last); rec.State != store.StatePaused {
		t.Fatalf("after a failed resume the record is %s", rec.State)
	}
}

// A sandbox mounting a volume is placed on the volume's node only (full there: the capacity
// error, though others have room), resumes only there, and volumes of two nodes cannot be
// mounted together.
func TestVolumesPinPlacement(t *testing.T) {
	ctx := context.Background()
	_, r, nodes := threeNodes(t)
	homes := map[string]string{"vol-b": "node-b", "vol-c": "node-c"}
	r.SetVolumeHome(func(_ context.Context, id string) (string, error) { return homes[id], nil })
	spec := func(id string, vols ...string) node.CreateSpec {
		s := node.CreateSpec{ID: id, TemplateID: "basetemplate00000001"}
		for _, v := range vols {
			s.Volumes = append(s.Volumes, node.VolumeMount{ID: v, Path: "/" + v})
		}
		return s
	}
	for i := range 6 {
		info, err := r.CreateSandbox(ctx, spec(fmt.Sprintf("sbx%017d", i), "vol-b"))
		if err != nil {
			t.Fatal(err)
		}
		if info.Node != "node-b" {
			t.Fatalf("a sandbox of vol-b placed on %s", info.Node)
		}
	}
	if _, err := r.CreateSandbox(ctx, spec("sbxtwonodes000000001", "vol-b", "vol-c")); errdefs.KindOf(err) != errdefs.KindInvalidArgument {
		t.Fatalf("volumes of two nodes: %v, want invalid argument", err)
	}
	nodes[1].slots = 0
	r.Refresh(ctx)
	if _, err := r.CreateSandbox(ctx, spec("sbxfull0000000000001", "vol-b")); errdefs.KindOf(err) != errdefs.KindResourceExhausted {
		t.Fatalf("its node full: %v, want the capacity error", err)
	}
	// A paused one resumes on its volume's node even when that node is drained.
	if _, err := nodes[1].fake.PauseSandbox(ctx, "sbx00000000000000000", true); err != nil {
		t.Fatal(err)
	}
	nodes[0].fake.PutPaused(spec("sbx00000000000000000"), true)
	r.SetDrained("node-b", true)
	info, err := r.ResumeSandbox(ctx, spec("sbx00000000000000000", "vol-b"), true)
	if err != nil || info.Node != "node-b" {
		t.Fatalf("resume of a sandbox with a volume: on %q, %v; want node-b", info.Node, err)
	}
}

// Between two refreshes the router keeps its view of the nodes' slots with what it did: a node
// that took its last sandbox is not offered the next one, and one whose sandbox was killed takes
// a create at once (before, every create failed until the next refresh said so).
func TestSlotsFollowCreatesAndKills(t *testing.T) {
	ctx := context.Background()
	d, r, nodes := threeNodes(t)
	for _, n := range nodes {
		n.slots = 1
	}
	r.Refresh(ctx)
	var made []driver.Sandbox
	for range nodes {
		sb, err := d.Create(ctx, driver.CreateRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, sb)
	}
	if _, err := d.Create(ctx, driver.CreateRequest{Template: "base"}); !errdefs.Is(err, errdefs.KindResourceExhausted) {
		t.Fatalf("a create with every node's one slot taken: %v, want the capacity error", err)
	}
	if err := d.Kill(ctx, made[1].ID); err != nil {
		t.Fatal(err)
	}
	sb, err := d.Create(ctx, driver.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatalf("a create right after a kill freed a slot: %v", err)
	}
	if sb.NodeID != made[1].NodeID {
		t.Fatalf("placed on %s, the freed slot is on %s", sb.NodeID, made[1].NodeID)
	}
}
