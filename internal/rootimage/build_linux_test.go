package rootimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// layers makes a two-layer template: the top layer deletes one of the bottom layer's files (an
// overlay whiteout) and has /opt as an absolute symlink to /srv, which the build must
// resolve inside the image and never on the host.
func layers(t *testing.T) (top, bottom string) {
	return layersIn(t, t.TempDir(), false)
}

// layerTime is every layer entry's mtime, as a template pulled from the artifact store keeps them.
var layerTime = time.Unix(1700000000, 0)

// layersIn makes the layers under base; reverse creates every directory's entries in the
// opposite order, so that a filesystem listing them in creation order lists them the other way.
func layersIn(t *testing.T, base string, reverse bool) (top, bottom string) {
	t.Helper()
	if _, err := os.Lstat("/srv/vmon"); err == nil {
		t.Fatal("/srv/vmon exists on the host: the test cannot tell whether the build wrote there")
	}
	bottom, top = filepath.Join(base, "bottom"), filepath.Join(base, "top")
	steps := []func() error{
		func() error { return os.MkdirAll(filepath.Join(bottom, "etc"), 0o755) },
		func() error { return os.MkdirAll(filepath.Join(bottom, "bin"), 0o755) },
		func() error { return os.MkdirAll(filepath.Join(bottom, "srv"), 0o755) },
		func() error { return os.MkdirAll(filepath.Join(top, "etc"), 0o755) },
	}
	write := func(p, s string) func() error {
		return func() error { return os.WriteFile(p, []byte(s), 0o644) }
	}
	files := []func() error{
		write(filepath.Join(bottom, "etc", "kept"), "kept\n"),
		write(filepath.Join(bottom, "etc", "gone"), "gone\n"),
		write(filepath.Join(bottom, "bin", "bash"), "#!fake\n"),
		write(filepath.Join(top, "etc", "top"), "top\n"),
		func() error { return unix.Mknod(filepath.Join(top, "etc", "gone"), unix.S_IFCHR, 0) },
		func() error { return os.Symlink("/srv", filepath.Join(bottom, "opt")) },
	}
	if reverse {
		slices.Reverse(files)
	}
	for _, f := range append(steps, files...) {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{top, bottom} {
		err := filepath.WalkDir(l, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			ts := unix.NsecToTimespec(layerTime.UnixNano())
			return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return top, bottom
}

func mountImage(t *testing.T, img string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "erofs", "-o", "ro,loop", img, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount the image: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestBuild builds an image from layers and an envd build and mounts it as the kernel sees it.
func TestBuild(t *testing.T) {
	top, bottom := layers(t)
	envd := t.TempDir()
	if err := os.WriteFile(filepath.Join(envd, "envd"), []byte("envd binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "images")
	s, err := New(Options{Dir: dir, DataDir: filepath.Dir(dir), GuestBinDir: "/opt/vmon/bin"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	img, err := s.Build(context.Background(), []string{top, bottom}, envd)
	if err != nil {
		t.Fatal(err)
	}
	if !img.Bash {
		t.Error("the image has /bin/bash but its record says not")
	}
	if _, err := os.Lstat("/srv/vmon"); err == nil {
		_ = os.RemoveAll("/srv/vmon")
		t.Fatal("the build wrote through the template's /opt symlink onto the host's /srv")
	}
	root := mountImage(t, img.Path)
	for p, want := range map[string]string{"etc/kept": "kept\n", "etc/top": "top\n", "srv/vmon/bin/envd": "envd binary"} {
		got, err := os.ReadFile(filepath.Join(root, p))
		if err != nil || string(got) != want {
			t.Errorf("%s in the image: %q, %v; want %q", p, got, err, want)
		}
	}
	fi, err := os.Stat(filepath.Join(root, "srv/vmon/bin/envd"))
	if err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("envd in the image: %v, %v; want mode 0555", fi, err)
	}
	// What the build added and the directories it added to carry the template's times, not the
	// build's.
	for _, p := range []string{".", "srv", "srv/vmon", "srv/vmon/bin", "srv/vmon/bin/envd", "tmp", keepFile, "etc"} {
		if fi, err := os.Lstat(filepath.Join(root, p)); err != nil || !fi.ModTime().Equal(layerTime) {
			t.Errorf("/%s in the image: mtime %v, %v; want the template's %v", p, fi.ModTime(), err, layerTime)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "etc", "gone")); !os.IsNotExist(err) {
		t.Errorf("a file the top layer deleted is in the image: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp in the image: %v, %v; want a sticky 0777 directory", fi, err)
	}
	if _, err := os.Stat(filepath.Join(root, keepFile)); err != nil {
		t.Errorf("/tmp in the image holds no file: %v", err)
	}
	// Nothing of the build is left but the image and its record.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("the images dir holds %d entries; want the image and its record", len(ents))
	}
}

// TestReproducible: two nodes whose data directories differ, whose filesystems list the
// template's directories in different orders and whose envd builds were written at different
// times build the same image, byte for byte, under the same key. A third keeps the layers
// elsewhere in its data directory (as a node that fetched the template rather than built it):
// its key differs, its bytes do not.
func TestReproducible(t *testing.T) {
	var digests, keys, sums []string
	for i, reverse := range []bool{false, true, false} {
		layersDir := "templates"
		if i == 2 {
			layersDir = "layers"
		}
		data := t.TempDir()
		if reverse { // a tmpfs lists a directory newest first, ext4 by hash
			if err := unix.Mount("tmpfs", data, "tmpfs", 0, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(data, unix.MNT_DETACH) })
		}
		top, bottom := layersIn(t, filepath.Join(data, layersDir), reverse)
		envd := filepath.Join(data, "envd", "abc")
		if err := os.MkdirAll(envd, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(envd, "envd"), []byte("envd binary"), 0o755); err != nil {
			t.Fatal(err)
		}
		written := time.Now().Add(time.Duration(i) * -time.Hour)
		if err := os.Chtimes(filepath.Join(envd, "envd"), written, written); err != nil {
			t.Fatal(err)
		}
		s, err := New(Options{Dir: filepath.Join(data, "root-images"), DataDir: data, GuestBinDir: "/opt/vmon/bin"})
		if err != nil {
			t.Fatal(err)
		}
		img, err := s.Build(context.Background(), []string{top, bottom}, envd)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(img.Path)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		digests, keys, sums = append(digests, img.Digest), append(keys, filepath.Base(img.Path)), append(sums, "sha256:"+hex.EncodeToString(sum[:]))
		if i == 0 {
			time.Sleep(1100 * time.Millisecond) // a build time in seconds would differ
		}
	}
	if keys[0] != keys[1] || keys[2] == keys[0] {
		t.Errorf("the same template and envd build are keyed %v; want the first two equal, the third (layers elsewhere) not", keys)
	}
	if !slices.Equal(digests, sums) {
		t.Errorf("the records' digests %v are not the images' %v", digests, sums)
	}
	if sums[0] != sums[1] || sums[0] != sums[2] {
		t.Errorf("builds of one template differ: %v", sums)
	}
}

// TestLookup: a missing image is built in the background, handed out once ready, found again by
// a new store, and swept when unwanted.
func TestLookup(t *testing.T) {
	top, bottom := layers(t)
	envd := t.TempDir()
	if err := os.WriteFile(filepath.Join(envd, "envd"), []byte("e"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "images")
	// An interrupted build's leftovers go when the store opens.
	if err := os.MkdirAll(filepath.Join(dir, buildPrefix+"x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "orphan.erofs"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Dir: dir, DataDir: filepath.Dir(dir), GuestBinDir: "/opt/vmon/bin"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("left after open: %v", ents)
	}
	lowers := []string{top, bottom}
	if _, ok := s.Lookup(lowers, envd); ok {
		t.Fatal("an image that was never built is ready")
	}
	var img Image
	for deadline := time.Now().Add(time.Minute); ; {
		var ok bool
		if img, ok = s.Lookup(lowers, envd); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the image was not built in the background within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if img.Path != filepath.Join(dir, s.Key(lowers, envd)+".erofs") {
		t.Fatalf("image path %s", img.Path)
	}
	s2, err := New(Options{Dir: dir, DataDir: filepath.Dir(dir), GuestBinDir: "/opt/vmon/bin"})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got, ok := s2.Lookup(lowers, envd); !ok || got.Path != img.Path || !got.Bash {
		t.Fatalf("a new store's lookup: %+v, %v", got, ok)
	}
	if _, ok := s2.Lookup([]string{bottom}, envd); ok {
		t.Fatal("another layer stack got the same image")
	}
	if err := s2.Sweep(func(Image) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img.Path); err != nil {
		t.Fatalf("a kept image was swept: %v", err)
	}
	s2.Close() // its background build of the other stack is done or cancelled
	if err := s2.Sweep(func(i Image) bool { return i.Path != img.Path }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img.Path); !os.IsNotExist(err) {
		t.Fatalf("an unwanted image was kept: %v", err)
	}
	if _, ok := s2.Lookup(lowers, envd); ok {
		t.Fatal("a swept image is still handed out")
	}
}

// TestForRestore: a checkpoint's image is handed out when it is there and built again when it is
// not (the same bytes); an image another key would build, or one from elsewhere, is not built.
func TestForRestore(t *testing.T) {
	data := t.TempDir()
	top, bottom := layersIn(t, filepath.Join(data, "templates"), false)
	envd := filepath.Join(data, "envd", "abc")
	if err := os.MkdirAll(envd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(envd, "envd"), []byte("e"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(data, "root-images")
	s, err := New(Options{Dir: dir, DataDir: data, GuestBinDir: "/opt/vmon/bin"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	lowers := []string{top, bottom}
	built, err := s.Build(ctx, lowers, envd)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.ForRestore(ctx, built.Path, lowers, envd); err != nil || got.Digest != built.Digest || !got.Bash {
		t.Fatalf("an image that is there: %+v, %v", got, err)
	}
	// Gone, as on a node the paused sandbox moved to.
	if err := os.Remove(strings.TrimSuffix(built.Path, ".erofs") + ".json"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(built.Path); err != nil {
		t.Fatal(err)
	}
	again, err := s.ForRestore(ctx, built.Path, lowers, envd)
	if err != nil || again.Path != built.Path || again.Digest != built.Digest {
		t.Fatalf("rebuilt: %+v, %v; want %s with digest %s", again, err, built.Path, built.Digest)
	}
	// Named by another key (a node that keeps the layers elsewhere): this node's image of the
	// layers, for the caller to compare digests; nothing is made under the other name.
	other, err := s.ForRestore(ctx, filepath.Join(dir, "0123abcd.erofs"), lowers, envd)
	if err != nil || other.Path != built.Path || other.Digest != built.Digest {
		t.Fatalf("an image named by another key: %+v, %v; want this node's %s", other, err, built.Path)
	}
	if _, err := os.Stat(filepath.Join(dir, "0123abcd.erofs")); !os.IsNotExist(err) {
		t.Fatalf("an image of another key was made: %v", err)
	}
	if _, err := s.ForRestore(ctx, filepath.Join(data, "elsewhere.erofs"), lowers, envd); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing image outside the store: %v", err)
	}
}
