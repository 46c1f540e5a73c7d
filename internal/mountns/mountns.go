// Package mountns keeps the mounts vmon makes for sandboxes and templates (overlay roots, sandbox
// disks, runsc's own mounts) in a mount namespace of vmon's own, one per data dir.
//
// A mount made in the host's namespace is copied into every mount namespace another process
// creates while it exists (`unshare -m`, a systemd unit with PrivateTmp, a container runtime),
// and an unmount in the host's namespace does not reach those copies: a sandbox disk stays
// mounted there, and ext4 writes to its image when the copy finally goes, long after a pause
// sealed the image's checksum. In a namespace of its own, vmon's mounts are not in the host's
// namespace for anyone to copy. Mounts the host makes still reach vmon (the namespace is a slave
// of the host's); nothing vmon mounts reaches the host.
//
// The namespace outlives the process, as the sandboxes do: it is pinned by a bind mount of its
// nsfs file at Pin(dataDir), inside Dir(dataDir), a bind mount of itself with private propagation
// in the host's namespace (the kernel pins a mount namespace only on a mount that cannot
// propagate into it). A restarted vmon serve enters the same namespace and finds its sandboxes'
// mounts. `umount <data>/mntns/mnt <data>/mntns` gives the namespace up (its mounts go with the
// last process in it).
package mountns

import (
	"errors"
	"path/filepath"
)

// envMarker tells the re-executed process which namespace it was put in ("mnt:[inode]"), so it
// knows it is there and does not enter again.
const envMarker = "VMON_MOUNT_NAMESPACE"

// Dir is the directory holding the pin, a private bind mount of itself in the host's namespace.
func Dir(dataDir string) string { return filepath.Join(dataDir, "mntns") }

// Pin is the file the data dir's mount namespace is bind-mounted on: `nsenter --mount=<Pin>`
// sees what vmon sees.
func Pin(dataDir string) string { return filepath.Join(Dir(dataDir), "mnt") }

// InheritEnv set to "inherit" keeps vmon in the mount namespace it was started in.
const InheritEnv = "VMON_MOUNT_NAMESPACE_MODE"

// ErrInherited is Enter's answer when InheritEnv asks vmon to stay in its mount namespace.
var ErrInherited = errors.New(InheritEnv + "=inherit: sandbox mounts stay in the mount namespace vmon was started in")
