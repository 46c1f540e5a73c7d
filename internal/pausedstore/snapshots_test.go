package pausedstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/snapshot"
	"github.com/vibemon/vmon/internal/template"
)

// snapNode keeps snapshots as sealed directories holding a "state" file; a sandbox started
// from one runs that state.
type snapNode struct {
	dataDir string
	running map[string]string
}

func (n *snapNode) SnapshotDir(id string) (string, error) {
	if id == "" || filepath.Base(id) != id {
		return "", errdefs.InvalidArgument("invalid snapshot id")
	}
	return filepath.Join(n.dataDir, "snapshots", id), nil
}

func (n *snapNode) take(t *testing.T, id, state string) {
	t.Helper()
	dir, _ := n.SnapshotDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.Seal(dir, snapshot.Meta{SandboxID: "src", TemplateID: "tpl", BuildID: "b7", Memory: true,
		Lowers: []string{"layers/" + strings.Repeat("a", 32), "templates/base/rootfs-b1"}}); err != nil {
		t.Fatal(err)
	}
}

func (n *snapNode) CreateFromSnapshot(_ context.Context, spec node.CreateSpec, snapID, _ string) (node.Info, error) {
	dir, _ := n.SnapshotDir(snapID)
	b, err := os.ReadFile(filepath.Join(dir, "state"))
	if errors.Is(err, os.ErrNotExist) {
		return node.Info{}, errdefs.NotFound("snapshot %q not found on this node", snapID)
	}
	if err != nil {
		return node.Info{}, err
	}
	n.running[spec.ID] = string(b)
	return node.Info{}, nil
}

func (n *snapNode) DeleteSnapshot(_ context.Context, snapID string) error {
	dir, _ := n.SnapshotDir(snapID)
	return os.RemoveAll(dir)
}

// A snapshot stays on its node until published; then another node starts sandboxes from it,
// fetching it and its template build first; a delete removes it everywhere it was asked to.
func TestSnapshotsAcrossNodes(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	var fetched []string
	// The template was built from steps: its layers have other names on the node that fetched it.
	here := []string{"layers/" + strings.Repeat("c", 32), "templates/base/rootfs-b1"}
	templates := func(_ context.Context, id, build string) (template.Manifest, error) {
		fetched = append(fetched, id+"/"+build)
		return template.Manifest{ID: id, BuildID: build, Layers: here}, nil
	}
	na, nb := &snapNode{dataDir: t.TempDir(), running: map[string]string{}}, &snapNode{dataDir: t.TempDir(), running: map[string]string{}}
	a, b := NewSnapshots(na, c.store, templates, nil), NewSnapshots(nb, c.store, templates, nil)
	na.take(t, "snap1", "counting at 41")

	if _, err := b.CreateFromSnapshot(ctx, node.CreateSpec{ID: "sb1"}, "snap1", ""); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("from an unpublished snapshot elsewhere: %v, want NotFound", err)
	}
	if _, err := a.CreateFromSnapshot(ctx, node.CreateSpec{ID: "sb0"}, "snap1", ""); err != nil || na.running["sb0"] != "counting at 41" {
		t.Fatalf("on its own node: %v, %q", err, na.running["sb0"])
	}
	if err := a.PublishSnapshot(ctx, "snap1"); err != nil {
		t.Fatal(err)
	}
	if err := a.PublishSnapshot(ctx, "snap1"); err != nil {
		t.Fatalf("publishing again: %v", err)
	}
	if err := a.PublishSnapshot(ctx, "nosuch"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("publishing a snapshot the node lacks: %v", err)
	}
	for _, id := range []string{"sb1", "sb2"} {
		if _, err := b.CreateFromSnapshot(ctx, node.CreateSpec{ID: id}, "snap1", ""); err != nil || nb.running[id] != "counting at 41" {
			t.Fatalf("%s on the other node: %v, %q", id, err, nb.running[id])
		}
	}
	if len(fetched) != 1 || fetched[0] != "tpl/b7" {
		t.Fatalf("template fetches: %v, want tpl/b7 once (the second create had the copy)", fetched)
	}
	dir, _ := nb.SnapshotDir("snap1")
	if meta, err := snapshot.Verify(dir); err != nil || !slices.Equal(meta.Lowers, here) {
		t.Fatalf("the fetched snapshot stacks on %v (%v), want the template's layers as named here %v", meta.Lowers, err, here)
	}

	for _, s := range []*Snapshots{a, b} {
		if err := s.DeleteSnapshot(ctx, "snap1"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.store.Resolve(ctx, SnapshotRef("snap1")); !errors.Is(err, artifacts.ErrNotFound) {
		t.Fatalf("the store still has the deleted snapshot: %v", err)
	}
	for _, n := range []*snapNode{na, nb} {
		dir, _ := n.SnapshotDir("snap1")
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a copy stays at %s: %v", dir, err)
		}
	}
}
