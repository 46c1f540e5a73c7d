package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
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
	images := t.TempDir()
	t.Run("formatted per sandbox", func(t *testing.T) { testDiskLimit(t, "") })
	// Twice from the same formatted image: the second copy must be as good as the first.
	t.Run("copied from a formatted image", func(t *testing.T) { testDiskLimit(t, images) })
	t.Run("copied again", func(t *testing.T) { testDiskLimit(t, images) })
	if n, _ := filepath.Glob(filepath.Join(images, "*.img")); len(n) != 1 {
		t.Fatalf("formatted images kept: %v", n)
	}
}

func testDiskLimit(t *testing.T, imageDir string) {
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
	root, err := Prepare(ctx, []string{lower}, sandbox, Options{DiskBytes: size, ImageDir: imageDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Release(context.Background(), sandbox) })
	if _, err := os.Stat(diskImage(sandbox)); err != nil {
		t.Fatalf("no disk image for a disk-limited sandbox: %v", err)
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

// BenchmarkPrepareRelease measures what a disk limit adds to a sandbox's root: each iteration
// prepares and releases one root without a disk limit and one with a 10 GiB disk, alternating,
// and reports both (ms per prepare+release) and the host disk an idle disk image takes.
//
//	sudo go test ./internal/rootfs -run '^$' -bench PrepareRelease -benchtime 50x
func BenchmarkPrepareRelease(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("needs root (overlay and loop mounts)")
	}
	ctx := context.Background()
	base := b.TempDir()
	lower := filepath.Join(base, "template")
	if err := os.MkdirAll(filepath.Join(lower, "etc"), 0o755); err != nil {
		b.Fatal(err)
	}
	var plain, disk, prepDisk, prepPlain time.Duration
	var imageBytes int64
	for i := 0; b.Loop(); i++ {
		for _, size := range []int64{0, 10 << 30} {
			dir := filepath.Join(base, fmt.Sprintf("sb%d-%d", i, size))
			start := time.Now()
			_, err := Prepare(ctx, []string{lower}, dir, Options{DiskBytes: size, ImageDir: filepath.Join(base, "images")})
			if err != nil {
				b.Fatal(err)
			}
			if size == 0 {
				prepPlain += time.Since(start)
			} else {
				prepDisk += time.Since(start)
			}
			if size > 0 {
				var st unix.Stat_t
				if err := unix.Stat(diskImage(dir), &st); err == nil {
					imageBytes += st.Blocks * 512
				}
			}
			if err := Release(ctx, dir); err != nil {
				b.Fatal(err)
			}
			if size == 0 {
				plain += time.Since(start)
			} else {
				disk += time.Since(start)
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(prepPlain.Microseconds())/1000/n, "ms/prepare-no-disk")
	b.ReportMetric(float64(prepDisk.Microseconds())/1000/n, "ms/prepare-10GiB-disk")
	b.ReportMetric(float64(plain.Microseconds())/1000/n, "ms/prepare+release-no-disk")
	b.ReportMetric(float64(disk.Microseconds())/1000/n, "ms/prepare+release-10GiB-disk")
	b.ReportMetric(float64(imageBytes)/n/(1<<20), "MiB-host-disk/idle-image")
}

// A stashed layer comes back with what the sandbox wrote, moved (pause/resume) or copied
// (snapshots: the saved layer stays for the next copy), with a disk image and without one.
func TestStashAndBringBack(t *testing.T) {
	requireRoot(t)
	for _, disk := range []int64{0, 96 << 20} {
		t.Run(fmt.Sprintf("disk=%d", disk), func(t *testing.T) {
			ctx := context.Background()
			base := t.TempDir()
			lower := filepath.Join(base, "template")
			if err := os.MkdirAll(filepath.Join(lower, "etc"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(lower, "etc", "gone"), []byte("t"), 0o644); err != nil {
				t.Fatal(err)
			}
			first, saved := filepath.Join(base, "first"), filepath.Join(base, "saved")
			root, err := Prepare(ctx, []string{lower}, first, Options{DiskBytes: disk})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "written"), []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(root, "etc", "gone")); err != nil { // a whiteout
				t.Fatal(err)
			}
			if err := os.Mkdir(saved, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := Stash(ctx, first, saved); err != nil {
				t.Fatal(err)
			}
			if err := Release(ctx, first); err != nil {
				t.Fatal(err)
			}
			if l := loopDevices(t, base); len(l) != 0 {
				t.Fatalf("loop devices left after Stash and Release: %v", l)
			}
			check := func(dir string, opts Options) {
				t.Helper()
				opts.DiskBytes, opts.Layer = disk, saved
				root, err := Prepare(ctx, []string{lower}, dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				if b, err := os.ReadFile(filepath.Join(root, "written")); err != nil || string(b) != "kept" {
					t.Fatalf("written file after bringing the layer back = %q, %v", b, err)
				}
				if _, err := os.Stat(filepath.Join(root, "etc", "gone")); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("deleted template file is back: %v", err)
				}
				if err := os.WriteFile(filepath.Join(root, "written"), []byte("changed in "+filepath.Base(dir)), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := Release(ctx, dir); err != nil {
					t.Fatal(err)
				}
			}
			// Two copies: each starts from the saved layer, not from the other's writes.
			check(filepath.Join(base, "copy1"), Options{CopyLayer: true})
			check(filepath.Join(base, "copy2"), Options{CopyLayer: true})
			check(filepath.Join(base, "moved"), Options{})
			if ents, _ := os.ReadDir(saved); len(ents) != 0 {
				t.Fatalf("a moved layer left %v behind", ents)
			}
			// Nothing to bring back: a clear error, and nothing left mounted.
			if _, err := Prepare(ctx, []string{lower}, filepath.Join(base, "again"), Options{DiskBytes: disk, Layer: saved}); !errdefs.Is(err, errdefs.KindDataLoss) {
				t.Fatalf("Prepare from an empty saved layer = %v, want DataLoss", err)
			}
		})
	}
}

// A layer saved without a disk (a template build's) brought back onto a size-limited disk: the
// files, deletions included, are there, and the disk limit holds.
func TestPlainLayerOntoDisk(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	lower := filepath.Join(base, "template")
	if err := os.MkdirAll(filepath.Join(lower, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "etc", "gone"), []byte("t"), 0o644); err != nil {
		t.Fatal(err)
	}
	build, saved := filepath.Join(base, "build"), filepath.Join(base, "saved")
	root, err := Prepare(ctx, []string{lower}, build, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "started"), []byte("pid 42"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "etc", "gone")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(saved, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Stash(ctx, build, saved); err != nil {
		t.Fatal(err)
	}
	if err := Release(ctx, build); err != nil {
		t.Fatal(err)
	}
	sb := filepath.Join(base, "sandbox")
	root, err = Prepare(ctx, []string{lower}, sb, Options{DiskBytes: 96 << 20, Layer: saved, CopyLayer: true})
	if err != nil {
		t.Fatal(err)
	}
	defer Release(ctx, sb)
	if b, err := os.ReadFile(filepath.Join(root, "started")); err != nil || string(b) != "pid 42" {
		t.Fatalf("saved file = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc", "gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a deletion in the saved layer was lost: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	if total := int64(st.Blocks) * st.Bsize; total > 96<<20 {
		t.Fatalf("root is not on the sandbox's disk: %d bytes", total)
	}
	if _, err := os.Stat(filepath.Join(saved, upperName, "started")); err != nil {
		t.Fatalf("a copied layer must stay for the next sandbox: %v", err)
	}
}

// heldDisk prepares a sandbox with a disk and bind-mounts the disk's filesystem at holder, as
// the runtime's gofer holds it in its own mount namespace.
func heldDisk(t *testing.T) (sandbox, saved, holder string) {
	t.Helper()
	requireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	lower := filepath.Join(base, "template")
	if err := os.MkdirAll(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	sandbox, saved, holder = filepath.Join(base, "sandbox"), filepath.Join(base, "saved"), filepath.Join(base, "holder")
	root, err := Prepare(ctx, []string{lower}, sandbox, Options{DiskBytes: 96 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(holder, unix.MNT_DETACH)
		_ = Release(ctx, sandbox)
		if l := loopDevices(t, base); len(l) != 0 {
			t.Errorf("loop devices left: %v", l)
		}
	})
	if err := os.WriteFile(filepath.Join(root, "written"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{saved, holder} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(diskDir(sandbox), holder, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	return sandbox, saved, holder
}

// Stash returns only once the disk's filesystem is gone everywhere: a second mount of it keeps
// the filesystem alive past the unmount, and ext4 writes to the image when it goes, which would
// change it under the snapshot's checksum.
func TestStashWaitsForTheFilesystemToGo(t *testing.T) {
	sandbox, saved, holder := heldDisk(t)
	var released atomic.Bool
	stashed := make(chan bool, 1)
	go func() {
		if err := Stash(context.Background(), sandbox, saved); err != nil {
			t.Error(err)
		}
		stashed <- released.Load()
	}()
	// Give Stash the chance to return too early; it must still be waiting when the holder goes.
	time.Sleep(200 * time.Millisecond)
	released.Store(true)
	if err := unix.Unmount(holder, 0); err != nil {
		t.Fatal(err)
	}
	if !<-stashed {
		t.Fatal("Stash moved the disk image while its filesystem was still mounted elsewhere")
	}
}

// A holder that outlasts the wait: Stash says so with ErrDiskBusy and leaves the image where it
// was (a pause must not seal an image that may yet change); once the holder is gone, Stash again
// moves it.
func TestStashWithADiskHeldElsewhere(t *testing.T) {
	timeout := loopReleaseTimeout
	loopReleaseTimeout = 300 * time.Millisecond
	t.Cleanup(func() { loopReleaseTimeout = timeout })
	sandbox, saved, holder := heldDisk(t)
	err := Stash(context.Background(), sandbox, saved)
	if !errors.Is(err, ErrDiskBusy) || !strings.Contains(err.Error(), "at "+holder) {
		t.Fatalf("Stash with the disk held elsewhere = %v, want ErrDiskBusy naming the mount at %s", err, holder)
	}
	if _, err := os.Stat(filepath.Join(saved, diskImageName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the disk image of a held disk was moved: %v", err)
	}
	if err := unix.Unmount(holder, 0); err != nil {
		t.Fatal(err)
	}
	if err := Stash(context.Background(), sandbox, saved); err != nil {
		t.Fatalf("Stash once the holder is gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(saved, diskImageName)); err != nil {
		t.Fatalf("the disk image was not moved: %v", err)
	}
}

// DiskHolders finds the mounts that would keep a sandbox's disk alive past its unmount: a bind
// mount in vmon's own namespace, and the copy in a mount namespace another process made while
// the disk was mounted (`unshare -m`, a service with PrivateTmp); the sandbox's own mount is
// none.
func TestDiskHolders(t *testing.T) {
	sandbox, _, holder := heldDisk(t)
	h, err := DiskHolders(sandbox)
	if err != nil || len(h) != 1 || !strings.HasSuffix(h[0], " at "+holder) {
		t.Fatalf("DiskHolders with a bind mount at %s = %q, %v", holder, h, err)
	}
	if err := unix.Unmount(holder, 0); err != nil {
		t.Fatal(err)
	}
	if h, err := DiskHolders(sandbox); err != nil || len(h) != 0 {
		t.Fatalf("DiskHolders of a disk only the sandbox mounts = %q, %v", h, err)
	}

	foreign := exec.Command("unshare", "-m", "--propagation", "private", "sleep", "60")
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = foreign.Process.Kill(); _ = foreign.Wait() })
	want := fmt.Sprintf("pid %d (sleep) at %s", foreign.Process.Pid, diskDir(sandbox))
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err := DiskHolders(sandbox)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) == 1 && h[0] == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DiskHolders with a foreign namespace = %q, want [%q]", h, want)
		}
		time.Sleep(20 * time.Millisecond) // until unshare has exec'd sleep
	}
	_ = foreign.Process.Kill()
	_ = foreign.Wait()
	if h, err := DiskHolders(sandbox); err != nil || len(h) != 0 {
		t.Fatalf("DiskHolders after the foreign namespace went = %q, %v", h, err)
	}
}
