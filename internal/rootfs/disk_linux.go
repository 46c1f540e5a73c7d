package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A disk-limited sandbox keeps its writable layer on its own ext4 filesystem: a sparse image
// file in the sandbox directory, attached to a loop device and mounted at diskName. The kernel
// enforces the size (writes past it fail with ENOSPC in the guest), the host's disk only grows by
// what the sandbox really wrote, and statfs on the overlay root reports the image's size and
// usage, so the guest's df and envd's metrics show the sandbox's own disk.
const (
	diskImageName = "disk.img"
	diskName      = "disk"
)

// MinDiskBytes is the smallest writable layer Prepare makes: ext4's own metadata and journal
// need room, and a sandbox must be able to write its first files.
const MinDiskBytes = 64 << 20

func diskImage(sandboxDir string) string { return filepath.Join(sandboxDir, diskImageName) }
func diskDir(sandboxDir string) string   { return filepath.Join(sandboxDir, diskName) }

// mkfsArgs format the image so that creating it is cheap: inode tables and journal are not
// zeroed (the sparse file reads as zeros already), no blocks are reserved for root (the guest's
// root should get the whole size), and no discard pass runs over the empty file.
var mkfsArgs = []string{"-q", "-F", "-t", "ext4", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"}

// mountDisk creates the sandbox's image of size bytes, formatted (a copy of the formatted image in
// imageDir, when set), and mounts it at diskDir. It returns a function that undoes everything it
// did; on error it has undone it already.
func mountDisk(ctx context.Context, sandboxDir string, size int64, imageDir string, layer layerSource) (undo func(), err error) {
	img, mnt := diskImage(sandboxDir), diskDir(sandboxDir)
	var steps []func()
	// Not the named result: an error return sets that to nil before the deferred call runs.
	rollback := func() {
		for i := len(steps) - 1; i >= 0; i-- {
			steps[i]()
		}
	}
	defer func() {
		if err != nil {
			rollback()
		}
	}()
	switch {
	case layer.dir != "":
		// A saved layer comes back as it was; moving it (pause/resume) gives it back on undo.
		var restore func()
		if restore, err = layer.bring(diskImageName, sandboxDir); err != nil {
			return nil, err
		}
		steps = append(steps, restore)
	case imageDir == "":
		steps = append(steps, func() { _ = os.Remove(img) })
		err = formatImage(ctx, img, size)
	default:
		steps = append(steps, func() { _ = os.Remove(img) })
		err = copyFormatted(ctx, imageDir, img, size)
	}
	if err != nil {
		return nil, err
	}
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create disk mount point: %w", err)
	}
	steps = append(steps, func() { _ = os.Remove(mnt) })
	loop, err := attachLoop(img)
	if err != nil {
		return nil, err
	}
	// The loop device clears itself (autoclear) once the mount below is gone and it is closed.
	defer loop.Close()
	// noinit_itable: the kernel would otherwise zero every inode table in the background, writing
	// tens of MB per sandbox to the host disk for tables that already read as zeros. discard:
	// blocks the guest frees are punched out of the image, so deleting files gives the host its
	// disk back.
	if err := unix.Mount(loop.Name(), mnt, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable,discard"); err != nil {
		return nil, fmt.Errorf("mount disk image: %w", err)
	}
	steps = append(steps, func() { _ = unmount(mnt) })
	return rollback, nil
}

// formatImage creates img, a sparse file of size bytes, and formats it.
func formatImage(ctx context.Context, img string, size int64) error {
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return fmt.Errorf("size disk image: %w", err)
	}
	mkfs := exec.CommandContext(ctx, "mkfs.ext4", append(append([]string{}, mkfsArgs...), img)...)
	if out, err := mkfs.CombinedOutput(); err != nil {
		return fmt.Errorf("format disk image (mkfs.ext4 from e2fsprogs): %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copyFormatted makes img a sparse copy of the formatted image of size bytes in imageDir,
// formatting that one first if it is missing. Every copy carries the same filesystem UUID, which
// ext4 does not mind: nothing mounts them by UUID.
func copyFormatted(ctx context.Context, imageDir, img string, size int64) error {
	golden := filepath.Join(imageDir, fmt.Sprintf("ext4-%d.img", size))
	src, err := os.Open(golden)
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(imageDir, 0o700); err != nil {
			return fmt.Errorf("create image dir: %w", err)
		}
		// Format under a unique name and rename, so concurrent creates never see half an image.
		tmp := fmt.Sprintf("%s.%d.tmp", golden, time.Now().UnixNano())
		if err := formatImage(ctx, tmp, size); err != nil {
			_ = os.Remove(tmp)
			return err
		}
		if err := os.Rename(tmp, golden); err != nil {
			_ = os.Remove(tmp)
			return fmt.Errorf("keep formatted image: %w", err)
		}
		src, err = os.Open(golden)
	}
	if err != nil {
		return fmt.Errorf("open formatted image: %w", err)
	}
	defer src.Close()
	dst, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	err = sparseCopy(dst, src, size)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy formatted image: %w", err)
	}
	return nil
}

// sparseCopy copies src's data extents (SEEK_DATA/SEEK_HOLE) to dst, which ends up size bytes
// long with holes where src has them.
func sparseCopy(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for pos := data; pos < hole; {
			in, out := pos, pos
			n, err := unix.CopyFileRange(int(src.Fd()), &in, int(dst.Fd()), &out, int(hole-pos), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("short copy at %d", pos)
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}

// attachLoop binds a free loop device to img and returns it open; the binding clears itself when
// the last user (the mount) goes away.
func attachLoop(img string) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open loop control (is the loop module loaded?): %w", err)
	}
	defer ctl.Close()
	backing, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open disk image: %w", err)
	}
	defer backing.Close()
	// Another process may take the free device between GET_FREE and CONFIGURE: try again.
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev, err := os.OpenFile(fmt.Sprintf("/dev/loop%d", n), os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open loop device: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, syscall.EBUSY) || attempt >= 20 {
			return nil, fmt.Errorf("attach loop device: %w", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// releaseDisk unmounts the sandbox's disk (which frees its loop device) and removes the image.
// A sandbox without a disk, or one already released, is success.
func releaseDisk(sandboxDir string) error {
	mnt := diskDir(sandboxDir)
	if err := unmount(mnt); err != nil {
		return err
	}
	if err := os.Remove(mnt); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", mnt, err)
	}
	if err := os.Remove(diskImage(sandboxDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove disk image: %w", err)
	}
	return nil
}

// loopReleaseTimeout bounds the wait for a disk's filesystem to be gone after its unmount: the
// runtime's holder goes within moments; a mount namespace made while the disk was mounted (a
// service started with a private /tmp) can hold it for as long as it lives.
var loopReleaseTimeout = 10 * time.Second

// waitLoopReleased waits until no loop device is backed by img. An unmount only removes this
// namespace's mount: the filesystem lives on while another holds it (the runtime's gofer, whose
// mount namespace has the sandbox's root, can exit a moment after the runtime is deleted), and
// ext4 writes to the image when it finally goes. The loop device clears itself (autoclear) only
// then, so its going is the sign that the image is still.
func waitLoopReleased(ctx context.Context, img string) error {
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		return fmt.Errorf("stat disk image: %w", err)
	}
	dev, err := loopBacking(st)
	if err != nil || dev == "" {
		return err
	}
	deadline := time.Now().Add(loopReleaseTimeout)
	for backs(dev, st) {
		if time.Now().After(deadline) {
			where := "no mount of it found (a namespace no process is in?)"
			if h, err := holders(dev, ""); err == nil && len(h) > 0 {
				where = "mounted by " + strings.Join(h, "; ")
			}
			return fmt.Errorf("%w: %s through %s, %v after its unmount: %s", ErrDiskBusy, img, dev, loopReleaseTimeout, where)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// DiskHolders lists the mounts of the sandbox disk's filesystem other than the sandbox's own disk
// mount in this process's mount namespace, in every mount namespace a process is in: a copy in a
// namespace made while the disk was mounted there, a bind mount of it. Each keeps the filesystem
// alive past the sandbox's unmount, and ext4 writes to the image when the last one goes, so a
// pause must not seal the image while one exists. A sandbox without a disk, or whose disk is
// not attached, has none.
func DiskHolders(sandboxDir string) ([]string, error) {
	sandboxDir = filepath.Clean(sandboxDir)
	var st unix.Stat_t
	if err := unix.Stat(diskImage(sandboxDir), &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat disk image: %w", err)
	}
	dev, err := loopBacking(st)
	if err != nil || dev == "" {
		return nil, err
	}
	return holders(dev, resolve(diskDir(sandboxDir)))
}

// holders lists the mounts of the filesystem on loop device dev in every mount namespace a
// process is in, as "pid N (comm) at path", except the one at own in this process's namespace.
// One process is read per namespace.
func holders(dev, own string) ([]string, error) {
	num, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "dev"))
	if err != nil {
		return nil, fmt.Errorf("device number of %s: %w", dev, err)
	}
	devID := strings.TrimSpace(string(num))
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("own mount namespace: %w", err)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range procs {
		pid := p.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		ns, err := os.Readlink("/proc/" + pid + "/ns/mnt")
		if err != nil || seen[ns] {
			continue // gone meanwhile, or its namespace was read already
		}
		f, err := os.Open("/proc/" + pid + "/mountinfo")
		if err != nil {
			continue
		}
		entries, err := parseMountInfo(f)
		f.Close()
		if err != nil {
			continue
		}
		seen[ns] = true
		for _, e := range entries {
			if e.Dev != devID || (ns == self && e.MountPoint == own) {
				continue
			}
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			out = append(out, fmt.Sprintf("pid %s (%s) at %s", pid, strings.TrimSpace(string(comm)), e.MountPoint))
		}
	}
	return out, nil
}

// loopBacking names the loop device backed by the file st describes, or "" when there is none.
func loopBacking(st unix.Stat_t) (string, error) {
	bound, err := filepath.Glob("/sys/block/loop*/loop")
	if err != nil {
		return "", err
	}
	for _, b := range bound {
		if dev := "/dev/" + filepath.Base(filepath.Dir(b)); backs(dev, st) {
			return dev, nil
		}
	}
	return "", nil
}

// backs reports whether loop device dev is backed by the file st describes (a device cleared
// meanwhile, or bound to another file since, is not).
func backs(dev string, st unix.Stat_t) bool {
	f, err := os.Open(dev)
	if err != nil {
		return false
	}
	defer f.Close()
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	return err == nil && info.Inode == st.Ino && info.Device == st.Dev
}

// unmount unmounts path, lazily if it is busy, looping over stacked mounts; not mounted is
// success, and still mounted afterwards is an error (never remove files through a live mount:
// that would only write whiteouts).
func unmount(path string) error {
	for range 8 {
		mounted, err := Mounted(path)
		if err != nil {
			return err
		}
		if !mounted {
			return nil
		}
		err = unix.Unmount(path, 0)
		if errors.Is(err, syscall.EBUSY) {
			err = unix.Unmount(path, unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	if mounted, err := Mounted(path); err != nil {
		return err
	} else if mounted {
		return fmt.Errorf("unmount %s: still mounted", path)
	}
	return nil
}

// DiskSupported reports whether this host can give sandboxes a size-limited disk: loop devices
// and mkfs.ext4 are available. The error says what is missing.
func DiskSupported() error {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("no /dev/loop-control (load the loop module: modprobe loop): %w", err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return fmt.Errorf("mkfs.ext4 not found (apt install e2fsprogs): %w", err)
	}
	return nil
}

// copySparseFile copies src to a new file dst, keeping its holes.
func copySparseFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = sparseCopy(out, in, fi.Size())
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(dst)
	}
	return err
}
