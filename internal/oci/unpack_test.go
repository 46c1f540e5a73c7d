//go:build linux

package oci

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
)

// unpackLayers pushes an image made of layers, pulls it back and unpacks it into a fresh
// directory, returning the directory and Unpack's error.
func unpackLayers(t *testing.T, layers ...v1.Layer) (string, error) {
	t.Helper()
	reg := newRegistry(t, "", "")
	ref := reg.push(t, "unpack/test:latest", image(t, "amd64", v1.Config{}, layers...))
	p := anonymous(t, Options{})
	img, err := p.Resolve(testCtx(t), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, p.Unpack(testCtx(t), img, dir, nil)
}

func lstat(t *testing.T, p string) *unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return &st
}

func wantAbsent(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists (err %v)", p, err)
	}
}

func TestUnpackMetadata(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test checks ownership and device nodes and must run as root")
	}
	dirTime := time.Date(2019, 1, 2, 3, 4, 5, 0, time.UTC)
	fileTime := time.Date(2020, 6, 7, 8, 9, 10, 0, time.UTC)
	dir, err := unpackLayers(t, layer(t,
		withMtime(dir("etc/", 0o755), dirTime),
		file("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644),
		dir("tmp/", 0o1777),
		dir("root/", 0o700),
		owned(dir("home/app/", 0o750), 1234, 1234),
		owned(withMtime(file("opt/app/data.txt", "fixture-data\n", 0o640), fileTime), 1234, 1234),
		file("bin/busybox", "#!fake\n", 0o755),
		file("usr/bin/su", "su\n", 0o4755),
		file("usr/bin/wall", "wall\n", 0o2755),
		symlink("bin/sh", "busybox"),
		owned(symlink("bin/abs", "/etc/passwd"), 1234, 1234),
		hardlink("bin/busybox-hard", "bin/busybox"),
		withXattr(file("bin/ping", "ping\n", 0o755), "user.vmon", "yes"),
		device("dev/null", tar.TypeChar, 1, 3),
		device("dev/loop9", tar.TypeBlock, 7, 9),
		device("run/fifo", tar.TypeFifo, 0, 0),
	))
	if err != nil {
		t.Fatal(err)
	}

	check := func(rel string, typ uint32, perm uint32, uid, gid uint32) *unix.Stat_t {
		t.Helper()
		st := lstat(t, filepath.Join(dir, rel))
		if st.Mode&unix.S_IFMT != typ || st.Mode&0o7777 != perm || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: mode %o uid %d gid %d, want type %o perm %o uid %d gid %d",
				rel, st.Mode, st.Uid, st.Gid, typ, perm, uid, gid)
		}
		return st
	}
	check("etc", unix.S_IFDIR, 0o755, 0, 0)
	check("tmp", unix.S_IFDIR, 0o1777, 0, 0)
	check("root", unix.S_IFDIR, 0o700, 0, 0)
	check("home/app", unix.S_IFDIR, 0o750, 1234, 1234)
	check("opt", unix.S_IFDIR, 0o755, 0, 0) // implicit parent
	data := check("opt/app/data.txt", unix.S_IFREG, 0o640, 1234, 1234)
	check("usr/bin/su", unix.S_IFREG, 0o4755, 0, 0)
	check("usr/bin/wall", unix.S_IFREG, 0o2755, 0, 0)
	check("bin/sh", unix.S_IFLNK, 0o777, 0, 0)
	check("bin/abs", unix.S_IFLNK, 0o777, 1234, 1234)
	check("dev/null", unix.S_IFCHR, 0o666, 0, 0)
	check("dev/loop9", unix.S_IFBLK, 0o666, 0, 0)
	check("run/fifo", unix.S_IFIFO, 0o666, 0, 0)

	if b, _ := os.ReadFile(filepath.Join(dir, "opt/app/data.txt")); string(b) != "fixture-data\n" {
		t.Errorf("data.txt = %q", b)
	}
	if got := time.Unix(data.Mtim.Unix()); !got.Equal(fileTime) {
		t.Errorf("data.txt mtime %v, want %v", got, fileTime)
	}
	// etc's mtime survives the file created in it afterwards.
	if st := lstat(t, filepath.Join(dir, "etc")); !time.Unix(st.Mtim.Unix()).Equal(dirTime) {
		t.Errorf("etc mtime %v, want %v", time.Unix(st.Mtim.Unix()), dirTime)
	}
	if target, _ := os.Readlink(filepath.Join(dir, "bin/sh")); target != "busybox" {
		t.Errorf("bin/sh -> %q", target)
	}
	if target, _ := os.Readlink(filepath.Join(dir, "bin/abs")); target != "/etc/passwd" {
		t.Errorf("bin/abs -> %q", target)
	}
	a, b := lstat(t, filepath.Join(dir, "bin/busybox")), lstat(t, filepath.Join(dir, "bin/busybox-hard"))
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link: inodes %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	if st := lstat(t, filepath.Join(dir, "dev/null")); unix.Major(st.Rdev) != 1 || unix.Minor(st.Rdev) != 3 {
		t.Errorf("dev/null is %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(filepath.Join(dir, "bin/ping"), "user.vmon", buf)
	if err != nil || string(buf[:n]) != "yes" {
		t.Errorf("xattr user.vmon = %q, %v", buf[:n], err)
	}
}

func TestUnpackProgress(t *testing.T) {
	reg := newRegistry(t, "", "")
	ref := reg.push(t, "progress:latest", image(t, "amd64", v1.Config{},
		layer(t, file("a", "a", 0o644)), layer(t, file("b", strings.Repeat("b", 5000), 0o644))))
	p := anonymous(t, Options{})
	img, err := p.Resolve(testCtx(t), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	if err := p.Unpack(testCtx(t), img, t.TempDir(), func(s string) { lines = append(lines, s) }); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "pulling layer 1/2 sha256:") ||
		!strings.HasPrefix(lines[1], "pulling layer 2/2 sha256:") || !strings.HasSuffix(lines[1], " B)") {
		t.Fatalf("progress lines %q", lines)
	}
}

func TestUnpackWhiteouts(t *testing.T) {
	dir, err := unpackLayers(t,
		layer(t,
			dir("etc/", 0o755),
			file("etc/removed-later", "x", 0o644),
			file("etc/kept", "k", 0o644),
			dir("gone/", 0o755),
			file("gone/deep/file", "x", 0o644),
			file("opt/app/dir-replaced/old.txt", "old", 0o644),
			file("opt/app/dir-replaced/sub/old2.txt", "old", 0o644),
			file("late-opaque/old.txt", "old", 0o644),
			file("replaced-by-file/inner", "x", 0o644),
			file("file-then-dir", "x", 0o644),
		),
		layer(t,
			file("etc/.wh.removed-later", "", 0o644),
			file(".wh.gone", "", 0o644),
			dir("opt/app/dir-replaced/", 0o755),
			file("opt/app/dir-replaced/.wh..wh..opq", "", 0o644),
			file("opt/app/dir-replaced/new.txt", "new", 0o644),
			// The opaque marker hides only lower layers, even when it comes after this
			// layer's own entries.
			file("late-opaque/new.txt", "new", 0o644),
			file("late-opaque/.wh..wh..opq", "", 0o644),
			file("replaced-by-file", "now a file", 0o644),
			dir("file-then-dir/", 0o755),
			file("file-then-dir/inside", "y", 0o644),
			file(".wh.never-existed", "", 0o644),
			file("nodir/.wh.x", "", 0o644),
		),
		layer(t,
			// Re-creating a whited-out path in a later layer works.
			file("etc/removed-later", "back", 0o600),
		),
	)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc/removed-later")); string(b) != "back" {
		t.Errorf("etc/removed-later = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc/kept")); string(b) != "k" {
		t.Errorf("etc/kept = %q", b)
	}
	wantAbsent(t, filepath.Join(dir, "gone"))
	wantAbsent(t, filepath.Join(dir, "opt/app/dir-replaced/old.txt"))
	wantAbsent(t, filepath.Join(dir, "opt/app/dir-replaced/sub"))
	wantAbsent(t, filepath.Join(dir, "opt/app/dir-replaced/.wh..wh..opq"))
	if b, _ := os.ReadFile(filepath.Join(dir, "opt/app/dir-replaced/new.txt")); string(b) != "new" {
		t.Errorf("dir-replaced/new.txt = %q", b)
	}
	wantAbsent(t, filepath.Join(dir, "late-opaque/old.txt"))
	if b, _ := os.ReadFile(filepath.Join(dir, "late-opaque/new.txt")); string(b) != "new" {
		t.Errorf("late-opaque/new.txt = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "replaced-by-file")); string(b) != "now a file" {
		t.Errorf("replaced-by-file = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "file-then-dir/inside")); string(b) != "y" {
		t.Errorf("file-then-dir/inside = %q", b)
	}
	for _, rel := range []string{".wh.never-existed", "nodir/.wh.x", "etc/.wh.removed-later", ".wh.gone"} {
		wantAbsent(t, filepath.Join(dir, rel))
	}
}

func TestUnpackHostileLayers(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Everything the tests might create outside the root if a check failed.
	escapes := []string{
		filepath.Join(outside, "pwned"),
		filepath.Join(outside, "x"),
		filepath.Join(outside, "link"),
		filepath.Join(outside, "sub"),
	}
	assertContained := func(t *testing.T) {
		t.Helper()
		for _, p := range escapes {
			wantAbsent(t, p)
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
			t.Fatalf("victim changed: %q %v", b, err)
		}
		if st := lstat(t, victim); st.Nlink != 1 || st.Mode&0o777 != 0o644 || st.Uid != 0 {
			t.Fatalf("victim metadata changed: nlink %d mode %o uid %d", st.Nlink, st.Mode, st.Uid)
		}
	}
	// rel is outside relative to a root two levels below the test's temp root... but a root
	// made by unpackLayers sits at an unknown depth, so climb far enough to reach "/".
	climb := strings.Repeat("../", 32) + strings.TrimPrefix(outside, "/")

	cases := []struct {
		name     string
		layers   func(t *testing.T) []v1.Layer
		wantErr  bool
		inside   string // a path that must exist inside the root instead
		wantKind errdefs.Kind
	}{
		{
			name:     "dotdot entry",
			layers:   func(t *testing.T) []v1.Layer { return []v1.Layer{layer(t, file(climb+"/x", "x", 0o644))} },
			wantErr:  true,
			wantKind: errdefs.KindInvalidArgument,
		},
		{
			name:     "dotdot in the middle",
			layers:   func(t *testing.T) []v1.Layer { return []v1.Layer{layer(t, file("a/../../x", "x", 0o644))} },
			wantErr:  true,
			wantKind: errdefs.KindInvalidArgument,
		},
		{
			name: "absolute symlink then write through it",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{
					layer(t, symlink("evil", outside)),
					layer(t, file("evil/pwned", "pwned", 0o644)),
				}
			},
			wantErr: true, // the target does not exist inside the root
		},
		{
			name: "absolute symlink to an existing in-root path",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{
					layer(t, dir(strings.TrimPrefix(outside, "/")+"/", 0o755), symlink("evil", outside)),
					layer(t, file("evil/pwned", "pwned", 0o644)),
				}
			},
			inside: strings.TrimPrefix(outside, "/") + "/pwned",
		},
		{
			name: "relative symlink climbing out",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{
					layer(t, dir("tmp/", 0o1777), symlink("up", strings.Repeat("../", 32)+"tmp")),
					layer(t, file("up/pwned", "pwned", 0o644)),
				}
			},
			inside: "tmp/pwned",
		},
		{
			name: "symlink in the same layer",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{layer(t, symlink("evil", outside), file("evil/pwned", "pwned", 0o644))}
			},
			wantErr: true,
		},
		{
			name: "symlink replaced by a file entry",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{
					layer(t, symlink("link", victim)),
					layer(t, file("link", "overwritten", 0o600)),
				}
			},
			inside: "link",
		},
		{
			name: "hard link to a host file",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{layer(t, hardlink("hl", climb+"/victim"))}
			},
			wantErr:  true,
			wantKind: errdefs.KindInvalidArgument,
		},
		{
			name: "hard link through a symlink",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{
					layer(t, symlink("evil", outside)),
					layer(t, hardlink("hl", "evil/victim")),
				}
			},
			wantErr: true,
		},
		{
			name: "whiteout through a symlink",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{
					layer(t, symlink("evil", outside)),
					layer(t, file("evil/.wh.victim", "", 0o644)),
				}
			},
		},
		{
			name: "opaque whiteout through a symlink",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{
					layer(t, symlink("evil", outside)),
					layer(t, file("evil/.wh..wh..opq", "", 0o644)),
				}
			},
			wantErr: true,
		},
		{
			name: "chown and chmod through a symlink",
			layers: func(t *testing.T) []v1.Layer {
				return []v1.Layer{
					layer(t, symlink("link", victim)),
					layer(t, owned(dir("link/", 0o777), 1234, 1234)),
				}
			},
			inside: "link",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := unpackLayers(t, tc.layers(t)...)
			t.Logf("Unpack: %v", err)
			assertContained(t)
			if tc.wantErr && err == nil {
				t.Fatal("want an error")
			}
			if !tc.wantErr && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantKind != errdefs.KindUnknown {
				wantKind(t, err, tc.wantKind)
			}
			if tc.inside != "" {
				if _, err := os.Lstat(filepath.Join(dir, tc.inside)); err != nil {
					t.Fatalf("want %s inside the root: %v", tc.inside, err)
				}
			}
		})
	}
}

func TestUnpackRequiresEmptyDir(t *testing.T) {
	reg := newRegistry(t, "", "")
	ref := reg.push(t, "e:1", image(t, "amd64", v1.Config{}, layer(t, file("a", "a", 0o644))))
	p := anonymous(t, Options{})
	img, err := p.Resolve(testCtx(t), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "existing"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.Unpack(testCtx(t), img, dir, nil); err == nil {
		t.Fatal("Unpack into a non-empty dir succeeded")
	}
	if err := p.Unpack(testCtx(t), img, filepath.Join(dir, "missing"), nil); err == nil {
		t.Fatal("Unpack into a missing dir succeeded")
	}
	if err := p.Unpack(testCtx(t), &Image{}, t.TempDir(), nil); err == nil {
		t.Fatal("Unpack of an unresolved image succeeded")
	}
}

func TestUnpackDotSlashNames(t *testing.T) {
	// Some builders write every name with a "./" prefix and include the root itself.
	dir, err := unpackLayers(t, layer(t,
		dir("./", 0o711),
		dir("./etc/", 0o700),
		file("./etc/hostname", "box\n", 0o644),
		symlink("./link", "./etc/hostname"),
	))
	if err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, dir); st.Mode&0o7777 != 0o711 || !time.Unix(st.Mtim.Unix()).Equal(epoch) {
		t.Errorf("root: mode %o mtime %v", st.Mode&0o7777, time.Unix(st.Mtim.Unix()))
	}
	if st := lstat(t, filepath.Join(dir, "etc")); st.Mode&0o7777 != 0o700 {
		t.Errorf("etc mode %o", st.Mode&0o7777)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "link")); err != nil || string(b) != "box\n" {
		t.Errorf("link: %q %v", b, err)
	}
}

func TestHumanSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.0 kB", 12_345_678: "12.3 MB", 3_200_000_000: "3.2 GB"} {
		if got := humanSize(n); got != want {
			t.Errorf("humanSize(%d) = %q, want %q", n, got, want)
		}
	}
}
