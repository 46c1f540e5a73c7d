package template

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/rootfs"
)

// fakeMmdebstrap stands in for mmdebstrap: it fills the target directory (the argument after the
// suite) with a marker file and prints progress lines, or fails when FAKE_FAIL is set.
const fakeMmdebstrap = `#!/bin/sh
set -eu
prev=""
for a in "$@"; do
	if [ "$prev" = bookworm ]; then target="$a"; fi
	prev="$a"
done
echo "I: fake mmdebstrap into $target"
if [ -n "${FAKE_FAIL:-}" ]; then echo "E: fake failure" >&2; exit 1; fi
mkdir -p "$target/etc" "$target/tmp"
echo "$*" > "$target/etc/build-args"
dd if=/dev/zero of="$target/blob" bs=1024 count=2048 2>/dev/null
echo "I: done"
`

func fake(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mmdebstrap")
	if err := os.WriteFile(p, []byte(fakeMmdebstrap), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func buildDirs(t *testing.T, dataDir string) []string {
	t.Helper()
	ents, err := os.ReadDir(Dir(dataDir, BaseID))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

func TestBuildBaseCacheAndRebuild(t *testing.T) {
	ctx := context.Background()
	dataDir := t.TempDir()
	mm := fake(t)
	var progress bytes.Buffer
	opts := BaseOptions{DataDir: dataDir, Mmdebstrap: mm, Progress: &progress, Sources: []string{"deb http://x/debian bookworm main"}}

	if _, err := Load(dataDir, BaseID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("Load before build = %v, want NotFound", err)
	}
	m1, err := BuildBase(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if m1.ID != BaseID || m1.CPUs != 2 || m1.MemoryMB != 512 || m1.DefaultUser != "user" ||
		m1.DefaultWorkdir != "/home/user" || m1.DiskSizeMB < 2 || m1.BuildID == "" {
		t.Fatalf("manifest = %+v", m1)
	}
	if !strings.Contains(progress.String(), "template base: I: fake mmdebstrap") ||
		!strings.Contains(progress.String(), "MB on disk") {
		t.Fatalf("progress output:\n%s", progress.String())
	}
	args, err := os.ReadFile(filepath.Join(m1.RootfsDir(), "etc", "build-args"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--variant=minbase", "python-is-python3", "build-essential", "deb http://x/debian bookworm main"} {
		if !strings.Contains(string(args), want) {
			t.Errorf("mmdebstrap args lack %q: %s", want, args)
		}
	}
	loaded, err := Load(dataDir, BaseID)
	if err != nil || loaded.BuildID != m1.BuildID || loaded.RootfsDir() != m1.RootfsDir() {
		t.Fatalf("Load = %+v, %v", loaded, err)
	}
	if l, err := List(dataDir); err != nil || len(l) != 1 || l[0].ID != BaseID {
		t.Fatalf("List = %+v, %v", l, err)
	}

	// Cached: no build runs (the binary does not even exist).
	cached := opts
	cached.Mmdebstrap = "/no/such/mmdebstrap"
	if m, err := BuildBase(ctx, cached); err != nil || m.BuildID != m1.BuildID {
		t.Fatalf("cached BuildBase = %+v, %v", m, err)
	}

	// Keep the first build in use by a sandbox overlay: a forced rebuild must not delete it.
	sandbox := filepath.Join(t.TempDir(), "sbx")
	if _, err := rootfs.Prepare(ctx, []string{m1.RootfsDir()}, sandbox, rootfs.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rootfs.Release(context.Background(), sandbox) })

	forced := opts
	forced.Force = true
	m2, err := BuildBase(ctx, forced)
	if err != nil {
		t.Fatal(err)
	}
	if m2.BuildID == m1.BuildID || m2.Rootfs == m1.Rootfs {
		t.Fatalf("forced rebuild reused build %s", m1.BuildID)
	}
	if got, _ := Load(dataDir, BaseID); got.BuildID != m2.BuildID {
		t.Fatalf("manifest not switched: %+v", got)
	}
	if dirs := buildDirs(t, dataDir); !slices.Equal(dirs, []string{m1.Rootfs, m2.Rootfs}) {
		t.Fatalf("build dirs with the old one in use = %v", dirs)
	}
	if err := rootfs.Release(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	if err := Prune(ctx, dataDir, BaseID); err != nil {
		t.Fatal(err)
	}
	if dirs := buildDirs(t, dataDir); !slices.Equal(dirs, []string{m2.Rootfs}) {
		t.Fatalf("build dirs after Prune = %v", dirs)
	}
}

func TestBuildBaseFailureKeepsPrevious(t *testing.T) {
	ctx := context.Background()
	dataDir := t.TempDir()
	opts := BaseOptions{DataDir: dataDir, Mmdebstrap: fake(t), Sources: []string{"deb http://x/debian bookworm main"}}
	m1, err := BuildBase(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_FAIL", "1")
	opts.Force = true
	if _, err := BuildBase(ctx, opts); err == nil || !strings.Contains(err.Error(), "fake failure") {
		t.Fatalf("failing build = %v, want the tool's last output in the error", err)
	}
	if m, err := Load(dataDir, BaseID); err != nil || m.BuildID != m1.BuildID {
		t.Fatalf("previous template lost: %+v, %v", m, err)
	}
	if dirs := buildDirs(t, dataDir); !slices.Equal(dirs, []string{m1.Rootfs}) {
		t.Fatalf("failed build left %v", dirs)
	}
}

func TestPruneRemovesInterruptedBuild(t *testing.T) {
	dataDir := t.TempDir()
	dir := Dir(dataDir, BaseID)
	stale := filepath.Join(dir, tmpPrefix+"20260101T000000Z"+tmpSuffix)
	orphan := filepath.Join(dir, rootfsPrefix+"20260101T000000Z")
	for _, d := range []string{filepath.Join(stale, "etc"), orphan} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := Prune(context.Background(), dataDir, BaseID); err != nil {
		t.Fatal(err)
	}
	// Without a manifest nothing says which rootfs is current, so rootfs dirs stay.
	if dirs := buildDirs(t, dataDir); !slices.Equal(dirs, []string{filepath.Base(orphan)}) {
		t.Fatalf("dirs after Prune = %v", dirs)
	}
	if err := Prune(context.Background(), filepath.Join(dataDir, "none"), BaseID); err != nil {
		t.Fatalf("Prune of a missing template: %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dataDir := t.TempDir()
	for _, id := range []string{"missing", "../etc", "Base", ""} {
		if _, err := Load(dataDir, id); !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("Load(%q) = %v, want NotFound", id, err)
		}
	}
	dir := Dir(dataDir, "broken")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(m Manifest) {
		b, _ := json.Marshal(m)
		if err := os.WriteFile(filepath.Join(dir, manifestName), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(Manifest{ID: "broken", Rootfs: "../../etc"})
	if _, err := Load(dataDir, "broken"); err == nil {
		t.Fatal("manifest pointing outside its template accepted")
	}
	write(Manifest{ID: "other", Rootfs: "rootfs-x"})
	if _, err := Load(dataDir, "broken"); err == nil {
		t.Fatal("manifest with another id accepted")
	}
	write(Manifest{ID: "broken", Rootfs: "rootfs-x"})
	if _, err := Load(dataDir, "broken"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("manifest without its rootfs = %v, want NotFound", err)
	}
	if l, err := List(dataDir); err != nil || len(l) != 0 {
		t.Fatalf("List with only broken templates = %+v, %v", l, err)
	}
	if msg := errdefs.PublicMessage(func() error { _, err := Load(dataDir, "broken"); return err }()); strings.Contains(msg, dataDir) {
		t.Fatalf("public message leaks a host path: %q", msg)
	}
}

// A rebuilt base keeps its old rootfs while a template built from steps stacks on it.
func TestPruneKeepsRootfsUnderBuilds(t *testing.T) {
	dataDir := t.TempDir()
	dir := Dir(dataDir, BaseID)
	current, old := rootfsPrefix+"20260202T000000Z", rootfsPrefix+"20260101T000000Z"
	for _, d := range []string{current, old} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeManifest(dir, Manifest{ID: BaseID, BuildID: "2", Rootfs: current}); err != nil {
		t.Fatal(err)
	}
	err := WriteBuild(dataDir, Manifest{ID: "child", BuildID: "b1",
		Layers: []string{"layers/abc", filepath.Join("templates", BaseID, old)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := Prune(context.Background(), dataDir, BaseID); err != nil {
		t.Fatal(err)
	}
	if dirs := buildDirs(t, dataDir); !slices.Equal(dirs, []string{old, current}) {
		t.Fatalf("dirs after Prune = %v, want the referenced old rootfs kept", dirs)
	}
	if err := RemoveBuilds(dataDir, "child"); err != nil {
		t.Fatal(err)
	}
	if err := Prune(context.Background(), dataDir, BaseID); err != nil {
		t.Fatal(err)
	}
	if dirs := buildDirs(t, dataDir); !slices.Equal(dirs, []string{current}) {
		t.Fatalf("dirs after the child was removed = %v", dirs)
	}
}

// TestBuildCodeInterpreterRootfs: its own template directory, base's packages plus the
// code-interpreter ones, and both customize hooks (base's, then the one that checks Python and R).
func TestBuildCodeInterpreterRootfs(t *testing.T) {
	dataDir := t.TempDir()
	m, err := BuildCodeInterpreterRootfs(context.Background(), BaseOptions{DataDir: dataDir, Mmdebstrap: fake(t),
		Sources: []string{"deb http://x/debian bookworm main"}})
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != CodeInterpreterRootfsID || m.DefaultUser != "user" {
		t.Fatalf("manifest %+v", m)
	}
	for _, p := range append(slices.Clone(BasePackages), CodeInterpreterPackages...) {
		if !slices.Contains(m.Packages, p) {
			t.Fatalf("package %s missing from %v", p, m.Packages)
		}
	}
	args, err := os.ReadFile(filepath.Join(m.RootfsDir(), "etc", "build-args"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(args), "--customize-hook="); n != 3 { // sync-out, base, code interpreter
		t.Fatalf("%d customize hooks in %s", n, args)
	}
	// Without man1, openjdk's postinst fails to make its java.1.gz alternative.
	if !strings.Contains(string(args), `--setup-hook=mkdir -p "$1"/usr/share/man/man1`) {
		t.Fatalf("no setup hook makes /usr/share/man/man1: %s", args)
	}
	if _, err := Load(dataDir, BaseID); err == nil {
		t.Fatal("building the code-interpreter rootfs built base too")
	}
}
