package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts overlayfs and must run as root (CI runs it as root)")
	}
}

func TestPrepareRelease(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	lower := filepath.Join(base, "template")
	sandbox := filepath.Join(base, "sandbox")
	if err := os.MkdirAll(filepath.Join(lower, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "etc", "hostname"), []byte("template\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(lower, 0o755); err != nil {
		t.Fatal(err)
	}

	root, err := Prepare(ctx, []string{lower}, sandbox, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Release(context.Background(), sandbox) })
	if root != RootDir(sandbox) {
		t.Fatalf("root = %s, want %s", root, RootDir(sandbox))
	}
	if ok, err := Mounted(root); err != nil || !ok {
		t.Fatalf("Mounted(root) = %v, %v", ok, err)
	}
	if ok, err := LowerInUse(lower); err != nil || !ok {
		t.Fatalf("LowerInUse(lower) = %v, %v", ok, err)
	}
	st, err := os.Stat(root)
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("merged root mode = %v, %v; want the template's 0755", st.Mode(), err)
	}

	// A second Prepare (recovery) returns the existing mount.
	if again, err := Prepare(ctx, []string{lower}, sandbox, Options{}); err != nil || again != root {
		t.Fatalf("second Prepare = %q, %v", again, err)
	}

	// Writes, overwrites and deletes land in the upper layer; the template is unchanged.
	if err := os.WriteFile(filepath.Join(root, "new.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("sandbox\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	upper := UpperDir(sandbox)
	if b, err := os.ReadFile(filepath.Join(upper, "new.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("upper new.txt = %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "etc", "hostname")); err != nil || string(b) != "sandbox\n" {
		t.Fatalf("upper etc/hostname = %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(lower, "etc", "hostname")); err != nil || string(b) != "template\n" {
		t.Fatalf("lower etc/hostname changed: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(lower, "new.txt")); !os.IsNotExist(err) {
		t.Fatalf("new.txt leaked into the template: %v", err)
	}
	if err := os.Remove(filepath.Join(root, "etc", "hostname")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(lower, "etc", "hostname")); err != nil {
		t.Fatalf("delete in sandbox removed the template's file: %v", err)
	}

	// Keep the mount busy so Release has to detach lazily.
	busy, err := os.Open(filepath.Join(root, "new.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if err := Release(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	if ok, err := Mounted(root); err != nil || ok {
		t.Fatalf("still mounted after Release: %v, %v", ok, err)
	}
	for _, d := range []string{root, upper, filepath.Join(sandbox, "work")} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("%s left behind: %v", d, err)
		}
	}
	if _, err := os.Stat(sandbox); err != nil {
		t.Fatalf("Release removed the sandbox dir the node owns: %v", err)
	}
	if err := Release(ctx, sandbox); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(lower, "etc", "hostname")); err != nil || string(b) != "template\n" {
		t.Fatalf("template changed by Release: %q, %v", b, err)
	}
}

func TestPrepareMissingTemplate(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	sandbox := filepath.Join(base, "sandbox")
	if _, err := Prepare(context.Background(), []string{filepath.Join(base, "missing")}, sandbox, Options{DiskBytes: MinDiskBytes}); err == nil {
		t.Fatal("Prepare over a missing template succeeded")
	}
	if _, err := os.Stat(RootDir(sandbox)); !os.IsNotExist(err) {
		t.Fatalf("failed Prepare left %s: %v", RootDir(sandbox), err)
	}
}

// TestRemoveTree checks that a tree with a mount inside (what a crashed template build leaves) is
// removed without deleting anything through the mount.
func TestRemoveTree(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	tree := filepath.Join(base, "tree")
	mnt := filepath.Join(tree, "dev")
	for _, d := range []string{outside, mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	precious := filepath.Join(outside, "precious")
	if err := os.WriteFile(precious, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(outside, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := RemoveTree(tree); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tree); !os.IsNotExist(err) {
		t.Fatalf("tree left: %v", err)
	}
	if _, err := os.Stat(precious); err != nil {
		t.Fatalf("RemoveTree deleted through a mount: %v", err)
	}
	if err := RemoveTree(tree); err != nil {
		t.Fatalf("RemoveTree of a missing dir: %v", err)
	}
}

// A committed upper layer stacks on top of the layers it was written over, the way template
// builds chain their steps: its files and its deletions both show in the next sandbox.
func TestCommitStacksLayers(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	bottom, middle := filepath.Join(base, "l0"), filepath.Join(base, "l1")
	for _, f := range []struct{ dir, name, body string }{
		{bottom, "a.txt", "a from l0"}, {bottom, "b.txt", "b from l0"}, {middle, "b.txt", "b from l1"},
	} {
		if err := os.MkdirAll(f.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(f.dir, f.name), []byte(f.body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	step := filepath.Join(base, "step")
	root, err := Prepare(ctx, []string{middle, bottom}, step, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Release(context.Background(), step) })
	if b, err := os.ReadFile(filepath.Join(root, "b.txt")); err != nil || string(b) != "b from l1" {
		t.Fatalf("b.txt = %q, %v; want the upper lower's copy", b, err)
	}
	if err := os.Remove(filepath.Join(root, "a.txt")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "c.txt"), []byte("c from step"), 0o644); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(base, "l2")
	if err := Commit(ctx, step, layer); err != nil {
		t.Fatal(err)
	}
	if err := Release(ctx, step); err != nil {
		t.Fatal(err)
	}

	sb := filepath.Join(base, "sandbox")
	root, err = Prepare(ctx, []string{layer, middle, bottom}, sb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Release(context.Background(), sb) })
	if _, err := os.Stat(filepath.Join(root, "a.txt")); !os.IsNotExist(err) {
		t.Fatalf("a.txt deleted by the committed step is visible: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "c.txt")); err != nil || string(b) != "c from step" {
		t.Fatalf("c.txt = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(bottom, "a.txt")); err != nil {
		t.Fatalf("the bottom layer was modified: %v", err)
	}
}

// The host side of everything a guest writes is nosuid,nodev: the merged root, with and without
// a disk of its own, and the disk's filesystem. A setuid file or device node a guest leaves there
// must mean nothing to the host.
func TestGuestWritableMountsAreNosuidNodev(t *testing.T) {
	requireRoot(t)
	for _, diskBytes := range []int64{0, MinDiskBytes} {
		base := t.TempDir()
		lower := filepath.Join(base, "template")
		sandbox := filepath.Join(base, "sandbox")
		if err := os.MkdirAll(lower, 0o755); err != nil {
			t.Fatal(err)
		}
		root, err := Prepare(context.Background(), []string{lower}, sandbox, Options{DiskBytes: diskBytes})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = Release(context.Background(), sandbox) })
		mounts := []string{root}
		if diskBytes > 0 {
			mounts = append(mounts, diskDir(sandbox))
		}
		for _, m := range mounts {
			var st unix.Statfs_t
			if err := unix.Statfs(m, &st); err != nil {
				t.Fatal(err)
			}
			if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
				t.Errorf("disk %d: %s has mount flags %#x, want nosuid and nodev", diskBytes, m, st.Flags)
			}
		}
	}
}
