package artifacts

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// PullStats describes a finished pull.
type PullStats struct {
	Manifest     string
	Files        int   // regular files
	Bytes        int64 // their total size, holes included
	Chunks       int   // distinct stored chunks the tree needs
	FromCache    int   // chunks found in the local cache
	Fetched      int   // chunks fetched from the backend
	FetchedBytes int64
	Duration     time.Duration
}

// Pull builds the tree ref names at dir, which must not exist. The tree is assembled in a
// temporary directory beside dir and renamed into place once complete and synced, so dir either
// does not exist or holds the whole tree; a failed pull removes its temporary directory, and the
// next pull to the same dir removes one a crash left. Every chunk is checked against its digest
// (a damaged one fails the pull with ErrCorrupt). Owners, device nodes and trusted.* attributes
// need root; without it owners are left as they come.
func (s *Store) Pull(ctx context.Context, ref, dir string) (PullStats, error) {
	start := time.Now()
	dir, err := filepath.Abs(dir)
	if err != nil {
		return PullStats{}, err
	}
	if !s.claim(dir) {
		return PullStats{}, fmt.Errorf("artifacts: pull %s to %s: another pull to it is running", ref, dir)
	}
	defer s.release(dir)
	if _, err := os.Lstat(dir); err == nil {
		return PullStats{}, fmt.Errorf("artifacts: pull %s: %s: %w", ref, dir, fs.ErrExist)
	}
	ri, err := s.Resolve(ctx, ref)
	if err != nil {
		return PullStats{}, err
	}
	m, err := s.loadManifest(ctx, ri.Manifest)
	if err != nil {
		return PullStats{}, fmt.Errorf("artifacts: pull %s: %w", ref, err)
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return PullStats{}, fmt.Errorf("artifacts: pull %s: %w", ref, err)
	}
	s.removeStalePulls(parent, filepath.Base(dir))
	tmp := filepath.Join(parent, tmpPullName(filepath.Base(dir))+randomID()[:8])
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return PullStats{}, fmt.Errorf("artifacts: pull %s: %w", ref, err)
	}
	st, err := s.pullInto(ctx, m, tmp)
	if err == nil {
		err = syncTree(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		if rerr := removeTree(tmp); rerr != nil {
			s.log.Warn("artifacts: could not remove a failed pull's directory", "dir", tmp, "err", rerr)
		}
		return PullStats{}, fmt.Errorf("artifacts: pull %s to %s: %w", ref, dir, err)
	}
	if err := syncDir(parent); err != nil {
		return PullStats{}, fmt.Errorf("artifacts: pull %s: %w", ref, err)
	}
	st.Manifest = ri.Manifest
	st.Duration = time.Since(start)
	s.log.Info("artifacts: pulled", "ref", ref, "store", s.b.String(), "dir", dir, "manifest", ri.Manifest[:12],
		"files", st.Files, "bytes", st.Bytes, "chunks", st.Chunks, "fromCache", st.FromCache,
		"fetched", st.Fetched, "fetchedBytes", st.FetchedBytes, "took", st.Duration.Round(time.Millisecond))
	return st, nil
}

func tmpPullName(base string) string { return tmpPrefix + "pull-" + base + "~" }

// removeStalePulls removes what pulls to parent/base that died with their process left behind.
// Pulls to one target are serialised by claim, so any such directory is dead.
func (s *Store) removeStalePulls(parent, base string) {
	prefix := tmpPullName(base)
	ents, _ := os.ReadDir(parent)
	for _, de := range ents {
		if name := de.Name(); strings.HasPrefix(name, prefix) && len(name) == len(prefix)+8 {
			p := filepath.Join(parent, name)
			if err := removeTree(p); err != nil {
				s.log.Warn("artifacts: could not remove a dead pull's directory", "dir", p, "err", err)
			} else {
				s.log.Info("artifacts: removed a dead pull's directory", "dir", p)
			}
		}
	}
}

func (s *Store) claim(dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pulling[dir] {
		return false
	}
	s.pulling[dir] = true
	return true
}

func (s *Store) release(dir string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pulling, dir)
}

// loc is one place a stored object's bytes go: n bytes from offset src of the object (a pack)
// or all of it (a chunk, src 0), to offset off of a file.
type loc struct {
	path   string
	off    int64
	n      int64
	src    int64
	inPack bool
}

func (s *Store) pullInto(ctx context.Context, m *Manifest, root string) (PullStats, error) {
	var st PullStats
	at := func(e *Entry) string { return filepath.Join(root, filepath.FromSlash(e.Path)) }

	// The skeleton: directories (owner-only until the end, so the pull can write into them),
	// empty files of their final size, links and nodes.
	want := map[string][]loc{}
	var order []string
	for i := range m.Entries {
		e := &m.Entries[i]
		p := at(e)
		var err error
		switch e.Type {
		case TypeDir:
			if e.Path != "." {
				err = os.Mkdir(p, 0o700)
			}
		case TypeFile:
			st.Files++
			st.Bytes += e.Size
			err = createSized(p, e.Size)
			add := func(d string, l loc) {
				if _, ok := want[d]; !ok {
					order = append(order, d)
				}
				want[d] = append(want[d], l)
			}
			if e.Pack != "" {
				add(e.Pack, loc{path: p, n: e.Size, src: e.PackOff, inPack: true})
			}
			for j, d := range e.Chunks {
				if d != "" {
					off := int64(j) * m.ChunkSize
					add(d, loc{path: p, off: off, n: min(m.ChunkSize, e.Size-off)})
				}
			}
		case TypeHardlink:
			err = os.Link(filepath.Join(root, filepath.FromSlash(e.Target)), p)
		case TypeSymlink:
			err = os.Symlink(e.Target, p)
		case TypeFIFO:
			err = unix.Mknod(p, unix.S_IFIFO|0o600, 0)
		case TypeChar:
			err = unix.Mknod(p, unix.S_IFCHR|0o600, int(e.Rdev))
		case TypeBlock:
			err = unix.Mknod(p, unix.S_IFBLK|0o600, int(e.Rdev))
		}
		if err != nil {
			return st, fmt.Errorf("create %s: %w", e.Path, err)
		}
	}
	st.Chunks = len(order)

	// The chunks, each fetched once however many places it goes.
	if s.cache != nil {
		s.cache.pin(order)
	}
	var mu sync.Mutex
	bufs := sync.Pool{New: func() any { b := make([]byte, m.ChunkSize); return &b }}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.concurrency)
	for _, d := range order {
		g.Go(func() error {
			if s.cache != nil {
				defer s.cache.unpin(d)
			}
			if err := gctx.Err(); err != nil {
				return err
			}
			bp := bufs.Get().(*[]byte)
			defer bufs.Put(bp)
			var data []byte
			cached := false
			if s.cache != nil {
				data, cached = s.cache.get(d, *bp)
			}
			if !cached {
				var err error
				data, err = s.fetch(gctx, chunkKey(d), d, *bp, m.ChunkSize)
				if err != nil {
					return err
				}
				if s.cache != nil {
					s.cache.put(d, data)
				}
			}
			mu.Lock()
			if cached {
				st.FromCache++
			} else {
				st.Fetched++
				st.FetchedBytes += int64(len(data))
			}
			mu.Unlock()
			for _, l := range want[d] {
				if l.inPack && l.src+l.n > int64(len(data)) || !l.inPack && int64(len(data)) != l.n {
					return fmt.Errorf("%w: object %s has %d bytes, %s needs %d at %d", ErrCorrupt, d, len(data), l.path, l.n, l.src)
				}
				if err := writeSparse(l.path, data[l.src:l.src+l.n], l.off); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return st, err
	}

	// Owners, attributes, modes and times last, children before parents: a directory's time
	// would change with every entry made in it, and a read-only directory would refuse them.
	root0 := os.Geteuid() == 0
	for i := len(m.Entries) - 1; i >= 0; i-- {
		e := &m.Entries[i]
		if e.Type == TypeHardlink {
			continue // the file entry it shares an inode with sets everything
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if err := applyMeta(at(e), e, root0); err != nil {
			return st, fmt.Errorf("%s: %w", e.Path, err)
		}
	}
	return st, nil
}

// applyMeta sets owner, then extended attributes (a chown drops file capabilities), then mode (a
// chown drops setuid bits), then times.
func applyMeta(p string, e *Entry, asRoot bool) error {
	if asRoot {
		if err := unix.Lchown(p, e.UID, e.GID); err != nil {
			return fmt.Errorf("lchown: %w", err)
		}
	}
	for name, val := range e.Xattrs {
		if err := unix.Lsetxattr(p, name, val, 0); err != nil {
			return fmt.Errorf("lsetxattr %s: %w", name, err)
		}
	}
	if e.Type != TypeSymlink {
		if err := unix.Chmod(p, e.Mode); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	ts := unix.NsecToTimespec(e.MTime)
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimes: %w", err)
	}
	return nil
}

func createSized(p string, size int64) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if size > 0 {
		if err := f.Truncate(size); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// writeSparse writes data at off, skipping 4 KiB blocks of zeros: the file was created at its
// final size, so they read back as zeros and stay holes on disk, as they were where the tree was
// pushed from (a sandbox's disk image is mostly hole).
func writeSparse(p string, data []byte, off int64) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	const blk = len(zeroBlock)
	for i := 0; i < len(data); {
		if allZero(data[i:min(i+blk, len(data))]) {
			i += blk
			continue
		}
		j := i + blk
		for j < len(data) && !allZero(data[j:min(j+blk, len(data))]) {
			j += blk
		}
		j = min(j, len(data))
		if _, err := f.WriteAt(data[i:j], off+int64(i)); err != nil {
			f.Close()
			return err
		}
		i = j
	}
	return f.Close()
}

// syncTree makes the pulled tree durable before it is renamed into place.
func syncTree(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// removeTree removes a pulled tree, even one whose directories were already made read-only.
func removeTree(p string) error {
	if err := os.RemoveAll(p); err == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	_ = filepath.WalkDir(p, func(q string, de fs.DirEntry, err error) error {
		if err == nil && de.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}
