//go:build linux

package oci

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/fsroot"
)

const (
	whiteoutPrefix = ".wh."
	// whiteoutMeta prefixes aufs bookkeeping entries (.wh..wh.plnk and friends), which carry no
	// meaning for the flattened filesystem.
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
	xattrPAXPrefix = "SCHILY.xattr."
)

// Unpack writes the image's flattened filesystem into dir, which must exist and be empty.
// Layers are streamed one at a time and applied in order, whiteouts included, so that the
// result is what an overlay mount of the layers would show. progress, if non-nil, receives one
// human-readable line per layer.
func (p *Puller) Unpack(ctx context.Context, img *Image, dir string, progress func(string)) error {
	if img == nil || (img.img == nil && img.reopen == nil) {
		return errNoHandle
	}
	h := img.img
	if img.reopen != nil {
		var err error
		if h, err = img.reopen(ctx); err != nil {
			return classify(ctx, err, img.Ref)
		}
	}
	layers, err := h.Layers()
	if err != nil {
		return classify(ctx, err, img.Ref)
	}

	root, err := openRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()

	u := &unpacker{
		root:     root,
		ref:      img.Ref,
		log:      p.log.With("image", img.Ref),
		dirTimes: map[string][2]unix.Timespec{},
		buf:      make([]byte, 1<<20),
	}
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return classify(ctx, err, img.Ref)
		}
		dg, err := l.Digest()
		if err != nil {
			return classify(ctx, err, img.Ref)
		}
		size, err := l.Size()
		if err != nil {
			return classify(ctx, err, img.Ref)
		}
		line := fmt.Sprintf("pulling layer %d/%d %s (%s)", i+1, len(layers), shortDigest(dg), humanSize(size))
		u.log.DebugContext(ctx, line)
		if progress != nil {
			progress(line)
		}
		if err := u.layer(ctx, l); err != nil {
			return fmt.Errorf("layer %d/%d %s: %w", i+1, len(layers), dg, err)
		}
	}
	return u.finish()
}

// openRoot opens dir, which must be an existing empty directory, as the unpack root.
func openRoot(dir string) (*fsroot.Root, error) {
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
	root, err := fsroot.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open unpack dir: %w", err)
	}
	return root, nil
}

// unpacker holds the state of one Unpack across layers.
type unpacker struct {
	root *fsroot.Root
	ref  string
	log  *slog.Logger
	// touched holds the paths the current layer created or descended into: whiteouts and
	// opaque markers hide only lower layers, whatever order the layer's entries come in.
	touched map[string]bool
	// dirTimes are re-applied at the end, since creating entries inside a directory (in the
	// same or a later layer) moves its mtime.
	dirTimes map[string][2]unix.Timespec
	buf      []byte
	warned   bool
}

// trackedReader remembers read failures so that a failed copy can be blamed on the registry
// stream rather than on the local disk.
type trackedReader struct {
	r   io.Reader
	err error
}

func (t *trackedReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF {
		t.err = err
	}
	return n, err
}

func (u *unpacker) layer(ctx context.Context, l v1.Layer) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return u.readErr(ctx, err)
	}
	defer rc.Close()
	src := &trackedReader{r: rc}
	tr := tar.NewReader(src)
	u.touched = map[string]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return classify(ctx, err, u.ref)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.readErr(ctx, err)
		}
		if err := u.apply(hdr, tr); err != nil {
			if src.err != nil {
				return u.readErr(ctx, src.err)
			}
			return err
		}
	}
	// ggcr checks the digest when the stream hits EOF, and tar stops reading before the
	// padding at the end: drain it so a tampered layer is reported.
	if _, err := io.Copy(io.Discard, src); err != nil {
		return u.readErr(ctx, err)
	}
	return nil
}

// readErr classifies a failure to read a layer: the registry or network when ggcr can tell,
// otherwise a layer that is not what its manifest promised.
func (u *unpacker) readErr(ctx context.Context, err error) error {
	c := classify(ctx, err, u.ref)
	var terr *transport.Error
	if errdefs.KindOf(c) != errdefs.KindUnknown || ctx.Err() != nil || errors.As(err, &terr) {
		return c
	}
	return errdefs.Wrap(errdefs.KindInvalidArgument, err, "image %q has a corrupt layer", u.ref)
}

// entryErr classifies a failure to create an entry. The entry's path is inside the image, so it
// is safe to show; host paths never appear because every call is relative to the root.
func (u *unpacker) entryErr(rel string, err error) error {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return errdefs.Wrap(errdefs.KindResourceExhausted, err, "not enough disk space to unpack image %q", u.ref)
	case errors.Is(err, fsroot.ErrUnsafePath):
		return errdefs.Wrap(errdefs.KindInvalidArgument, err, "image %q contains an unsafe path", u.ref)
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOENT),
		errors.Is(err, unix.EEXIST), errors.Is(err, unix.EXDEV), errors.Is(err, fsroot.ErrDangling):
		return errdefs.Wrap(errdefs.KindInvalidArgument, err, "image %q has an invalid layer entry /%s", u.ref, rel)
	}
	return fmt.Errorf("unpack /%s: %w", rel, err)
}

func (u *unpacker) touch(rel string) {
	for rel != "." && rel != "" && !u.touched[rel] {
		u.touched[rel] = true
		rel, _ = fsroot.SplitParent(rel)
	}
}

func joinRel(dir, name string) string {
	if dir == "." || dir == "" {
		return name
	}
	return dir + "/" + name
}

func (u *unpacker) apply(hdr *tar.Header, r io.Reader) error {
	rel, err := fsroot.CleanStrict(hdr.Name)
	if err != nil {
		return u.entryErr(hdr.Name, err)
	}
	if rel == "." {
		return u.applyRoot(hdr)
	}
	parent, base := fsroot.SplitParent(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		if err := u.whiteout(parent, base); err != nil {
			return u.entryErr(rel, err)
		}
		return nil
	}

	var target string
	if hdr.Typeflag == tar.TypeLink {
		if target, err = fsroot.CleanStrict(hdr.Linkname); err != nil {
			return u.entryErr(rel, err)
		}
		if target == rel {
			return nil
		}
		if target == "." {
			return u.entryErr(rel, fmt.Errorf("hard link to the root: %w", unix.EXDEV))
		}
	}

	u.touch(rel)
	pfd, err := u.root.MkdirAllFD(parent, 0o755)
	if err != nil {
		return u.entryErr(rel, err)
	}
	defer unix.Close(pfd)

	var st unix.Stat_t
	exists := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	isDir := exists && st.Mode&unix.S_IFMT == unix.S_IFDIR
	// A directory over a directory merges (later layers add to it); anything else replaces
	// what lower layers had, as an overlay would show it.
	if exists && !(hdr.Typeflag == tar.TypeDir && isDir) {
		if err := fsroot.RemoveAllAt(pfd, base); err != nil {
			return u.entryErr(rel, err)
		}
	}

	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if !isDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return u.entryErr(rel, err)
			}
		}
		u.dirTimes[rel] = times(hdr)
		return u.entryErr2(rel, u.meta(pfd, base, hdr, true))

	case tar.TypeReg, tar.TypeGNUSparse:
		if err := u.writeFile(pfd, base, r); err != nil {
			return u.entryErr(rel, err)
		}
		return u.entryErr2(rel, u.meta(pfd, base, hdr, true))

	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return u.entryErr(rel, err)
		}
		return u.entryErr2(rel, u.meta(pfd, base, hdr, false))

	case tar.TypeLink:
		tparent, tbase := fsroot.SplitParent(target)
		tfd, err := u.root.OpenDirFD(tparent)
		if err != nil {
			return u.entryErr(rel, fmt.Errorf("hard link target /%s: %w", target, err))
		}
		defer unix.Close(tfd)
		// Flags 0: a link to a symlink links the symlink itself, as tar recorded it.
		if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
			return u.entryErr(rel, fmt.Errorf("hard link to /%s: %w", target, err))
		}
		return nil

	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(pfd, base, nodeType(hdr.Typeflag)|mode, int(dev)); err != nil {
			if err == unix.EPERM && hdr.Typeflag != tar.TypeFifo {
				// Without CAP_MKNOD (not root, or a restricted container) device nodes
				// cannot exist; the guest's devtmpfs provides the real ones anyway.
				u.log.Warn("skipping device node: not permitted", "path", "/"+rel)
				return nil
			}
			return u.entryErr(rel, err)
		}
		return u.entryErr2(rel, u.meta(pfd, base, hdr, true))

	default:
		u.log.Debug("skipping unsupported tar entry", "path", "/"+rel, "type", string(hdr.Typeflag))
		return nil
	}
}

func nodeType(typeflag byte) uint32 {
	switch typeflag {
	case tar.TypeChar:
		return unix.S_IFCHR
	case tar.TypeBlock:
		return unix.S_IFBLK
	default:
		return unix.S_IFIFO
	}
}

// entryErr2 is entryErr that passes nil through.
func (u *unpacker) entryErr2(rel string, err error) error {
	if err == nil {
		return nil
	}
	return u.entryErr(rel, err)
}

// applyRoot applies a "./" entry's ownership and mode to the root itself.
func (u *unpacker) applyRoot(hdr *tar.Header) error {
	if hdr.Typeflag != tar.TypeDir {
		return u.entryErr(".", fmt.Errorf("root entry is not a directory: %w", unix.ENOTDIR))
	}
	p := fsroot.ProcPath(u.root.FD(), "")
	if err := unix.Chown(p, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown root: %w", err)
	}
	if err := unix.Chmod(p, uint32(hdr.Mode)&0o7777); err != nil {
		return fmt.Errorf("chmod root: %w", err)
	}
	u.dirTimes["."] = times(hdr)
	return nil
}

func (u *unpacker) writeFile(pfd int, base string, r io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), base)
	// Hide ReadFrom so the shared buffer is used instead of a fresh one per file.
	_, err = io.CopyBuffer(struct{ io.Writer }{f}, r, u.buf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// meta applies ownership, mode, xattrs and times to name inside dirfd, never following a
// symlink at name. Ownership goes first because chown clears setuid and setgid bits.
func (u *unpacker) meta(dirfd int, name string, hdr *tar.Header, chmod bool) error {
	if err := unix.Fchownat(dirfd, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if chmod {
		mode := uint32(hdr.Mode) & 0o7777
		err := unix.Fchmodat(dirfd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
		if err == unix.EOPNOTSUPP {
			// Kernels before 6.6 lack fchmodat2. name was just created by us as a
			// non-symlink, so following it is the same thing.
			err = unix.Fchmodat(dirfd, name, mode, 0)
		}
		if err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	for k, v := range hdr.PAXRecords {
		attr, ok := strings.CutPrefix(k, xattrPAXPrefix)
		if !ok {
			continue
		}
		if err := unix.Lsetxattr(fsroot.ProcPath(dirfd, name), attr, []byte(v), 0); err != nil {
			// Filesystems without xattrs, LSM labels the host will not take, and user.*
			// attributes on symlinks are not worth failing a pull over.
			if err == unix.ENOTSUP || strings.HasPrefix(attr, "security.") || strings.HasPrefix(attr, "trusted.") || !chmod {
				if !u.warned {
					u.log.Warn("dropping extended attributes the target filesystem refused", "attr", attr, "err", err)
					u.warned = true
				}
				continue
			}
			return fmt.Errorf("setxattr %s: %w", attr, err)
		}
	}
	ts := times(hdr)
	if err := unix.UtimesNanoAt(dirfd, name, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func times(hdr *tar.Header) [2]unix.Timespec {
	mt := hdr.ModTime
	at := hdr.AccessTime
	if at.IsZero() {
		at = mt
	}
	return [2]unix.Timespec{tsOf(at), tsOf(mt)}
}

func tsOf(t time.Time) unix.Timespec {
	if t.IsZero() {
		t = time.Unix(0, 0)
	}
	return unix.NsecToTimespec(t.UnixNano())
}

// whiteout applies a ".wh.*" entry found in directory parent.
func (u *unpacker) whiteout(parent, base string) error {
	if base == whiteoutOpaque {
		return u.opaque(parent)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%w: whiteout %q", fsroot.ErrUnsafePath, base)
	}
	pfd, err := u.root.OpenDirFD(parent)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	rel := joinRel(parent, name)
	if u.touched[rel] {
		return u.pruneAt(pfd, name, rel)
	}
	return fsroot.RemoveAllAt(pfd, name)
}

// opaque hides everything lower layers put in dir, keeping what this layer adds to it.
func (u *unpacker) opaque(dir string) error {
	pfd, err := u.root.MkdirAllFD(dir, 0o755)
	if err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	unix.Close(pfd)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	u.touch(dir)
	return u.prune(fd, dir)
}

// pruneAt prunes name inside dirfd if it is a directory this layer touched; a non-directory
// this layer wrote is kept as is.
func (u *unpacker) pruneAt(dirfd int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return u.prune(fd, rel)
}

// prune removes every entry below directory fd (at rel) that the current layer did not touch.
func (u *unpacker) prune(fd int, rel string) error {
	names, err := fsroot.ReadDirNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		child := joinRel(rel, n)
		if u.touched[child] {
			err = u.pruneAt(fd, n, child)
		} else {
			err = fsroot.RemoveAllAt(fd, n)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// finish restores directory times that entries created after them have moved.
func (u *unpacker) finish() error {
	for rel, ts := range u.dirTimes {
		if rel == "." {
			if err := unix.UtimesNano(fsroot.ProcPath(u.root.FD(), ""), ts[:]); err != nil {
				return fmt.Errorf("set root times: %w", err)
			}
			continue
		}
		parent, base := fsroot.SplitParent(rel)
		pfd, err := u.root.OpenDirFD(parent)
		if err != nil {
			continue // removed or replaced by a later layer
		}
		var st unix.Stat_t
		if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.UtimesNanoAt(pfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW)
		}
		unix.Close(pfd)
		if err != nil {
			return fmt.Errorf("set times of /%s: %w", rel, err)
		}
	}
	return nil
}

func shortDigest(h v1.Hash) string {
	hex := h.Hex
	if len(hex) > 12 {
		hex = hex[:12] + "…"
	}
	return h.Algorithm + ":" + hex
}

func humanSize(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, s := range []string{"kB", "MB", "GB", "TB"} {
		v /= unit
		if v < unit {
			return fmt.Sprintf("%.1f %s", v, s)
		}
	}
	return fmt.Sprintf("%.1f PB", v/unit)
}
