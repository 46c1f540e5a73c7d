//go:build linux

package oci

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// errUnsafePath marks a layer entry that names a location outside the unpack root.
var errUnsafePath = errors.New("path escapes the image root")

// errDangling marks a parent path that runs into a symlink whose target does not exist.
var errDangling = errors.New("path passes through a dangling symlink")

// fsRoot is the unpack target. Every path handed to it is relative to the root and resolved by
// the kernel with RESOLVE_IN_ROOT, so symlinks planted by the image (absolute or full of "..")
// resolve as they would inside the guest and can never lead to the host's files. Entries are
// then created by name relative to a resolved parent with *at calls that do not follow the
// final component.
type fsRoot struct {
	fd int
}

func openRoot(dir string) (*fsRoot, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open unpack dir: %w", err)
	}
	names, err := f.Readdirnames(1)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read unpack dir: %w", err)
	}
	if len(names) > 0 {
		return nil, fmt.Errorf("unpack dir %s is not empty", dir)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open unpack dir: %w", err)
	}
	return &fsRoot{fd: fd}, nil
}

func (r *fsRoot) Close() error { return unix.Close(r.fd) }

// cleanPath turns a tar entry name into a path relative to the root ("." for the root itself).
// Names that climb above the root are rejected rather than clamped: no legitimate layer has
// them, so one that does is hostile or broken.
func cleanPath(name string) (string, error) {
	p := path.Clean("/" + name)
	depth := 0
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return "", fmt.Errorf("%w: %q", errUnsafePath, name)
			}
		default:
			depth++
		}
	}
	if p == "/" {
		return ".", nil
	}
	return p[1:], nil
}

// open resolves rel inside the root and opens it with flags.
func (r *fsRoot) open(rel string, flags uint64) (int, error) {
	how := unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	for range 16 {
		fd, err := unix.Openat2(r.fd, rel, &how)
		// EAGAIN means a concurrent rename raced the lookup; nothing else renames in the
		// root, but retrying is what the kernel asks for.
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		return fd, err
	}
	return -1, unix.EAGAIN
}

// openDir returns an O_PATH handle on the directory rel, which must exist.
func (r *fsRoot) openDir(rel string) (int, error) {
	return r.open(rel, unix.O_PATH|unix.O_DIRECTORY)
}

// mkdirAll returns an O_PATH handle on directory rel, creating missing components (0755, root
// owned, as layers often omit parent entries).
func (r *fsRoot) mkdirAll(rel string) (int, error) {
	fd, err := r.openDir(rel)
	if err == nil || err != unix.ENOENT || rel == "." {
		return fd, err
	}
	parent, base := splitPath(rel)
	pfd, err := r.mkdirAll(parent)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil {
		if err == unix.EEXIST {
			// Something exists but does not resolve: a dangling symlink. Creating its target
			// would mean interpreting it ourselves; a well-formed layer never needs that.
			return -1, fmt.Errorf("%w: /%s", errDangling, rel)
		}
		return -1, err
	}
	return unix.Openat(pfd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// splitPath splits a root-relative path into its parent ("." at the top) and last component.
func splitPath(rel string) (string, string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return ".", rel
	}
	return rel[:i], rel[i+1:]
}

// removeAllAt deletes name inside dirfd and, for a directory, everything below it, without
// following any symlink.
func removeAllAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	for range 3 {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", name, err)
		}
		names, err := readDirNames(fd)
		if err == nil {
			for _, n := range names {
				if err = removeAllAt(fd, n); err != nil {
					break
				}
			}
		}
		unix.Close(fd)
		if err != nil {
			return err
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == nil || err == unix.ENOENT {
			return nil
		}
		if err != unix.ENOTEMPTY {
			return fmt.Errorf("remove %s: %w", name, err)
		}
	}
	return fmt.Errorf("remove %s: %w", name, unix.ENOTEMPTY)
}

// readDirNames lists a directory fd without consuming it (the fd stays open for the caller).
func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// procPath names entry name inside dirfd through /proc, for the xattr calls that have no *at
// form; the kernel walks the fd's magic link, never the host path of the root.
func procPath(dirfd int, name string) string {
	p := "/proc/self/fd/" + strconv.Itoa(dirfd)
	if name != "" {
		p += "/" + name
	}
	return p
}
