//go:build linux

// Package fsroot does file operations inside a guest root filesystem from the host, as root,
// without ever leaving it: every path is resolved by the kernel inside the root (openat2 with
// RESOLVE_IN_ROOT), so an image's absolute or ".." symlinks resolve as the guest would see them
// and never reach host files. Template builds use it to provision images and apply COPY steps.
// It must never be given a root a sandbox is running on: the runtime assumes it owns those files.
package fsroot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Root is an open guest root directory.
type Root struct {
	fd   int
	path string
}

// Open opens the directory at dir as a root.
func Open(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", dir, err)
	}
	return &Root{fd: fd, path: dir}, nil
}

// Close releases the root.
func (r *Root) Close() error { return unix.Close(r.fd) }

// Clean makes p a path relative to the root ("." for the root itself); ".." cannot climb above it.
func Clean(p string) string {
	c := path.Clean("/" + p)
	if c == "/" {
		return "."
	}
	return c[1:]
}

func (r *Root) openat(p string, flags uint64, mode uint32) (int, error) {
	return unix.Openat2(r.fd, Clean(p), &unix.OpenHow{
		Flags: flags | unix.O_CLOEXEC, Mode: uint64(mode),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// Parent opens the directory holding p (resolved in the root) and returns it with p's last
// element, which the caller operates on with *at calls that do not follow it.
func (r *Root) Parent(p string) (*os.File, string, error) {
	c := Clean(p)
	if c == "." {
		return nil, "", errors.New("the root itself has no parent")
	}
	fd, err := r.openat(path.Dir(c), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, "", fmt.Errorf("open parent of /%s: %w", c, err)
	}
	return os.NewFile(uintptr(fd), "/"+path.Dir(c)), path.Base(c), nil
}

// Stat follows symlinks inside the root.
func (r *Root) Stat(p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := r.openat(p, unix.O_PATH, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	err = unix.Fstat(fd, &st)
	return st, err
}

// Lstat does not follow a symlink at p itself.
func (r *Root) Lstat(p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if Clean(p) == "." {
		return st, unix.Fstat(r.fd, &st)
	}
	dir, base, err := r.Parent(p)
	if err != nil {
		return st, err
	}
	defer dir.Close()
	err = unix.Fstatat(int(dir.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// ReadFile reads a file, following symlinks inside the root; at most limit bytes.
func (r *Root) ReadFile(p string, limit int64) ([]byte, error) {
	fd, err := r.openat(p, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// MkdirAll creates p and missing parents with mode and owner; existing directories are kept as
// they are. A non-directory in the way is an error.
func (r *Root) MkdirAll(p string, mode os.FileMode, uid, gid int) error {
	c := Clean(p)
	if c == "." {
		return nil
	}
	cur := ""
	for _, el := range strings.Split(c, "/") {
		cur = path.Join(cur, el)
		st, err := r.Stat(cur)
		if err == nil {
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("/%s exists and is not a directory", cur)
			}
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("stat /%s: %w", cur, err)
		}
		dir, base, err := r.Parent(cur)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(int(dir.Fd()), base, uint32(mode.Perm()))
		if err == nil {
			err = unix.Fchownat(int(dir.Fd()), base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err == nil {
			// mkdir applies the umask; set the mode (and special bits) exactly.
			err = fchmodat(dir, base, mode)
		}
		dir.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir /%s: %w", cur, err)
		}
	}
	return nil
}

// WriteFile replaces p with a regular file (a symlink at p is replaced, never followed).
func (r *Root) WriteFile(p string, data []byte, mode os.FileMode, uid, gid int) error {
	return r.CreateFile(p, mode, uid, gid, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// CreateFile replaces p with a regular file whose contents fill writes.
func (r *Root) CreateFile(p string, mode os.FileMode, uid, gid int, fill func(io.Writer) error) error {
	dir, base, err := r.Parent(p)
	if err != nil {
		return err
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	if err := removeNonDir(dfd, base); err != nil {
		return fmt.Errorf("replace %s: %w", p, err)
	}
	fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return fmt.Errorf("create %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	err = fill(f)
	if err == nil {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// Symlink replaces p with a symlink to target (a guest path; never resolved here).
func (r *Root) Symlink(target, p string, uid, gid int) error {
	dir, base, err := r.Parent(p)
	if err != nil {
		return err
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	if err := removeNonDir(dfd, base); err != nil {
		return fmt.Errorf("replace %s: %w", p, err)
	}
	if err := unix.Symlinkat(target, dfd, base); err != nil {
		return fmt.Errorf("symlink %s: %w", p, err)
	}
	if err := unix.Fchownat(dfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %s: %w", p, err)
	}
	return nil
}

// Chown and Chmod change p itself (not a symlink's target).
func (r *Root) Chown(p string, uid, gid int) error {
	if Clean(p) == "." {
		return unix.Fchownat(r.fd, "", uid, gid, unix.AT_EMPTY_PATH)
	}
	dir, base, err := r.Parent(p)
	if err != nil {
		return err
	}
	defer dir.Close()
	return unix.Fchownat(int(dir.Fd()), base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
}

// Chmod sets p's mode including setuid, setgid and sticky bits; symlinks are left alone.
func (r *Root) Chmod(p string, mode os.FileMode) error {
	dir, base, err := r.Parent(p)
	if err != nil {
		return err
	}
	defer dir.Close()
	return fchmodat(dir, base, mode)
}

func fchmodat(dir *os.File, base string, mode os.FileMode) error {
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	return unix.Fchmodat(int(dir.Fd()), base, unixMode(mode), 0)
}

func unixMode(m os.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		u |= unix.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		u |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		u |= unix.S_ISVTX
	}
	return u
}

// removeNonDir removes base in dfd unless it is a directory or absent.
func removeNonDir(dfd int, base string) error {
	var st unix.Stat_t
	err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("%s is a directory", base)
	}
	return unix.Unlinkat(dfd, base, 0)
}
