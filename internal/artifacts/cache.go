package artifacts

import (
	"container/list"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// cache keeps objects (chunks and manifests, both named by the sha256 of their bytes) on the
// node's disk, up to limit bytes, evicting the least recently used first. A pinned object is
// never evicted: a pull pins the chunks it still has to write, so another pull filling the cache
// cannot take them away halfway. Use order is kept in file modification times, so it survives a
// restart. Contents are checked against their digest on every read, so a torn or damaged file
// (the cache does not fsync) is a miss, never bad data.
type cache struct {
	dir   string
	limit int64
	log   *slog.Logger

	mu      sync.Mutex
	entries map[string]*list.Element // digest -> element whose Value is *cacheEntry
	lru     list.List                // front: most recently used
	size    int64
	pins    map[string]int
}

type cacheEntry struct {
	digest string
	size   int64
}

func openCache(dir string, limit int64, log *slog.Logger) (*cache, error) {
	c := &cache{dir: dir, limit: limit, log: log, entries: map[string]*list.Element{}, pins: map[string]int{}}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("artifacts: cache: %w", err)
	}
	type found struct {
		cacheEntry
		used time.Time
	}
	var all []found
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.IsDir() {
			// Only the cache's own fan-out directories: a cache pointed at the wrong place must
			// not count, let alone evict, what it finds there.
			if p != dir && (filepath.Dir(p) != dir || len(de.Name()) != 2) {
				return fs.SkipDir
			}
			return nil
		}
		if filepath.Dir(p) == dir {
			return nil
		}
		if strings.HasPrefix(de.Name(), tmpPrefix) {
			return os.Remove(p) // a write that a crash interrupted
		}
		if !validDigest(de.Name()) || de.Name()[:2] != filepath.Base(filepath.Dir(p)) {
			return nil
		}
		fi, err := de.Info()
		if err != nil {
			return err
		}
		all = append(all, found{cacheEntry{de.Name(), fi.Size()}, fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("artifacts: cache %s: %w", dir, err)
	}
	slices.SortFunc(all, func(a, b found) int { return b.used.Compare(a.used) })
	for _, f := range all {
		e := f.cacheEntry
		c.entries[e.digest] = c.lru.PushBack(&e)
		c.size += e.size
	}
	c.mu.Lock()
	c.evictLocked()
	c.mu.Unlock()
	return c, nil
}

func (c *cache) path(digest string) string {
	return filepath.Join(c.dir, digest[:2], digest)
}

// pin keeps digests from eviction until unpinned, whether or not they are cached yet.
func (c *cache) pin(digests []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range digests {
		c.pins[d]++
	}
}

func (c *cache) unpin(digest string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pins[digest]--; c.pins[digest] <= 0 {
		delete(c.pins, digest)
	}
	c.evictLocked()
}

// get returns the object's bytes in buf (grown if needed), or ok=false if it is not cached or
// does not match its digest (then it is dropped).
func (c *cache) get(digest string, buf []byte) (data []byte, ok bool) {
	c.mu.Lock()
	el, hit := c.entries[digest]
	if hit {
		c.lru.MoveToFront(el)
	}
	c.mu.Unlock()
	if !hit {
		return nil, false
	}
	p := c.path(digest)
	f, err := os.Open(p)
	if err != nil {
		c.drop(digest)
		return nil, false
	}
	data, err = readAllInto(f, buf)
	f.Close()
	if err != nil || digestOf(data) != digest {
		c.log.Warn("artifacts: dropping damaged cache entry", "digest", digest, "err", err)
		c.drop(digest)
		os.Remove(p)
		return nil, false
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now) // the use order for the next start; losing it costs only order
	return data, true
}

// put stores an object whose digest the caller has checked, then evicts down to the limit.
func (c *cache) put(digest string, data []byte) {
	size := int64(len(data))
	if size > c.limit {
		return
	}
	c.mu.Lock()
	if el, ok := c.entries[digest]; ok {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if err := c.write(digest, data); err != nil {
		c.log.Warn("artifacts: cache write failed", "digest", digest, "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[digest]; ok {
		return // written twice at once; the rename made both the same file
	}
	c.entries[digest] = c.lru.PushFront(&cacheEntry{digest, size})
	c.size += size
	c.evictLocked()
}

func (c *cache) write(digest string, data []byte) error {
	p := c.path(digest)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), tmpPrefix+"*")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), p); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

func (c *cache) drop(digest string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[digest]; ok {
		c.lru.Remove(el)
		c.size -= el.Value.(*cacheEntry).size
		delete(c.entries, digest)
	}
}

// evictLocked removes unpinned objects, least recently used first, until the cache fits its
// limit. Pinned objects may keep it over the limit until their pulls are done with them.
func (c *cache) evictLocked() {
	for el := c.lru.Back(); el != nil && c.size > c.limit; {
		prev := el.Prev()
		e := el.Value.(*cacheEntry)
		if c.pins[e.digest] == 0 {
			if err := os.Remove(c.path(e.digest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				c.log.Warn("artifacts: cache eviction failed", "digest", e.digest, "err", err)
			} else {
				c.lru.Remove(el)
				delete(c.entries, e.digest)
				c.size -= e.size
			}
		}
		el = prev
	}
}

// usage reports the bytes cached and the limit.
func (c *cache) usage() (size, limit int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.size, c.limit
}

func (c *cache) has(digest string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.entries[digest]
	return ok
}

// readAllInto reads r to its end into buf's storage, growing it only if the data does not fit:
// a chunk read into a chunk-sized buffer must not reallocate just to find the end.
func readAllInto(r io.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			var one [1]byte
			n, err := r.Read(one[:])
			if n > 0 {
				buf = append(buf, one[0])
			}
			if err == io.EOF {
				return buf, nil
			}
			if err != nil {
				return buf, err
			}
			continue
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
