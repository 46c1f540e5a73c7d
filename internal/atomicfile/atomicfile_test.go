package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// A replaced file holds the new content with its mode, and no temporary file is left beside it.
func TestReplace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	for i, write := range []func(string, []byte, os.FileMode) error{Replace, ReplaceDurably} {
		want := []byte{'v', byte('0' + i)}
		if err := write(p, want, 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != string(want) {
			t.Fatalf("content %q, %v; want %q", got, err, want)
		}
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 {
			t.Fatalf("mode %v", fi.Mode().Perm())
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("%d entries left in the directory", len(ents))
	}
	if err := Replace(filepath.Join(dir, "missing", "f"), nil, 0o600); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
}
