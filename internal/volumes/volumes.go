// Package volumes owns the directories behind E2B volumes on one node: one directory per volume
// under <data-dir>/volumes/, mounted into every sandbox that names it and kept across sandbox
// kills, pauses and node restarts, and the file operations of E2B's volume content API on it.
//
// Every path a client gives is resolved inside the volume's directory with os.Root, so no path,
// symlink or ".." in the volume can reach anything outside it. The package never reads records,
// tokens or sandboxes: the driver decides who may touch which volume.
package volumes

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Dir holds the volumes of one node.
type Dir struct{ root string }

// New returns the volumes under dataDir/volumes, creating that directory.
func New(dataDir string) (*Dir, error) {
	root := filepath.Join(dataDir, "volumes")
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("create volumes dir: %w", err)
	}
	return &Dir{root: root}, nil
}

var idRe = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// Path is the host directory of volume id, which sandboxes mount.
func (d *Dir) Path(id string) (string, error) {
	if !idRe.MatchString(id) {
		return "", errdefs.InvalidArgument("invalid volume id")
	}
	return filepath.Join(d.root, id), nil
}

// Create makes volume id's directory. Guests of any user may write at its top, as on a fresh disk
// (sticky, like /tmp, so users do not remove each other's files).
func (d *Dir) Create(id string) error {
	p, err := d.Path(id)
	if err != nil {
		return err
	}
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create volume: %w", err)
	}
	return os.Chmod(p, 0o777|os.ModeSticky)
}

// Delete removes volume id and everything in it; a missing one is success.
func (d *Dir) Delete(id string) error {
	p, err := d.Path(id)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("remove volume: %w", err)
	}
	return nil
}

// IDs lists the volumes on disk.
func (d *Dir) IDs() ([]string, error) {
	ents, err := os.ReadDir(d.root)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && idRe.MatchString(e.Name()) {
			ids = append(ids, e.Name())
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
	p, err := d.Path(id)
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
