package build

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vibemon/vmon/internal/fsroot"
)

type tarEntry struct {
	name, body, link string
	dir              bool
	mode             int64
}

func makeTar(t *testing.T, gz bool, entries ...tarEntry) *bytes.Reader {
	t.Helper()
	var buf bytes.Buffer
	var w *tar.Writer
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = tar.NewWriter(zw)
	} else {
		w = tar.NewWriter(&buf)
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		switch {
		case e.dir:
			h.Typeflag, h.Size, h.Mode = tar.TypeDir, 0, 0o755
		case e.link != "":
			h.Typeflag, h.Size, h.Linkname = tar.TypeSymlink, 0, e.link
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := w.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return bytes.NewReader(buf.Bytes())
}

func openRoot(t *testing.T) (string, *fsroot.Root) {
	t.Helper()
	dir := t.TempDir()
	r, err := fsroot.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return dir, r
}

func readIn(t *testing.T, dir, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, p))
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return string(b)
}

func TestApplyCopyDockerRules(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("COPY sets file ownership and must run as root (CI runs it as root)")
	}
	mode := os.FileMode(0o750)
	for _, tc := range []struct {
		name    string
		entries []tarEntry
		spec    copySpec
		want    map[string]string // path -> content ("" for a directory)
	}{
		{"file into dir (trailing slash)", []tarEntry{{name: "app.txt", body: "a"}},
			copySpec{src: "app.txt", dest: "/app", destDir: true}, map[string]string{"app/app.txt": "a"}},
		{"file to a new path", []tarEntry{{name: "cfg.json", body: "{}"}},
			copySpec{src: "cfg.json", dest: "/etc/app/config.json"}, map[string]string{"etc/app/config.json": "{}"}},
		{"nested file keeps only its name", []tarEntry{{name: "src/index.js", body: "js"}},
			copySpec{src: "src/index.js", dest: "/srv", destDir: true}, map[string]string{"srv/index.js": "js"}},
		{"directory contents go into dest", []tarEntry{{name: "dir", dir: true}, {name: "dir/sub", dir: true},
			{name: "dir/sub/n.txt", body: "n"}, {name: "dir/top.txt", body: "t"}},
			copySpec{src: "dir", dest: "/opt/dir"}, map[string]string{"opt/dir/sub/n.txt": "n", "opt/dir/top.txt": "t"}},
		{"several matches make dest a directory", []tarEntry{{name: "a.txt", body: "1"}, {name: "b.txt", body: "2"}},
			copySpec{src: "*.txt", dest: "/multi"}, map[string]string{"multi/a.txt": "1", "multi/b.txt": "2"}},
		{"gzip and ./ prefixes", []tarEntry{{name: "./g.txt", body: "g"}},
			copySpec{src: "g.txt", dest: "/g/", destDir: true}, map[string]string{"g/g.txt": "g"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, root := openRoot(t)
			tc.spec.uid, tc.spec.gid = 1234, 4321
			tc.spec.mode = &mode
			n, err := applyCopy(root, makeTar(t, strings.HasPrefix(tc.name, "gzip"), tc.entries...), tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if n != len(tc.entries) {
				t.Errorf("wrote %d entries, want %d", n, len(tc.entries))
			}
			for p, body := range tc.want {
				if got := readIn(t, dir, p); got != body {
					t.Errorf("%s = %q, want %q", p, got, body)
				}
				fi, err := os.Lstat(filepath.Join(dir, p))
				if err != nil {
					t.Fatal(err)
				}
				st := fi.Sys().(*syscall.Stat_t)
				if st.Uid != 1234 || st.Gid != 4321 || fi.Mode().Perm() != 0o750 {
					t.Errorf("%s: owner %d:%d mode %v, want 1234:4321 0750", p, st.Uid, st.Gid, fi.Mode())
				}
			}
		})
	}
}

// An image's symlink must resolve inside the image: a COPY through /etc -> / lands in the root,
// never in the host's /etc.
func TestApplyCopyStaysInRoot(t *testing.T) {
	dir, root := openRoot(t)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	// The same path inside the root, where the guest would see the link's target.
	if err := os.MkdirAll(filepath.Join(dir, outside), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := applyCopy(root, makeTar(t, false, tarEntry{name: "x.txt", body: "x"}),
		copySpec{src: "x.txt", dest: "/escape/", destDir: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "x.txt")); err == nil {
		t.Fatal("COPY followed a symlink out of the root")
	}
	// The symlink's target resolved inside the root instead.
	if got := readIn(t, dir, strings.TrimPrefix(outside, "/")+"/x.txt"); got != "x" {
		t.Fatalf("in-root copy = %q", got)
	}

	for _, bad := range []string{"../evil.txt", "/abs.txt"} {
		_, err := applyCopy(root, makeTar(t, false, tarEntry{name: bad, body: "e"}), copySpec{src: "*", dest: "/d/", destDir: true})
		if err == nil {
			t.Fatalf("archive entry %q was accepted", bad)
		}
	}
	if _, err := applyCopy(root, makeTar(t, false), copySpec{src: "none", dest: "/d"}); err == nil {
		t.Fatal("an empty archive was accepted")
	}
}
