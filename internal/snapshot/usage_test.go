package snapshot

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Usage says what Bytes says of the whole directory, while snapshots are published, grow in
// progress, change and go.
func TestUsage(t *testing.T) {
	root := t.TempDir()
	write := func(rel string, size int) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var u Usage
	check := func(what string) {
		t.Helper()
		if got, want := u.Bytes(root), Bytes(root); got != want {
			t.Fatalf("%s: Usage %d, Bytes %d", what, got, want)
		}
	}
	check("empty")
	write("aaa/"+MetaFile, 100)
	write("aaa/"+LayerDir+"/disk.img", 64<<10)
	write("bbb/"+CheckpointDir+"/pages", 128<<10)
	check("two published")
	// An in-progress snapshot grows below its top directory: it is walked every time.
	write(tmpPrefix+"ccc-1/"+CheckpointDir+"/pages", 16<<10)
	check("one in progress")
	write(tmpPrefix+"ccc-1/"+CheckpointDir+"/pages", 256<<10)
	check("in progress, grown")
	// Published, then resealed (a new file renamed in at the top).
	if err := os.Rename(filepath.Join(root, tmpPrefix+"ccc-1"), filepath.Join(root, "ccc")); err != nil {
		t.Fatal(err)
	}
	check("published")
	// Past the timestamp granularity of filesystems without fine-grained timestamps, so the
	// reseal below gives bbb a new modification time.
	time.Sleep(20 * time.Millisecond)
	if err := writeMeta(filepath.Join(root, "bbb"), Meta{SandboxID: "bbb"}, func() error {
		write("bbb/"+LayerDir+"/disk.img", 32<<10)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check("resealed with its layer back")
	if err := os.RemoveAll(filepath.Join(root, "aaa")); err != nil {
		t.Fatal(err)
	}
	check("one removed")
	if len(u.dirs) != 2 {
		t.Fatalf("%d snapshots remembered, want 2 (bbb, ccc)", len(u.dirs))
	}
}
