//go:build linux

package fsroot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
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

// FD is the root's O_PATH directory descriptor, for *at calls and ProcPath on the root itself.
// It stays owned by r: do not close it.
func (r *Root) FD() int { return r.fd }

// OpenFD resolves p (cleaned with Clean) inside the root, following symlinks as the guest
// would, and opens it with flags (O_CLOEXEC is added; flags must not create a file). The caller
// closes the returned descriptor.
func (r *Root) OpenFD(p string, flags uint64) (int, error) {
	how := unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	rel := Clean(p)
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

// OpenDirFD returns an O_PATH handle on the directory p, which must exist. Errors are bare
// errnos (ENOENT, ENOTDIR, ELOOP, ...).
func (r *Root) OpenDirFD(p string) (int, error) {
	return r.OpenFD(p, unix.O_PATH|unix.O_DIRECTORY)
}

// MkdirAllFD returns an O_PATH handle on directory p, creating it and missing parents with
// perm (less the umask), owned by the caller. A non-directory in the way matches unix.ENOTDIR;
// a dangling symlink in the way matches ErrDangling (its target is never created).
func (r *Root) MkdirAllFD(p string, perm os.FileMode) (int, error) {
	return r.mkdirAll(Clean(p), uint32(perm.Perm()), nil)
}

// mkdirAll is the walk behind MkdirAll and MkdirAllFD. It returns an O_PATH handle on the clean
// path c, creating missing directories with mkdir(perm) and then calling made (if non-nil) on
// each one it created, relative to its parent.
func (r *Root) mkdirAll(c string, perm uint32, made func(dfd int, name string) error) (int, error) {
	fd, err := r.OpenDirFD(c)
	if err == nil || c == "." {
		return fd, err
	}
	// Slow path: resolve each prefix from the root (so absolute symlinks stay inside) to find
	// what is missing or in the way, holding the last directory reached.
	dfd, err := unix.FcntlInt(uintptr(r.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	cur, created := "", false
	for el := range strings.SplitSeq(c, "/") {
		if cur == "" {
			cur = el
		} else {
			cur += "/" + el
		}
		if !created { // below a directory we just made, nothing exists yet
			fd, err := r.OpenFD(cur, unix.O_PATH)
			if err == nil {
				var st unix.Stat_t
				if err = unix.Fstat(fd, &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
					err = notDirError(cur)
				}
				unix.Close(dfd)
				if err != nil {
					unix.Close(fd)
					return -1, err
				}
				dfd = fd
				continue
			}
			if err != unix.ENOENT {
				unix.Close(dfd)
				return -1, fmt.Errorf("stat /%s: %w", cur, err)
			}
		}
		err := unix.Mkdirat(dfd, el, perm)
		if err == unix.EEXIST {
			// Something exists but does not resolve: a dangling symlink. Creating its target
			// would mean interpreting it ourselves.
			unix.Close(dfd)
			return -1, danglingError(cur)
		}
		if err == nil && made != nil {
			err = made(dfd, el)
		}
		if err != nil {
			unix.Close(dfd)
			return -1, fmt.Errorf("mkdir /%s: %w", cur, err)
		}
		created = true
		fd, err := unix.Openat(dfd, el, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(dfd)
		if err != nil {
			return -1, fmt.Errorf("open /%s: %w", cur, err)
		}
		dfd = fd
	}
	return dfd, nil
}

// notDirError is a non-directory where a directory is needed; it matches unix.ENOTDIR.
type notDirError string

func (e notDirError) Error() string { return "/" + string(e) + " exists and is not a directory" }
func (e notDirError) Unwrap() error { return unix.ENOTDIR }

// danglingError is a dangling symlink where a directory is needed; it matches ErrDangling.
type danglingError string

func (e danglingError) Error() string { return ErrDangling.Error() + ": /" + string(e) }
func (e danglingError) Unwrap() error { return ErrDangling }

// Parent opens the directory holding p (resolved in the root) and returns it with p's last
// element, which the caller operates on with *at calls that do not follow it.
func (r *Root) Parent(p string) (*os.File, string, error) {
	c := Clean(p)
	if c == "." {
		return nil, "", errors.New("the root itself has no parent")
	}
	dir, base := SplitParent(c)
	fd, err := r.OpenDirFD(dir)
	if err != nil {
		return nil, "", fmt.Errorf("open parent of /%s: %w", c, err)
	}
	return os.NewFile(uintptr(fd), "/"+dir), base, nil
}

// Stat follows symlinks inside the root.
func (r *Root) Stat(p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := r.OpenFD(p, unix.O_PATH)
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
	fd, err := r.OpenFD(p, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// MkdirAll creates p and missing parents with mode and owner; existing directories are kept as
// they are. A non-directory in the way is an error; a dangling symlink at p itself is left as
// it is (a caller that needs the directory checks with Stat), one above p is an error.
func (r *Root) MkdirAll(p string, mode os.FileMode, uid, gid int) error {
	c := Clean(p)
	fd, err := r.mkdirAll(c, uint32(mode.Perm()), func(dfd int, name string) error {
		if err := unix.Fchownat(dfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		// mkdir applies the umask; set the mode (and special bits) exactly.
		return fchmodat(dfd, name, mode)
	})
	if err == nil {
		unix.Close(fd)
		return nil
	}
	if d, ok := errors.AsType[danglingError](err); ok && string(d) == c {
		return nil
	}
	return err
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

// Chown changes the owner of p itself (not a symlink's target).
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
	return fchmodat(int(dir.Fd()), base, mode)
}

func fchmodat(dfd int, base string, mode os.FileMode) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	return unix.Fchmodat(dfd, base, unixMode(mode), 0)
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

// RemoveAllAt deletes name inside dirfd and, for a directory, everything below it, without
// following any symlink. A missing name is not an error.
func RemoveAllAt(dirfd int, name string) error {
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
		names, err := ReadDirNames(fd)
		if err == nil {
			for _, n := range names {
				if err = RemoveAllAt(fd, n); err != nil {
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

// ReadDirNames lists the directory open (for reading, not O_PATH) at fd without consuming fd,
// which stays open for the caller.
func ReadDirNames(fd int) ([]string, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

// ProcPath names entry name inside dirfd ("" for dirfd itself) through /proc, for calls that
// have no *at form (xattrs, chmod of an O_PATH handle); the kernel walks the fd's magic link,
// never the host path of the root.
func ProcPath(dirfd int, name string) string {
	p := "/proc/self/fd/" + strconv.Itoa(dirfd)
	if name != "" {
		p += "/" + name
	}
	return p
}
