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

// mountDisk creates the sandbox's image of size bytes, formats it and mounts it at diskDir. It
// returns a function that undoes everything it did; on error it has undone it already.
func mountDisk(ctx context.Context, sandboxDir string, size int64) (undo func(), err error) {
	img, mnt := diskImage(sandboxDir), diskDir(sandboxDir)
	var steps []func()
	undo = func() {
		for i := len(steps) - 1; i >= 0; i-- {
			steps[i]()
		}
	}
	defer func() {
		if err != nil {
			undo()
		}
	}()
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create disk image: %w", err)
	}
	steps = append(steps, func() { _ = os.Remove(img) })
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("size disk image: %w", err)
	}
	mkfs := exec.CommandContext(ctx, "mkfs.ext4", append(append([]string{}, mkfsArgs...), img)...)
	if out, err := mkfs.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("format disk image (mkfs.ext4 from e2fsprogs): %w: %s", err, strings.TrimSpace(string(out)))
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
	return undo, nil
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
	if mounted, err := Mounted(mnt); err != nil {
		return err
	} else if mounted {
		return fmt.Errorf("unmount %s: still mounted", mnt)
	}
	if err := os.Remove(mnt); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", mnt, err)
	}
	if err := os.Remove(diskImage(sandboxDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove disk image: %w", err)
	}
	return nil
}

// unmount unmounts path, lazily if it is busy, looping over stacked mounts; not mounted is success.
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
