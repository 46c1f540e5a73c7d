package artifacts

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Entry types in a manifest.
const (
	TypeDir      = "dir"
	TypeFile     = "file"
	TypeSymlink  = "symlink"
	TypeHardlink = "hardlink" // another name for an earlier file entry (Target)
	TypeChar     = "char"
	TypeBlock    = "block"
	TypeFIFO     = "fifo"
)

const manifestFormat = 1

// maxManifestBytes bounds a decoded manifest, so a damaged or hostile object cannot make a pull
// inflate gigabytes into memory. A 40,000-file rootfs takes about 8 MiB.
const maxManifestBytes = 512 << 20

// Manifest records a directory tree: every entry in walk order (each parent before its children)
// and how regular files are cut into chunks.
type Manifest struct {
	Format    int     `json:"format"`
	ChunkSize int64   `json:"chunkSize"`
	Entries   []Entry `json:"entries"`
}

// Entry is one file, directory, link or device node of a tree.
type Entry struct {
	// Path is slash-separated and relative to the tree's root; the root itself is ".".
	Path string `json:"path"`
	Type string `json:"type"`
	// Mode holds the permission bits with setuid, setgid and sticky (07777).
	Mode  uint32 `json:"mode"`
	UID   int    `json:"uid"`
	GID   int    `json:"gid"`
	MTime int64  `json:"mtime"` // nanoseconds since the epoch
	Size  int64  `json:"size,omitempty"`
	// Target is a symlink's target, or the path of the file entry a hardlink shares.
	Target string `json:"target,omitempty"`
	Rdev   uint64 `json:"rdev,omitempty"`
	// Xattrs are the extended attributes (overlayfs's trusted.* markers, file capabilities).
	Xattrs map[string][]byte `json:"xattrs,omitempty"`
	// Chunks are the digests of a file's ChunkSize pieces in order; "" is a piece of zeros, which
	// is not stored and stays a hole when pulled.
	Chunks []string `json:"chunks,omitempty"`
	// Pack, for a small file instead of Chunks, is the digest of the stored object that holds
	// it with other small files, at offset PackOff.
	Pack    string `json:"pack,omitempty"`
	PackOff int64  `json:"packOff,omitempty"`
}

// packable reports whether a file of this size travels in a pack with other small files: a
// rootfs is mostly files of a few KiB, and one object per file would make a push or pull of it
// tens of thousands of requests.
func packable(size, chunkSize int64) bool {
	return size > 0 && size <= min(64<<10, chunkSize/4)
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func validDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func chunkCount(size, chunkSize int64) int {
	return int((size + chunkSize - 1) / chunkSize)
}

// scanTree records root's tree without reading file contents (chunks are filled in by the push).
// Sockets are skipped: they mean nothing once their process is gone.
func scanTree(root string, chunkSize int64, log *slog.Logger) (*Manifest, error) {
	m := &Manifest{Format: manifestFormat, ChunkSize: chunkSize}
	type inode struct{ dev, ino uint64 }
	firstName := map[inode]string{}
	err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		e := Entry{
			Path:  rel,
			Mode:  st.Mode & 0o7777,
			UID:   int(st.Uid),
			GID:   int(st.Gid),
			MTime: st.Mtim.Nano(),
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			e.Type = TypeDir
		case unix.S_IFREG:
			e.Type = TypeFile
			if st.Nlink > 1 {
				id := inode{uint64(st.Dev), st.Ino}
				if first, ok := firstName[id]; ok {
					m.Entries = append(m.Entries, Entry{Path: rel, Type: TypeHardlink, Target: first})
					return nil
				}
				firstName[id] = rel
			}
			e.Size = st.Size
			e.Chunks = make([]string, chunkCount(st.Size, chunkSize))
		case unix.S_IFLNK:
			e.Type = TypeSymlink
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFCHR:
			e.Type, e.Rdev = TypeChar, st.Rdev
		case unix.S_IFBLK:
			e.Type, e.Rdev = TypeBlock, st.Rdev
		case unix.S_IFIFO:
			e.Type = TypeFIFO
		default:
			log.Debug("artifacts: skipping socket", "path", p)
			return nil
		}
		if e.Xattrs, err = readXattrs(p); err != nil {
			return err
		}
		m.Entries = append(m.Entries, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("artifacts: scan %s: %w", root, err)
	}
	if len(m.Entries) == 0 || m.Entries[0].Type != TypeDir {
		return nil, fmt.Errorf("artifacts: scan %s: not a directory", root)
	}
	return m, nil
}

func readXattrs(p string) (map[string][]byte, error) {
	var names []byte
	for size := 256; ; size *= 4 {
		names = make([]byte, size)
		n, err := unix.Llistxattr(p, names)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, &fs.PathError{Op: "llistxattr", Path: p, Err: err}
		}
		names = names[:n]
		break
	}
	var out map[string][]byte
	for name := range strings.SplitSeq(string(names), "\x00") {
		if name == "" {
			continue
		}
		var val []byte
		for size := 256; ; size *= 4 {
			val = make([]byte, size)
			n, err := unix.Lgetxattr(p, name, val)
			if errors.Is(err, unix.ERANGE) && size < 1<<20 {
				continue
			}
			if errors.Is(err, unix.ENODATA) {
				val = nil
				break
			}
			if err != nil {
				return nil, &fs.PathError{Op: "lgetxattr " + name, Path: p, Err: err}
			}
			val = val[:n]
			break
		}
		if val == nil {
			continue // removed between list and get
		}
		if out == nil {
			out = map[string][]byte{}
		}
		out[name] = val
	}
	return out, nil
}

func encodeManifest(m *Manifest) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := json.NewEncoder(zw).Encode(m); err != nil {
		return nil, fmt.Errorf("artifacts: encode manifest: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("artifacts: encode manifest: %w", err)
	}
	return buf.Bytes(), nil
}

// decodeManifest decodes and validates a stored manifest. Every check that keeps a pull inside its
// target directory is here: paths are relative and clean, each parent is a directory entry
// made earlier (so no path passes through a symlink), and hardlinks name earlier files.
func decodeManifest(data []byte) (*Manifest, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrCorrupt, err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrCorrupt, err)
	}
	if len(raw) > maxManifestBytes {
		return nil, fmt.Errorf("%w: manifest larger than %d bytes", ErrCorrupt, maxManifestBytes)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrCorrupt, err)
	}
	if err := m.validate(); err != nil {
		return nil, fmt.Errorf("%w: manifest: %w", ErrCorrupt, err)
	}
	return &m, nil
}

func (m *Manifest) validate() error {
	if m.Format != manifestFormat {
		return fmt.Errorf("format %d, want %d", m.Format, manifestFormat)
	}
	if m.ChunkSize < 4096 || m.ChunkSize > 1<<30 || m.ChunkSize%4096 != 0 {
		return fmt.Errorf("chunk size %d", m.ChunkSize)
	}
	if len(m.Entries) == 0 || m.Entries[0].Path != "." || m.Entries[0].Type != TypeDir {
		return errors.New("first entry is not the root directory")
	}
	types := make(map[string]string, len(m.Entries))
	for i, e := range m.Entries {
		if i > 0 {
			if e.Path == "" || e.Path == "." || path.IsAbs(e.Path) || path.Clean(e.Path) != e.Path ||
				e.Path == ".." || strings.HasPrefix(e.Path, "../") || strings.ContainsRune(e.Path, 0) {
				return fmt.Errorf("entry %d: bad path %q", i, e.Path)
			}
			if types[path.Dir(e.Path)] != TypeDir {
				return fmt.Errorf("entry %q: parent is not an earlier directory", e.Path)
			}
		}
		if _, dup := types[e.Path]; dup {
			return fmt.Errorf("entry %q: listed twice", e.Path)
		}
		types[e.Path] = e.Type
		if e.Mode&^0o7777 != 0 {
			return fmt.Errorf("entry %q: mode %o", e.Path, e.Mode)
		}
		switch e.Type {
		case TypeFile:
			if e.Pack != "" {
				if !validDigest(e.Pack) || len(e.Chunks) != 0 || !packable(e.Size, m.ChunkSize) ||
					e.PackOff < 0 || e.PackOff+e.Size > m.ChunkSize {
					return fmt.Errorf("entry %q: bad pack reference", e.Path)
				}
				break
			}
			if e.Size < 0 || len(e.Chunks) != chunkCount(e.Size, m.ChunkSize) {
				return fmt.Errorf("entry %q: size %d with %d chunks", e.Path, e.Size, len(e.Chunks))
			}
			for _, d := range e.Chunks {
				if d != "" && !validDigest(d) {
					return fmt.Errorf("entry %q: bad chunk digest %q", e.Path, d)
				}
			}
		case TypeHardlink:
			if types[e.Target] != TypeFile {
				return fmt.Errorf("entry %q: hardlink to %q, which is not an earlier file", e.Path, e.Target)
			}
		case TypeSymlink:
			if e.Target == "" || strings.ContainsRune(e.Target, 0) {
				return fmt.Errorf("entry %q: bad symlink target", e.Path)
			}
		case TypeDir, TypeChar, TypeBlock, TypeFIFO:
		default:
			return fmt.Errorf("entry %q: unknown type %q", e.Path, e.Type)
		}
		if e.Type != TypeFile && (len(e.Chunks) != 0 || e.Pack != "") {
			return fmt.Errorf("entry %q: a %s with contents", e.Path, e.Type)
		}
	}
	return nil
}
