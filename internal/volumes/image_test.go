package volumes

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
)

// backingLoops lists the loop devices bound to img.
func backingLoops(t *testing.T, img string) []string {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == img {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return out
}

func statfs(t *testing.T, p string) unix.Statfs_t {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A volume is a filesystem of its size: writes past it fail with ENOSPC (through the content
// API as 507), the image on the host's disk never holds more than the size, statfs (the guest's
// df) reports the size, and the host mount is nosuid,nodev. Delete leaves no mount, loop device,
// directory or image.
func TestVolumeIsASizedFilesystem(t *testing.T) {
	d := newDir(t)
	const sizeMB = 80
	if err := d.Create(context.Background(), "v1", sizeMB); err != nil {
		t.Fatal(err)
	}
	p, _ := d.Path("v1")
	img := d.image("v1")
	if got, err := d.SizeBytes("v1"); err != nil || got != sizeMB<<20 {
		t.Fatalf("SizeBytes = %d, %v", got, err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("volume root = %v, %v; want 1777 like /tmp", fi.Mode(), err)
	}
	if ents, _ := os.ReadDir(p); len(ents) != 0 {
		t.Fatalf("a new volume holds %v", ents)
	}
	st := statfs(t, p)
	if total := int64(st.Blocks) * st.Bsize; total > sizeMB<<20 || total < (sizeMB-16)<<20 {
		t.Fatalf("statfs size = %d bytes, want about %d MiB", total, sizeMB)
	}
	if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
		t.Fatalf("volume mount flags = %#x, want nosuid and nodev", st.Flags)
	}

	// Fill it from the host side as a guest would.
	f, err := os.Create(filepath.Join(p, "big"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{0xa5}, 1<<20)
	var werr error
	for i := 0; i < 2*sizeMB && werr == nil; i++ {
		_, werr = f.Write(chunk)
	}
	if werr == nil {
		werr = f.Sync()
	}
	f.Close()
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing twice the size: %v, want ENOSPC", werr)
	}
	var ist unix.Stat_t
	if err := unix.Stat(img, &ist); err != nil {
		t.Fatal(err)
	}
	if used := ist.Blocks * 512; used > (sizeMB+1)<<20 { // +1 MiB: the host filesystem's own extent blocks
		t.Fatalf("the image holds %d bytes of the host's disk, more than its %d MiB", used, sizeMB)
	}
	if _, err := d.Write("v1", "/more", bytes.NewReader(chunk), Attrs{}, false); !errdefs.Is(err, errdefs.KindInsufficientStorage) {
		t.Fatalf("upload into a full volume = %v, want InsufficientStorage", err)
	}

	// A setuid root program and a device node mean nothing to the host.
	if err := os.Remove(filepath.Join(p, "big")); err != nil {
		t.Fatal(err)
	}
	if euid := runSetuidCopy(t, filepath.Join(p, "id")); euid != "65534" {
		t.Fatalf("a setuid root program on the volume ran with euid %s for uid 65534 (want 65534: nosuid)", euid)
	}
	if err := unix.Mknod(filepath.Join(p, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Open(filepath.Join(p, "null")); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("opening a device node on the volume = %v, want EACCES (nodev)", err)
	}

	if err := d.Delete("v1"); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{p, img} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Fatalf("%s left after Delete: %v", gone, err)
		}
	}
	if loops := backingLoops(t, img); len(loops) != 0 {
		t.Fatalf("loop devices left after Delete: %v", loops)
	}
}

// runSetuidCopy copies the host's id(1) to dst as a setuid root program and runs it as uid 65534,
// returning the effective uid it reports. It runs through /proc/self/fd, so the directories above
// dst need not be open to that uid.
func runSetuidCopy(t *testing.T, dst string) string {
	t.Helper()
	src, err := exec.LookPath("id")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dst, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("/proc/self/fd/3", "-u")
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("run the setuid copy: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// Sizes outside the node's bounds are InvalidArgument; 0 is the node's default; a node's own
// bounds are checked when it starts.
func TestVolumeSizes(t *testing.T) {
	d := newDir(t)
	for _, bad := range []int{-1, 1, MinSizeMB - 1, 1025} {
		if _, err := d.SizeMB(bad); !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("SizeMB(%d) = %v, want InvalidArgument", bad, err)
		}
		if err := d.Create(context.Background(), "bad", bad); !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("Create of %d MiB = %v, want InvalidArgument", bad, err)
		}
	}
	if ids, _ := d.IDs(); len(ids) != 0 {
		t.Fatalf("refused creates left %v", ids)
	}
	if got, err := d.SizeMB(0); err != nil || got != MinSizeMB {
		t.Fatalf("SizeMB(0) = %d, %v; want the default", got, err)
	}
	for _, o := range []Options{{DefaultSizeMB: 2048, MaxSizeMB: 1024}, {DefaultSizeMB: 1}, {MaxSizeMB: MaxSizeMB + 1}} {
		if _, err := New(t.TempDir(), o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// After a restart (or a reboot) the volume's filesystem is mounted again where it was, with its
// files; a filesystem still held elsewhere (a sandbox's mount namespace) is mounted from the
// same loop device, never a second time from the image.
func TestVolumeMountsAgain(t *testing.T) {
	d := newDir(t)
	if err := d.Create(context.Background(), "v1", 0); err != nil {
		t.Fatal(err)
	}
	p, _ := d.Path("v1")
	img := d.image("v1")
	if err := os.WriteFile(filepath.Join(p, "kept"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	unmount := func() {
		t.Helper()
		if err := unix.Unmount(p, 0); err != nil {
			t.Fatal(err)
		}
	}

	// A reboot: nothing is mounted; a new Dir mounts it on first use (the content API).
	unmount()
	d2, err := New(filepath.Dir(d.root), d.opts)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(p, "kept")); err == nil {
		t.Fatalf("the file is readable with the volume unmounted: %q", b)
	}
	if e, err := d2.Stat("v1", "/kept"); err != nil || e.Size != 4 {
		t.Fatalf("stat after remount = %+v, %v", e, err)
	}

	// Held elsewhere: a bind of the volume's filesystem outlives the unmount of its directory.
	holder := t.TempDir()
	if err := unix.Mount(p, holder, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(holder, unix.MNT_DETACH)
	unmount()
	before := backingLoops(t, img)
	if len(before) != 1 {
		t.Fatalf("loop devices of a held volume: %v", before)
	}
	d3, err := New(filepath.Dir(d.root), d.opts)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := d3.Mount("v1"); err != nil || got != p {
		t.Fatalf("Mount = %q, %v", got, err)
	}
	if after := backingLoops(t, img); len(after) != 1 || after[0] != before[0] {
		t.Fatalf("loop devices after mounting a held volume again: %v, before %v", after, before)
	}
	if err := os.WriteFile(filepath.Join(p, "new"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(holder, "new")); err != nil {
		t.Fatalf("the holder does not see a write through the remount (two filesystems?): %v", err)
	}
	if err := unix.Unmount(holder, 0); err != nil {
		t.Fatal(err)
	}
	if err := d3.Delete("v1"); err != nil {
		t.Fatal(err)
	}
}

// A volume made by an older vmon (a plain directory, no image) keeps its files, has no size, and
// is still nosuid,nodev on the host.
func TestOlderVolumeKeepsItsFiles(t *testing.T) {
	d := newDir(t)
	p, _ := d.Path("old1")
	if err := os.MkdirAll(p, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "kept"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.MountAll(); err != nil {
		t.Fatal(err)
	}
	f, _, err := d.Open("old1", "/kept")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if size, err := d.SizeBytes("old1"); err != nil || size != 0 {
		t.Fatalf("SizeBytes of an older volume = %d, %v", size, err)
	}
	if st := statfs(t, p); st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
		t.Fatalf("older volume's flags = %#x, want nosuid and nodev", st.Flags)
	}
	if err := d.Delete("old1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("older volume left after Delete: %v", err)
	}
}

// IDs finds what a crash during Create leaves (an image without its directory), so the orphan
// sweep at start removes it.
func TestIDsFindLoneImages(t *testing.T) {
	d := newDir(t)
	if err := os.WriteFile(d.image("lone"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(d.root, "both"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.image("both"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ids, err := d.IDs()
	if err != nil || strings.Join(ids, ",") != "both,lone" {
		t.Fatalf("IDs = %v, %v", ids, err)
	}
	for _, id := range ids {
		if err := d.Delete(id); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(d.root); len(ents) != 0 {
		t.Fatalf("left after Delete: %v", ents)
	}
}
