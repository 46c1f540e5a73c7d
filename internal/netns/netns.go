// Package netns owns the named network namespaces sandboxes run in: it creates them the way
// `ip netns add` does (a bind mount under /run/netns, so `ip netns exec` works for debugging),
// brings their loopback up, deletes them and lists them for orphan cleanup after a crash.
//
// It must never touch links, addresses, routes or firewall rules beyond loopback. The seam for
// per-sandbox networking is the namespace itself: the networking layer (netpool) will later create
// a veth pair whose host end (vmon<N>) stays in the root namespace, where firewall rules are keyed
// on it, and move the peer into Path(name) before the runtime starts. gVisor's netstack takes over
// whatever link it finds in the namespace, so nothing here needs to change for that.
//
// Every namespace switch happens on a locked OS thread that is thrown away afterwards, so no
// goroutine of the caller ever runs in the wrong namespace.
package netns

import (
	"errors"
	"path/filepath"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Dir is where named namespaces are bind-mounted (iproute2's location).
const Dir = "/run/netns"

// Prefix marks the namespaces vmon owns; List returns only those.
const Prefix = "vmon-"

// ErrUnsupported is returned (wrapped) on systems without network namespaces.
var ErrUnsupported = errors.New("network namespaces are not supported on this OS")

// Name is the namespace name of a sandbox.
func Name(sandboxID string) string { return Prefix + sandboxID }

// Path is the file a runtime joins to enter namespace name.
func Path(name string) string { return filepath.Join(Dir, name) }

func validateName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 200 ||
		strings.ContainsAny(name, "/\x00") {
		return errdefs.InvalidArgument("invalid network namespace name")
	}
	return nil
}
