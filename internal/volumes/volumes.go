// Package volumes owns the storage behind E2B volumes on one node: one size-limited filesystem
// per volume, mounted into every sandbox that names it and kept across sandbox kills, pauses and
// node restarts, and the file operations of E2B's volume content API on it.
//
// A volume is a sparse ext4 image <data-dir>/volumes/<id>.img (made like a sandbox's disk, by
// internal/rootfs) mounted nosuid,nodev on the host at <data-dir>/volumes/<id>/. The kernel
// enforces its size (ENOSPC in the guest, the host's disk grows by at most that much), statfs
// on it reports that size (the guest's df), and a setuid file or device node a guest leaves in
// it means nothing to the host. Sandboxes bind the one host mount, so two sandboxes mounting a
// volume share one filesystem. A volume made by an older vmon is a plain directory without an
// image: it keeps its data and has no size limit (a warning is logged), and is bound onto itself
// nosuid,nodev.
//
// Every path a client gives is resolved inside the volume's directory with os.Root, so no path,
// symlink or ".." in the volume can reach anything outside it. The package never reads records,
// tokens or sandboxes: the driver decides who may touch which volume.
package volumes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/rootfs"
)

// Size bounds of one volume, in MiB. The smallest is what ext4's metadata and journal leave
// usable room in; the largest is ext4's comfortable range for a sparse image.
const (
	MinSizeMB = rootfs.MinDiskBytes >> 20
	MaxSizeMB = 16 << 20
	// DefaultSizeMB is a volume's size when neither the client nor the node sets one.
	DefaultSizeMB = 10240
)

// Options shape a node's volumes.
type Options struct {
	// DefaultSizeMB is the size of a volume created without one (DefaultSizeMB when 0).
	DefaultSizeMB int
	// MaxSizeMB bounds what a client may ask for (MaxSizeMB when 0).
	MaxSizeMB int
	// ImageDir keeps one formatted image per size that new volumes are sparse copies of (the
	// sandbox disks' <data-dir>/disk-images); empty: every volume is formatted on its own.
	ImageDir string
	// Log gets the warning about volumes without a size limit; nil: slog.Default().
	Log *slog.Logger
}

// Dir holds the volumes of one node.
type Dir struct {
	root string
	opts Options

	mu sync.Mutex
	// mounted caches the volumes known mounted, so content calls do not read the mount table.
	mounted map[string]bool
}

// New returns the volumes under dataDir/volumes, creating that directory.
func New(dataDir string, opts Options) (*Dir, error) {
	if opts.DefaultSizeMB == 0 {
		opts.DefaultSizeMB = DefaultSizeMB
	}
	if opts.MaxSizeMB == 0 {
		opts.MaxSizeMB = MaxSizeMB
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.MaxSizeMB < MinSizeMB || opts.MaxSizeMB > MaxSizeMB {
		return nil, fmt.Errorf("the largest volume must be between %d and %d MiB, not %d", MinSizeMB, MaxSizeMB, opts.MaxSizeMB)
	}
	if opts.DefaultSizeMB < MinSizeMB || opts.DefaultSizeMB > opts.MaxSizeMB {
		return nil, fmt.Errorf("the default volume size must be between %d and %d MiB, not %d", MinSizeMB, opts.MaxSizeMB, opts.DefaultSizeMB)
	}
	root := filepath.Join(dataDir, "volumes")
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("create volumes dir: %w", err)
	}
	return &Dir{root: root, opts: opts, mounted: map[string]bool{}}, nil
}

var idRe = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

const imageSuffix = ".img"

// Path is the host directory of volume id (where its filesystem is mounted).
func (d *Dir) Path(id string) (string, error) {
	if !idRe.MatchString(id) {
		return "", errdefs.InvalidArgument("invalid volume id")
	}
	return filepath.Join(d.root, id), nil
}

func (d *Dir) image(id string) string { return filepath.Join(d.root, id+imageSuffix) }

// SizeMB resolves a create's size: 0 is the node's default; anything outside MinSizeMB and the
// node's largest is InvalidArgument.
func (d *Dir) SizeMB(requested int) (int, error) {
	if requested == 0 {
		return d.opts.DefaultSizeMB, nil
	}
	if requested < MinSizeMB || requested > d.opts.MaxSizeMB {
		return 0, errdefs.InvalidArgument("sizeMB must be between %d and %d, got %d", MinSizeMB, d.opts.MaxSizeMB, requested)
	}
	return requested, nil
}

// Create makes volume id: an image of sizeMB MiB (0: the node's default), formatted and mounted.
// Guests of any user may write at its top, as on a fresh disk (sticky, like /tmp, so users do
// not remove each other's files). A failed Create leaves nothing behind.
func (d *Dir) Create(ctx context.Context, id string, sizeMB int) (err error) {
	p, err := d.Path(id)
	if err != nil {
		return err
	}
	if sizeMB, err = d.SizeMB(sizeMB); err != nil {
		return err
	}
	img := d.image(id)
	if _, err := os.Lstat(img); err == nil {
		return errdefs.Conflict("volume %q exists", id)
	}
	defer func() {
		if err != nil {
			_ = d.Delete(id)
		}
	}()
	// Outside the lock: formatting the first image of a size takes a while, and ids are fresh.
	if err := rootfs.CreateImage(ctx, img, int64(sizeMB)<<20, d.opts.ImageDir); err != nil {
		return fmt.Errorf("create volume image: %w", err)
	}
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create volume: %w", err)
	}
	if _, err := d.Mount(id); err != nil {
		return err
	}
	// mkfs makes lost+found; a volume starts empty (e2fsck makes it again should it need one).
	if err := os.Remove(filepath.Join(p, "lost+found")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("create volume: %w", err)
	}
	return os.Chmod(p, 0o777|os.ModeSticky)
}

// Mount makes sure volume id's filesystem is mounted at its directory (after a restart or a
// reboot it may not be) and returns that directory, for sandboxes to bind. A missing volume is
// NotFound.
func (d *Dir) Mount(id string) (string, error) {
	p, err := d.Path(id)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.mountLocked(id, true); err != nil {
		return "", err
	}
	return p, nil
}

// mountLocked mounts volume id unless it is mounted. Unless verify, a volume this Dir mounted
// before is taken as still mounted without reading the mount table.
func (d *Dir) mountLocked(id string, verify bool) error {
	if d.mounted[id] && !verify {
		return nil
	}
	p := filepath.Join(d.root, id)
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.NotFound("volume %q not found", id)
	}
	if err != nil {
		return fmt.Errorf("stat volume: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("volume %q is not a directory", id)
	}
	if ok, err := rootfs.Mounted(p); err != nil {
		return err
	} else if !ok {
		if _, err := os.Stat(d.image(id)); err == nil {
			err = rootfs.MountImage(d.image(id), p)
			if err != nil {
				return fmt.Errorf("mount volume %q: %w", id, err)
			}
		} else if errors.Is(err, os.ErrNotExist) {
			d.opts.Log.Warn("volume made by an older vmon has no size limit: its files are on the host's disk; copy them to a new volume to limit it", "volume", id)
			if err := rootfs.BindNoSuid(p); err != nil {
				return fmt.Errorf("mount volume %q: %w", id, err)
			}
		} else {
			return fmt.Errorf("stat volume image: %w", err)
		}
	}
	d.mounted[id] = true
	return nil
}

// MountAll mounts every volume on disk (at start, so a volume's files are where the content API
// and sandboxes look for them). It returns the first error and goes on past it.
func (d *Dir) MountAll() error {
	ids, err := d.IDs()
	if err != nil {
		return err
	}
	var first error
	for _, id := range ids {
		if _, err := d.Mount(id); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Delete unmounts volume id and removes its directory and image; a missing one is success. A
// sandbox runtime still holding the filesystem keeps it until it goes (the unmount is lazy then),
// and the image's blocks go back to the host when it does.
func (d *Dir) Delete(id string) error {
	if _, err := d.Path(id); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deleteLocked(id)
}

func (d *Dir) deleteLocked(id string) error {
	delete(d.mounted, id)
	p := filepath.Join(d.root, id)
	if err := rootfs.Unmount(p); err != nil {
		return fmt.Errorf("unmount volume: %w", err)
	}
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("remove volume: %w", err)
	}
	if err := os.Remove(d.image(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove volume image: %w", err)
	}
	return nil
}

// SizeBytes is volume id's size limit; 0 for a volume without one (made by an older vmon).
func (d *Dir) SizeBytes(id string) (int64, error) {
	if _, err := d.Path(id); err != nil {
		return 0, err
	}
	fi, err := os.Stat(d.image(id))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stat volume image: %w", err)
	}
	return fi.Size(), nil
}

// IDs lists the volumes on disk: directories and images (an image without its directory is
// what a crash during Create leaves).
func (d *Dir) IDs() ([]string, error) {
	ents, err := os.ReadDir(d.root)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		name := e.Name()
		if e.Type().IsRegular() {
			name = strings.TrimSuffix(name, imageSuffix)
			if name == e.Name() {
				continue
			}
		} else if !e.IsDir() {
			continue
		}
		if idRe.MatchString(name) && !slices.Contains(ids, name) {
			ids = append(ids, name)
		}
	}
	return ids, nil
}

// Entry is E2B's VolumeEntryStat.
type Entry struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"`
	Type   string    `json:"type"` // file, directory, symlink, unknown
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// Attrs are optional ownership and mode for what a client creates or changes.
type Attrs struct {
	UID, GID *uint32
	Mode     *uint32
}

// MaxDepth bounds a listing's recursion.
const MaxDepth = 32

// clean turns a client's path into one relative to the volume's root ("." for the root). Paths
// are absolute within the volume ("/a/b") or relative to its root.
func clean(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", errdefs.InvalidArgument("path contains a NUL byte")
	}
	c := path.Clean("/" + p)
	if c == "/" {
		return ".", nil
	}
	return strings.TrimPrefix(c, "/"), nil
}

func (d *Dir) open(id string) (*os.Root, error) {
	// Mounted first: a client's files must land on the volume's filesystem, never in the
	// directory under it.
	p, err := d.Path(id)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	err = d.mountLocked(id, false)
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFound("volume %q not found", id)
	}
	return r, err
}

// at opens volume id's root and resolves client path p inside it. The caller closes the root.
func (d *Dir) at(id, p string) (*os.Root, string, error) {
	r, err := d.open(id)
	if err != nil {
		return nil, "", err
	}
	rel, err := clean(p)
	if err != nil {
		r.Close()
		return nil, "", err
	}
	return r, rel, nil
}

// pathErr maps a missing path to E2B's 404 and anything a path can do wrong to 400.
func pathErr(p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound("path %s not found", errdefs.Quote(p))
	case errors.Is(err, fs.ErrExist):
		return errdefs.Conflict("path %s already exists", errdefs.Quote(p))
	case errors.Is(err, syscall.ENOTDIR):
		return errdefs.InvalidArgument("a parent of %s is not a directory", errdefs.Quote(p))
	case errors.Is(err, syscall.EISDIR):
		return errdefs.InvalidArgument("path %s is a directory", errdefs.Quote(p))
	case errors.Is(err, syscall.ENOTEMPTY):
		return errdefs.Conflict("directory %s is not empty", errdefs.Quote(p))
	case strings.Contains(err.Error(), "path escapes from parent"):
		return errdefs.InvalidArgument("path %s leaves the volume", errdefs.Quote(p))
	case errors.Is(err, syscall.ENOSPC):
		return errdefs.InsufficientStorage("no space left for %s", errdefs.Quote(p))
	default:
		return fmt.Errorf("volume path %s: %w", errdefs.Quote(p), err)
	}
}

func entryOf(r *os.Root, rel string, fi fs.FileInfo) Entry {
	e := Entry{Name: fi.Name(), Path: "/" + strings.TrimPrefix(rel, "."), Size: fi.Size(),
		Mode: uint32(fi.Mode().Perm()), Mtime: fi.ModTime().UTC(), Type: "unknown"}
	if rel == "." {
		e.Name, e.Path = "/", "/"
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		e.Target, _ = r.Readlink(rel)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
		e.Mode = st.Mode & 0o7777
		e.Atime = time.Unix(st.Atim.Sec, st.Atim.Nsec).UTC()
		e.Ctime = time.Unix(st.Ctim.Sec, st.Ctim.Nsec).UTC()
	}
	return e
}

// Stat describes path in volume id (a symlink itself, not its target).
func (d *Dir) Stat(id, p string) (Entry, error) {
	r, rel, err := d.at(id, p)
	if err != nil {
		return Entry{}, err
	}
	defer r.Close()
	fi, err := r.Lstat(rel)
	if err != nil {
		return Entry{}, pathErr(p, err)
	}
	return entryOf(r, rel, fi), nil
}

// List returns what directory p holds, recursing depth levels (1: its own entries).
func (d *Dir) List(id, p string, depth int) ([]Entry, error) {
	if depth == 0 {
		depth = 1
	}
	if depth < 1 || depth > MaxDepth {
		return nil, errdefs.InvalidArgument("depth must be between 1 and %d", MaxDepth)
	}
	r, rel, err := d.at(id, p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	fi, err := r.Lstat(rel)
	if err != nil {
		return nil, pathErr(p, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.InvalidArgument("path %s is not a directory", errdefs.Quote(p))
	}
	out := []Entry{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		f, err := r.Open(dir)
		if err != nil {
			return pathErr(p, err)
		}
		ents, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return pathErr(p, err)
		}
		slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
		for _, de := range ents {
			child := path.Join(dir, de.Name())
			info, err := de.Info()
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, entryOf(r, child, info))
			if de.IsDir() && level < depth {
				if err := walk(child, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(rel, 1)
}

// Mkdir creates directory p (with its parents when force) and returns it.
func (d *Dir) Mkdir(id, p string, a Attrs, force bool) (Entry, error) {
	r, rel, err := d.at(id, p)
	if err != nil {
		return Entry{}, err
	}
	defer r.Close()
	mode := os.FileMode(0o755)
	if a.Mode != nil {
		mode = os.FileMode(*a.Mode & 0o7777)
	}
	if force {
		err = r.MkdirAll(rel, mode)
	} else {
		err = r.Mkdir(rel, mode)
	}
	if err != nil {
		return Entry{}, pathErr(p, err)
	}
	if err := applyAttrs(r, rel, a); err != nil {
		return Entry{}, pathErr(p, err)
	}
	return d.statIn(r, rel, p)
}

func (d *Dir) statIn(r *os.Root, rel, p string) (Entry, error) {
	fi, err := r.Lstat(rel)
	if err != nil {
		return Entry{}, pathErr(p, err)
	}
	return entryOf(r, rel, fi), nil
}

func applyAttrs(r *os.Root, rel string, a Attrs) error {
	if a.Mode != nil {
		if err := r.Chmod(rel, os.FileMode(*a.Mode&0o777)|modeBits(*a.Mode)); err != nil {
			return err
		}
	}
	if a.UID != nil || a.GID != nil {
		uid, gid := -1, -1
		if a.UID != nil {
			uid = int(*a.UID)
		}
		if a.GID != nil {
			gid = int(*a.GID)
		}
		if err := r.Lchown(rel, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// modeBits turns the setuid, setgid and sticky bits of a Unix mode into Go's.
func modeBits(m uint32) os.FileMode {
	var out os.FileMode
	if m&0o4000 != 0 {
		out |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	return out
}

// Chattr changes ownership and mode of p.
func (d *Dir) Chattr(id, p string, a Attrs) (Entry, error) {
	r, rel, err := d.at(id, p)
	if err != nil {
		return Entry{}, err
	}
	defer r.Close()
	if _, err := r.Lstat(rel); err != nil {
		return Entry{}, pathErr(p, err)
	}
	if err := applyAttrs(r, rel, a); err != nil {
		return Entry{}, pathErr(p, err)
	}
	return d.statIn(r, rel, p)
}

// Open returns regular file p for reading, with its size.
func (d *Dir) Open(id, p string) (io.ReadCloser, int64, error) {
	r, rel, err := d.at(id, p)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	// O_NONBLOCK: a FIFO planted in the volume must not pin the request.
	f, err := r.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, pathErr(p, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = errdefs.InvalidArgument("path %s is not a regular file", errdefs.Quote(p))
		}
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// Write writes body to file p (creating its parents when force) and returns it. The content goes
// to a temporary file first, so a failed upload leaves the old content.
func (d *Dir) Write(id, p string, body io.Reader, a Attrs, force bool) (Entry, error) {
	r, rel, err := d.at(id, p)
	if err != nil {
		return Entry{}, err
	}
	defer r.Close()
	if rel == "." {
		return Entry{}, errdefs.InvalidArgument("path %s is a directory", errdefs.Quote(p))
	}
	dir := path.Dir(rel)
	if force && dir != "." {
		if err := r.MkdirAll(dir, 0o755); err != nil {
			return Entry{}, pathErr(p, err)
		}
	}
	if fi, err := r.Lstat(rel); err == nil && !fi.Mode().IsRegular() {
		return Entry{}, errdefs.InvalidArgument("path %s exists and is not a regular file", errdefs.Quote(p))
	}
	tmp := path.Join(dir, fmt.Sprintf(".vmon-upload-%d", time.Now().UnixNano()))
	mode := os.FileMode(0o644)
	if a.Mode != nil {
		mode = os.FileMode(*a.Mode & 0o777)
	}
	f, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return Entry{}, pathErr(p, err)
	}
	_, err = io.Copy(f, body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = applyAttrs(r, tmp, a)
	}
	if err == nil {
		err = r.Rename(tmp, rel)
	}
	if err != nil {
		_ = r.Remove(tmp)
		return Entry{}, pathErr(p, err)
	}
	return d.statIn(r, rel, p)
}

// Remove deletes p, with everything under it for a directory. The root itself stays.
func (d *Dir) Remove(id, p string) error {
	r, rel, err := d.at(id, p)
	if err != nil {
		return err
	}
	defer r.Close()
	if rel == "." {
		return errdefs.InvalidArgument("the volume's root cannot be removed")
	}
	if _, err := r.Lstat(rel); err != nil {
		return pathErr(p, err)
	}
	return pathErr(p, r.RemoveAll(rel))
}
