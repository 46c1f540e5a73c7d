// Package rootimage builds and keeps the read-only EROFS images that sandboxes boot from without a
// gofer: a template's layers merged into one filesystem, with the node's envd build inside it
// (a bind mount of envd would bring the gofer back). One image serves every sandbox of that
// template and envd build, and the kernel's page cache shares its pages between them.
//
// It owns one directory (the node's images directory): an image is <key>.erofs beside
// <key>.json, which says what it was built from and is written last, so an image without its
// record is unfinished and is swept. It reads template layers and envd builds and never writes
// to them; it mounts an overlay of them only under its own directory while it builds.
package rootimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// FormatVersion changes whenever what an image holds or how it is laid out changes, so images
// built the old way get new keys instead of being taken for current. 2: reproducible builds.
// 3: one UUID for all images, so that the bytes do not depend on where the layers are.
const FormatVersion = "3"

// retryAfter is how long a failed build is not tried again: creates boot without an image
// meanwhile, and a build that fails at once would otherwise run on every create.
const retryAfter = time.Minute

// Image is a built root image.
type Image struct {
	// Path is the EROFS image.
	Path string `json:"-"`
	// Lowers are the template layers it merges (topmost first) and Envd the envd build it holds.
	Lowers []string `json:"lowers"`
	Envd   string   `json:"envd"`
	// Bash says the image has /bin/bash (node-run commands use it as a login shell).
	Bash    bool      `json:"bash"`
	BuiltAt time.Time `json:"builtAt"`
	// Digest is the image's sha256. A build is reproducible, so another node's build of the same
	// key has the same digest; a checkpoint records it and is restored only on that very image.
	Digest string `json:"digest"`
}

// Options configure a Store.
type Options struct {
	// Dir holds the images; it is created if missing.
	Dir string
	// DataDir is the node's data directory: layers and envd builds under it are keyed by their
	// path relative to it, so nodes with the same template and envd builds name the same image.
	DataDir string
	// GuestBinDir is where envd's build directory appears in the guest.
	GuestBinDir string
	Log         *slog.Logger
}

// Store builds images on demand, one at a time, and hands out the ones that are ready.
type Store struct {
	opts Options
	// sem lets one build run at a time: a build reads the whole template and writes as much.
	sem chan struct{}

	mu       sync.Mutex
	building map[string]bool
	failed   map[string]time.Time
	ready    map[string]Image
	// wg counts background builds, for Close.
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// New opens the store in opts.Dir and removes what an interrupted build left there.
func New(opts Options) (*Store, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if !filepath.IsAbs(opts.Dir) || !filepath.IsAbs(opts.GuestBinDir) || !filepath.IsAbs(opts.DataDir) {
		return nil, errors.New("rootimage: the images, data and guest envd directories must be absolute")
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create root images dir: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{opts: opts, sem: make(chan struct{}, 1), building: map[string]bool{}, failed: map[string]time.Time{},
		ready: map[string]Image{}, ctx: ctx, cancel: cancel}
	if err := s.sweepUnfinished(); err != nil {
		return nil, err
	}
	return s, nil
}

// Close stops background builds and waits for them.
func (s *Store) Close() {
	// Under mu: a Lookup then either saw the store closed or counted its build before Wait.
	s.mu.Lock()
	s.cancel()
	s.mu.Unlock()
	s.wg.Wait()
}

// Key names the image of lowers (topmost first) with the envd build in envdDir. Template layers
// and envd builds are immutable directories named by their build, so their paths under the data
// directory name their content on every node.
func (s *Store) Key(lowers []string, envdDir string) string {
	h := sha256.New()
	fmt.Fprintf(h, "vmon-root-image %s\n", FormatVersion)
	for _, l := range lowers {
		fmt.Fprintf(h, "lower %s\n", s.keyPath(l))
	}
	fmt.Fprintf(h, "envd %s\n", s.keyPath(envdDir))
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func (s *Store) keyPath(p string) string {
	if rel, err := filepath.Rel(s.opts.DataDir, p); err == nil && filepath.IsLocal(rel) {
		return filepath.ToSlash(rel)
	}
	return filepath.Clean(p)
}

func (s *Store) imagePath(key string) string  { return filepath.Join(s.opts.Dir, key+".erofs") }
func (s *Store) recordPath(key string) string { return filepath.Join(s.opts.Dir, key+".json") }

// Lookup returns the image of lowers with envdDir if it is built. If it is not, it starts
// building it in the background (unless a build of it runs or failed less than a minute ago)
// and reports false: the caller boots this sandbox another way.
func (s *Store) Lookup(lowers []string, envdDir string) (Image, bool) {
	key := s.Key(lowers, envdDir)
	s.mu.Lock()
	img, ok := s.ready[key]
	s.mu.Unlock()
	if ok {
		// An image removed by hand would fail every create of its template at the runtime's
		// start; this way it is built again and they boot from an overlay meanwhile.
		if _, err := os.Stat(img.Path); err == nil {
			return img, true
		}
		s.mu.Lock()
		delete(s.ready, key)
		s.mu.Unlock()
	}
	if img, err := s.read(key); err == nil {
		s.mu.Lock()
		s.ready[key] = img
		s.mu.Unlock()
		return img, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.building[key] || time.Since(s.failed[key]) < retryAfter || s.ctx.Err() != nil {
		return Image{}, false
	}
	s.building[key] = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if _, err := s.Build(s.ctx, lowers, envdDir); err != nil && s.ctx.Err() == nil {
			s.opts.Log.Error("building a root image failed; sandboxes of its template boot from an overlay meanwhile",
				"lowers", strings.Join(lowers, ":"), "envd", envdDir, "err", err)
		}
	}()
	return Image{}, false
}

// ForRestore returns the image for a checkpoint taken on the image at path: that one when this
// store has it, else this node's image of lowers and envdDir, built if missing (a paused sandbox
// that moved from another node, or an image removed by hand). Builds are reproducible, so that
// is the same image whenever the files are the same, even where this node keeps the layers
// elsewhere (its key, and so its path, then differ). The caller compares digests: only they say
// the bytes are the same.
func (s *Store) ForRestore(ctx context.Context, path string, lowers []string, envdDir string) (Image, error) {
	key, ok := strings.CutSuffix(filepath.Base(path), ".erofs")
	if filepath.Dir(path) != s.opts.Dir || !ok || key == "" {
		// Not one of this store's: it can only be used as it is.
		if _, err := os.Stat(path); err != nil {
			return Image{}, err
		}
		return Image{Path: path}, nil
	}
	if img, err := s.read(key); err == nil {
		return img, nil
	}
	return s.Build(ctx, lowers, envdDir)
}

// Build builds the image of lowers with envdDir unless it exists, and returns it.
func (s *Store) Build(ctx context.Context, lowers []string, envdDir string) (img Image, err error) {
	key := s.Key(lowers, envdDir)
	s.mu.Lock()
	s.building[key] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.building, key)
		if err != nil {
			s.failed[key] = time.Now()
		} else {
			delete(s.failed, key)
			s.ready[key] = img
		}
		s.mu.Unlock()
	}()
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return Image{}, ctx.Err()
	}
	defer func() { <-s.sem }()
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}
	if img, err := s.read(key); err == nil {
		return img, nil
	}
	began := time.Now()
	img, err = s.build(ctx, key, lowers, envdDir)
	if err != nil {
		return Image{}, err
	}
	s.opts.Log.Info("root image built", "key", key, "lowers", strings.Join(lowers, ":"), "envd", envdDir,
		"took", time.Since(began).Round(time.Millisecond))
	return img, nil
}

// read returns image key if both its image and its record are there.
func (s *Store) read(key string) (Image, error) {
	b, err := os.ReadFile(s.recordPath(key))
	if err != nil {
		return Image{}, err
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return Image{}, fmt.Errorf("root image record %s: %w", key, err)
	}
	img.Path = s.imagePath(key)
	if _, err := os.Stat(img.Path); err != nil {
		return Image{}, err
	}
	return img, nil
}

// sweepUnfinished removes build directories, records' temporary files and images without a
// record.
func (s *Store) sweepUnfinished() error {
	ents, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("read root images dir: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, buildPrefix):
			if err := removeBuild(filepath.Join(s.opts.Dir, name)); err != nil {
				return err
			}
		case strings.HasPrefix(name, "."):
			_ = os.Remove(filepath.Join(s.opts.Dir, name))
		case strings.HasSuffix(name, ".erofs"):
			if _, err := os.Stat(s.recordPath(strings.TrimSuffix(name, ".erofs"))); errors.Is(err, os.ErrNotExist) {
				_ = os.Remove(filepath.Join(s.opts.Dir, name))
			}
		}
	}
	return nil
}

// buildPrefix names a build's working directory in the images directory.
const buildPrefix = ".build-"

// Sweep removes the images keep does not want (given each image's path and record) and records
// without an image. An image a sandbox or snapshot boots from must be kept: a checkpoint reopens
// the very image it was taken on.
func (s *Store) Sweep(keep func(Image) bool) error {
	recs, err := filepath.Glob(filepath.Join(s.opts.Dir, "*.json"))
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, rec := range recs {
		key := strings.TrimSuffix(filepath.Base(rec), ".json")
		if s.building[key] {
			continue
		}
		img, err := s.read(key)
		if err != nil {
			// A record that cannot be read cannot say the image is unused.
			img = Image{Path: s.imagePath(key)}
		}
		if keep(img) {
			continue
		}
		delete(s.ready, key)
		// The record goes first: an image without one is unfinished, and never handed out.
		if err := os.Remove(rec); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(s.imagePath(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
