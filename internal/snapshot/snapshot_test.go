package snapshot

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
)

// sealed builds a published snapshot with a sparse file, a small file and a nested one.
func sealed(t *testing.T) string {
	t.Helper()
	final := filepath.Join(t.TempDir(), "snaps", "sb1")
	tmp, err := TempDir(final)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(tmp, CheckpointDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, CheckpointDir, "checkpoint.img"), []byte("kernel state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(tmp, LayerDir), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(tmp, LayerDir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	// 1 GiB, mostly hole, with data at both ends.
	if _, err := f.WriteAt([]byte("head"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("tail"), 1<<30-4); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := Seal(tmp, Meta{SandboxID: "sb1", TemplateID: "base", Lowers: []string{"templates/base/rootfs"}, Memory: true}); err != nil {
		t.Fatal(err)
	}
	if err := Publish(tmp, final); err != nil {
		t.Fatal(err)
	}
	return final
}

func TestSealVerify(t *testing.T) {
	dir := sealed(t)
	m, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.SandboxID != "sb1" || !m.Memory || len(m.Files) != 2 {
		t.Fatalf("meta = %+v", m)
	}
	if b := Bytes(dir); b <= 0 || b > 1<<20 {
		t.Fatalf("Bytes = %d: a sparse image must count only its data", b)
	}
	if err := Sweep(filepath.Dir(dir)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal("Sweep removed a published snapshot")
	}
}

func TestVerifyRefusesDamage(t *testing.T) {
	cases := map[string]func(t *testing.T, dir string){
		"flipped byte in a hole": func(t *testing.T, dir string) {
			writeAt(t, filepath.Join(dir, LayerDir, "disk.img"), 1<<20, "x")
		},
		"flipped byte in data": func(t *testing.T, dir string) {
			writeAt(t, filepath.Join(dir, CheckpointDir, "checkpoint.img"), 3, "X")
		},
		"truncated": func(t *testing.T, dir string) {
			if err := os.Truncate(filepath.Join(dir, CheckpointDir, "checkpoint.img"), 4); err != nil {
				t.Fatal(err)
			}
		},
		"missing": func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, CheckpointDir, "checkpoint.img")); err != nil {
				t.Fatal(err)
			}
		},
		"extra": func(t *testing.T, dir string) {
			writeAt(t, filepath.Join(dir, LayerDir, "planted"), 0, "x")
		},
		"manifest garbage": func(t *testing.T, dir string) {
			writeAt(t, filepath.Join(dir, MetaFile), 0, "}}}")
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dir := sealed(t)
			damage(t, dir)
			_, err := Verify(dir)
			if !errdefs.Is(err, errdefs.KindDataLoss) || !strings.Contains(err.Error(), "damaged") {
				t.Fatalf("Verify = %v, want a DataLoss error", err)
			}
		})
	}
	dir := sealed(t)
	if err := os.Remove(filepath.Join(dir, MetaFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(dir); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("Verify without a manifest = %v, want NotFound", err)
	}
}

func TestSweepRemovesUnpublished(t *testing.T) {
	parent := t.TempDir()
	tmp, err := TempDir(filepath.Join(parent, "sb2"))
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, filepath.Join(tmp, "half"), 0, "x")
	// A discarded snapshot frees its name at once and is swept if nobody deleted it.
	spent := filepath.Join(parent, "sb3")
	if err := os.Mkdir(spent, 0o700); err != nil {
		t.Fatal(err)
	}
	writeAt(t, filepath.Join(spent, MetaFile), 0, "{}")
	trash, err := Discard(spent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spent); !os.IsNotExist(err) || filepath.Dir(trash) != parent {
		t.Fatalf("Discard left %s (%v) / moved it to %s", spent, err, trash)
	}
	if err := Sweep(parent); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 0 {
		t.Fatalf("Sweep left %v", ents)
	}
}

// Sweep spares the leftovers of the snapshots it is told to keep (a restart still settling them);
// SweepOne removes exactly one snapshot's.
func TestSweepKeepsAndSweepOne(t *testing.T) {
	parent := t.TempDir()
	var tmps []string
	for _, name := range []string{"sb1", "sb12", "sb2"} {
		tmp, err := TempDir(filepath.Join(parent, name))
		if err != nil {
			t.Fatal(err)
		}
		tmps = append(tmps, tmp)
	}
	if err := Sweep(parent, "sb1"); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		if _, err := os.Stat(tmps[i]); (err == nil) != want {
			t.Errorf("%s kept = %v, want %v", tmps[i], err == nil, want)
		}
	}
	if err := SweepOne(filepath.Join(parent, "sb1")); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 0 {
		t.Fatalf("SweepOne left %v", ents)
	}
}

func writeAt(t *testing.T, path string, off int64, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(s), off); err != nil {
		t.Fatal(err)
	}
}

func TestReferencedLayers(t *testing.T) {
	data := t.TempDir()
	final := filepath.Join(data, "paused", "sb1")
	tmp, err := TempDir(final)
	if err != nil {
		t.Fatal(err)
	}
	if err := Seal(tmp, Meta{SandboxID: "sb1", Lowers: []string{"layers/aaa", "templates/base/rootfs-1"}}); err != nil {
		t.Fatal(err)
	}
	if err := Publish(tmp, final); err != nil {
		t.Fatal(err)
	}
	refs, err := ReferencedLayers(data)
	if err != nil {
		t.Fatal(err)
	}
	if !refs["layers/aaa"] || !refs["templates/base/rootfs-1"] || len(refs) != 2 {
		t.Fatalf("refs = %v", refs)
	}
	writeAt(t, filepath.Join(final, MetaFile), 0, "{{{")
	if _, err := ReferencedLayers(data); err == nil {
		t.Fatal("an unreadable manifest must stop garbage collection")
	}
}

// TestChecksumIgnoresLayout: a copy whose holes moved (zeros written out as data, or data blocks
// of zeros punched into holes, as cp --sparse and rsync -S do) still verifies, so a snapshot
// stays valid when it is copied to another node.
func TestChecksumIgnoresLayout(t *testing.T) {
	dir := sealed(t)
	img := filepath.Join(dir, LayerDir, "disk.img")
	// Zeros written over part of a hole, and over a block-straddling range at the front.
	writeAt(t, img, 1<<20, string(make([]byte, 3*sumBlock+100)))
	writeAt(t, img, 4, string(make([]byte, sumBlock)))
	if _, err := Verify(dir); err != nil {
		t.Fatalf("zeros written as data: %v", err)
	}
	// The zeros punched back out, and the block holding "head" left alone.
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1<<20, 4*sumBlock); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Verify(dir); err != nil {
		t.Fatalf("zeros punched into a hole: %v", err)
	}
	// A whole copy by cp --sparse=always, which turns every zero block into a hole.
	cp := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", "--sparse=always", dir, cp).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if _, err := Verify(cp); err != nil {
		t.Fatalf("sparse copy: %v", err)
	}
	// Content still counts: one non-zero byte in the zeros is damage.
	writeAt(t, img, 1<<20+2*sumBlock, "\x01")
	if _, err := Verify(dir); !errdefs.Is(err, errdefs.KindDataLoss) {
		t.Fatalf("Verify after a byte changed = %v, want DataLoss", err)
	}
}

// TestVerifyReadsVersion1: snapshots written before the layout-free checksum still restore.
func TestVerifyReadsVersion1(t *testing.T) {
	dir := sealed(t)
	m, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != formatVersion {
		t.Fatalf("sealed as version %d, want %d", m.Version, formatVersion)
	}
	files, err := checksumTree(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	m.Version, m.Files = 1, files
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, MetaFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(dir); err != nil {
		t.Fatalf("version 1 snapshot: %v", err)
	}
	writeAt(t, filepath.Join(dir, CheckpointDir, "checkpoint.img"), 0, "K")
	if _, err := Verify(dir); !errdefs.Is(err, errdefs.KindDataLoss) {
		t.Fatalf("damaged version 1 snapshot: Verify = %v, want DataLoss", err)
	}
	m.Version = 9
	b, _ = json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, MetaFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); !errdefs.Is(err, errdefs.KindDataLoss) {
		t.Fatalf("unknown version: Read = %v, want DataLoss", err)
	}
}
