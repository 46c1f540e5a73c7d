package nodeimage

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// TreeOptions shape the layer WriteTree makes of a directory.
type TreeOptions struct {
	// Epoch clamps every entry's mtime (SOURCE_DATE_EPOCH): files newer than it (written during
	// the build) get it, files older (as shipped in their packages) keep theirs.
	Epoch time.Time
	// Empty names directories (relative, slash-separated, e.g. "dev") whose contents are left
	// out: the directory itself is kept. Runtimes provide /dev, /proc and /sys.
	Empty []string
}

// keptXattrs are the extended attributes carried into the layer. Only file capabilities matter
// to what runs in the image; others (security.selinux, trusted.*) describe the build host.
var keptXattrs = []string{"security.capability"}

// WriteTree writes the directory root as an uncompressed layer tar to w, reproducibly: entries in
// lexical order of their paths, names relative without a leading "./" (directories with a
// trailing "/"), numeric owners only, mtimes clamped to opts.Epoch and whole seconds, no access
// or change times, hard links as links to the first path of the inode in that order. Sockets are
// left out (a tar cannot hold them).
func WriteTree(w io.Writer, root string, opts TreeOptions) error {
	tw := tar.NewWriter(w)
	empty := map[string]bool{}
	for _, e := range opts.Empty {
		empty[strings.Trim(e, "/")] = true
	}
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	// WalkDir visits in lexical order of names within a directory, which is the lexical order of
	// the paths (a directory's own entry sorts before its children).
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if underEmpty(rel, empty) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
		hdr := &tar.Header{
			Name:    rel,
			Mode:    int64(st.Mode & 0o7777),
			Uid:     int(st.Uid),
			Gid:     int(st.Gid),
			ModTime: clamp(time.Unix(st.Mtim.Sec, 0), opts.Epoch),
		}
		var content string
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
		case unix.S_IFREG:
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok && st.Nlink > 1 {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				break
			}
			if st.Nlink > 1 {
				links[key] = rel
			}
			hdr.Typeflag, hdr.Size, content = tar.TypeReg, st.Size, path
		case unix.S_IFLNK:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case unix.S_IFCHR, unix.S_IFBLK:
			hdr.Typeflag = tar.TypeChar
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				hdr.Typeflag = tar.TypeBlock
			}
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
		default: // sockets
			return nil
		}
		if hdr.Typeflag != tar.TypeSymlink {
			for _, name := range keptXattrs {
				if v, ok, err := lgetxattr(path, name); err != nil {
					return err
				} else if ok {
					if hdr.PAXRecords == nil {
						hdr.PAXRecords = map[string]string{}
					}
					hdr.PAXRecords["SCHILY.xattr."+name] = v
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if content != "" {
			if err := copyFile(tw, content, hdr.Size); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func underEmpty(rel string, empty map[string]bool) bool {
	for dir := filepath.ToSlash(filepath.Dir(rel)); dir != "." && dir != "/"; dir = filepath.ToSlash(filepath.Dir(dir)) {
		if empty[dir] {
			return true
		}
	}
	return false
}

func clamp(t, epoch time.Time) time.Time {
	if !epoch.IsZero() && t.After(epoch) {
		return epoch.UTC()
	}
	return t.UTC()
}

func lgetxattr(path, name string) (string, bool, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
		switch {
		case errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP):
			return "", false, nil
		case errors.Is(err, unix.ERANGE):
			buf = make([]byte, 2*len(buf))
			continue
		case err != nil:
			return "", false, fmt.Errorf("read %s of %s: %w", name, path, err)
		}
		return string(buf[:n]), true, nil
	}
}

// copyFile copies exactly size bytes of path into w: a file that changed size since it was
// looked at is an error, not a corrupt layer.
func copyFile(w io.Writer, path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return fmt.Errorf("copy %s: %w", path, err)
	}
	if n != size {
		return fmt.Errorf("copy %s: %d bytes, expected %d (changed during the build?)", path, n, size)
	}
	return nil
}
