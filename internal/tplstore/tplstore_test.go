package tplstore

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/snapshot"
	"github.com/vibemon/vmon/internal/template"
)

// writeTemplate makes a rootfs template build in dataDir.
func writeTemplate(t *testing.T, dataDir, id, build string, builtAt time.Time) {
	t.Helper()
	dir := template.Dir(dataDir, id)
	rootfs := filepath.Join(dir, "rootfs-"+build)
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "os-release"), []byte("build "+build+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("etc/os-release", filepath.Join(rootfs, "release")); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(template.Manifest{Format: 1, ID: id, BuildID: build, Rootfs: "rootfs-" + build, CPUs: 2, MemoryMB: 512,
		DefaultUser: "user", BuiltAt: builtAt})
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func newStore(t *testing.T) *artifacts.Store {
	t.Helper()
	b, err := artifacts.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := artifacts.New(artifacts.Options{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A build published by one data dir is fetched whole into another, which then boots it; a newer
// build replaces the older one as the data dir's own, the older staying for what runs on it.
func TestPublishAndFetch(t *testing.T) {
	ctx := context.Background()
	store := newStore(t)
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	a, b := t.TempDir(), t.TempDir()
	writeTemplate(t, a, "base", "b1", t0)
	pub := New(store, a, nil)
	if err := pub.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx); err != nil {
		t.Fatalf("publishing again: %v", err)
	}
	ms, err := New(store, t.TempDir(), nil).Manifests(ctx)
	if err != nil || len(ms) != 1 || ms[0].ID != "base" || ms[0].BuildID != "b1" || ms[0].MemoryMB != 512 {
		t.Fatalf("the store's templates: %+v %v", ms, err)
	}
	sub := New(store, b, nil)
	m, err := sub.Fetch(ctx, "base", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(m.RootfsDir(), "release")); err != nil || string(got) != "build b1\n" {
		t.Fatalf("the fetched rootfs: %q %v", got, err)
	}
	if local, err := template.Load(b, "base"); err != nil || local.BuildID != "b1" {
		t.Fatalf("the fetched build is not the data dir's own: %+v %v", local, err)
	}

	writeTemplate(t, a, "base", "b2", t0.Add(time.Hour))
	if err := pub.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	m, err = sub.Fetch(ctx, "base", "b2")
	if err != nil || m.BuildID != "b2" {
		t.Fatalf("fetch of the newer build: %+v %v", m, err)
	}
	if _, err := os.Stat(filepath.Join(template.Dir(b, "base"), "rootfs-b1")); err != nil {
		t.Fatalf("the older build's rootfs went: %v", err)
	}
	if m, err := sub.Fetch(ctx, "base", ""); err != nil || m.BuildID != "b2" {
		t.Fatalf("the newest build: %+v %v", m, err)
	}
	for _, c := range [][2]string{{"nosuch", ""}, {"base", "b9"}} {
		if _, err := sub.Fetch(ctx, c[0], c[1]); !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("fetch %v: %v", c, err)
		}
	}
}

// A template built from steps on base goes through the store with its layers, its started
// snapshot and base's root filesystem: another data dir gets them all, under their trees' digests
// (it has a different layer of its own under the builder's step key, which it keeps and does not
// take for the builder's), the build manifest naming them and the snapshot stacked on them; its
// own base is left as it was. The store's template list (what a driver records) leaves
// step-built templates to the driver that ran their build.
func TestPublishAndFetchLayered(t *testing.T) {
	ctx := context.Background()
	store := newStore(t)
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	a, b := t.TempDir(), t.TempDir()
	writeTemplate(t, a, "base", "b1", t0)
	writeTemplate(t, b, "base", "b0", t0.Add(-time.Hour)) // b's own, older base
	step, snap := "layers/"+strings.Repeat("a", 32), "layers/"+strings.Repeat("b", 32)
	put := func(dataDir, rel, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dataDir, rel, "opt"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dataDir, rel, "opt", "what"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put(a, step, "a's step")
	put(a, snap, "a's started sandbox")
	if err := snapshot.Seal(filepath.Join(a, snap), snapshot.Meta{TemplateID: "tpl", BuildID: "bd1",
		Lowers: []string{step, "templates/base/rootfs-b1"}, Memory: true}); err != nil {
		t.Fatal(err)
	}
	// b ran the same step itself, to another result (a RUN is not reproducible).
	put(b, step, "b's step")
	m := template.Manifest{ID: "tpl", BuildID: "bd1", Layers: []string{step, "templates/base/rootfs-b1"}, StartSnapshot: snap,
		StartCmd: "sleep infinity", DefaultUser: "user", BuiltAt: t0}
	if err := template.WriteBuild(a, m); err != nil {
		t.Fatal(err)
	}
	pub := New(store, a, nil)
	if err := pub.PublishBuild(ctx, m); err != nil {
		t.Fatal(err)
	}
	if ms, err := pub.Manifests(ctx); err != nil || len(ms) != 0 {
		t.Fatalf("the store lists %+v (%v); a step-built template is the driver's to record", ms, err)
	}
	got, err := New(store, b, nil).Fetch(ctx, "tpl", "bd1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Layers) != 2 || got.Layers[0] == step || got.Layers[1] != "templates/base/rootfs-b1" || got.StartSnapshot == snap || got.StartSnapshot == "" {
		t.Fatalf("fetched manifest: %+v; want its own layer and snapshot under digest names, base's tree by name", got)
	}
	for rel, want := range map[string]string{got.Layers[0]: "a's step", got.StartSnapshot: "a's started sandbox", step: "b's step"} {
		if c, err := os.ReadFile(filepath.Join(b, rel, "opt", "what")); err != nil || string(c) != want {
			t.Fatalf("%s: %q %v, want %q", rel, c, err, want)
		}
	}
	if meta, err := snapshot.Read(filepath.Join(b, got.StartSnapshot)); err != nil || !slices.Equal(meta.Lowers, got.Layers) {
		t.Fatalf("the fetched started snapshot stacks on %v (%v), want %v", meta.Lowers, err, got.Layers)
	}
	if _, err := snapshot.Verify(filepath.Join(b, got.StartSnapshot)); err != nil {
		t.Fatalf("the fetched started snapshot does not verify: %v", err)
	}
	if c, err := os.ReadFile(filepath.Join(b, "templates", "base", "rootfs-b1", "release")); err != nil || string(c) != "build b1\n" {
		t.Fatalf("base's rootfs of the build: %q %v", c, err)
	}
	if local, err := template.Load(b, "base"); err != nil || local.BuildID != "b0" {
		t.Fatalf("the data dir's own base changed: %+v %v", local, err)
	}
	if loaded, err := template.LoadBuild(b, "tpl", "bd1"); err != nil || loaded.StartCmd != "sleep infinity" || !slices.Equal(loaded.Layers, got.Layers) {
		t.Fatalf("the build is not the data dir's: %+v %v", loaded, err)
	}
	ents, _ := os.ReadDir(filepath.Join(b, "layers"))
	if len(ents) != 3 {
		t.Fatalf("layers dir holds %d entries, want its own and the 2 fetched, nothing left over", len(ents))
	}

	// A manifest naming a path outside the build cache and the templates' trees is refused.
	bad := m
	bad.BuildID, bad.Layers = "bd2", []string{"../../etc"}
	if err := pub.PublishBuild(ctx, bad); err == nil {
		t.Fatal("a layer outside the data dir's layers was published")
	}
}
