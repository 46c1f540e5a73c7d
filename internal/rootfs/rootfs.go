// Package rootfs owns each sandbox's writable root filesystem: an overlayfs mount whose lower layer
// is a template rootfs and whose upper and work layers live in the sandbox's own directory, so a
// sandbox's disk use is only what it writes and the template is shared by every sandbox.
//
// It mounts and unmounts exactly what it creates under a sandbox directory (root, upper, work,
// and for a size-limited disk the image disk.img mounted at disk/ through a loop device, with
// upper and work inside it) and must never write to a template (a lower layer) nor touch anything
// else in the sandbox directory: the node owns that directory and keeps other state there. It also answers the mount
// questions other packages have (Mounted for recovery, LowerInUse before a template's old rootfs
// is deleted) and removes trees that may still contain mounts (RemoveTree), so mount table
// parsing lives in one place.
package rootfs

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
)

// ErrUnsupported is returned (wrapped) where overlay mounts cannot be made (non-Linux builds).
var ErrUnsupported = errors.New("overlay root filesystems are not supported on this OS")

// ErrDiskBusy is a sandbox disk whose filesystem is still mounted somewhere after its unmount.
var ErrDiskBusy = errors.New("the disk's filesystem is still in use elsewhere")

// Names of the directories Prepare creates inside a sandbox directory.
const (
	rootName  = "root"
	upperName = "upper"
	workName  = "work"
)

// RootDir is where Prepare mounts the merged root of the sandbox in sandboxDir.
func RootDir(sandboxDir string) string { return filepath.Join(sandboxDir, rootName) }

// UpperDir is where the sandbox's own writes land; its size is the sandbox's disk use.
func UpperDir(sandboxDir string) string { return filepath.Join(sandboxDir, upperName) }

func workDir(sandboxDir string) string { return filepath.Join(sandboxDir, workName) }

// MaxLowers bounds a template's layer stack. The legacy mount data is limited to one page; with
// layer paths of the data dir's usual length this leaves room for the upper and work paths.
const MaxLowers = 64

func validateDirs(lowers []string, sandboxDir string) error {
	if len(lowers) == 0 {
		return errdefs.InvalidArgument("a template needs at least one layer")
	}
	if len(lowers) > MaxLowers {
		return errdefs.InvalidArgument("a template may have at most %d layers (got %d)", MaxLowers, len(lowers))
	}
	if !filepath.IsAbs(sandboxDir) {
		return errdefs.InvalidArgument("template and sandbox directories must be absolute paths")
	}
	s := filepath.Clean(sandboxDir)
	for _, lowerDir := range lowers {
		if !filepath.IsAbs(lowerDir) {
			return errdefs.InvalidArgument("template and sandbox directories must be absolute paths")
		}
		l := filepath.Clean(lowerDir)
		// An upper layer inside a lower one (or the reverse) would let writes reach the template.
		if l == s || within(s, l) || within(l, s) {
			return errdefs.InvalidArgument("sandbox directory and template must not overlap")
		}
		// The legacy mount data format has no escaping that every kernel honours.
		if strings.ContainsAny(l, ",:\\\n") {
			return errdefs.InvalidArgument("template and sandbox paths must not contain ',', ':', '\\' or newlines")
		}
	}
	if strings.ContainsAny(s, ",:\\\n") {
		return errdefs.InvalidArgument("template and sandbox paths must not contain ',', ':', '\\' or newlines")
	}
	return nil
}

// within reports whether path is strictly inside dir (both clean).
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// Options shape a sandbox's writable layer.
type Options struct {
	// DiskBytes, when positive, is a hard limit on what the sandbox can write: the upper layer
	// lives on a filesystem of that size of its own (see disk_linux.go). Zero means the upper
	// layer is a directory on the host's filesystem, bounded only by it (template builds).
	DiskBytes int64
	// ImageDir keeps one freshly formatted image per disk size, which each new disk is a sparse
	// copy of: copying the few MiB mkfs writes is several times faster than running mkfs on every
	// create. Empty: every disk is formatted on its own.
	ImageDir string
	// Layer, when set, is a directory holding a writable layer saved by Stash (a paused sandbox,
	// a snapshot): Prepare brings it back instead of starting an empty one. DiskBytes must match
	// the kind of layer saved (an image needs DiskBytes, a plain upper directory needs none).
	Layer string
	// CopyLayer copies the saved layer (sparse) instead of moving it, so it can be brought back
	// again (snapshots, forks). A moved layer is moved back if Prepare fails.
	CopyLayer bool
}

// overlayOptions renders the mount data for one sandbox whose upper and work directories are in
// layerDir. index and xino are turned off because the lower layer is shared by many mounts:
// neither feature is needed and both pin state to one lower directory.
func overlayOptions(lowers []string, layerDir string) string {
	return fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,xino=off",
		strings.Join(lowers, ":"), UpperDir(layerDir), workDir(layerDir))
}
