package artifacts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DirBackend keeps objects as files under a root directory, one file per key. It relies only on
// what NFS also gives: an object is written to a temporary file in its final directory, synced,
// then renamed over its name, and the directory synced, so a crash or a concurrent reader on any
// client sees the whole object or none.
type DirBackend struct {
	root string
}

// OpenDir opens (and creates if missing) a directory backend.
func OpenDir(root string) (*DirBackend, error) {
	if root == "" {
		return nil, errors.New("artifacts: empty store directory")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("artifacts: store directory %q: %w", root, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("artifacts: store directory: %w", err)
	}
	return &DirBackend{root: abs}, nil
}

func (d *DirBackend) String() string { return "dir:" + d.root }

func (d *DirBackend) path(key string) (string, error) {
	if err := checkKey(key); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

func (d *DirBackend) Put(ctx context.Context, key string, data []byte) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("artifacts: put %s: %w", key, err)
	}
	f, err := os.CreateTemp(dir, tmpPrefix+"*")
	if err != nil {
		return fmt.Errorf("artifacts: put %s: %w", key, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("artifacts: put %s: %w", key, err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("artifacts: put %s: %w", key, err)
	}
	// Data synced before the rename: a crash can lose the object but never leave a torn one.
	if err := f.Sync(); err != nil {
		return fmt.Errorf("artifacts: put %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("artifacts: put %s: %w", key, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("artifacts: put %s: %w", key, err)
	}
	ok = true
	// The directory synced after it: a ref written later must not survive a crash that loses the
	// chunks it names.
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("artifacts: put %s: %w", key, err)
	}
	return nil
}

func (d *DirBackend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("artifacts: get %s: %w", key, err)
	}
	return f, nil
}

func (d *DirBackend) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	p, err := d.path(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		return ObjectInfo{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return ObjectInfo{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("artifacts: stat %s: %w", key, err)
	}
	if !fi.Mode().IsRegular() {
		return ObjectInfo{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

func (d *DirBackend) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	// Walk only the deepest directory the prefix names whole; the rest is filtered by name.
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		if err := checkKey(prefix[:i]); err != nil {
			return err
		}
		start = filepath.Join(d.root, filepath.FromSlash(prefix[:i]))
	}
	err := filepath.WalkDir(start, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed under us, or the prefix's directory was never made
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(de.Name(), tmpPrefix) {
			if de.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if de.IsDir() || !de.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(d.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return fn(ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
	})
	if err != nil {
		return fmt.Errorf("artifacts: list %s%s: %w", d, prefix, err)
	}
	return nil
}

func (d *DirBackend) Delete(ctx context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("artifacts: delete %s: %w", key, err)
	}
	return nil
}

// sweepStale removes temporary files that interrupted Puts left behind.
func (d *DirBackend) sweepStale(ctx context.Context, olderThan time.Duration) (int, error) {
	n := 0
	cutoff := time.Now().Add(-olderThan)
	err := filepath.WalkDir(d.root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if de.IsDir() || !strings.HasPrefix(de.Name(), tmpPrefix) {
			return nil
		}
		fi, err := de.Info()
		if err != nil || fi.ModTime().After(cutoff) {
			return nil // vanished, or young: a Put in progress owns it
		}
		if os.Remove(p) == nil {
			n++
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("artifacts: sweep %s: %w", d, err)
	}
	return n, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
