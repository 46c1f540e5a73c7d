package node

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/rootimage"
	"github.com/vibemon/vmon/internal/snapshot"
)

// TestSweepEnvd: envd builds that a paused sandbox, a snapshot, a template's started snapshot or
// a running sandbox still needs stay, with the running one; the rest go.
func TestSweepEnvd(t *testing.T) {
	data := t.TempDir()
	for _, b := range []string{"cur", "paused", "snap", "started", "running", "old1", "old2"} {
		writeFile(t, filepath.Join(data, EnvdDir, b, "envd"), "envd "+b)
	}
	seal := func(root, name, envd string) {
		dir := filepath.Join(data, root, name)
		if err := os.MkdirAll(filepath.Join(dir, snapshot.LayerDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := snapshot.Seal(dir, snapshot.Meta{SandboxID: name, Lowers: []string{"templates/base/rootfs"}, Memory: true, Envd: envd}); err != nil {
			t.Fatal(err)
		}
	}
	seal("paused", "sb1", EnvdDir+"/paused")
	seal("snapshots", "snap1", EnvdDir+"/snap")
	seal("layers", "k1", EnvdDir+"/started")
	seal("paused", "sb2", "") // files only, or from before envd was versioned
	b, _ := json.Marshal(bootRecord{Envd: EnvdDir + "/running"})
	writeFile(t, filepath.Join(data, "sandboxes", "rt1", bootFile), string(b))

	if err := SweepEnvd(data, filepath.Join(data, EnvdDir, "cur", "envd"), "layers"); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(data, EnvdDir))
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{"cur", "paused", "running", "snap", "started"}; !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}

	// An unreadable record stops the sweep rather than risk a build someone needs.
	writeFile(t, filepath.Join(data, "paused", "sb3", snapshot.MetaFile), "{garbage")
	if err := os.RemoveAll(filepath.Join(data, "paused", "sb1")); err != nil {
		t.Fatal(err)
	}
	if err := SweepEnvd(data, filepath.Join(data, EnvdDir, "cur", "envd"), "layers"); err == nil {
		t.Fatal("sweep went on past an unreadable snapshot manifest")
	}
	if _, err := os.Stat(filepath.Join(data, EnvdDir, "paused")); err != nil {
		t.Fatalf("a build was removed although the sweep stopped: %v", err)
	}
}

// TestEnvdFor: a snapshot names the envd build its checkpoint needs; one without a name uses the
// binary envd lived in before builds were versioned, and a missing build is refused clearly.
func TestEnvdFor(t *testing.T) {
	data := t.TempDir()
	n := &Node{opts: Options{DataDir: data, EnvdPath: filepath.Join(data, EnvdDir, "cur", "envd")}}
	writeFile(t, filepath.Join(data, EnvdDir, "old", "envd"), "old")
	if dir, err := n.envdFor(snapshot.Meta{Envd: EnvdDir + "/old"}); err != nil || dir != filepath.Join(data, EnvdDir, "old") {
		t.Fatalf("envdFor(old) = %q, %v", dir, err)
	}
	if dir, err := n.envdFor(snapshot.Meta{}); err != nil || dir != "" {
		t.Fatalf("envdFor(unversioned, no legacy binary) = %q, %v; want the running one", dir, err)
	}
	writeFile(t, filepath.Join(data, legacyEnvdDir, "envd"), "legacy")
	if dir, err := n.envdFor(snapshot.Meta{}); err != nil || dir != filepath.Join(data, legacyEnvdDir) {
		t.Fatalf("envdFor(unversioned) = %q, %v; want the legacy directory", dir, err)
	}
	_, err := n.envdFor(snapshot.Meta{SandboxID: "sb1", Envd: EnvdDir + "/gone"})
	if !errdefs.Is(err, errdefs.KindUnavailable) {
		t.Fatalf("envdFor(gone) = %v, want Unavailable", err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRootImagesInUse: the root images that paused sandboxes, snapshots and running sandboxes
// booted from are in use (their checkpoints reopen them); a snapshot without one names none.
func TestRootImagesInUse(t *testing.T) {
	data := t.TempDir()
	seal := func(root, name, image string) {
		dir := filepath.Join(data, root, name)
		if err := os.MkdirAll(filepath.Join(dir, snapshot.LayerDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := snapshot.Seal(dir, snapshot.Meta{SandboxID: name, Lowers: []string{"templates/base/rootfs"}, Memory: true, RootImage: image}); err != nil {
			t.Fatal(err)
		}
	}
	seal("paused", "sb1", "root-images/a.erofs")
	seal("snapshots", "snap1", "root-images/b.erofs")
	seal("paused", "sb2", "")
	var rec bootRecord
	rec.Runtime.RootImage = filepath.Join(data, "root-images", "c.erofs")
	b, _ := json.Marshal(rec)
	writeFile(t, filepath.Join(data, "sandboxes", "rt1", bootFile), string(b))
	writeFile(t, filepath.Join(data, "sandboxes", "rt2", bootFile), "{}")

	got, err := RootImagesInUse(data, "layers")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for p := range got {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	want := []string{filepath.Join(data, "root-images", "a.erofs"), filepath.Join(data, "root-images", "b.erofs"),
		filepath.Join(data, "root-images", "c.erofs")}
	if !slices.Equal(paths, want) {
		t.Fatalf("in use %v, want %v", paths, want)
	}
}

// fakeImages is a RootImages whose ForRestore hands out what it is told.
type fakeImages struct {
	img rootimage.Image
	err error
}

func (f fakeImages) Lookup([]string, string) (rootimage.Image, bool) { return rootimage.Image{}, false }
func (f fakeImages) Build(context.Context, []string, string) (rootimage.Image, error) {
	return f.img, f.err
}
func (f fakeImages) ForRestore(_ context.Context, path string, _ []string, _ string) (rootimage.Image, error) {
	if f.err != nil {
		return rootimage.Image{}, f.err
	}
	img := f.img
	if img.Path == "" {
		img.Path = path
	}
	return img, nil
}

// TestFromSnapshot: a checkpoint taken on a root image is restored on it, with no saved layer;
// one whose image this node lacks, cannot build, or has with another digest is refused clearly;
// one without an image is left as it was.
func TestFromSnapshot(t *testing.T) {
	ctx := context.Background()
	data := t.TempDir()
	n := &Node{opts: Options{DataDir: data}}
	writeFile(t, filepath.Join(data, "root-images", "a.erofs"), "image")
	bs := bootSpec{layer: "/snap/layer", copyLayer: true}
	if err := n.fromSnapshot(ctx, &bs, snapshot.Meta{}); err != nil || bs.layer != "/snap/layer" || bs.rootImage.Path != "" {
		t.Fatalf("a snapshot without an image: %+v, %v", bs, err)
	}
	if err := n.fromSnapshot(ctx, &bs, snapshot.Meta{RootImage: "root-images/a.erofs"}); err != nil {
		t.Fatal(err)
	}
	if bs.rootImage.Path != filepath.Join(data, "root-images", "a.erofs") || bs.layer != "" || bs.copyLayer {
		t.Fatalf("a snapshot on an image: %+v", bs)
	}
	err := n.fromSnapshot(ctx, &bootSpec{}, snapshot.Meta{SandboxID: "x", RootImage: "root-images/gone.erofs"})
	if !errdefs.Is(err, errdefs.KindUnavailable) || !strings.Contains(err.Error(), "gone.erofs") {
		t.Fatalf("a snapshot whose image is gone: %v", err)
	}

	// A node with root images: the store's image, with its record (the shell it has).
	n.opts.RootImages = fakeImages{img: rootimage.Image{Digest: "sha256:aa", Bash: true}}
	meta := snapshot.Meta{SandboxID: "x", RootImage: "root-images/b.erofs", RootImageDigest: "sha256:aa"}
	bs = bootSpec{}
	if err := n.fromSnapshot(ctx, &bs, meta); err != nil || bs.rootImage.Path != filepath.Join(data, "root-images", "b.erofs") || !bs.rootImage.Bash {
		t.Fatalf("a snapshot restored on the store's image: %+v, %v", bs.rootImage, err)
	}
	meta.RootImageDigest = "sha256:bb"
	if err := n.fromSnapshot(ctx, &bootSpec{}, meta); !errdefs.Is(err, errdefs.KindUnavailable) || !strings.Contains(err.Error(), "sha256:bb") {
		t.Fatalf("an image whose digest differs from the checkpoint's: %v", err)
	}
	// This node keeps the template's layers elsewhere, so its image of them has another name:
	// used when the digests say it holds the same bytes, refused when there is none to compare.
	mine := filepath.Join(data, "root-images", "mine.erofs")
	n.opts.RootImages = fakeImages{img: rootimage.Image{Path: mine, Digest: "sha256:aa"}}
	meta.RootImageDigest = "sha256:aa"
	bs = bootSpec{}
	if err := n.fromSnapshot(ctx, &bs, meta); err != nil || bs.rootImage.Path != mine {
		t.Fatalf("this node's image of the same bytes: %+v, %v", bs.rootImage, err)
	}
	meta.RootImageDigest = ""
	if err := n.fromSnapshot(ctx, &bootSpec{}, meta); !errdefs.Is(err, errdefs.KindUnavailable) {
		t.Fatalf("another image and no digest to compare: %v", err)
	}
	meta.RootImageDigest = "sha256:aa"
	n.opts.RootImages = fakeImages{err: errors.New("no such template")}
	if err := n.fromSnapshot(ctx, &bootSpec{}, meta); !errdefs.Is(err, errdefs.KindUnavailable) || !strings.Contains(err.Error(), "no such template") {
		t.Fatalf("an image the node cannot build: %v", err)
	}
}

// A started snapshot taken on a root image is restored only by creates with its disk size
// (runsc refuses another root size); others are told to run the start command themselves.
func TestCreateFromStartNeedsTheSnapshotsDisk(t *testing.T) {
	src := t.TempDir()
	if err := snapshot.Seal(src, snapshot.Meta{SandboxID: "buildx", TemplateID: "build", Lowers: []string{"layers/a"},
		DiskMB: 10240, Memory: true, RootImage: "root-images/k.erofs"}); err != nil {
		t.Fatal(err)
	}
	n := &Node{opts: Options{DataDir: t.TempDir()}}
	_, err := n.createFromStart(context.Background(), CreateSpec{ID: "sbx", DiskMB: 2048}, Image{StartSnapshot: src})
	if !errors.Is(err, errStartDisk) || !strings.Contains(err.Error(), "10240 MiB") {
		t.Fatalf("a create with another disk size: %v", err)
	}
}
