package rootfs

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
)

// The same size-limited filesystem a sandbox's disk is, for other owners (volumes): a sparse
// ext4 image mounted through a loop device, nosuid and nodev on the host, so whatever a guest
// writes there can neither outgrow the image nor become a setuid program or a device the host
// honours.

// CreateImage makes img, which must not exist, a formatted ext4 image of size bytes: a sparse
// copy of imageDir's formatted image of that size (made first if missing), or formatted on its
// own when imageDir is empty.
func CreateImage(ctx context.Context, img string, size int64, imageDir string) error {
	if size < MinDiskBytes {
		return errdefs.InvalidArgument("an image must have at least %d MiB", MinDiskBytes>>20)
	}
	if imageDir == "" {
		return formatImage(ctx, img, size)
	}
	return copyFormatted(ctx, imageDir, img, size)
}

// MountImage mounts the ext4 image img at dir (nosuid, nodev, discard), attaching a loop device
// that clears itself when the last mount goes. When a loop device already backs img, its
// filesystem is still mounted somewhere (a runtime's mount namespace that outlived this
// process's mount, e.g. across a restart in a fresh namespace): that device is mounted again,
// which shares its one filesystem, since two filesystems on one image would corrupt it.
func MountImage(img, dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(img, &st); err != nil {
		return fmt.Errorf("stat image: %w", err)
	}
	if dev, err := loopBacking(st); err != nil {
		return err
	} else if dev != "" {
		err := mountExt4(dev, dir)
		if err == nil {
			return nil
		}
		// The device cleared itself meanwhile (its last mount went): attach a new one.
		if !errors.Is(err, syscall.ENXIO) && !errors.Is(err, syscall.ENODEV) && !errors.Is(err, syscall.ENOENT) {
			return err
		}
	}
	loop, err := attachLoop(img)
	if err != nil {
		return err
	}
	defer loop.Close()
	return mountExt4(loop.Name(), dir)
}

// mountExt4 mounts the ext4 filesystem on block device dev at dir with the options every
// guest-writable image gets (see mountDisk for noinit_itable and discard).
func mountExt4(dev, dir string) error {
	if err := unix.Mount(dev, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "noinit_itable,discard"); err != nil {
		return fmt.Errorf("mount %s at %s: %w", dev, dir, err)
	}
	return nil
}

// Unmount unmounts everything mounted at dir (lazily when busy); not mounted is success, still
// mounted afterwards an error.
func Unmount(dir string) error { return unmount(dir) }

// BindNoSuid bind-mounts dir onto itself with nosuid and nodev, so a plain directory a guest
// writes into gets the same host-side protection as an image, without a size limit.
func BindNoSuid(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("make %s nosuid,nodev: %w", dir, err)
	}
	return nil
}
