package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Create makes the named namespace with its loopback up and returns its path. If the namespace
// already exists (recovery) it is kept and its loopback brought up again. A failed Create leaves
// nothing behind.
func Create(ctx context.Context, name string) (string, error) {
	if err := validateName(name); err != nil {
		return "", err
	}
	path := Path(name)
	if err := ensureDir(); err != nil {
		return "", err
	}
	if isNamespace(path) {
		if err := loopbackUp(path); err != nil {
			return "", err
		}
		return path, nil
	}
	// A plain file here is the leftover of a crash between create and bind mount.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("remove stale %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	f.Close()

	if err := bindNewNamespace(path); err != nil {
		_ = os.Remove(path)
		return "", err
	}
	if err := loopbackUp(path); err != nil {
		_ = Delete(context.WithoutCancel(ctx), name)
		return "", err
	}
	return path, nil
}

// bindNewNamespace creates a network namespace and pins it by bind-mounting it on path.
func bindNewNamespace(path string) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: this thread ends up in the new namespace, and a goroutine that exits
		// while locked takes its thread with it, so no other goroutine can ever be scheduled in
		// the wrong namespace, whatever fails below.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind network namespace to %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	return <-errc
}

// loopbackUp sets lo up inside the namespace at path. netlink opens its socket inside the target
// namespace on a locked thread and switches back before returning.
func loopbackUp(path string) error {
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find loopback in %s: %w", path, err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set loopback up in %s: %w", path, err)
	}
	return nil
}

// Delete unmounts and removes the named namespace. The namespace itself lives on until its last
// user (a runtime process) exits. An absent namespace is success.
func Delete(ctx context.Context, name string) error {
	if err := validateName(name); err != nil {
		return err
	}
	path := Path(name)
	// Loop in case the path was mounted more than once.
	for range 8 {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
			break // not a mount point (any more), or gone
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// List returns the names of the namespaces vmon owns (those starting with Prefix), sorted.
func List(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", Dir, err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), Prefix) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// ensureDir makes Dir a shared mount point, as iproute2 does, so that unmounting a namespace here
// also unmounts the copies other mount namespaces (e.g. a runtime's) got when they were cloned,
// instead of keeping the namespace alive there.
func ensureDir() error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", Dir, err)
	}
	err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, syscall.EINVAL) {
		// Not a mount point yet: bind it onto itself first.
		if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", Dir, err)
		}
		err = unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", Dir, err)
	}
	return nil
}

// isNamespace reports whether path is a mounted namespace file.
func isNamespace(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// Do runs fn on an OS thread inside the namespace at path; a child process fn starts is forked
// from that thread and so runs in the namespace too. The thread is never unlocked: it exits
// with its goroutine, so no other goroutine is ever scheduled in the wrong namespace.
func Do(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := vnetns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("open namespace %s: %w", path, err)
			return
		}
		defer ns.Close()
		if err := vnetns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter namespace %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
