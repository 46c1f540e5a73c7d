package artifacts

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Defaults for Options.
const (
	DefaultChunkSize   = 8 << 20
	DefaultConcurrency = 8
)

// Key layout in the backend.
const (
	chunkPrefix    = "chunks/"
	manifestPrefix = "manifests/"
	refPrefix      = "refs/"
	refSuffix      = ".ref" // keeps "a" and "a/b" from being a file and a directory in a DirBackend
	intentPrefix   = "intents/"
	gcStateKey     = "gc/state"
)

func chunkKey(d string) string    { return chunkPrefix + d[:2] + "/" + d }
func manifestKey(d string) string { return manifestPrefix + d[:2] + "/" + d }
func refKey(name string) string   { return refPrefix + name + refSuffix }

// Options configure a Store.
type Options struct {
	Backend Backend
	// CacheDir holds the node's local copies of chunks and manifests, at most CacheLimit bytes
	// (pinned chunks of running pulls can exceed it for as long as they run). An empty CacheDir
	// or a CacheLimit of 0 turns the cache off, which suits a DirBackend on a local disk.
	CacheDir   string
	CacheLimit int64
	// Concurrency bounds the chunk transfers of one push or pull (DefaultConcurrency if 0).
	Concurrency int
	// ChunkSize is used for new pushes (DefaultChunkSize if 0); pulls use the manifest's.
	ChunkSize int64
	Logger    *slog.Logger
}

// Store pushes directory trees to a Backend and pulls them back. It is safe for concurrent use.
type Store struct {
	b           Backend
	cache       *cache // nil: no cache
	concurrency int
	chunkSize   int64
	log         *slog.Logger

	// The commit protocol's timings (see GC); tests shorten them.
	pollInterval time.Duration // how often a push waiting for a GC, or a GC waiting for commits, looks again
	intentTTL    time.Duration // a commit intent older than this belongs to a dead push
	gcHeartbeat  time.Duration // how often a running GC refreshes its state
	gcStaleAfter time.Duration // a running GC state not refreshed for this long belongs to a dead GC

	// beforeCommit, when set by a test, runs after a push has stored its chunks and manifest,
	// before it announces its commit; afterIntent runs after it announced it.
	beforeCommit func()
	afterIntent  func()

	mu      sync.Mutex
	pulling map[string]bool // target directories of running pulls
}

// New opens a Store.
func New(opts Options) (*Store, error) {
	if opts.Backend == nil {
		return nil, errors.New("artifacts: no backend")
	}
	s := &Store{
		b:            opts.Backend,
		concurrency:  opts.Concurrency,
		chunkSize:    opts.ChunkSize,
		log:          opts.Logger,
		pollInterval: time.Second,
		intentTTL:    2 * time.Minute,
		gcHeartbeat:  10 * time.Second,
		gcStaleAfter: 2 * time.Minute,
		pulling:      map[string]bool{},
	}
	if s.concurrency <= 0 {
		s.concurrency = DefaultConcurrency
	}
	if s.chunkSize == 0 {
		s.chunkSize = DefaultChunkSize
	}
	if s.chunkSize < 4096 || s.chunkSize%4096 != 0 || s.chunkSize > 1<<30 {
		return nil, fmt.Errorf("artifacts: chunk size %d: want a multiple of 4096 up to 1 GiB", s.chunkSize)
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if opts.CacheDir != "" && opts.CacheLimit > 0 {
		c, err := openCache(opts.CacheDir, opts.CacheLimit, s.log)
		if err != nil {
			return nil, err
		}
		s.cache = c
	}
	return s, nil
}

// Backend returns the store's backend.
func (s *Store) Backend() Backend { return s.b }

// CacheUsage reports the bytes in the local cache and its limit (0, 0 without a cache).
func (s *Store) CacheUsage() (size, limit int64) {
	if s.cache == nil {
		return 0, 0
	}
	return s.cache.usage()
}

// RefInfo is what a ref records about the tree it names.
type RefInfo struct {
	Name     string    `json:"-"`
	Manifest string    `json:"manifest"` // digest of the tree's manifest
	Files    int       `json:"files"`    // regular files
	Bytes    int64     `json:"bytes"`    // their total size (holes included)
	PushedAt time.Time `json:"pushedAt"`
}

var refSegment = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// CheckRef reports whether name is a valid ref: slash-separated segments of letters, digits, '.',
// '_' and '-', each starting with a letter or digit ("templates/base", "paused/sb-1").
func CheckRef(name string) error {
	if name == "" || len(name) > 512 {
		return fmt.Errorf("artifacts: invalid ref %q", name)
	}
	for seg := range strings.SplitSeq(name, "/") {
		if !refSegment.MatchString(seg) {
			return fmt.Errorf("artifacts: invalid ref %q", name)
		}
	}
	return nil
}

// Resolve reads a ref; a missing ref is ErrNotFound.
func (s *Store) Resolve(ctx context.Context, ref string) (RefInfo, error) {
	if err := CheckRef(ref); err != nil {
		return RefInfo{}, err
	}
	data, err := s.readSmall(ctx, refKey(ref))
	if err != nil {
		return RefInfo{}, fmt.Errorf("artifacts: ref %s: %w", ref, err)
	}
	var ri RefInfo
	if err := json.Unmarshal(data, &ri); err != nil || !validDigest(ri.Manifest) {
		return RefInfo{}, fmt.Errorf("%w: ref %s does not decode", ErrCorrupt, ref)
	}
	ri.Name = ref
	return ri, nil
}

// Refs lists the refs whose names start with prefix ("" for all).
func (s *Store) Refs(ctx context.Context, prefix string) ([]RefInfo, error) {
	var names []string
	err := s.b.List(ctx, refPrefix+prefix, func(o ObjectInfo) error {
		if name, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, refPrefix), refSuffix); ok && CheckRef(name) == nil {
			names = append(names, name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]RefInfo, 0, len(names))
	for _, n := range names {
		ri, err := s.Resolve(ctx, n)
		if errors.Is(err, ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, ri)
	}
	return out, nil
}

// Delete removes a ref. The chunks and manifest only it reached stay until a GC; a pull that
// already read the ref may fail once they are gone.
func (s *Store) Delete(ctx context.Context, ref string) error {
	if err := CheckRef(ref); err != nil {
		return err
	}
	if err := s.b.Delete(ctx, refKey(ref)); err != nil {
		return fmt.Errorf("artifacts: delete ref %s: %w", ref, err)
	}
	s.log.Info("artifacts: ref deleted", "ref", ref, "store", s.b.String())
	return nil
}

// readSmall reads a whole object that is expected to be small (a ref, an intent, the GC state).
func (s *Store) readSmall(ctx context.Context, key string) ([]byte, error) {
	rc, err := s.b.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("artifacts: read %s: %w", key, err)
	}
	return data, nil
}

// fetch reads an object named by its digest into buf (grown if needed) and checks it.
func (s *Store) fetch(ctx context.Context, key, digest string, buf []byte, limit int64) ([]byte, error) {
	rc, err := s.b.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := readAllInto(io.LimitReader(rc, limit+1), buf)
	if err != nil {
		return nil, fmt.Errorf("artifacts: read %s: %w", key, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w: %s in %s is larger than %d bytes", ErrCorrupt, key, s.b, limit)
	}
	if got := digestOf(data); got != digest {
		return nil, fmt.Errorf("%w: %s in %s: its bytes hash to %s", ErrCorrupt, key, s.b, got)
	}
	return data, nil
}

// loadManifest returns the manifest with this digest, from the cache if it is there.
func (s *Store) loadManifest(ctx context.Context, digest string) (*Manifest, error) {
	var data []byte
	if s.cache != nil {
		data, _ = s.cache.get(digest, nil)
	}
	if data == nil {
		var err error
		if data, err = s.fetch(ctx, manifestKey(digest), digest, nil, maxManifestBytes); err != nil {
			return nil, fmt.Errorf("artifacts: manifest %s: %w", digest, err)
		}
		if s.cache != nil {
			s.cache.put(digest, data)
		}
	}
	m, err := decodeManifest(data)
	if err != nil {
		return nil, fmt.Errorf("artifacts: manifest %s: %w", digest, err)
	}
	return m, nil
}

// gcState is the object through which GC and pushes' commits keep out of each other's way.
type gcState struct {
	Gen       int64     `json:"gen"`
	Running   bool      `json:"running"`
	Heartbeat time.Time `json:"heartbeat"`
	Owner     string    `json:"owner"`
}

// same reports whether no GC started or finished between the two readings.
func (g gcState) same(o gcState) bool {
	return g.Gen == o.Gen && g.Running == o.Running && g.Owner == o.Owner
}

// busy reports whether a live GC may be deleting now.
func (s *Store) busy(g gcState) bool {
	return g.Running && time.Since(g.Heartbeat) < s.gcStaleAfter
}

func (s *Store) readGCState(ctx context.Context) (gcState, error) {
	data, err := s.readSmall(ctx, gcStateKey)
	if errors.Is(err, ErrNotFound) {
		return gcState{}, nil
	}
	if err != nil {
		return gcState{}, fmt.Errorf("artifacts: GC state: %w", err)
	}
	var g gcState
	if err := json.Unmarshal(data, &g); err != nil {
		return gcState{}, fmt.Errorf("%w: GC state does not decode", ErrCorrupt)
	}
	return g, nil
}

func (s *Store) writeJSON(ctx context.Context, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.b.Put(ctx, key, data)
}

// waitGCIdle waits until no live GC runs and returns the state it then read.
func (s *Store) waitGCIdle(ctx context.Context) (gcState, error) {
	logged := false
	for {
		g, err := s.readGCState(ctx)
		if err != nil {
			return g, err
		}
		if !s.busy(g) {
			return g, nil
		}
		if !logged {
			s.log.Info("artifacts: waiting for a GC to finish", "store", s.b.String(), "gc", g.Owner)
			logged = true
		}
		if err := sleepCtx(ctx, s.pollInterval); err != nil {
			return g, err
		}
	}
}

type intent struct {
	Ref  string    `json:"ref"`
	Time time.Time `json:"time"`
}

// commit writes a ref once the objects it reaches are known to survive any GC: it announces the
// commit with an intent object, then reads the GC state. A GC writes its state before it waits for
// intents to go, so either the GC sees the intent (and marks after the ref exists) or the push
// sees the GC (and does not commit). If a GC ran since the push read seen, the push waits for it
// to end, re-checks its objects with reverify (which uploads what the GC took) and tries again.
func (s *Store) commit(ctx context.Context, ref string, info RefInfo, seen gcState, reverify func(context.Context) error) error {
	for {
		id := randomID()
		if err := s.writeJSON(ctx, intentPrefix+id, intent{Ref: ref, Time: time.Now().UTC()}); err != nil {
			return fmt.Errorf("artifacts: commit %s: %w", ref, err)
		}
		if s.afterIntent != nil {
			s.afterIntent()
		}
		g, err := s.readGCState(ctx)
		if err == nil && g.same(seen) && !s.busy(g) {
			info.PushedAt = time.Now().UTC()
			err = s.writeJSON(ctx, refKey(ref), info)
			if derr := s.b.Delete(context.WithoutCancel(ctx), intentPrefix+id); derr != nil {
				s.log.Warn("artifacts: could not remove a commit intent; GC will wait for it to go stale", "err", derr)
			}
			if err != nil {
				return fmt.Errorf("artifacts: commit %s: %w", ref, err)
			}
			return nil
		}
		if derr := s.b.Delete(context.WithoutCancel(ctx), intentPrefix+id); derr != nil {
			s.log.Warn("artifacts: could not remove a commit intent; GC will wait for it to go stale", "err", derr)
		}
		if err != nil {
			return fmt.Errorf("artifacts: commit %s: %w", ref, err)
		}
		s.log.Info("artifacts: a GC ran during the push; checking its chunks again", "ref", ref, "store", s.b.String())
		if seen, err = s.waitGCIdle(ctx); err != nil {
			return fmt.Errorf("artifacts: commit %s: %w", ref, err)
		}
		if err := reverify(ctx); err != nil {
			return fmt.Errorf("artifacts: commit %s: %w", ref, err)
		}
	}
}

func randomID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
