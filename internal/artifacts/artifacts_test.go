package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The same suite runs against every backend: a directory and a real S3 server (SeaweedFS).

const testChunk = 64 << 10

type backendKind struct {
	name string
	open func(t *testing.T) Backend
}

var backendKinds = []backendKind{
	{"dir", func(t *testing.T) Backend {
		b, err := OpenDir(filepath.Join(t.TempDir(), "store"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}},
	{"s3", func(t *testing.T) Backend { return newWeedBackend(t) }},
}

func eachBackend(t *testing.T, fn func(t *testing.T, b Backend)) {
	for _, k := range backendKinds {
		t.Run(k.name, func(t *testing.T) { fn(t, k.open(t)) })
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newTestStore opens a store with small chunks (so small trees span many) and a cache of
// cacheLimit bytes (0: none).
func newTestStore(t *testing.T, b Backend, cacheLimit int64) *Store {
	t.Helper()
	s, err := New(Options{
		Backend:     b,
		CacheDir:    filepath.Join(t.TempDir(), "cache"),
		CacheLimit:  cacheLimit,
		Concurrency: 4,
		ChunkSize:   testChunk,
		Logger:      testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.pollInterval = 20 * time.Millisecond
	s.gcHeartbeat = 50 * time.Millisecond
	return s
}

// countingBackend counts requests by kind and key prefix ("put chunks", "stat manifests").
type countingBackend struct {
	Backend
	mu       sync.Mutex
	n        map[string]int
	afterPut func(key string)
}

func newCounting(b Backend) *countingBackend {
	return &countingBackend{Backend: b, n: map[string]int{}}
}

func (c *countingBackend) count(op, key string) {
	kind, _, _ := strings.Cut(key, "/")
	c.mu.Lock()
	c.n[op+" "+kind]++
	c.mu.Unlock()
}

func (c *countingBackend) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

func (c *countingBackend) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = map[string]int{}
}

func (c *countingBackend) Put(ctx context.Context, key string, data []byte) error {
	err := c.Backend.Put(ctx, key, data)
	if err == nil {
		c.count("put", key)
		if c.afterPut != nil {
			c.afterPut(key)
		}
	}
	return err
}

func (c *countingBackend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	c.count("get", key)
	return c.Backend.Get(ctx, key)
}

func (c *countingBackend) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	c.count("stat", key)
	return c.Backend.Stat(ctx, key)
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeFile writes a file with exactly these mode bits (setuid included, umask ignored).
func writeFile(t *testing.T, p string, data []byte, mode uint32) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// writable lets the test's temporary directories be removed without root, whatever modes the
// tree in them was given.
func writable(t *testing.T, dir string) {
	t.Cleanup(func() {
		_ = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// makeTree builds a tree with what templates and snapshots hold: big multi-chunk files, an empty
// one, a sparse one, duplicates and a hard link, symlinks of every kind, odd modes, a FIFO, set
// times, extended attributes, and as root owners, device nodes and overlayfs markers.
func makeTree(t *testing.T, root string, seed uint64) {
	t.Helper()
	writable(t, root)
	r := rand.New(rand.NewPCG(seed, 1))
	big := randBytes(r, 5*testChunk+123)
	writeFile(t, filepath.Join(root, "big"), big, 0o644)
	writeFile(t, filepath.Join(root, "copy-of-big"), big, 0o640)
	must(t, os.Link(filepath.Join(root, "big"), filepath.Join(root, "big-link")))
	writeFile(t, filepath.Join(root, "empty"), nil, 0o600)
	writeFile(t, filepath.Join(root, "a", "b", "c", "deep.txt"), []byte("deep\n"), 0o644)
	writeFile(t, filepath.Join(root, "bin", "tool"), randBytes(r, 3000), 0o755)
	writeFile(t, filepath.Join(root, "bin", "suid"), []byte("#!/bin/sh\n"), 0o4755)
	writeFile(t, filepath.Join(root, "ro", "file"), []byte("in a read-only dir"), 0o444)
	must(t, os.Chmod(filepath.Join(root, "ro"), 0o555))
	must(t, os.MkdirAll(filepath.Join(root, "tmp"), 0o755))
	must(t, unix.Chmod(filepath.Join(root, "tmp"), 0o1777))
	must(t, os.MkdirAll(filepath.Join(root, "emptydir"), 0o700))

	// 64 MiB, nearly all hole, with data in three chunks and one chunk of written zeros.
	f, err := os.Create(filepath.Join(root, "disk.img"))
	must(t, err)
	must(t, f.Truncate(64<<20))
	_, err = f.WriteAt([]byte("head"), 0)
	must(t, err)
	_, err = f.WriteAt([]byte("middle"), 10<<20+5)
	must(t, err)
	_, err = f.WriteAt(make([]byte, testChunk), 20<<20)
	must(t, err)
	_, err = f.WriteAt([]byte("tail"), 64<<20-4)
	must(t, err)
	must(t, f.Close())

	must(t, os.Symlink("big", filepath.Join(root, "link-rel")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(root, "link-abs")))
	must(t, os.Symlink("nowhere/at/all", filepath.Join(root, "link-dangling")))
	must(t, os.Symlink("a/b", filepath.Join(root, "link-dir")))
	must(t, unix.Mkfifo(filepath.Join(root, "pipe"), 0o620))

	if err := unix.Setxattr(filepath.Join(root, "bin", "tool"), "user.vmon", []byte("hello\x00bytes"), 0); err != nil {
		t.Logf("no user xattrs here: %v", err)
	}
	if os.Geteuid() == 0 {
		must(t, os.Chown(filepath.Join(root, "a", "b", "c", "deep.txt"), 1234, 5678))
		must(t, os.Lchown(filepath.Join(root, "link-rel"), 1234, 5678))
		must(t, os.Chown(filepath.Join(root, "a"), 1000, 1000))
		must(t, unix.Mknod(filepath.Join(root, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		// overlayfs's markers in a paused sandbox's upper layer: a whiteout and an opaque dir.
		must(t, unix.Mknod(filepath.Join(root, "a", "whiteout"), unix.S_IFCHR, 0))
		must(t, unix.Setxattr(filepath.Join(root, "a", "b"), "trusted.overlay.opaque", []byte("y"), 0))
		must(t, unix.Setxattr(filepath.Join(root, "bin", "suid"), "security.capability",
			[]byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0)) // cap_net_raw, effective
		must(t, unix.Chmod(filepath.Join(root, "bin", "suid"), 0o4755))
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)
	must(t, os.Chtimes(filepath.Join(root, "big"), old, old))
	must(t, unix.Lutimes(filepath.Join(root, "link-abs"), []unix.Timeval{unix.NsecToTimeval(old.UnixNano()), unix.NsecToTimeval(old.UnixNano())}))
	must(t, os.Chtimes(filepath.Join(root, "a", "b"), old, old))
}

// sameTree fails unless b is a faithful copy of a: every entry's metadata, every file's bytes,
// hard links, and holes kept as holes.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	writable(t, b)
	log := testLogger(t)
	ma, err := scanTree(a, testChunk, log)
	must(t, err)
	mb, err := scanTree(b, testChunk, log)
	must(t, err)
	if len(ma.Entries) != len(mb.Entries) {
		t.Fatalf("%d entries pushed, %d pulled", len(ma.Entries), len(mb.Entries))
	}
	for i := range ma.Entries {
		ea, eb := ma.Entries[i], mb.Entries[i]
		if !reflect.DeepEqual(ea, eb) {
			t.Errorf("entry differs:\n pushed %+v\n pulled %+v", ea, eb)
			continue
		}
		if ea.Type == TypeFile {
			da, err := os.ReadFile(filepath.Join(a, ea.Path))
			must(t, err)
			db, err := os.ReadFile(filepath.Join(b, eb.Path))
			must(t, err)
			if !bytes.Equal(da, db) {
				t.Errorf("%s: contents differ", ea.Path)
			}
		}
	}
	var st unix.Stat_t
	must(t, unix.Stat(filepath.Join(b, "disk.img"), &st))
	// Its data is 3 blocks in 3 chunks: written whole, the chunks would take 192 KiB.
	if st.Blocks*512 > 64<<10 {
		t.Errorf("disk.img: %d bytes allocated after the pull; its holes were filled", st.Blocks*512)
	}
}

func TestBackendContract(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		_, err := b.Stat(ctx, "x/missing")
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("stat of a missing key: %v", err)
		}
		if _, err := b.Get(ctx, "x/missing"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get of a missing key: %v", err)
		}
		must(t, b.Delete(ctx, "x/missing"))
		data := bytes.Repeat([]byte("0123456789"), 100000)
		must(t, b.Put(ctx, "x/a/one", data))
		must(t, b.Put(ctx, "x/a/two", []byte("2")))
		must(t, b.Put(ctx, "x/b", nil))
		must(t, b.Put(ctx, "y/other", []byte("y")))
		must(t, b.Put(ctx, "x/a/two", []byte("22"))) // replaced whole
		info, err := b.Stat(ctx, "x/a/one")
		must(t, err)
		if info.Size != int64(len(data)) || time.Since(info.ModTime) > time.Hour || info.ModTime.After(time.Now().Add(time.Minute)) {
			t.Fatalf("stat: %+v", info)
		}
		rc, err := b.Get(ctx, "x/a/two")
		must(t, err)
		got, err := io.ReadAll(rc)
		rc.Close()
		must(t, err)
		if string(got) != "22" {
			t.Fatalf("get after replace: %q", got)
		}
		var keys []string
		must(t, b.List(ctx, "x/", func(o ObjectInfo) error { keys = append(keys, o.Key); return nil }))
		if fmt.Sprint(sorted(keys)) != "[x/a/one x/a/two x/b]" {
			t.Fatalf("list x/: %v", keys)
		}
		keys = nil
		must(t, b.List(ctx, "x/a/t", func(o ObjectInfo) error { keys = append(keys, o.Key); return nil }))
		if fmt.Sprint(keys) != "[x/a/two]" {
			t.Fatalf("list x/a/t: %v", keys)
		}
		must(t, b.List(ctx, "nothing/", func(o ObjectInfo) error { return fmt.Errorf("listed %s", o.Key) }))
		must(t, b.Delete(ctx, "x/a/one"))
		if _, err := b.Stat(ctx, "x/a/one"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("stat after delete: %v", err)
		}
		for _, bad := range []string{"", "/abs", "a/../b", "a//b", "a/./b", "..", "a/", ".tmp-x", "a/.tmp-y"} {
			if err := b.Put(ctx, bad, nil); err == nil {
				t.Errorf("put %q was accepted", bad)
			}
		}
	})
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

func TestRoundTrip(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		src := filepath.Join(t.TempDir(), "src")
		makeTree(t, src, 1)
		cb := newCounting(b)
		s := newTestStore(t, cb, 1<<30)
		ps, err := s.Push(ctx, "templates/base", src)
		must(t, err)
		// big and its copy share 6 chunks; disk.img has 3 data chunks (the written zeros are not stored).
		// big and its copy share 6 chunks; deep.txt, tool, suid and ro/file share a pack;
		// disk.img has 3 data chunks (its written zeros are not stored, like its holes).
		if ps.Chunks != 6+1+3 || ps.Uploaded != ps.Chunks+1 || cb.get("put chunks") != ps.Chunks {
			t.Errorf("push stats %+v, %d chunk puts", ps, cb.get("put chunks"))
		}

		// Another node: its own empty cache.
		s2 := newTestStore(t, b, 1<<30)
		dst := filepath.Join(t.TempDir(), "templates", "base")
		pl, err := s2.Pull(ctx, "templates/base", dst)
		must(t, err)
		if pl.Fetched != ps.Chunks || pl.FromCache != 0 || pl.Manifest != ps.Manifest {
			t.Errorf("pull stats %+v after push %+v", pl, ps)
		}
		sameTree(t, src, dst)

		// Pushing the same tree again uploads nothing and names the same manifest.
		cb.reset()
		ps2, err := s.Push(ctx, "templates/base-again", src)
		must(t, err)
		if ps2.Manifest != ps.Manifest || ps2.Uploaded != 0 || cb.get("put chunks") != 0 {
			t.Errorf("second push %+v, %d chunk puts", ps2, cb.get("put chunks"))
		}
		// A pull on the node that pushed, whose cache the first pull filled, fetches nothing.
		cb.reset()
		pl2, err := s2.Pull(ctx, "templates/base-again", filepath.Join(t.TempDir(), "again"))
		must(t, err)
		if pl2.Fetched != 0 || pl2.FromCache != ps.Chunks || cb.get("get chunks") != 0 {
			t.Errorf("cached pull %+v", pl2)
		}

		refs, err := s.Refs(ctx, "templates/")
		must(t, err)
		if len(refs) != 2 || refs[0].Manifest != ps.Manifest || refs[0].Bytes != ps.Bytes || refs[0].Files != ps.Files {
			t.Errorf("refs: %+v", refs)
		}
		if _, err := s2.Pull(ctx, "templates/base", dst); !errors.Is(err, fs.ErrExist) {
			t.Errorf("pull onto an existing dir: %v", err)
		}
		if _, err := s2.Pull(ctx, "templates/none", filepath.Join(t.TempDir(), "x")); !errors.Is(err, ErrNotFound) {
			t.Errorf("pull of a missing ref: %v", err)
		}
	})
}

// Small files travel in packs: far fewer objects than files, and a changed file changes the
// packs near it, not all of them.
func TestPacks(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		src := filepath.Join(t.TempDir(), "src")
		r := rand.New(rand.NewPCG(9, 9))
		const files = 3000
		for i := range files {
			writeFile(t, filepath.Join(src, fmt.Sprintf("d%02d", i%30), fmt.Sprintf("f%04d", i)), randBytes(r, 1+r.IntN(2000)), 0o644)
		}
		cb := newCounting(b)
		s := newTestStore(t, cb, 0)
		ps, err := s.Push(ctx, "templates/small", src)
		must(t, err)
		// About 3 MB of files in packs of 16 to 64 KiB.
		if ps.Files != files || ps.Chunks < 40 || ps.Chunks > 200 {
			t.Fatalf("%d small files went into %d objects", ps.Files, ps.Chunks)
		}
		dst := filepath.Join(t.TempDir(), "dst")
		_, err = newTestStore(t, b, 0).Pull(ctx, "templates/small", dst)
		must(t, err)
		sameContents(t, src, dst)

		// One file grows: the packs before it stay, and those after it soon line up again.
		writeFile(t, filepath.Join(src, "d07", "f1507"), randBytes(r, 2500), 0o644)
		cb.reset()
		ps2, err := s.Push(ctx, "templates/small", src)
		must(t, err)
		if n := cb.get("put chunks"); n < 1 || n > 4 {
			t.Fatalf("after changing one file of %d, %d of %d packs were uploaded", files, n, ps2.Chunks)
		} else {
			t.Logf("after changing one file: %d of %d packs uploaded", n, ps2.Chunks)
		}
		dst2 := filepath.Join(t.TempDir(), "dst")
		_, err = newTestStore(t, b, 0).Pull(ctx, "templates/small", dst2)
		must(t, err)
		sameContents(t, src, dst2)
	})
}

func sameContents(t *testing.T, a, b string) {
	t.Helper()
	n := 0
	must(t, filepath.WalkDir(a, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		da, err := os.ReadFile(p)
		must(t, err)
		db, err := os.ReadFile(filepath.Join(b, rel))
		must(t, err)
		if !bytes.Equal(da, db) {
			t.Errorf("%s differs", rel)
		}
		n++
		return nil
	}))
	if n == 0 {
		t.Fatal("no files compared")
	}
}

// corrupt flips one byte of a stored object, through the backend.
func corrupt(t *testing.T, b Backend, key string) {
	t.Helper()
	ctx := context.Background()
	rc, err := b.Get(ctx, key)
	must(t, err)
	data, err := io.ReadAll(rc)
	rc.Close()
	must(t, err)
	data[len(data)/2] ^= 0x40
	must(t, b.Put(ctx, key, data))
}

func noLeftovers(t *testing.T, parent string) {
	t.Helper()
	ents, err := os.ReadDir(parent)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left in %s: %s", parent, e.Name())
	}
}

func TestCorruptChunk(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		src := filepath.Join(t.TempDir(), "src")
		makeTree(t, src, 2)
		s := newTestStore(t, b, 1<<30)
		_, err := s.Push(ctx, "paused/sb1", src)
		must(t, err)
		var victim string
		must(t, b.List(ctx, chunkPrefix, func(o ObjectInfo) error {
			if o.Size == testChunk {
				victim = o.Key
			}
			return nil
		}))
		corrupt(t, b, victim)

		s2 := newTestStore(t, b, 1<<30)
		parent := filepath.Join(t.TempDir(), "paused")
		_, err = s2.Pull(ctx, "paused/sb1", filepath.Join(parent, "sb1"))
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), filepath.Base(victim)) {
			t.Fatalf("pull of a tree with a damaged chunk: %v", err)
		}
		t.Logf("the error: %v", err)
		noLeftovers(t, parent)
		if s2.cache.has(filepath.Base(victim)) {
			t.Errorf("the damaged chunk went into the cache")
		}

		// A damaged manifest is refused the same way.
		ri, err := s.Resolve(ctx, "paused/sb1")
		must(t, err)
		corrupt(t, b, manifestKey(ri.Manifest))
		_, err = newTestStore(t, b, 0).Pull(ctx, "paused/sb1", filepath.Join(parent, "sb1"))
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("pull with a damaged manifest: %v", err)
		}
		noLeftovers(t, parent)
	})
}

func TestResumePush(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		src := t.TempDir()
		r := rand.New(rand.NewPCG(3, 3))
		for i := range 10 {
			writeFile(t, filepath.Join(src, fmt.Sprintf("f%d", i)), randBytes(r, 4*testChunk), 0o644)
		}
		const total = 40
		// The first push is cut off by its context after 15 chunks are stored.
		cb := newCounting(b)
		s := newTestStore(t, cb, 0)
		ctx, cancel := context.WithCancel(context.Background())
		cb.afterPut = func(key string) {
			if strings.HasPrefix(key, chunkPrefix) && cb.get("put chunks") == 15 {
				cancel()
			}
		}
		_, err := s.Push(ctx, "templates/resumed", src)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted push: %v", err)
		}
		if _, err := s.Resolve(context.Background(), "templates/resumed"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an interrupted push wrote its ref: %v", err)
		}
		stored := 0
		must(t, b.List(context.Background(), chunkPrefix, func(ObjectInfo) error { stored++; return nil }))
		if stored < 15 || stored >= total {
			t.Fatalf("%d chunks stored after the interrupted push", stored)
		}

		cb.afterPut = nil
		cb.reset()
		ps, err := s.Push(context.Background(), "templates/resumed", src)
		must(t, err)
		// An upload the cancel cut off can still land on an S3 server afterwards (it finishes a
		// request it received): at most the store's concurrency (4 here) more chunks than were
		// counted may be there by the resumed push, which uploads only what it finds missing.
		if got := cb.get("put chunks"); got > total-stored || got < total-stored-4 || ps.Uploaded != got+1 {
			t.Fatalf("the resumed push uploaded %d chunks (stats %+v); %d of %d were stored", got, ps, stored, total)
		}
		if got := cb.get("stat chunks"); got != total {
			t.Errorf("%d chunk stats, want %d", got, total)
		}
		t.Logf("interrupted after %d chunks; the resumed push uploaded %d", stored, total-stored)
		dst := filepath.Join(t.TempDir(), "out")
		_, err = newTestStore(t, b, 0).Pull(context.Background(), "templates/resumed", dst)
		must(t, err)
		for i := range 10 {
			a, _ := os.ReadFile(filepath.Join(src, fmt.Sprintf("f%d", i)))
			c, _ := os.ReadFile(filepath.Join(dst, fmt.Sprintf("f%d", i)))
			if !bytes.Equal(a, c) {
				t.Fatalf("f%d differs", i)
			}
		}
	})
}

func TestResumePull(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		src := t.TempDir()
		r := rand.New(rand.NewPCG(4, 4))
		writeFile(t, filepath.Join(src, "big"), randBytes(r, 30*testChunk), 0o644)
		_, err := newTestStore(t, b, 0).Push(context.Background(), "templates/t", src)
		must(t, err)

		// The pull is cut off after 10 chunk fetches; the next one fetches only the rest.
		cb := newCounting(b)
		s := newTestStore(t, cb, 1<<30)
		ctx, cancel := context.WithCancel(context.Background())
		cutter := &cancelAfterGets{countingBackend: cb, n: 10, cancel: cancel}
		s.b = cutter
		parent := t.TempDir()
		dst := filepath.Join(parent, "t")
		if _, err := s.Pull(ctx, "templates/t", dst); !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted pull: %v", err)
		}
		noLeftovers(t, parent)
		s.b = cb
		s.cache.mu.Lock()
		cachedChunks := len(s.cache.entries) - 1 // and the manifest
		s.cache.mu.Unlock()
		cb.reset()
		pl, err := s.Pull(context.Background(), "templates/t", dst)
		must(t, err)
		if pl.FromCache < 5 || pl.FromCache != cachedChunks || pl.FromCache+pl.Fetched != 30 || cb.get("get chunks") != pl.Fetched {
			t.Fatalf("resumed pull %+v, %d chunk gets, %d chunks were cached", pl, cb.get("get chunks"), cachedChunks)
		}
		t.Logf("resumed pull: %d chunks from the cache, %d fetched", pl.FromCache, pl.Fetched)
	})
}

type cancelAfterGets struct {
	*countingBackend
	mu     sync.Mutex
	n      int
	cancel func()
}

func (c *cancelAfterGets) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := c.countingBackend.Get(ctx, key)
	if strings.HasPrefix(key, chunkPrefix) {
		c.mu.Lock()
		if c.n--; c.n == 0 {
			c.cancel()
		}
		c.mu.Unlock()
	}
	return rc, err
}

func TestCacheLimit(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		src := t.TempDir()
		r := rand.New(rand.NewPCG(5, 5))
		for i := range 20 {
			writeFile(t, filepath.Join(src, fmt.Sprintf("f%02d", i)), randBytes(r, testChunk), 0o644)
		}
		_, err := newTestStore(t, b, 0).Push(ctx, "templates/t", src)
		must(t, err)

		// Room for 5 chunks and the manifest: the tree's 20 chunks pass through, 5 stay.
		limit := int64(5*testChunk + 4096)
		cb := newCounting(b)
		s := newTestStore(t, cb, limit)
		pl, err := s.Pull(ctx, "templates/t", filepath.Join(t.TempDir(), "a"))
		must(t, err)
		size, _ := s.CacheUsage()
		if size > limit || pl.Fetched != 20 {
			t.Fatalf("cache holds %d bytes of %d after a pull %+v", size, limit, pl)
		}
		du := dirBytes(t, s.cache.dir)
		if du != size {
			t.Fatalf("cache dir holds %d bytes, the index says %d", du, size)
		}
		cb.reset()
		pl2, err := s.Pull(ctx, "templates/t", filepath.Join(t.TempDir(), "b"))
		must(t, err)
		if pl2.FromCache < 4 || pl2.FromCache+pl2.Fetched != 20 || cb.get("get chunks") != pl2.Fetched {
			t.Fatalf("second pull %+v with %d chunk gets", pl2, cb.get("get chunks"))
		}
		if size, _ := s.CacheUsage(); size > limit {
			t.Fatalf("cache over its limit: %d", size)
		}

		// The limit is kept across a restart: a new store on the same cache with a lower limit.
		s3, err := New(Options{Backend: b, CacheDir: s.cache.dir, CacheLimit: 2 * testChunk, ChunkSize: testChunk, Logger: testLogger(t)})
		must(t, err)
		if size, _ := s3.CacheUsage(); size > 2*testChunk || dirBytes(t, s.cache.dir) != size {
			t.Fatalf("reopened cache holds %d bytes", size)
		}
	})
}

func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	must(t, filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !de.IsDir() {
			fi, err := de.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	}))
	return n
}

// A chunk a running pull still needs is not evicted, whatever else comes through the cache.
func TestCachePinned(t *testing.T) {
	c, err := openCache(t.TempDir(), 2*1000, testLogger(t))
	must(t, err)
	blob := func(i int) ([]byte, string) {
		b := bytes.Repeat([]byte{byte(i)}, 1000)
		return b, digestOf(b)
	}
	x, dx := blob(0)
	c.pin([]string{dx})
	c.put(dx, x)
	for i := 1; i < 10; i++ {
		b, d := blob(i)
		c.put(d, b)
	}
	if got, ok := c.get(dx, nil); !ok || !bytes.Equal(got, x) {
		t.Fatal("a pinned chunk was evicted")
	}
	if size, _ := c.usage(); size > 2*1000 {
		t.Fatalf("cache holds %d bytes", size)
	}
	c.unpin(dx)
	for i := 10; i < 13; i++ {
		b, d := blob(i)
		c.put(d, b)
	}
	if c.has(dx) {
		t.Fatal("an unpinned, least recently used chunk stayed over the limit")
	}
	// A damaged cache file is a miss, never bad data.
	y, dy := blob(20)
	c.put(dy, y)
	must(t, os.WriteFile(c.path(dy), []byte("garbage"), 0o600))
	if _, ok := c.get(dy, nil); ok || c.has(dy) {
		t.Fatal("a damaged cache entry was served")
	}

	// Reopened, even with no room, it removes its own files and leaves anything else alone.
	foreign := []string{"notes.txt", "ab/not-a-digest", "other/" + dy, dy[:2] + "x/" + dy}
	for _, f := range foreign {
		writeFile(t, filepath.Join(c.dir, f), []byte("not the cache's"), 0o644)
	}
	must(t, os.WriteFile(filepath.Join(c.dir, dy[:2], tmpPrefix+"123"), nil, 0o600))
	c2, err := openCache(c.dir, 1, testLogger(t))
	must(t, err)
	if size, _ := c2.usage(); size != 0 {
		t.Fatalf("reopened cache holds %d bytes over a limit of 1", size)
	}
	for _, f := range foreign {
		if _, err := os.Stat(filepath.Join(c.dir, f)); err != nil {
			t.Errorf("the cache removed %s: %v", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(c.dir, dy[:2], tmpPrefix+"123")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an interrupted write's file was left: %v", err)
	}
}

func TestGC(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		r := rand.New(rand.NewPCG(6, 6))
		shared := randBytes(r, 2*testChunk)
		srcA, srcB := t.TempDir(), t.TempDir()
		writeFile(t, filepath.Join(srcA, "shared"), shared, 0o644)
		writeFile(t, filepath.Join(srcA, "only-a"), randBytes(r, 3*testChunk), 0o644)
		writeFile(t, filepath.Join(srcA, "small-a"), randBytes(r, 100), 0o644) // in a pack
		writeFile(t, filepath.Join(srcB, "shared"), shared, 0o644)
		writeFile(t, filepath.Join(srcB, "only-b"), randBytes(r, 4*testChunk), 0o644)
		s := newTestStore(t, b, 0)
		_, err := s.Push(ctx, "templates/a", srcA)
		must(t, err)
		psB, err := s.Push(ctx, "paused/b", srcB)
		must(t, err)

		// Nothing is unreferenced: nothing goes.
		st, err := s.GC(ctx, -1)
		must(t, err)
		if st.DeletedChunks != 0 || st.Chunks != 10 || st.Refs != 2 {
			t.Fatalf("GC with both refs: %+v", st)
		}
		must(t, s.Delete(ctx, "paused/b"))
		// Within the grace period nothing goes either.
		st, err = s.GC(ctx, time.Hour)
		must(t, err)
		if st.DeletedChunks != 0 || st.KeptYoung != 5 {
			t.Fatalf("GC within the grace period: %+v", st)
		}
		st, err = s.GC(ctx, -1)
		must(t, err)
		if st.DeletedChunks != 4 || st.DeletedManifests != 1 || st.FreedBytes < 4*testChunk {
			t.Fatalf("GC after deleting b: %+v", st)
		}
		if _, err := b.Stat(ctx, manifestKey(psB.Manifest)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("b's manifest survived: %v", err)
		}
		left := 0
		must(t, b.List(ctx, chunkPrefix, func(ObjectInfo) error { left++; return nil }))
		if left != 6 {
			t.Fatalf("%d chunks left, want a's 5 and its pack", left)
		}
		dst := filepath.Join(t.TempDir(), "a")
		_, err = newTestStore(t, b, 0).Pull(ctx, "templates/a", dst)
		must(t, err)
		got, _ := os.ReadFile(filepath.Join(dst, "shared"))
		if !bytes.Equal(got, shared) {
			t.Fatal("a's shared file changed")
		}
		g, err := s.readGCState(ctx)
		must(t, err)
		if g.Running || g.Gen != 3 {
			t.Fatalf("GC state after three runs: %+v", g)
		}
	})
}

// A GC that runs while a push is between storing its chunks and writing its ref deletes those
// chunks (grace 0); the push sees the GC at commit and uploads them again.
func TestGCDuringPush(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		src := t.TempDir()
		r := rand.New(rand.NewPCG(7, 7))
		writeFile(t, filepath.Join(src, "f"), randBytes(r, 6*testChunk), 0o644)
		cb := newCounting(b)
		s := newTestStore(t, cb, 0)
		gcer := newTestStore(t, b, 0)
		var gcStats GCStats
		s.beforeCommit = func() {
			var err error
			gcStats, err = gcer.GC(ctx, -1)
			must(t, err)
		}
		_, err := s.Push(ctx, "templates/racy", src)
		must(t, err)
		if gcStats.DeletedChunks != 6 || gcStats.DeletedManifests != 1 {
			t.Fatalf("the GC did not delete the push's objects: %+v", gcStats)
		}
		if got := cb.get("put chunks"); got != 12 {
			t.Fatalf("%d chunk puts; want 6, and 6 again after the GC", got)
		}
		_, err = newTestStore(t, b, 0).Pull(ctx, "templates/racy", filepath.Join(t.TempDir(), "out"))
		must(t, err)
	})
}

// A GC that starts while a push has announced its commit waits for the commit before it marks;
// the push, seeing the GC, waits for it and re-checks its chunks. Either way nothing it needs is
// lost.
func TestGCWaitsForCommit(t *testing.T) {
	eachBackend(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		src := t.TempDir()
		r := rand.New(rand.NewPCG(8, 8))
		writeFile(t, filepath.Join(src, "f"), randBytes(r, 3*testChunk), 0o644)
		s := newTestStore(t, b, 0)
		gcer := newTestStore(t, b, 0)
		gcDone := make(chan GCStats, 1)
		once := false
		s.afterIntent = func() {
			if once {
				return
			}
			once = true
			go func() {
				st, err := gcer.GC(ctx, -1)
				if err != nil {
					t.Error(err)
				}
				gcDone <- st
			}()
			// Until the GC state says running, then a while more: the GC must be waiting.
			for {
				g, err := s.readGCState(ctx)
				must(t, err)
				if g.Running {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			select {
			case st := <-gcDone:
				t.Fatalf("the GC finished while a commit was announced: %+v", st)
			case <-time.After(10 * gcer.pollInterval):
			}
		}
		_, err := s.Push(ctx, "templates/waited", src)
		must(t, err)
		st := <-gcDone
		t.Logf("GC: %+v", st)
		_, err = newTestStore(t, b, 0).Pull(ctx, "templates/waited", filepath.Join(t.TempDir(), "out"))
		must(t, err)
	})
}

func TestGCRefusesSecondRun(t *testing.T) {
	b, err := OpenDir(t.TempDir())
	must(t, err)
	s := newTestStore(t, b, 0)
	ctx := context.Background()
	must(t, s.writeJSON(ctx, gcStateKey, gcState{Gen: 7, Running: true, Heartbeat: time.Now(), Owner: "other"}))
	if _, err := s.GC(ctx, -1); !errors.Is(err, ErrGCRunning) {
		t.Fatalf("GC while another runs: %v", err)
	}
	// A running state whose heartbeat stopped belongs to a dead GC: a new one takes over.
	must(t, s.writeJSON(ctx, gcStateKey, gcState{Gen: 7, Running: true, Heartbeat: time.Now().Add(-time.Hour), Owner: "dead"}))
	_, err = s.GC(ctx, -1)
	must(t, err)
	// A dead push's commit intent does not hold GC up for ever.
	s.intentTTL = 50 * time.Millisecond
	must(t, s.writeJSON(ctx, intentPrefix+"dead", intent{Ref: "x"}))
	time.Sleep(100 * time.Millisecond)
	st, err := s.GC(ctx, -1)
	must(t, err)
	if st.StaleIntents != 1 {
		t.Fatalf("GC stats %+v", st)
	}
}

func TestManifestValidation(t *testing.T) {
	ok := func() *Manifest {
		return &Manifest{Format: manifestFormat, ChunkSize: testChunk, Entries: []Entry{
			{Path: ".", Type: TypeDir},
			{Path: "d", Type: TypeDir},
			{Path: "d/f", Type: TypeFile, Size: 10, Chunks: []string{digestOf([]byte("x"))}},
			{Path: "l", Type: TypeSymlink, Target: "/etc"},
		}}
	}
	if err := ok().validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(m *Manifest){
		"escape":           func(m *Manifest) { m.Entries[1].Path = "../d" },
		"absolute":         func(m *Manifest) { m.Entries[1].Path = "/d" },
		"unclean":          func(m *Manifest) { m.Entries[1].Path = "d/" },
		"through symlink":  func(m *Manifest) { m.Entries = append(m.Entries, Entry{Path: "l/passwd", Type: TypeFile}) },
		"parent missing":   func(m *Manifest) { m.Entries = append(m.Entries, Entry{Path: "x/y", Type: TypeDir}) },
		"child first":      func(m *Manifest) { m.Entries[1], m.Entries[2] = m.Entries[2], m.Entries[1] },
		"duplicate":        func(m *Manifest) { m.Entries = append(m.Entries, Entry{Path: "d", Type: TypeDir}) },
		"hardlink to dir":  func(m *Manifest) { m.Entries = append(m.Entries, Entry{Path: "h", Type: TypeHardlink, Target: "d"}) },
		"hardlink forward": func(m *Manifest) { m.Entries = append(m.Entries, Entry{Path: "h", Type: TypeHardlink, Target: "z"}) },
		"chunk count":      func(m *Manifest) { m.Entries[2].Size = testChunk + 1 },
		"bad digest":       func(m *Manifest) { m.Entries[2].Chunks[0] = "../../etc" },
		"mode bits":        func(m *Manifest) { m.Entries[1].Mode = 0o170000 },
		"unknown type":     func(m *Manifest) { m.Entries[1].Type = "socket" },
		"no root":          func(m *Manifest) { m.Entries = m.Entries[1:] },
		"chunk size":       func(m *Manifest) { m.ChunkSize = 1000 },
	} {
		m := ok()
		mod(m)
		if err := m.validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestRefNames(t *testing.T) {
	for _, good := range []string{"templates/base", "paused/sb-1", "a", "x/y.z_w"} {
		if err := CheckRef(good); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
	for _, bad := range []string{"", "/a", "a/", "a//b", "../a", "a/..", ".hidden", "a/.tmp-x", "sp ace"} {
		if CheckRef(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestOpenBackend(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "store")
	b, err := OpenBackend(ctx, dir)
	must(t, err)
	if b.String() != "dir:"+dir {
		t.Fatalf("backend %s", b)
	}
	for _, bad := range []string{"http://x", "s3://", "s3:///prefix", "s3://b/p?region=x", "s3://b/../x"} {
		if _, err := OpenBackend(ctx, bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	t.Setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	sb, err := OpenBackend(ctx, "s3://bucket/some/prefix/")
	must(t, err)
	s3b := sb.(*S3Backend)
	if s3b.String() != "s3://bucket/some/prefix/" || !s3b.client.Options().UsePathStyle {
		t.Fatalf("%s path-style %v", s3b, s3b.client.Options().UsePathStyle)
	}
	sb, err = OpenBackend(ctx, "s3://bucket?addressing=virtual")
	must(t, err)
	if sb.(*S3Backend).client.Options().UsePathStyle {
		t.Fatal("addressing=virtual ignored")
	}
}
