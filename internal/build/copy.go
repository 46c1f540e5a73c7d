package build

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/fsroot"
)

// copySpec is one COPY step made concrete.
type copySpec struct {
	// src is the pattern the SDK matched in its context directory; archive paths are relative
	// to that directory.
	src string
	// dest is absolute (already resolved against the workdir); a trailing "/" marks a directory.
	dest     string
	destDir  bool
	uid, gid int
	// mode, when set, replaces the mode of everything copied.
	mode *os.FileMode
}

// openArchive returns a tar reader over a COPY archive, gzipped or not.
func openArchive(f io.ReadSeeker) (*tar.Reader, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	br := bufio.NewReader(f)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.KindInvalidArgument, err, "the uploaded files are not a valid gzip archive")
		}
		return tar.NewReader(zr), nil
	}
	return tar.NewReader(br), nil
}

// cleanEntry makes an archive path relative and clean; paths that climb out are refused.
func cleanEntry(name string) (string, error) {
	c := path.Clean(strings.TrimPrefix(name, "./"))
	if c == "." {
		return "", nil
	}
	if path.IsAbs(c) || c == ".." || strings.HasPrefix(c, "../") {
		return "", errdefs.InvalidArgument("the uploaded archive has an entry outside its directory: %q", name)
	}
	return c, nil
}

// rootOf finds the copied root an archive path belongs to: the SDK archives every path its glob
// matched and, for directories, everything below them, so a root is an entry none of whose
// parent directories is in the archive.
func rootOf(names map[string]bool, name string) (root, rest string) {
	if names[""] && name != "" {
		return "", name // the whole context directory was copied
	}
	parts := strings.Split(name, "/")
	for i := 1; i <= len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		if names[prefix] {
			return prefix, strings.Join(parts[i:], "/")
		}
	}
	return name, ""
}

// applyCopy writes the archive's entries into root (a build's merged root, no sandbox running)
// following Docker's COPY rules: a matched directory's contents go into dest; a single matched
// file becomes dest unless dest is a directory (a trailing "/", several matches, or an existing
// directory), where it keeps its name. It returns the number of entries written.
func applyCopy(root *fsroot.Root, archive io.ReadSeeker, c copySpec) (int, error) {
	// First pass: the archive's paths, then which of them are roots and whether each is a
	// directory.
	tr, err := openArchive(archive)
	if err != nil {
		return 0, err
	}
	names := map[string]bool{}
	var dirs []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, errdefs.Wrap(errdefs.KindInvalidArgument, err, "the uploaded archive is corrupt")
		}
		name, err := cleanEntry(h.Name)
		if err != nil {
			return 0, err
		}
		names[name] = true
		if h.Typeflag == tar.TypeDir {
			dirs = append(dirs, name)
		}
	}
	roots := map[string]bool{} // root -> is a directory
	for name := range names {
		if r, rest := rootOf(names, name); rest != "" {
			roots[r] = true
		} else if _, ok := roots[r]; !ok {
			roots[r] = false
		}
	}
	for _, d := range dirs {
		if _, ok := roots[d]; ok {
			roots[d] = true
		}
	}
	if len(roots) == 0 {
		return 0, errdefs.InvalidArgument("COPY %s: no files in the upload match", c.src)
	}
	destDir := c.destDir || len(roots) > 1
	if !destDir {
		if st, err := root.Stat(c.dest); err == nil && st.Mode&0o170000 == 0o040000 {
			destDir = true
		}
	}
	target := func(r, rest string) string {
		switch {
		case roots[r]: // a directory: its contents go into dest
			return path.Join(c.dest, rest)
		case destDir:
			return path.Join(c.dest, path.Base(r))
		default:
			return c.dest
		}
	}
	if destDir || anyDir(roots) {
		if err := root.MkdirAll(c.dest, 0o755, c.uid, c.gid); err != nil {
			return 0, fmt.Errorf("create %s: %w", c.dest, err)
		}
	}

	tr, err = openArchive(archive)
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, errdefs.Wrap(errdefs.KindInvalidArgument, err, "the uploaded archive is corrupt")
		}
		name, _ := cleanEntry(h.Name)
		dst := target(rootOf(names, name))
		if err := root.MkdirAll(path.Dir(dst), 0o755, c.uid, c.gid); err != nil {
			return n, fmt.Errorf("create %s: %w", path.Dir(dst), err)
		}
		mode := h.FileInfo().Mode()
		if c.mode != nil {
			mode = *c.mode
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(dst, mode, c.uid, c.gid); err != nil {
				return n, err
			}
			if err := root.Chown(dst, c.uid, c.gid); err != nil {
				return n, err
			}
			if err := root.Chmod(dst, mode); err != nil {
				return n, err
			}
		case tar.TypeReg:
			if err := root.CreateFile(dst, mode, c.uid, c.gid, func(w io.Writer) error {
				_, err := io.Copy(w, tr)
				return err
			}); err != nil {
				return n, err
			}
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, dst, c.uid, c.gid); err != nil {
				return n, err
			}
		case tar.TypeLink:
			// Hard links inside an upload: copy the already-written target's bytes; a link
			// between copied files needs no identity inside a template.
			linked, err := cleanEntry(h.Linkname)
			if err != nil {
				return n, err
			}
			if !names[linked] {
				return n, errdefs.InvalidArgument("COPY %s: hard link %q points outside the copied files", c.src, h.Name)
			}
			data, err := root.ReadFile(target(rootOf(names, linked)), 1<<40)
			if err != nil {
				return n, fmt.Errorf("read hard link target: %w", err)
			}
			if err := root.WriteFile(dst, data, mode, c.uid, c.gid); err != nil {
				return n, err
			}
		default:
			return n, errdefs.InvalidArgument("COPY %s: %q is not a file, directory or symlink", c.src, h.Name)
		}
		n++
	}
}

func anyDir(roots map[string]bool) bool {
	for _, d := range roots {
		if d {
			return true
		}
	}
	return false
}
