// Package snapshot owns the on-disk format of a saved sandbox: one self-contained directory holding
// the runtime's checkpoint image (memory, processes, kernel state), the sandbox's writable layer
// and a manifest (meta.json) that describes the sandbox and carries a checksum of every file.
//
// A snapshot is built in a temporary directory next to its final place, every file synced, and
// renamed into place as the last step, so a crash leaves either a complete snapshot or a
// temporary directory that Sweep removes. Verify checks every checksum before a restore, so a
// corrupt or missing part is refused instead of restored half-way. Paths inside are relative to
// the snapshot or to the data directory, never absolute host paths.
//
// The package never starts or stops runtimes, mounts filesystems or reads sandbox records: the node
// fills the directory and the driver decides what it belongs to.
package snapshot

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Names inside a snapshot directory.
const (
	MetaFile      = "meta.json"
	CheckpointDir = "checkpoint" // the runtime's image; absent for filesystem-only snapshots
	LayerDir      = "layer"      // the writable layer (disk.img, or an upper directory)
	tmpPrefix     = ".tmp-"
	spentPrefix   = ".spent-"
)

// formatVersion changes when a reader of an older format could misread a newer snapshot. Version 1
// differs only in its checksums (see checksumFile) and is still read.
const formatVersion = 2

// Meta describes a snapshot: what to rebuild the sandbox from and what the files must contain.
type Meta struct {
	Version   int       `json:"version"`
	SandboxID string    `json:"sandboxID"`
	CreatedAt time.Time `json:"createdAt"`
	// TemplateID and BuildID name the template build whose layers lie under the writable layer;
	// Lowers are those layers relative to the data directory, topmost first.
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID,omitempty"`
	Lowers     []string `json:"lowers"`
	CPUs       int      `json:"cpus"`
	MemoryMB   int      `json:"memoryMB"`
	DiskMB     int      `json:"diskMB"`
	// Memory says the snapshot holds a checkpoint image (processes and memory), not only files.
	Memory bool `json:"memory"`
	// Envd is the directory, relative to the data directory, of the envd build whose process
	// the checkpoint holds: a restore must map that same binary again.
	Envd string `json:"envd,omitempty"`
	// Channel says how the checkpoint's envd gets its agent channel (the node's names; empty
	// for an envd that dials a socket in a host directory, as vmon's did before the control
	// socket).
	Channel string `json:"channel,omitempty"`
	// RootImage is the read-only root image, relative to the data directory, the checkpoint's
	// sandbox booted from: its writable layer lives in the checkpoint (no files are kept beside
	// it), and a restore must open that same image again.
	RootImage string `json:"rootImage,omitempty"`
	// RootImageDigest is that image's digest: a restore takes only the very same image, rebuilt
	// or not.
	RootImageDigest string `json:"rootImageDigest,omitempty"`
	// EnvdToken is the access token the restored envd still holds: a sandbox started from the
	// snapshot proves it to envd to install its own.
	EnvdToken string `json:"envdToken,omitempty"`
	// Files lists every file under the snapshot directory but meta.json, with its checksum.
	Files []File `json:"files"`
}

// File is one file of a snapshot: its path relative to the snapshot directory, size and CRC-32C
// (Castagnoli, hardware-accelerated) over its non-zero blocks and their offsets (checksumFile).
// Holes are not read: a sparse 10 GiB disk image costs what it holds.
type File struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	CRC  uint32 `json:"crc32c"`
}

// Bytes is the disk space the snapshot's files take (allocated blocks, holes excluded).
func Bytes(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				total += st.Blocks * 512
			}
		}
		return nil
	})
	return total
}

var table = crc32.MakeTable(crc32.Castagnoli)

// TempDir returns a fresh temporary directory for a snapshot that will be published as final.
func TempDir(final string) (string, error) {
	parent := filepath.Dir(final)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("create snapshot parent: %w", err)
	}
	return os.MkdirTemp(parent, tmpPrefix+filepath.Base(final)+"-")
}

// Seal checksums every file under dir, writes meta (with Files filled in) and syncs everything.
func Seal(dir string, meta Meta) error {
	meta.Version = formatVersion
	files, err := checksumTree(dir, formatVersion)
	if err != nil {
		return err
	}
	meta.Files = files
	// The files are synced before the manifest that vouches for them takes its place.
	return writeMeta(dir, meta, func() error { return syncTree(dir) })
}

// writeMeta replaces dir's manifest with meta through a rename (Seal also refreshes a published
// snapshot in place); beforeRename runs once the new manifest is written.
func writeMeta(dir string, meta Meta, beforeRename func() error) error {
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fmt.Errorf("encode snapshot meta: %w", err)
	}
	tmp := filepath.Join(dir, MetaFile+".new")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write snapshot meta: %w", err)
	}
	if beforeRename != nil {
		if err := beforeRename(); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, filepath.Join(dir, MetaFile)); err != nil {
		return fmt.Errorf("write snapshot meta: %w", err)
	}
	return syncDir(dir)
}

// Publish renames a sealed temporary directory to final (which must not exist) and syncs the
// parent, so the snapshot is either wholly there after a crash or not at all.
func Publish(tmp, final string) error {
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("publish snapshot: %w", err)
	}
	return syncDir(filepath.Dir(final))
}

// Read returns the manifest of the snapshot in dir without checking the files.
func Read(dir string) (Meta, error) {
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if errors.Is(err, os.ErrNotExist) {
		return Meta{}, errdefs.NotFound("snapshot %s has no manifest", filepath.Base(dir))
	}
	if err != nil {
		return Meta{}, fmt.Errorf("read snapshot manifest: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, corrupt(dir, "its manifest is not valid JSON: %v", err)
	}
	if m.Version != formatVersion && m.Version != 1 {
		return Meta{}, corrupt(dir, "format version %d, this vmon reads %d", m.Version, formatVersion)
	}
	for _, l := range m.Lowers {
		if !filepath.IsLocal(l) {
			return Meta{}, corrupt(dir, "it names a layer outside the data directory")
		}
	}
	if m.Envd != "" && !filepath.IsLocal(m.Envd) {
		return Meta{}, corrupt(dir, "it names an envd outside the data directory")
	}
	return m, nil
}

// Verify reads the manifest and checks that the files under dir are exactly the ones it lists,
// with their sizes and checksums. Any difference is a DataLoss error naming the part.
func Verify(dir string) (Meta, error) {
	m, err := Read(dir)
	if err != nil {
		return Meta{}, err
	}
	got, err := checksumTree(dir, m.Version)
	if err != nil {
		return Meta{}, err
	}
	want := map[string]File{}
	for _, f := range m.Files {
		want[f.Path] = f
	}
	for _, f := range got {
		w, ok := want[f.Path]
		switch {
		case !ok:
			return Meta{}, corrupt(dir, "%s is not part of it", f.Path)
		case w.Size != f.Size:
			return Meta{}, corrupt(dir, "%s has %d bytes, the manifest says %d", f.Path, f.Size, w.Size)
		case w.CRC != f.CRC:
			return Meta{}, corrupt(dir, "%s does not match its checksum", f.Path)
		}
		delete(want, f.Path)
	}
	for p := range want {
		return Meta{}, corrupt(dir, "%s is missing", p)
	}
	return m, nil
}

func corrupt(dir, format string, args ...any) error {
	return errdefs.DataLoss("snapshot %s is damaged and cannot be restored: %s",
		filepath.Base(dir), fmt.Sprintf(format, args...))
}

// Discard moves the snapshot at final out of the way under a name Sweep removes, and returns
// where it went: the caller deletes it at leisure while final's name is free again at once.
func Discard(final string) (string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	trash := filepath.Join(filepath.Dir(final), spentPrefix+filepath.Base(final)+"-"+hex.EncodeToString(b[:]))
	if err := os.Rename(final, trash); err != nil {
		return "", fmt.Errorf("discard snapshot: %w", err)
	}
	return trash, nil
}

// Sweep removes temporary snapshot directories under parent (left by a crash mid-write) and
// discarded ones a crash left before they were deleted, except those of the snapshots named in
// keep (their owner is still settling them).
func Sweep(parent string, keep ...string) error {
	ents, err := os.ReadDir(parent)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, tmpPrefix) && !strings.HasPrefix(name, spentPrefix) {
			continue
		}
		if slices.ContainsFunc(keep, func(k string) bool {
			return strings.HasPrefix(name, tmpPrefix+k+"-") || strings.HasPrefix(name, spentPrefix+k+"-")
		}) {
			continue
		}
		errs = append(errs, os.RemoveAll(filepath.Join(parent, name)))
	}
	return errors.Join(errs...)
}

// SweepOne removes what unfinished writes and removals of the snapshot at final left.
func SweepOne(final string) error {
	parent, base := filepath.Dir(final), filepath.Base(final)
	var errs []error
	for _, prefix := range []string{tmpPrefix, spentPrefix} {
		left, _ := filepath.Glob(filepath.Join(parent, prefix+base+"-*"))
		for _, l := range left {
			errs = append(errs, os.RemoveAll(l))
		}
	}
	return errors.Join(errs...)
}

// checksumTree lists every regular file under dir except the manifest, sorted by path, with
// checksums in the given format version. Files are read in parallel: a restore waits for this.
func checksumTree(dir string, version int) ([]File, error) {
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == MetaFile || rel == MetaFile+".new" || !d.Type().IsRegular() {
			return nil
		}
		files = append(files, File{Path: filepath.ToSlash(rel)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checksum snapshot: %w", err)
	}
	var g errgroup.Group
	g.SetLimit(min(goruntime.NumCPU(), 4))
	for i := range files {
		g.Go(func() error {
			buf := bufPool.Get().(*[]byte)
			defer bufPool.Put(buf)
			size, crc, err := checksumFile(filepath.Join(dir, filepath.FromSlash(files[i].Path)), version, *buf)
			files[i].Size, files[i].CRC = size, crc
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("checksum snapshot: %w", err)
	}
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return files, nil
}

// sumBlock is the unit of the version 2 checksum.
const sumBlock = 4096

// bufPool holds read buffers, a whole number of sumBlocks each.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 256*sumBlock); return &b }}

var zeroBlock [sumBlock]byte

// checksumFile sums path's content without reading its holes. Version 2 sums every 4 KiB block
// that is not all zeros, after its offset: the result depends on the content alone, so a copy
// that moved holes (cp --sparse, rsync -S, tar) still verifies. Version 1 summed each data
// extent after its offset, which ties the sum to the filesystem's layout; it is still read.
func checksumFile(path string, version int, buf []byte) (int64, uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size := st.Size()
	crc := uint32(0)
	var hdr [8]byte
	sumAt := func(off int64, b []byte) {
		binary.LittleEndian.PutUint64(hdr[:], uint64(off))
		crc = crc32.Update(crc, table, hdr[:])
		crc = crc32.Update(crc, table, b)
	}
	// done is where the blocks summed so far end: extents need not start or end on a block.
	done := int64(0)
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			break
		}
		if err != nil {
			return 0, 0, err
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return 0, 0, err
		}
		off = hole
		if version == 1 {
			sumAt(data, nil)
		} else {
			data = max(data/sumBlock*sumBlock, done)
			hole = min((hole+sumBlock-1)/sumBlock*sumBlock, size)
			done = hole
		}
		for pos := data; pos < hole; {
			n, err := f.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if n == 0 && err != nil {
				if err == io.EOF {
					err = fmt.Errorf("%s changed while it was read", path)
				}
				return 0, 0, err
			}
			if version == 1 {
				crc = crc32.Update(crc, table, buf[:n])
			} else {
				for b := 0; b < n; b += sumBlock {
					blk := buf[b:min(b+sumBlock, n)]
					if !bytes.Equal(blk, zeroBlock[:len(blk)]) {
						sumAt(pos+int64(b), blk)
					}
				}
			}
			pos += int64(n)
		}
	}
	return size, crc, nil
}

func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() || d.IsDir() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			err = f.Sync()
			f.Close()
			if err != nil {
				return fmt.Errorf("sync %s: %w", p, err)
			}
		}
		return nil
	})
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Roots are the directories, relative to the data directory, that hold snapshots.
var Roots = []string{"paused", "snapshots"}

// ReferencedLayers returns the template layers (relative to dataDir) that some snapshot stacks
// its writable layer on, so template garbage collection keeps them. A manifest it cannot read is
// an error: deleting a layer is never worth a guess.
func ReferencedLayers(dataDir string) (map[string]bool, error) {
	refs := map[string]bool{}
	for _, root := range Roots {
		metas, err := filepath.Glob(filepath.Join(dataDir, root, "*", MetaFile))
		if err != nil {
			return nil, err
		}
		for _, p := range metas {
			m, err := Read(filepath.Dir(p))
			if err != nil {
				return nil, fmt.Errorf("read snapshot %s: %w", filepath.Base(filepath.Dir(p)), err)
			}
			for _, l := range m.Lowers {
				refs[filepath.Clean(l)] = true
			}
		}
	}
	return refs, nil
}

// SetLowers rewrites the layers a snapshot's writable layer stacks on, for a snapshot fetched
// from another node whose template layers have other names here. Its files and their checksums
// stay as they are (the manifest is not one of them).
func SetLowers(dir string, lowers []string) error {
	m, err := Read(dir)
	if err != nil {
		return err
	}
	for _, l := range lowers {
		if !filepath.IsLocal(l) {
			return fmt.Errorf("snapshot %s: layer %q lies outside the data directory", filepath.Base(dir), l)
		}
	}
	m.Lowers = append([]string(nil), lowers...)
	return writeMeta(dir, m, nil)
}
