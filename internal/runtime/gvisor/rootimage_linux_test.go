package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vibemon/vmon/internal/runtime"
)

var (
	imageOnce sync.Once
	imagePath string
	imageErr  error
)

// rootImage is the fixture template as an EROFS image (mkfs.erofs from erofs-utils, which
// scripts/install-deps.sh installs). gVisor reads no inline (tail-packed) data, hence
// noinline_data. /tmp gets a file so that gVisor keeps it on the image's writable layer.
func rootImage(t *testing.T, fx fixture) string {
	t.Helper()
	imageOnce.Do(func() {
		base := filepath.Dir(fx.lower)
		src := filepath.Join(base, "image-src")
		if out, err := exec.Command("cp", "-a", fx.lower, src).CombinedOutput(); err != nil {
			imageErr = fmt.Errorf("copy template: %v: %s", err, out)
			return
		}
		if err := os.WriteFile(filepath.Join(src, "tmp", ".keep"), nil, 0o644); err != nil {
			imageErr = err
			return
		}
		img := filepath.Join(base, "template.erofs")
		if out, err := exec.Command("mkfs.erofs", "-E", "noinline_data", img, src).CombinedOutput(); err != nil {
			imageErr = fmt.Errorf("mkfs.erofs (apt-get install erofs-utils): %v: %s", err, out)
			return
		}
		imagePath = img
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return imagePath
}

// gofers returns the pids of the gofer processes runsc runs for sandbox id.
func gofers(id string) []int {
	var pids []int
	for pid, args := range processes() {
		if args[0] == "runsc-gofer" && slices.Contains(args, id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// upperFiles returns the sizes of the files the sandbox process holds open in dir: the writable
// layer's host file, which runsc unlinks as soon as it has opened it.
func upperFiles(t *testing.T, stateDir, dir string) []int64 {
	t.Helper()
	pid, err := readPidFile(filepath.Join(stateDir, pidFileName))
	if err != nil {
		t.Fatal(err)
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int64
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if err != nil || !strings.HasPrefix(target, dir+"/") {
			continue
		}
		fi, err := os.Stat(filepath.Join(fdDir, fd.Name()))
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, fi.Size())
	}
	return sizes
}

// TestRootImage boots a sandbox from an EROFS image with no mounts: it runs without a gofer, its
// writes (/tmp's included) land in a host file in RootDir rather than in memory, RootSizeBytes
// bounds them with ENOSPC, and they survive a checkpoint and restore.
func TestRootImage(t *testing.T) {
	rt, fx := setup(t)
	ctx := context.Background()
	img := rootImage(t, fx)

	// The control: a sandbox with a host root and mounts has a gofer, and gofers finds it.
	withGofer := newSandbox(t, fx, rt, nil)
	if err := rt.Start(ctx, withGofer.spec); err != nil {
		t.Fatal(err)
	}
	if len(gofers(withGofer.spec.ID)) == 0 {
		t.Fatal("found no gofer for a sandbox with a host root")
	}

	const limit = 32 << 20
	var upper string
	s := newSandbox(t, fx, rt, func(sp *runtime.Spec) {
		upper = filepath.Join(filepath.Dir(sp.StateDir), "image-layer")
		sp.RootDir = upper
		sp.RootImage = img
		sp.RootSizeBytes = limit
		sp.Mounts = nil
	})
	if err := os.Mkdir(upper, 0o700); err != nil {
		t.Fatal(err)
	}
	id := s.spec.ID
	if err := rt.Start(ctx, s.spec); err != nil {
		t.Fatalf("start: %v\n%s", err, tail(ConsoleLog(s.spec.StateDir), 4096))
	}
	if g := gofers(id); len(g) != 0 {
		t.Fatalf("a sandbox from a root image with no mounts has gofers %v", g)
	}
	if got := exec1(t, rt, id, "/bin/busybox", "cat", "/etc/template-file"); got != "template\n" {
		t.Fatalf("template file = %q", got)
	}
	if mounts := exec1(t, rt, id, "/bin/busybox", "cat", "/proc/mounts"); strings.Contains(mounts, " /tmp ") {
		t.Fatalf("/tmp is a mount of its own, not the image's writable layer:\n%s", mounts)
	}

	before := upperFiles(t, s.spec.StateDir, upper)
	if len(before) != 1 {
		t.Fatalf("the sandbox holds %d files in %s; want its writable layer's one", len(before), upper)
	}
	exec1(t, rt, id, "/bin/busybox", "sh", "-c",
		"head -c 4194304 /dev/urandom > /root/data && head -c 4194304 /dev/urandom > /tmp/data && sync")
	after := upperFiles(t, s.spec.StateDir, upper)
	if len(after) != 1 || after[0]-before[0] < 8<<20 {
		t.Fatalf("writable layer file went from %v to %v bytes after 8 MiB of writes; want +8 MiB", before, after)
	}
	sum := exec1(t, rt, id, "/bin/busybox", "md5sum", "/root/data", "/tmp/data")

	// The bound: the guest sees it as its disk's size and runs out of space at it.
	df := strings.Fields(strings.Split(exec1(t, rt, id, "/bin/busybox", "df", "-k", "/"), "\n")[1])
	if df[1] != strconv.Itoa(limit>>10) {
		t.Fatalf("df / in the guest: %v; want %d KiB in all", df, limit>>10)
	}
	out, err := rt.Exec(ctx, id, "/bin/busybox", "sh", "-c", "dd if=/dev/zero of=/root/big bs=1048576 count=40")
	if err == nil || !strings.Contains(string(out), "No space left on device") {
		t.Fatalf("writing past the bound: %v: %s; want ENOSPC", err, out)
	}
	exec1(t, rt, id, "/bin/busybox", "rm", "/root/big")
	exec1(t, rt, id, "/bin/busybox", "sh", "-c", "echo after > /root/after")

	// Pause and resume: the writes are in the checkpoint, and a restored sandbox gets a new layer
	// file holding them, again without a gofer.
	ckpt := filepath.Join(filepath.Dir(s.spec.StateDir), "ckpt")
	if err := rt.Checkpoint(ctx, id, ckpt, false); err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := rt.Restore(ctx, s.spec, ckpt); err != nil {
		t.Fatalf("restore: %v\n%s", err, tail(ConsoleLog(s.spec.StateDir), 4096))
	}
	if g := gofers(id); len(g) != 0 {
		t.Fatalf("the restored sandbox has gofers %v", g)
	}
	if got := exec1(t, rt, id, "/bin/busybox", "md5sum", "/root/data", "/tmp/data"); got != sum {
		t.Fatalf("after restore: %q; before: %q", got, sum)
	}
	if got := exec1(t, rt, id, "/bin/busybox", "cat", "/root/after"); got != "after\n" {
		t.Fatalf("after restore: /root/after = %q", got)
	}
	if n := len(upperFiles(t, s.spec.StateDir, upper)); n != 1 {
		t.Fatalf("the restored sandbox holds %d files in %s; want 1", n, upper)
	}

	// Another node: the same image bytes at another path, another directory for the layer file
	// (each node's data directory differs).
	if err := rt.Checkpoint(ctx, id, ckpt+"2", false); err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(filepath.Dir(s.spec.StateDir), "other-node")
	if err := os.MkdirAll(filepath.Join(elsewhere, "layers"), 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", img, filepath.Join(elsewhere, "template.erofs")).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	moved := s.spec
	moved.RootImage, moved.RootDir = filepath.Join(elsewhere, "template.erofs"), filepath.Join(elsewhere, "layers")
	if err := rt.Restore(ctx, moved, ckpt+"2"); err != nil {
		t.Fatalf("restore on another node's copy of the image: %v\n%s", err, tail(ConsoleLog(s.spec.StateDir), 4096))
	}
	if got := exec1(t, rt, id, "/bin/busybox", "md5sum", "/root/data", "/tmp/data"); got != sum {
		t.Fatalf("after a restore elsewhere: %q; before: %q", got, sum)
	}
	if n := len(upperFiles(t, s.spec.StateDir, moved.RootDir)); n != 1 {
		t.Fatalf("the sandbox restored elsewhere holds %d files in %s; want 1", n, moved.RootDir)
	}
	upper = moved.RootDir

	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if left, err := os.ReadDir(upper); err != nil || len(left) != 0 {
		t.Fatalf("left in the writable layer's directory after destroy: %v, %v", left, err)
	}
}
