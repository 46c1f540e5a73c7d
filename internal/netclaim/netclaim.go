// Package netclaim lets a node claim what it uses alone in its network namespace (the prefix of
// its links and iptables chains, its sandbox address pool, its NFLOG group), so that a second node
// started in the same namespace with the same settings fails at once with a clear error instead
// of silently tearing down or rerouting the first one's sandbox networking.
//
// A claim is an exclusive flock on a file under <dir>/<namespace id>/, held for as long as the
// node runs: the kernel drops it when the process dies, so a crashed node never blocks its own
// restart. It only coordinates vmon processes; it never touches links, rules or addresses.
package netclaim

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultDir is where claims live: /run is per boot and shared by every mount namespace the
// nodes of a host use.
const DefaultDir = "/run/vmon/netclaims"

// Claims are the claims one node holds.
type Claims struct {
	files []*os.File
}

// Release gives the claims up.
func (c *Claims) Release() {
	for _, f := range c.files {
		_ = f.Close()
	}
	c.files = nil
}

// Want is what a node claims.
type Want struct {
	// Scope prefixes its links and chains.
	Scope string
	// Pool is its sandbox address pool; one overlapping another node's is refused too.
	Pool netip.Prefix
	// LogGroup is its NFLOG group (0: none).
	LogGroup uint16
}

// Claim takes w in the network namespace this process runs in. The error names what is taken
// and the flag that changes it.
func Claim(dir string, w Want) (*Claims, error) {
	ns, err := namespaceID()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, ns)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("netclaim: %w", err)
	}
	// Looking for overlapping claims and taking one's own are one step: two nodes starting at the
	// same instant with overlapping (not equal) pools or scopes must not both see the other's
	// claim missing. Held only while claiming.
	guard, err := os.OpenFile(filepath.Join(root, ".claiming"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netclaim: %w", err)
	}
	defer guard.Close()
	if err := unix.Flock(int(guard.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("netclaim: %w", err)
	}
	c := &Claims{}
	take := func(name, what string) error {
		f, err := lock(filepath.Join(root, name))
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("another vmon node in this network namespace already uses %s", what)
		}
		if err != nil {
			return fmt.Errorf("netclaim %s: %w", name, err)
		}
		c.files = append(c.files, f)
		return nil
	}
	// iptables matches links by prefix ("vmon+" also matches "vmonb0"): a scope that starts
	// another live node's, or starts with it, collides as much as the same one.
	if other, err := liveClaim(root, "scope-", func(o string) bool {
		return o != w.Scope && (strings.HasPrefix(o, w.Scope) || strings.HasPrefix(w.Scope, o))
	}); err != nil {
		return nil, err
	} else if other != "" {
		return nil, fmt.Errorf("another vmon node in this network namespace uses the link and chain prefix %q, which overlaps %q (give each node a --net-scope that does not start another's)", other, w.Scope)
	}
	if err := take("scope-"+w.Scope, fmt.Sprintf("the link and chain prefix %q (give each node its own --net-scope)", w.Scope)); err != nil {
		c.Release()
		return nil, err
	}
	if w.LogGroup != 0 {
		if err := take(fmt.Sprintf("nflog-%d", w.LogGroup), fmt.Sprintf("NFLOG group %d (give each node its own --nflog-group)", w.LogGroup)); err != nil {
			c.Release()
			return nil, err
		}
	}
	if err := c.claimPool(root, w.Pool); err != nil {
		c.Release()
		return nil, err
	}
	return c, nil
}

// claimPool claims pool, refusing one that overlaps a pool another live node claimed.
func (c *Claims) claimPool(root string, pool netip.Prefix) error {
	name := "pool-" + strings.NewReplacer(".", "_", "/", "-").Replace(pool.String())
	other, err := liveClaim(root, "pool-", func(x string) bool {
		p, err := netip.ParsePrefix(strings.NewReplacer("_", ".", "-", "/").Replace(x))
		return err == nil && "pool-"+x != name && p.Overlaps(pool)
	})
	if err != nil {
		return err
	}
	if other != "" {
		p := strings.NewReplacer("_", ".", "-", "/").Replace(other)
		return fmt.Errorf("another vmon node in this network namespace uses sandbox addresses %s, which overlap --net-pool %s (give each node its own --net-pool)", p, pool)
	}
	f, err := lock(filepath.Join(root, name))
	if errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("another vmon node in this network namespace already uses sandbox addresses %s (give each node its own --net-pool)", pool)
	}
	if err != nil {
		return fmt.Errorf("netclaim %s: %w", name, err)
	}
	c.files = append(c.files, f)
	return nil
}

// liveClaim returns the first claim under root named prefix+X, with match(X), that a live node
// holds ("" if none).
func liveClaim(root, prefix string, match func(string) bool) (string, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return "", fmt.Errorf("netclaim: %w", err)
	}
	for _, e := range ents {
		x, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !match(x) {
			continue
		}
		f, err := lock(filepath.Join(root, e.Name()))
		if err == nil {
			// Nobody holds it: a node that is gone.
			_ = f.Close()
			continue
		}
		if errors.Is(err, unix.EWOULDBLOCK) {
			return x, nil
		}
	}
	return "", nil
}

func lock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// namespaceID names this process's network namespace by its device and inode, which stay the
// same for as long as the namespace exists.
func namespaceID() (string, error) {
	fi, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return "", fmt.Errorf("netclaim: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", errors.New("netclaim: no inode for /proc/self/ns/net")
	}
	return fmt.Sprintf("%d-%d", st.Dev, st.Ino), nil
}
