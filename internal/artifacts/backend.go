package artifacts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// ErrNotFound is returned (wrapped) for a key, ref or object that does not exist.
var ErrNotFound = errors.New("artifacts: not found")

// ErrCorrupt is returned (wrapped) when stored bytes do not match their digest or a manifest does
// not decode: the store holds a damaged object, and nothing built from it was put in place.
var ErrCorrupt = errors.New("artifacts: corrupt object")

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// Backend stores immutable objects by key. Keys are slash-separated relative paths without empty,
// "." or ".." segments. Implementations must make Put all-or-nothing (a concurrent or later reader
// sees the whole object or none of it), durable when Put returns, and Put of an existing key must
// replace it. Every method is safe for concurrent use.
type Backend interface {
	// Put stores data under key.
	Put(ctx context.Context, key string, data []byte) error
	// Get opens the object; a missing key is ErrNotFound.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat describes the object; a missing key is ErrNotFound.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// List calls fn for every object whose key starts with prefix, in no particular order.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error
	// Delete removes the object; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// String names the backend for logs ("dir:/var/lib/vmon/store", "s3://bucket/prefix").
	String() string
}

// staleSweeper is implemented by backends that can leave debris of interrupted writes behind
// (the directory backend's temporary files); GC calls it.
type staleSweeper interface {
	sweepStale(ctx context.Context, olderThan time.Duration) (int, error)
}

// OpenBackend opens the backend a --store value names: an s3://bucket/prefix URL, or else a
// directory path (created if missing). See OpenS3 for how the S3 endpoint and credentials are
// found.
func OpenBackend(ctx context.Context, spec string) (Backend, error) {
	if strings.HasPrefix(spec, "s3://") {
		return OpenS3(ctx, spec)
	}
	if strings.Contains(spec, "://") {
		return nil, fmt.Errorf("artifacts: store %q: only directories and s3:// URLs are supported", spec)
	}
	return OpenDir(spec)
}

// checkKey refuses keys that could escape a directory backend's root or alias another key.
func checkKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/") {
		return fmt.Errorf("artifacts: invalid key %q", key)
	}
	for seg := range strings.SplitSeq(key, "/") {
		if seg == "" || seg == "." || seg == ".." || strings.HasPrefix(seg, tmpPrefix) || strings.ContainsRune(seg, 0) {
			return fmt.Errorf("artifacts: invalid key %q", key)
		}
	}
	return nil
}

// tmpPrefix starts the names of files and directories that are being written: never a key, never
// listed, and removed by GC (objects) or by the next pull (trees) when a crash left them behind.
const tmpPrefix = ".tmp-"
