package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Prepare mounts the sandbox's writable root at RootDir(sandboxDir): an overlay of lowers (the
// template's layers, topmost first; read-only, never modified) with upper and work layers in
// sandboxDir, or on the sandbox's own size-limited disk when opts.DiskBytes is set. It returns
// the merged directory. If that directory is already a mount point (recovery after a restart)
// it is returned as is. A failed Prepare leaves nothing it created behind.
func Prepare(ctx context.Context, lowers []string, sandboxDir string, opts Options) (string, error) {
	if err := validateDirs(lowers, sandboxDir); err != nil {
		return "", err
	}
	if opts.DiskBytes < 0 || (opts.DiskBytes > 0 && opts.DiskBytes < MinDiskBytes) {
		return "", errdefs.InvalidArgument("a sandbox disk must have at least %d MiB", MinDiskBytes>>20)
	}
	lowers = slices.Clone(lowers)
	for i := range lowers {
		lowers[i] = filepath.Clean(lowers[i])
	}
	lowerDir, sandboxDir := lowers[0], filepath.Clean(sandboxDir)
	root := RootDir(sandboxDir)
	if ok, err := Mounted(root); err != nil {
		return "", err
	} else if ok {
		return root, nil
	}
	var lowerStat unix.Stat_t
	if err := unix.Stat(lowerDir, &lowerStat); err != nil {
		return "", errdefs.Wrap(errdefs.KindNotFound, fmt.Errorf("stat template rootfs %s: %w", lowerDir, err),
			"template root filesystem is missing")
	}
	if lowerStat.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", errdefs.InvalidArgument("template root filesystem is not a directory")
	}
	if err := os.MkdirAll(sandboxDir, 0o711); err != nil {
		return "", fmt.Errorf("create sandbox dir: %w", err)
	}

	ok := false
	var created []string
	var undoDisk func()
	defer func() {
		if ok {
			return
		}
		for i := len(created) - 1; i >= 0; i-- {
			_ = os.RemoveAll(created[i])
		}
		if undoDisk != nil {
			undoDisk()
		}
	}()
	layerDir := sandboxDir
	layer := layerSource{dir: opts.Layer, copy: opts.CopyLayer}
	// A saved plain upper directory (a template build's started snapshot) brought back onto a
	// size-limited disk: the disk starts empty and the files are copied onto it.
	seedUpper := ""
	if layer.dir != "" && opts.DiskBytes > 0 {
		if _, err := os.Stat(filepath.Join(layer.dir, diskImageName)); errors.Is(err, os.ErrNotExist) {
			if fi, err := os.Stat(filepath.Join(layer.dir, upperName)); err == nil && fi.IsDir() {
				seedUpper, layer = filepath.Join(layer.dir, upperName), layerSource{}
			}
		}
	}
	if opts.DiskBytes > 0 {
		u, err := mountDisk(ctx, sandboxDir, opts.DiskBytes, opts.ImageDir, layer)
		if err != nil {
			return "", err
		}
		undoDisk, layerDir = u, diskDir(sandboxDir)
	} else if layer.dir != "" {
		restore, err := layer.bring(upperName, sandboxDir)
		if err != nil {
			return "", err
		}
		undoDisk = restore
	}
	mkdir := func(dir string, mode os.FileMode) error {
		if err := os.Mkdir(dir, mode); err != nil {
			if errors.Is(err, os.ErrExist) {
				return nil
			}
			return fmt.Errorf("create %s: %w", dir, err)
		}
		created = append(created, dir)
		return nil
	}
	upper := UpperDir(layerDir)
	for _, d := range []string{upper, workDir(layerDir), root} {
		if err := mkdir(d, 0o755); err != nil {
			return "", err
		}
	}
	if seedUpper != "" {
		// cp keeps owners, modes, xattrs (overlay whiteouts and opaque markers) and sparseness.
		out, err := exec.CommandContext(ctx, "cp", "-a", "--sparse=always", "--", seedUpper+"/.", upper).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("copy saved files onto the disk: %w: %s", err, strings.TrimSpace(string(out)))
		}
	}
	// The merged root directory takes its owner and mode from the upper layer's root, so copy
	// them from the template or the guest's "/" would be root-only.
	if err := os.Chown(upper, int(lowerStat.Uid), int(lowerStat.Gid)); err != nil {
		return "", fmt.Errorf("chown upper dir: %w", err)
	}
	if err := os.Chmod(upper, os.FileMode(lowerStat.Mode&0o7777)); err != nil {
		return "", fmt.Errorf("chmod upper dir: %w", err)
	}
	// nosuid, nodev: the merged root is the host side of what the guest writes; a setuid file or
	// device node the guest leaves there must mean nothing to the host. Inside the sandbox the
	// sentry decides setuid on its own (sudo keeps working).
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, overlayOptions(lowers, layerDir)); err != nil {
		return "", fmt.Errorf("mount overlay at %s: %w", root, err)
	}
	ok = true
	return root, nil
}

// Release unmounts the sandbox's root (lazily if it is still busy, e.g. a runtime process that
// has not exited yet) and removes the root, upper and work directories and the sandbox's disk.
// A sandbox that was never prepared, or was already released, is success.
func Release(ctx context.Context, sandboxDir string) error {
	sandboxDir = filepath.Clean(sandboxDir)
	root := RootDir(sandboxDir)
	// unmount loops because a root may have been mounted more than once (a crash between mount
	// and record).
	if err := unmount(root); err != nil {
		return err
	}
	for _, d := range []string{root, workDir(sandboxDir), UpperDir(sandboxDir)} {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("remove %s: %w", d, err)
		}
	}
	return releaseDisk(sandboxDir)
}

// Stash unmounts the sandbox's root and disk, waits until the disk's filesystem is gone, and
// moves its writable layer (the disk image, or the upper directory of a sandbox without one) into
// dst, an existing directory on the same filesystem, for Prepare's Options.Layer to bring back.
// The runtime must be stopped first. What is left in the sandbox directory is removed by Release.
// ErrDiskBusy (wrapped) says the filesystem is still mounted elsewhere after the wait: the image
// may yet change, so it was not moved; Stash may be called again.
func Stash(ctx context.Context, sandboxDir, dst string) error {
	sandboxDir = filepath.Clean(sandboxDir)
	root := RootDir(sandboxDir)
	if err := unmount(root); err != nil {
		return err
	}
	name := upperName
	if _, err := os.Stat(diskImage(sandboxDir)); err == nil {
		name = diskImageName
		if err := unmount(diskDir(sandboxDir)); err != nil {
			return err
		}
		// Moved while its filesystem lives on elsewhere, the image would change under the
		// snapshot's checksum.
		if err := waitLoopReleased(ctx, diskImage(sandboxDir)); err != nil {
			return err
		}
	}
	if err := os.Rename(filepath.Join(sandboxDir, name), filepath.Join(dst, name)); err != nil {
		return fmt.Errorf("move writable layer: %w", err)
	}
	return nil
}

// CopyWritable copies the writable layer of a sandbox whose runtime is stopped (its root may stay
// mounted) into dst, an existing directory, as Stash would move it: the disk image after its
// filesystem was synced (a crash-consistent image of a journaled filesystem), or the upper
// directory. Snapshots use it so the sandbox can go on afterwards.
func CopyWritable(ctx context.Context, sandboxDir, dst string) error {
	sandboxDir = filepath.Clean(sandboxDir)
	img := diskImage(sandboxDir)
	if _, err := os.Stat(img); err != nil {
		out, err := exec.CommandContext(ctx, "cp", "-a", "--sparse=always", "--", UpperDir(sandboxDir), filepath.Join(dst, upperName)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("copy writable layer: %w: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := syncFS(diskDir(sandboxDir)); err != nil {
		return err
	}
	if err := copySparseFile(img, filepath.Join(dst, diskImageName)); err != nil {
		return fmt.Errorf("copy disk image: %w", err)
	}
	return nil
}

// syncFS flushes the filesystem mounted at dir, so its backing image holds everything written.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// layerSource is a saved writable layer Prepare brings back.
type layerSource struct {
	dir  string
	copy bool
}

// bring puts the saved layer entry name (disk.img or upper) into sandboxDir and returns how to
// undo that: a moved layer goes back where it came from, a copy is removed.
func (l layerSource) bring(name, sandboxDir string) (undo func(), err error) {
	src, dst := filepath.Join(l.dir, name), filepath.Join(sandboxDir, name)
	fi, err := os.Lstat(src)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.KindDataLoss, err, "the saved writable layer is missing")
	}
	if !l.copy {
		if err := os.Rename(src, dst); err != nil {
			return nil, fmt.Errorf("move writable layer back: %w", err)
		}
		return func() { _ = os.Rename(dst, src) }, nil
	}
	undo = func() { _ = os.RemoveAll(dst) }
	if fi.Mode().IsRegular() {
		err = copySparseFile(src, dst)
	} else {
		// cp keeps owners, modes, xattrs (overlay whiteouts and opaque markers) and sparseness.
		out, cerr := exec.Command("cp", "-a", "--sparse=always", "--", src, dst).CombinedOutput()
		if cerr != nil {
			err = fmt.Errorf("%w: %s", cerr, strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		undo()
		return nil, fmt.Errorf("copy writable layer: %w", err)
	}
	return undo, nil
}

// Commit unmounts the sandbox's root and moves its upper layer (everything the sandbox wrote,
// whiteouts included) to dst, which must not exist, on the same filesystem. Template builds use
// it to turn a build step's writes into a layer. The runtime must be stopped first.
func Commit(ctx context.Context, sandboxDir, dst string) error {
	sandboxDir = filepath.Clean(sandboxDir)
	root := RootDir(sandboxDir)
	if err := unix.Unmount(root, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("unmount %s: %w", root, err)
	}
	if mounted, err := Mounted(root); err != nil {
		return err
	} else if mounted {
		return fmt.Errorf("unmount %s: still mounted", root)
	}
	if err := os.Rename(UpperDir(sandboxDir), dst); err != nil {
		return fmt.Errorf("move upper layer: %w", err)
	}
	return nil
}

// Mounted reports whether path is a mount point in this process's mount namespace.
func Mounted(path string) (bool, error) {
	entries, err := readMountInfo()
	if err != nil {
		return false, err
	}
	path = resolve(path)
	for _, e := range entries {
		if e.MountPoint == path {
			return true, nil
		}
	}
	return false, nil
}

// LowerInUse reports whether any overlay mount uses dir as a lower layer, so a template build
// can tell whether an old rootfs may be deleted.
func LowerInUse(dir string) (bool, error) {
	entries, err := readMountInfo()
	if err != nil {
		return false, err
	}
	dir = resolve(dir)
	for _, e := range entries {
		if e.FSType != "overlay" {
			continue
		}
		for _, l := range overlayLowerDirs(e.SuperOptions) {
			if filepath.Clean(l) == dir {
				return true, nil
			}
		}
	}
	return false, nil
}

// resolve cleans path and resolves symlinks when it exists, since mountinfo holds real paths.
func resolve(path string) string {
	path = filepath.Clean(path)
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return path
}

func readMountInfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	return parseMountInfo(f)
}

// RemoveTree removes dir and everything below it after unmounting (lazily, deepest first) every
// mount at or below it. It is for trees a crashed tool may have left mounts in, e.g. a template
// build where mmdebstrap mounts /proc, /sys and /dev into the target: a plain RemoveAll would
// walk into those mounts and delete host files through them. If a mount cannot be removed the
// tree is left alone.
func RemoveTree(dir string) error {
	dir = resolve(dir)
	for range 8 {
		entries, err := readMountInfo()
		if err != nil {
			return err
		}
		var under []string
		for _, e := range entries {
			if e.MountPoint == dir || within(e.MountPoint, dir) {
				under = append(under, e.MountPoint)
			}
		}
		if len(under) == 0 {
			if err := os.RemoveAll(dir); err != nil {
				return fmt.Errorf("remove %s: %w", dir, err)
			}
			return nil
		}
		// Deepest first, so a parent mount is not detached from under its children's paths.
		sort.Slice(under, func(i, j int) bool { return len(under[i]) > len(under[j]) })
		for _, m := range under {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil &&
				!errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("unmount %s: %w", m, err)
			}
		}
	}
	return fmt.Errorf("remove %s: mounts below it keep reappearing", dir)
}
