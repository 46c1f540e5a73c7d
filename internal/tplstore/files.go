package tplstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/errdefs"
)

// FileStore is the artifact store as Files uses it (*artifacts.Store).
type FileStore interface {
	Store
	Delete(ctx context.Context, ref string) error
}

// Files keeps the archives the SDK uploads for COPY steps in the cluster's store, one ref per
// template and hash (build-files/<template>/<hash>, a tree holding one file). Drivers sharing a
// database answer one build's calls in any order between them: the upload lands on one, the start
// on another, and the driver that runs the build reads the archive from the store. No driver
// holds an upload alone, so losing one loses none. The driver's data dir only stages them.
type Files struct {
	store FileStore
	stage string
}

// archiveName is the one file of an archive's tree.
const archiveName = "archive"

// NewFiles keeps archives in store, staging them under <dataDir>/build-files-stage (emptied
// here: what is there was left by a process that died mid-transfer).
func NewFiles(store FileStore, dataDir string) (*Files, error) {
	stage := filepath.Join(dataDir, "build-files-stage")
	if err := os.RemoveAll(stage); err != nil {
		return nil, fmt.Errorf("clear %s: %w", stage, err)
	}
	if err := os.MkdirAll(stage, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", stage, err)
	}
	return &Files{store: store, stage: stage}, nil
}

func filesRef(templateID, hash string) (string, error) {
	if err := build.CheckFile(templateID, hash); err != nil {
		return "", err
	}
	ref := "build-files/" + templateID + "/" + hash
	if err := artifacts.CheckRef(ref); err != nil {
		return "", errdefs.InvalidArgument("invalid template id")
	}
	return ref, nil
}

// Has reports whether the archive for hash was uploaded for the template.
func (f *Files) Has(ctx context.Context, templateID, hash string) (bool, error) {
	ref, err := filesRef(templateID, hash)
	if err != nil {
		return false, err
	}
	_, err = f.store.Resolve(ctx, ref)
	if errors.Is(err, artifacts.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Put stores exactly size bytes from r as the archive for hash; until the store holds all of
// it, Has says it is missing.
func (f *Files) Put(ctx context.Context, templateID, hash string, r io.Reader, size int64) error {
	ref, err := filesRef(templateID, hash)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(f.stage, "put-")
	if err != nil {
		return fmt.Errorf("stage upload: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := build.WriteArchive(filepath.Join(dir, archiveName), r, size); err != nil {
		return err
	}
	if _, err := f.store.Push(ctx, ref, dir); err != nil {
		return fmt.Errorf("store upload: %w", err)
	}
	return nil
}

// Open opens the archive for hash; a missing one is NotFound. The file is fetched to the stage
// and unlinked there at once: it lives as long as the caller keeps it open.
func (f *Files) Open(ctx context.Context, templateID, hash string) (*os.File, error) {
	ref, err := filesRef(templateID, hash)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(f.stage, "get-")
	if err != nil {
		return nil, fmt.Errorf("stage archive: %w", err)
	}
	defer os.RemoveAll(dir)
	tree := filepath.Join(dir, "tree")
	if _, err := f.store.Pull(ctx, ref, tree); err != nil {
		if errors.Is(err, artifacts.ErrNotFound) {
			return nil, errdefs.NotFound("the files for this COPY step (hash %s) were never uploaded", hash)
		}
		return nil, fmt.Errorf("fetch archive %s: %w", hash, err)
	}
	return os.Open(filepath.Join(tree, archiveName))
}

// RemoveTemplate drops every archive of a template.
func (f *Files) RemoveTemplate(ctx context.Context, templateID string) error {
	if strings.Contains(templateID, "/") || artifacts.CheckRef("build-files/"+templateID) != nil {
		return errdefs.InvalidArgument("invalid template id")
	}
	refs, err := f.store.Refs(ctx, "build-files/"+templateID+"/")
	if err != nil {
		return fmt.Errorf("list archives of %s: %w", templateID, err)
	}
	var errs []error
	for _, r := range refs {
		errs = append(errs, f.store.Delete(ctx, r.Name))
	}
	return errors.Join(errs...)
}
