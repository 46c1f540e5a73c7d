package pausedstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/snapshot"
	"github.com/vibemon/vmon/internal/template"
)

// fakeNode keeps a paused sandbox as a sealed snapshot directory holding one file, "state", which
// stands for its memory and files; a running sandbox is that state in memory.
type fakeNode struct {
	dataDir string
	running map[string]string
}

func (n *fakeNode) PausedDir(id string) string { return filepath.Join(n.dataDir, "paused", id) }

func (n *fakeNode) Settled(context.Context, string) error { return nil }

func (n *fakeNode) PauseSandbox(_ context.Context, id string, memory bool) (node.PauseInfo, error) {
	state, ok := n.running[id]
	if !ok {
		return node.PauseInfo{}, errdefs.NotFound("sandbox %q is not running", id)
	}
	dir := n.PausedDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return node.PauseInfo{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte(state), 0o600); err != nil {
		return node.PauseInfo{}, err
	}
	if err := snapshot.Seal(dir, snapshot.Meta{SandboxID: id, TemplateID: "base", BuildID: "b1", Memory: memory}); err != nil {
		return node.PauseInfo{}, err
	}
	delete(n.running, id)
	return node.PauseInfo{Memory: memory}, nil
}

func (n *fakeNode) ResumeSandbox(_ context.Context, spec node.CreateSpec, _ bool) (node.Info, error) {
	b, err := os.ReadFile(filepath.Join(n.PausedDir(spec.ID), "state"))
	if errors.Is(err, os.ErrNotExist) {
		return node.Info{}, errdefs.NotFound("paused sandbox %q not found on this node", spec.ID)
	}
	if err != nil {
		return node.Info{}, err
	}
	n.running[spec.ID] = string(b)
	return node.Info{}, os.RemoveAll(n.PausedDir(spec.ID))
}

func (n *fakeNode) DeletePaused(_ context.Context, id string) error {
	if _, err := os.Stat(n.PausedDir(id)); errors.Is(err, os.ErrNotExist) {
		return errdefs.NotFound("paused sandbox %q not found", id)
	}
	return os.RemoveAll(n.PausedDir(id))
}

type cluster struct {
	store   *artifacts.Store
	fetched []string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	b, err := artifacts.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := artifacts.New(artifacts.Options{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{store: s}
}

func (c *cluster) node(t *testing.T, s Store) (*Carrier, *fakeNode) {
	t.Helper()
	n := &fakeNode{dataDir: t.TempDir(), running: map[string]string{}}
	templates := func(_ context.Context, id, build string) (template.Manifest, error) {
		c.fetched = append(c.fetched, id+"/"+build)
		return template.Manifest{}, nil
	}
	carrier, err := New(n, s, templates, filepath.Join(n.dataDir, "cluster"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return carrier, n
}

func (c *cluster) stored(t *testing.T, id string) bool {
	t.Helper()
	_, err := c.store.Resolve(context.Background(), Ref(id))
	if err != nil && !errors.Is(err, artifacts.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// A sandbox paused on one node is in the store once the pause returns, resumes on another with
// its state and template, and its copy is spent then.
func TestResumeOnAnotherNode(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	a, na := c.node(t, c.store)
	b, nb := c.node(t, c.store)
	na.running["sb1"] = "counted to 41"
	if _, err := a.PauseSandbox(ctx, "sb1", true); err != nil {
		t.Fatal(err)
	}
	if !c.stored(t, "sb1") {
		t.Fatal("a returned pause left no copy in the store")
	}
	if _, err := b.ResumeSandbox(ctx, node.CreateSpec{ID: "sb1"}, true); err != nil {
		t.Fatal(err)
	}
	if nb.running["sb1"] != "counted to 41" {
		t.Fatalf("resumed elsewhere with state %q", nb.running["sb1"])
	}
	if len(c.fetched) != 1 || c.fetched[0] != "base/b1" {
		t.Fatalf("templates fetched for the resume: %v", c.fetched)
	}
	if c.stored(t, "sb1") {
		t.Fatal("the spent copy is still in the store")
	}
}

// A node that drops its stale copy of a sandbox which has since run and paused elsewhere leaves
// the newer copy in the store; the node holding that one resumes it warm and spends it.
func TestStaleCopyLeavesNewerOne(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	a, na := c.node(t, c.store)
	b, nb := c.node(t, c.store)
	na.running["sb1"] = "v1"
	if _, err := a.PauseSandbox(ctx, "sb1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ResumeSandbox(ctx, node.CreateSpec{ID: "sb1"}, true); err != nil {
		t.Fatal(err)
	}
	nb.running["sb1"] = "v2"
	if _, err := b.PauseSandbox(ctx, "sb1", true); err != nil {
		t.Fatal(err)
	}
	if err := a.DeletePaused(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(na.PausedDir("sb1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stale copy is still on its node: %v", err)
	}
	if !c.stored(t, "sb1") {
		t.Fatal("dropping a stale copy removed the newer one from the store")
	}
	// The stale node has no copy now: it cannot resume the sandbox from its own, and takes the
	// store's.
	if _, err := a.ResumeSandbox(ctx, node.CreateSpec{ID: "sb1"}, true); err != nil {
		t.Fatal(err)
	}
	if na.running["sb1"] != "v2" {
		t.Fatalf("resumed with state %q, want the newest", na.running["sb1"])
	}
	if c.stored(t, "sb1") {
		t.Fatal("the spent copy is still in the store")
	}
	// A warm resume (the node paused it itself) spends the store's copy too.
	if _, err := a.PauseSandbox(ctx, "sb1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ResumeSandbox(ctx, node.CreateSpec{ID: "sb1"}, true); err != nil {
		t.Fatal(err)
	}
	if c.stored(t, "sb1") {
		t.Fatal("a warm resume left its copy in the store")
	}
}

// A node with no copy, while the store has none either, answers NotFound (the router then tries
// another node); deleting a sandbox paused here removes its copy in the store.
func TestNoCopyAndDelete(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	a, na := c.node(t, c.store)
	b, _ := c.node(t, c.store)
	if _, err := b.ResumeSandbox(ctx, node.CreateSpec{ID: "nowhere"}, true); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("resume with no copy anywhere: %v, want NotFound", err)
	}
	na.running["sb1"] = "v1"
	if _, err := a.PauseSandbox(ctx, "sb1", false); err != nil {
		t.Fatal(err)
	}
	if err := a.DeletePaused(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if c.stored(t, "sb1") {
		t.Fatal("a deleted paused sandbox is still in the store")
	}
	if err := a.DeletePaused(ctx, "sb1"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("deleting again: %v, want NotFound", err)
	}
}

// failingPush is a store whose pushes fail after the ref was written once.
type failingPush struct {
	Store
	fail bool
}

func (f *failingPush) Push(ctx context.Context, ref, dir string) (artifacts.PushStats, error) {
	if f.fail {
		return artifacts.PushStats{}, errors.New("store unreachable")
	}
	return f.Store.Push(ctx, ref, dir)
}

// A pause whose copy cannot be stored still pauses (here only), and removes the sandbox's older
// copy so that no other node resumes it from a stale state.
func TestPushFailureRemovesOlderCopy(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	fs := &failingPush{Store: c.store, fail: true}
	a, na := c.node(t, fs)
	b, _ := c.node(t, c.store)
	// An older copy of sb1 lingers in the store, as after a removal that failed.
	stale := t.TempDir()
	if err := os.WriteFile(filepath.Join(stale, "state"), []byte("v1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.Seal(stale, snapshot.Meta{SandboxID: "sb1", TemplateID: "base"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.store.Push(ctx, Ref("sb1"), stale); err != nil {
		t.Fatal(err)
	}
	na.running["sb1"] = "v2"
	if _, err := a.PauseSandbox(ctx, "sb1", true); err != nil {
		t.Fatalf("a pause whose copy cannot be stored: %v", err)
	}
	if c.stored(t, "sb1") {
		t.Fatal("the older copy is still in the store")
	}
	if _, err := b.ResumeSandbox(ctx, node.CreateSpec{ID: "sb1"}, true); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("resume elsewhere: %v, want NotFound", err)
	}
	if _, err := a.ResumeSandbox(ctx, node.CreateSpec{ID: "sb1"}, true); err != nil || na.running["sb1"] != "v2" {
		t.Fatalf("resume on the node that paused it: %v, state %q", err, na.running["sb1"])
	}
}

// A node that still holds an old copy (its drop after a resume elsewhere never happened) and is
// asked to resume the sandbox takes the newer copy from the store, not its own.
func TestStaleCopyNotResumed(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	a, na := c.node(t, c.store)
	b, nb := c.node(t, c.store)
	na.running["sb1"] = "v1"
	if _, err := a.PauseSandbox(ctx, "sb1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ResumeSandbox(ctx, node.CreateSpec{ID: "sb1"}, true); err != nil {
		t.Fatal(err)
	}
	nb.running["sb1"] = "v2"
	if _, err := b.PauseSandbox(ctx, "sb1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ResumeSandbox(ctx, node.CreateSpec{ID: "sb1"}, true); err != nil {
		t.Fatal(err)
	}
	if na.running["sb1"] != "v2" {
		t.Fatalf("resumed the stale copy %q, want v2", na.running["sb1"])
	}
}
