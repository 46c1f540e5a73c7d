package artifacts

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// PushStats describes a finished push.
type PushStats struct {
	Manifest      string // digest of the tree's manifest
	Files         int    // regular files
	Bytes         int64  // their total size, holes included
	Chunks        int    // distinct stored chunks the tree needs
	Uploaded      int    // objects uploaded (chunks and manifest); the rest were already there
	UploadedBytes int64
	Duration      time.Duration
}

// Push stores the tree under dir and points ref at it. The tree must not change while it is
// pushed (a file that does is refused). Chunks the backend already holds are not uploaded again,
// so pushing again after an interruption sends only what is missing. The ref is written last:
// until Push returns nil, readers of ref see its previous tree, if any.
func (s *Store) Push(ctx context.Context, ref, dir string) (PushStats, error) {
	start := time.Now()
	if err := CheckRef(ref); err != nil {
		return PushStats{}, err
	}
	// Read before any chunk is checked: a GC that starts after this is seen at commit.
	seen, err := s.readGCState(ctx)
	if err != nil {
		return PushStats{}, fmt.Errorf("artifacts: push %s: %w", ref, err)
	}
	// A template's directory may be reached through a symlink; the tree is what it points at.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return PushStats{}, fmt.Errorf("artifacts: push %s: %w", ref, err)
	}
	m, err := scanTree(dir, s.chunkSize, s.log)
	if err != nil {
		return PushStats{}, fmt.Errorf("artifacts: push %s: %w", ref, err)
	}
	p := &pusher{s: s, root: dir, calls: map[string]*call{}, sources: map[string]source{}}
	p.bufs.New = func() any { b := make([]byte, s.chunkSize); return &b }

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(cctx)
	g.SetLimit(s.concurrency)
	var st PushStats
	var packErr error
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Type != TypeFile {
			continue
		}
		st.Files++
		st.Bytes += e.Size
		if packable(e.Size, s.chunkSize) {
			if packErr = p.pack(gctx, g, e); packErr != nil {
				cancel()
				break
			}
			continue
		}
		for j := range e.Chunks {
			g.Go(func() error { return p.chunk(gctx, e, j) })
		}
	}
	if packErr == nil {
		p.flushPack(gctx, g)
	}
	err = g.Wait()
	if packErr != nil {
		err = packErr
	}
	if err != nil {
		return PushStats{}, fmt.Errorf("artifacts: push %s from %s: %w", ref, dir, err)
	}
	if err := checkUnchanged(dir, m); err != nil {
		return PushStats{}, fmt.Errorf("artifacts: push %s: %w", ref, err)
	}

	enc, err := encodeManifest(m)
	if err != nil {
		return PushStats{}, err
	}
	md := digestOf(enc)
	p.sources[manifestKey(md)] = source{data: enc}
	if err := p.ensure(ctx, manifestKey(md), enc); err != nil {
		return PushStats{}, fmt.Errorf("artifacts: push %s: manifest: %w", ref, err)
	}
	if s.cache != nil {
		// The node that pushes a tree is likely to pull it next (a paused sandbox resumed here).
		s.cache.put(md, enc)
	}

	if s.beforeCommit != nil {
		s.beforeCommit()
	}
	info := RefInfo{Manifest: md, Files: st.Files, Bytes: st.Bytes}
	if err := s.commit(ctx, ref, info, seen, p.reverify); err != nil {
		return PushStats{}, err
	}
	st.Manifest = md
	st.Chunks = len(p.sources) - 1
	st.Uploaded, st.UploadedBytes = p.uploaded, p.uploadedBytes
	st.Duration = time.Since(start)
	s.log.Info("artifacts: pushed", "ref", ref, "store", s.b.String(), "manifest", md[:12],
		"files", st.Files, "bytes", st.Bytes, "chunks", st.Chunks, "uploaded", st.Uploaded,
		"uploadedBytes", st.UploadedBytes, "took", st.Duration.Round(time.Millisecond))
	return st, nil
}

type pusher struct {
	s    *Store
	root string
	bufs sync.Pool

	// The pack being filled with small files, in walk order.
	packBuf     []byte
	packMembers []*Entry

	mu            sync.Mutex
	calls         map[string]*call  // key -> the one upload of it in this push
	sources       map[string]source // key -> where to read it again (reverify)
	uploaded      int
	uploadedBytes int64
}

type call struct {
	done chan struct{}
	err  error
}

// source is where an object's bytes can be read again: a file range, the files of a pack, or
// bytes in memory.
type source struct {
	path   string
	off, n int64
	files  []string
	digest string
	data   []byte
}

// pack adds a small file to the current pack, and stores the pack once it is full or the file
// ends it. Where a pack ends depends on the content of the file that ends it (and a minimum
// size), not on a running total alone, so a file that changes or appears between two pushes of a
// tree changes the packs around it and not every pack after it.
func (p *pusher) pack(ctx context.Context, g *errgroup.Group, e *Entry) error {
	path := filepath.Join(p.root, filepath.FromSlash(e.Path))
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if int64(len(data)) != e.Size {
		return fmt.Errorf("%s changed while it was pushed", path)
	}
	e.Chunks = nil
	e.PackOff = int64(len(p.packBuf))
	p.packBuf = append(p.packBuf, data...)
	p.packMembers = append(p.packMembers, e)
	cs := p.s.chunkSize
	full := int64(len(p.packBuf))+min(64<<10, cs/4) > cs
	if full || (int64(len(p.packBuf)) >= cs/4 && sha256.Sum256(data)[0] < 8) {
		p.flushPack(ctx, g)
	}
	return nil
}

func (p *pusher) flushPack(ctx context.Context, g *errgroup.Group) {
	if len(p.packMembers) == 0 {
		return
	}
	buf, members := p.packBuf, p.packMembers
	p.packBuf, p.packMembers = make([]byte, 0, len(buf)), nil
	d := digestOf(buf)
	files := make([]string, len(members))
	for i, e := range members {
		e.Pack = d
		files[i] = filepath.Join(p.root, filepath.FromSlash(e.Path))
	}
	key := chunkKey(d)
	p.mu.Lock()
	p.sources[key] = source{files: files, n: int64(len(buf)), digest: d}
	p.mu.Unlock()
	g.Go(func() error { return p.ensure(ctx, key, buf) })
}

// chunk hashes chunk j of a file and makes sure the backend holds it.
func (p *pusher) chunk(ctx context.Context, e *Entry, j int) error {
	cs := p.s.chunkSize
	off := int64(j) * cs
	n := min(cs, e.Size-off)
	path := filepath.Join(p.root, filepath.FromSlash(e.Path))
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if hole, err := isHole(f, off, n); err != nil {
		return err
	} else if hole {
		return nil
	}
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	data := (*bp)[:n]
	if _, err := f.ReadAt(data, off); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s shrank while it was pushed", path)
		}
		return err
	}
	if allZero(data) {
		return nil
	}
	d := digestOf(data)
	e.Chunks[j] = d
	key := chunkKey(d)
	p.mu.Lock()
	p.sources[key] = source{path: path, off: off, n: n, digest: d}
	p.mu.Unlock()
	return p.ensure(ctx, key, data)
}

// ensure uploads an object unless the backend has it (or this push is already uploading it).
func (p *pusher) ensure(ctx context.Context, key string, data []byte) error {
	p.mu.Lock()
	if c, ok := p.calls[key]; ok {
		p.mu.Unlock()
		select {
		case <-c.done:
			return c.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := &call{done: make(chan struct{})}
	p.calls[key] = c
	p.mu.Unlock()
	c.err = p.upload(ctx, key, data)
	close(c.done)
	return c.err
}

func (p *pusher) upload(ctx context.Context, key string, data []byte) error {
	info, err := p.s.b.Stat(ctx, key)
	if err == nil && info.Size == int64(len(data)) {
		return nil
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	// Missing, or of the wrong size (damaged): store it (again).
	if err := p.s.b.Put(ctx, key, data); err != nil {
		return err
	}
	p.mu.Lock()
	p.uploaded++
	p.uploadedBytes += int64(len(data))
	p.mu.Unlock()
	return nil
}

// reverify checks, after a GC, that every object the push relies on is still stored, and uploads
// again (from the tree, checked against its digest) whatever the GC deleted.
func (p *pusher) reverify(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(p.s.concurrency)
	missing := 0
	var mu sync.Mutex
	for key, src := range p.sources {
		g.Go(func() error {
			if _, err := p.s.b.Stat(gctx, key); err == nil {
				return nil
			} else if !errors.Is(err, ErrNotFound) {
				return err
			}
			mu.Lock()
			missing++
			mu.Unlock()
			data := src.data
			switch {
			case src.files != nil:
				for _, f := range src.files {
					b, err := os.ReadFile(f)
					if err != nil {
						return err
					}
					data = append(data, b...)
				}
				if digestOf(data) != src.digest {
					return fmt.Errorf("a file of %s changed while it was pushed", filepath.Dir(src.files[0]))
				}
			case data == nil:
				bp := p.bufs.Get().(*[]byte)
				defer p.bufs.Put(bp)
				f, err := os.Open(src.path)
				if err != nil {
					return err
				}
				data = (*bp)[:src.n]
				_, err = f.ReadAt(data, src.off)
				f.Close()
				if err != nil {
					return err
				}
				if digestOf(data) != src.digest {
					return fmt.Errorf("%s changed while it was pushed", src.path)
				}
			}
			return p.upload(gctx, key, data)
		})
	}
	err := g.Wait()
	p.s.log.Info("artifacts: push re-checked its objects after a GC", "missing", missing, "err", err)
	return err
}

// isHole reports whether [off, off+n) of f holds no data (a sparse file's hole), without reading.
func isHole(f *os.File, off, n int64) (bool, error) {
	next, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return true, nil // no data at or after off
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
		return false, nil // no SEEK_DATA here: read it
	}
	if err != nil {
		return false, fmt.Errorf("seek %s: %w", f.Name(), err)
	}
	return next >= off+n, nil
}

func allZero(b []byte) bool {
	for len(b) >= len(zeroBlock) {
		if string(b[:len(zeroBlock)]) != string(zeroBlock[:]) {
			return false
		}
		b = b[len(zeroBlock):]
	}
	return string(b) == string(zeroBlock[:len(b)])
}

var zeroBlock [4096]byte

// checkUnchanged refuses a push whose files changed size or time while their chunks were read.
func checkUnchanged(root string, m *Manifest) error {
	for _, e := range m.Entries {
		if e.Type != TypeFile {
			continue
		}
		p := filepath.Join(root, filepath.FromSlash(e.Path))
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if st.Size != e.Size || st.Mtim.Nano() != e.MTime {
			return fmt.Errorf("%s changed while it was pushed", p)
		}
	}
	return nil
}
