//go:build linux

package fsroot

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		"":            ".",
		"/":           ".",
		"a":           "a",
		"/etc//x/./":  "etc/x",
		"a/../b":      "b",
		"../../etc":   "etc",
		"/../x/../..": ".",
	} {
		if got := Clean(in); got != want {
			t.Errorf("Clean(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCleanStrict(t *testing.T) {
	for in, want := range map[string]string{
		"a":          "a",
		"./a/b/":     "a/b",
		"/abs//x/./": "abs/x",
		"a/../b":     "b",
		"./":         ".",
		"/":          ".",
		"a/b/../../": ".",
	} {
		got, err := CleanStrict(in)
		if err != nil || got != want {
			t.Errorf("CleanStrict(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"..", "../a", "a/../../b", "/../x", "./../x"} {
		if got, err := CleanStrict(in); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("CleanStrict(%q) = %q, %v; want ErrUnsafePath", in, got, err)
		}
	}
}

func TestSplitParent(t *testing.T) {
	for in, want := range map[string][2]string{"a": {".", "a"}, "a/b": {"a", "b"}, "a/b/c": {"a/b", "c"}} {
		if p, b := SplitParent(in); p != want[0] || b != want[1] {
			t.Errorf("SplitParent(%q) = %q, %q; want %q", in, p, b, want)
		}
	}
}

// newRoot returns a fresh host directory and a Root on it.
func newRoot(t *testing.T) (string, *Root) {
	t.Helper()
	dir := t.TempDir()
	r, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return dir, r
}

func TestMkdirAllThroughAbsoluteSymlinkStaysInRoot(t *testing.T) {
	dir, r := newRoot(t)
	outside := t.TempDir()
	// /link -> <host outside dir> must resolve as the guest path, inside the root, where that
	// path exists too.
	if err := os.MkdirAll(filepath.Join(dir, outside), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	uid, gid := os.Getuid(), os.Getgid()
	if err := r.MkdirAll("/link/sub", 0o750, uid, gid); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, outside, "sub")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o750 {
		t.Errorf("in-root target: %v %v", st, err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("MkdirAll escaped the root: %v", ents)
	}

	fd, err := r.MkdirAllFD("/link/other/deeper", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if _, err := os.Stat(filepath.Join(dir, outside, "other/deeper")); err != nil {
		t.Error(err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("MkdirAllFD escaped the root: %v", ents)
	}
}

func TestMkdirAllInTheWay(t *testing.T) {
	dir, r := newRoot(t)
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nowhere", filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	uid, gid := os.Getuid(), os.Getgid()
	if err := r.MkdirAll("/file/x", 0o755, uid, gid); !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("MkdirAll under a file: %v", err)
	}
	if _, err := r.MkdirAllFD("/file/x", 0o755); !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("MkdirAllFD under a file: %v", err)
	}
	// A dangling symlink: MkdirAllFD refuses to create its target anywhere; MkdirAll leaves
	// one at the path itself alone and fails below it.
	if _, err := r.MkdirAllFD("/dangling/x", 0o755); !errors.Is(err, ErrDangling) {
		t.Errorf("MkdirAllFD through a dangling symlink: %v", err)
	}
	if err := r.MkdirAll("/dangling", 0o755, uid, gid); err != nil {
		t.Errorf("MkdirAll on a dangling symlink: %v", err)
	}
	if err := r.MkdirAll("/dangling/x", 0o755, uid, gid); !errors.Is(err, ErrDangling) {
		t.Errorf("MkdirAll through a dangling symlink: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dangling target was created: %v", err)
	}
}

func TestWriteFileReplacesSymlink(t *testing.T) {
	dir, r := newRoot(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteFile("/f", []byte("guest"), 0o600, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host" {
		t.Errorf("WriteFile followed the symlink: victim now %q", b)
	}
	st, err := os.Lstat(filepath.Join(dir, "f"))
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Fatalf("f: %v %v", st, err)
	}
	if b, err := r.ReadFile("f", 100); err != nil || string(b) != "guest" {
		t.Errorf("ReadFile: %q %v", b, err)
	}
}

func TestParentOfRoot(t *testing.T) {
	_, r := newRoot(t)
	for _, p := range []string{"/", ".", "", "/.."} {
		if f, _, err := r.Parent(p); err == nil {
			f.Close()
			t.Errorf("Parent(%q) succeeded", p)
		}
	}
	f, base, err := r.Parent("/a/b")
	if err == nil {
		f.Close()
	}
	if !errors.Is(err, unix.ENOENT) || base != "" {
		t.Errorf("Parent of a missing dir: %q %v", base, err)
	}
}

func TestLstatVersusStat(t *testing.T) {
	dir, r := newRoot(t)
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Absolute: resolves to /d inside the root, whatever the host has at /d.
	if err := os.Symlink("/d", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	st, err := r.Stat("/l")
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("Stat(/l): mode %o %v", st.Mode, err)
	}
	st, err = r.Lstat("/l")
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		t.Errorf("Lstat(/l): mode %o %v", st.Mode, err)
	}
	if st, err := r.Lstat("/"); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("Lstat(/): mode %o %v", st.Mode, err)
	}
}

func TestRemoveAllAtDoesNotFollow(t *testing.T) {
	dir, r := newRoot(t)
	keep := t.TempDir()
	if err := os.WriteFile(filepath.Join(keep, "k"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tree/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(keep, filepath.Join(dir, "tree/sub/link")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveAllAt(r.FD(), "tree"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "tree")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tree left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(keep, "k")); err != nil {
		t.Errorf("RemoveAllAt followed a symlink: %v", err)
	}
	if err := RemoveAllAt(r.FD(), "missing"); err != nil {
		t.Errorf("missing: %v", err)
	}
}
