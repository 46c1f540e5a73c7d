package rootimage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// layers makes a two-layer template: the top layer deletes one of the bottom layer's files (an
// overlay whiteout) and has /opt as an absolute symlink to /srv, which the build must
// resolve inside the image and never on the host.
func layers(t *testing.T) (top, bottom string) {
	t.Helper()
	if _, err := os.Lstat("/srv/vmon"); err == nil {
		t.Fatal("/srv/vmon exists on the host: the test cannot tell whether the build wrote there")
	}
	base := t.TempDir()
	bottom, top = filepath.Join(base, "bottom"), filepath.Join(base, "top")
	for _, d := range []string{filepath.Join(bottom, "etc"), filepath.Join(bottom, "bin"), filepath.Join(bottom, "srv"),
		filepath.Join(top, "etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(bottom, "etc", "kept"), "kept\n")
	write(filepath.Join(bottom, "etc", "gone"), "gone\n")
	write(filepath.Join(bottom, "bin", "bash"), "#!fake\n")
	write(filepath.Join(top, "etc", "top"), "top\n")
	if err := unix.Mknod(filepath.Join(top, "etc", "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/srv", filepath.Join(bottom, "opt")); err != nil {
		t.Fatal(err)
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
	s, err := New(Options{Dir: dir, GuestBinDir: "/opt/vmon/bin"})
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
	s, err := New(Options{Dir: dir, GuestBinDir: "/opt/vmon/bin"})
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
	if img.Path != filepath.Join(dir, Key(lowers, envd)+".erofs") {
		t.Fatalf("image path %s", img.Path)
	}
	s2, err := New(Options{Dir: dir, GuestBinDir: "/opt/vmon/bin"})
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
