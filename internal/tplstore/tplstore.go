// Package tplstore moves rootfs templates (a manifest and one read-only root filesystem, as base
// and code-interpreter-v1-rootfs are) between a node's data dir and the cluster's artifact store
// (internal/artifacts), so that a build made on one node boots on every node, and a driver knows
// the cluster's templates without holding any.
//
// A build is two refs: templates/<id>/<build>/rootfs (the tree) and templates/<id>/<build>/manifest
// (a tree holding manifest.json), the manifest written last: a reader that finds it finds the
// whole build. It never builds a template and never touches sandboxes; templates built from steps
// (layers) stay on their node.
package tplstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/template"
)

// Store is the artifact store as this package uses it (*artifacts.Store).
type Store interface {
	Push(ctx context.Context, ref, dir string) (artifacts.PushStats, error)
	Pull(ctx context.Context, ref, dir string) (artifacts.PullStats, error)
	Resolve(ctx context.Context, ref string) (artifacts.RefInfo, error)
	Refs(ctx context.Context, prefix string) ([]artifacts.RefInfo, error)
}

const prefix = "templates/"

func rootfsRef(id, build string) string   { return prefix + id + "/" + build + "/rootfs" }
func manifestRef(id, build string) string { return prefix + id + "/" + build + "/manifest" }

// Sync moves the rootfs templates of one data dir.
type Sync struct {
	store   Store
	dataDir string
	log     *slog.Logger

	mu sync.Mutex
	// fetching serialises fetches of one template (two creates need it at once). +checklocks:mu
	fetching map[string]*sync.Mutex
}

// New returns a Sync of dataDir's templates with store.
func New(store Store, dataDir string, log *slog.Logger) *Sync {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sync{store: store, dataDir: dataDir, log: log, fetching: map[string]*sync.Mutex{}}
}

// Publish pushes every rootfs template build of the data dir the store lacks.
func (s *Sync) Publish(ctx context.Context) error {
	ms, err := template.List(s.dataDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range ms {
		if err := s.publish(ctx, m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Sync) publish(ctx context.Context, m template.Manifest) error {
	if len(m.Layers) > 0 || m.StartSnapshot != "" {
		return nil // built from steps: its layers live on its node
	}
	if _, err := s.store.Resolve(ctx, manifestRef(m.ID, m.BuildID)); err == nil {
		return nil
	} else if !errors.Is(err, artifacts.ErrNotFound) {
		return fmt.Errorf("template %s: %w", m.ID, err)
	}
	st, err := s.store.Push(ctx, rootfsRef(m.ID, m.BuildID), m.RootfsDir())
	if err != nil {
		return fmt.Errorf("publish template %s build %s: %w", m.ID, m.BuildID, err)
	}
	tmp, err := os.MkdirTemp("", "vmon-manifest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), b, 0o644); err != nil {
		return err
	}
	if _, err := s.store.Push(ctx, manifestRef(m.ID, m.BuildID), tmp); err != nil {
		return fmt.Errorf("publish template %s build %s: %w", m.ID, m.BuildID, err)
	}
	s.log.Info("template published to the store", "template", m.ID, "build", m.BuildID, "files", st.Files, "bytes", st.Bytes)
	return nil
}

// Manifests lists the newest build of each template in the store.
func (s *Sync) Manifests(ctx context.Context) ([]template.Manifest, error) {
	refs, err := s.store.Refs(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("list the store's templates: %w", err)
	}
	newest := map[string]template.Manifest{}
	for _, r := range refs {
		parts := strings.Split(strings.TrimPrefix(r.Name, prefix), "/")
		if len(parts) != 3 || parts[2] != "manifest" {
			continue
		}
		m, err := s.manifest(ctx, parts[0], parts[1])
		if err != nil {
			s.log.Warn("a template manifest in the store cannot be read", "ref", r.Name, "err", err)
			continue
		}
		if cur, ok := newest[m.ID]; !ok || m.BuiltAt.After(cur.BuiltAt) {
			newest[m.ID] = m
		}
	}
	out := make([]template.Manifest, 0, len(newest))
	for _, m := range newest {
		out = append(out, m)
	}
	return out, nil
}

// manifest reads one build's manifest from the store.
func (s *Sync) manifest(ctx context.Context, id, build string) (template.Manifest, error) {
	tmp, err := os.MkdirTemp("", "vmon-manifest-")
	if err != nil {
		return template.Manifest{}, err
	}
	defer os.RemoveAll(tmp)
	if _, err := s.store.Pull(ctx, manifestRef(id, build), filepath.Join(tmp, "m")); err != nil {
		return template.Manifest{}, err
	}
	b, err := os.ReadFile(filepath.Join(tmp, "m", "manifest.json"))
	if err != nil {
		return template.Manifest{}, err
	}
	var m template.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return template.Manifest{}, err
	}
	if m.ID != id || m.BuildID != build || len(m.Layers) > 0 || !filepath.IsLocal(m.Rootfs) {
		return template.Manifest{}, fmt.Errorf("manifest of %s/%s is inconsistent", id, build)
	}
	return m, nil
}

// Fetch makes build of template id (the store's newest when build is "") the data dir's own,
// pulling it when the data dir holds another build or none, and returns its manifest. Sandboxes
// already running on an older build keep it: its root filesystem stays beside the new one.
func (s *Sync) Fetch(ctx context.Context, id, build string) (template.Manifest, error) {
	s.mu.Lock()
	l, ok := s.fetching[id]
	if !ok {
		l = &sync.Mutex{}
		s.fetching[id] = l
	}
	s.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	if local, err := template.Load(s.dataDir, id); err == nil && (build == "" || local.BuildID == build) {
		return local, nil
	}
	var m template.Manifest
	var err error
	if build == "" {
		ms, lerr := s.Manifests(ctx)
		if lerr != nil {
			return template.Manifest{}, lerr
		}
		for _, c := range ms {
			if c.ID == id {
				m, build = c, c.BuildID
			}
		}
		if build == "" {
			return template.Manifest{}, errdefs.NotFound("template %q is neither on this node nor in the store", id)
		}
	} else if m, err = s.manifest(ctx, id, build); errors.Is(err, artifacts.ErrNotFound) {
		return template.Manifest{}, errdefs.NotFound("template %q build %s is neither on this node nor in the store", id, build)
	} else if err != nil {
		return template.Manifest{}, err
	}
	dir := template.Dir(s.dataDir, id)
	rootfs := filepath.Join(dir, m.Rootfs)
	if _, err := os.Stat(rootfs); errors.Is(err, os.ErrNotExist) {
		st, err := s.store.Pull(ctx, rootfsRef(id, build), rootfs)
		if err != nil {
			return template.Manifest{}, fmt.Errorf("fetch template %s build %s: %w", id, build, err)
		}
		s.log.Info("template fetched from the store", "template", id, "build", build, "files", st.Files, "bytes", st.Bytes)
	} else if err != nil {
		return template.Manifest{}, err
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return template.Manifest{}, err
	}
	tmp := filepath.Join(dir, ".manifest.json.tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return template.Manifest{}, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "manifest.json")); err != nil {
		return template.Manifest{}, err
	}
	return template.Load(s.dataDir, id)
}
