package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Files keeps the archives the SDK uploads for COPY steps, per template and content hash. An
// archive is written to a temporary file and renamed into place only when complete, so a
// present hash is always a whole upload.
type Files struct{ dir string }

// NewFiles keeps uploads under <dataDir>/build-files.
func NewFiles(dataDir string) *Files { return &Files{dir: filepath.Join(dataDir, "build-files")} }

func (f *Files) path(templateID, hash string) (string, error) {
	if err := CheckFile(templateID, hash); err != nil {
		return "", err
	}
	return filepath.Join(f.dir, templateID, hash), nil
}

// CheckFile refuses a template id or archive hash that cannot name an upload.
func CheckFile(templateID, hash string) error {
	if !filesHashRe.MatchString(hash) {
		return errdefs.InvalidArgument("invalid files hash %q (want 64 hex digits)", hash)
	}
	if templateID == "" || filepath.Base(templateID) != templateID || templateID[0] == '.' {
		return errdefs.InvalidArgument("invalid template id")
	}
	return nil
}

// Has reports whether the archive for hash was uploaded for the template.
func (f *Files) Has(_ context.Context, templateID, hash string) (bool, error) {
	p, err := f.path(templateID, hash)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Put stores exactly size bytes from r as the archive for hash. A short body or one longer than
// size is an error and leaves nothing behind.
func (f *Files) Put(_ context.Context, templateID, hash string, r io.Reader, size int64) error {
	p, err := f.path(templateID, hash)
	if err != nil {
		return err
	}
	return WriteArchive(p, r, size)
}

// WriteArchive writes exactly size bytes from r to path, through a temporary file renamed into
// place once whole: a short body or one longer than size is an error and leaves nothing behind.
func WriteArchive(path string, r io.Reader, size int64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create upload dir: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".upload-*")
	if err != nil {
		return fmt.Errorf("create upload: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	n, err := io.Copy(tmp, io.LimitReader(r, size+1))
	if err != nil {
		return errdefs.Wrap(errdefs.KindInvalidArgument, err, "upload interrupted")
	}
	if n != size {
		return errdefs.InvalidArgument("upload has %d bytes, Content-Length said %d", n, size)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write upload: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	ok = true
	return nil
}

// Open opens the archive for hash; a missing one is NotFound.
func (f *Files) Open(_ context.Context, templateID, hash string) (*os.File, error) {
	p, err := f.path(templateID, hash)
	if err != nil {
		return nil, err
	}
	file, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.NotFound("the files for this COPY step (hash %s) were never uploaded", hash)
	}
	return file, err
}

// RemoveTemplate drops every upload of a template.
func (f *Files) RemoveTemplate(_ context.Context, templateID string) error {
	if templateID == "" || filepath.Base(templateID) != templateID || templateID[0] == '.' {
		return errdefs.InvalidArgument("invalid template id")
	}
	return os.RemoveAll(filepath.Join(f.dir, templateID))
}
