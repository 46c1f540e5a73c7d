package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
)

// loopDevices lists the loop devices bound to files under dir.
func loopDevices(t *testing.T, dir string) []string {
	t.Helper()
	ents, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range ents {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir) {
			out = append(out, f)
		}
	}
	return out
}

// A disk-limited sandbox writes until its disk is full and gets ENOSPC; its statfs is its own
// disk; deleting files gives the host its blocks back; Release leaves no mount, loop device or
// image.
func TestDiskLimit(t *testing.T) {
	requireRoot(t)
	if err := DiskSupported(); err != nil {
		t.Fatalf("this host cannot run disk-limited sandboxes: %v", err)
	}
	ctx := context.Background()
	base := t.TempDir()
	lower := filepath.Join(base, "template")
	sandbox := filepath.Join(base, "sandbox")
	if err := os.MkdirAll(filepath.Join(lower, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A template file larger than the disk: the lower layer does not count against it.
	if err := os.WriteFile(filepath.Join(lower, "etc", "big"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	const size = 96 << 20
	root, err := Prepare(ctx, []string{lower}, sandbox, Options{DiskBytes: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Release(context.Background(), sandbox) })
	if !IsDiskLimited(sandbox) {
		t.Fatal("IsDiskLimited = false for a disk-limited sandbox")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	total := int64(st.Blocks) * st.Bsize
	if total > size || total < size*3/4 {
		t.Fatalf("statfs of the root says %d bytes, want about the disk's %d", total, size)
	}
	if _, err := os.ReadFile(filepath.Join(root, "etc", "big")); err != nil {
		t.Fatalf("template file not visible: %v", err)
	}

	// Fill the disk: the write fails with ENOSPC before the image grows past its size.
	f, err := os.Create(filepath.Join(root, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	var written int64
	for written <= size {
		n, err := f.Write(chunk)
		written += int64(n)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write after %d bytes: %v, want ENOSPC", written, err)
			}
			break
		}
	}
	f.Close()
	if written > size {
		t.Fatalf("wrote %d bytes to a %d-byte disk", written, size)
	}
	var img unix.Stat_t
	if err := unix.Stat(diskImage(sandbox), &img); err != nil {
		t.Fatal(err)
	}
	if used := img.Blocks * 512; used > size {
		t.Fatalf("the image uses %d bytes of host disk, over its size %d", used, size)
	}
	// Deleting gives the blocks back to the host (discard punches them out of the image).
	if err := os.Remove(filepath.Join(root, "fill")); err != nil {
		t.Fatal(err)
	}
	// ext4 discards freed blocks after the transaction that freed them commits.
	deadline := time.Now().Add(30 * time.Second)
	for {
		unix.Sync()
		if err := unix.Stat(diskImage(sandbox), &img); err != nil {
			t.Fatal(err)
		}
		if img.Blocks*512 <= size/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after deleting, the image still uses %d bytes of host disk", img.Blocks*512)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if len(loopDevices(t, base)) != 1 {
		t.Fatalf("want one loop device for the sandbox, have %v", loopDevices(t, base))
	}
	if err := Release(ctx, sandbox); err != nil {
		t.Fatal(err)
	}
	if err := Release(ctx, sandbox); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if d := loopDevices(t, base); len(d) != 0 {
		t.Fatalf("loop devices left after Release: %v", d)
	}
	for _, p := range []string{diskImage(sandbox), diskDir(sandbox), RootDir(sandbox)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left after Release: %v", p, err)
		}
	}
}

func TestDiskTooSmall(t *testing.T) {
	base := t.TempDir()
	for _, size := range []int64{-1, 1, MinDiskBytes - 1} {
		_, err := Prepare(context.Background(), []string{filepath.Join(base, "t")}, filepath.Join(base, "s"), Options{DiskBytes: size})
		if !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("disk of %d bytes: %v, want InvalidArgument", size, err)
		}
	}
}
