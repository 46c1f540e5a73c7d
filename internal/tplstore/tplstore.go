// Package tplstore moves template builds between a node's data dir and the cluster's artifact
// store (internal/artifacts), so that a build made on one node boots on every node, and a driver
// knows the cluster's rootfs templates without holding any.
//
// A rootfs template (a manifest and one read-only root filesystem, as base and
// code-interpreter-v1-rootfs are) is two refs: templates/<id>/<build>/rootfs (the tree) and
// templates/<id>/<build>/manifest (a tree holding manifest.json). A template built from steps is
// its layers and started snapshot, each the ref templates/<id>/<build>/layer-<i>, and the
// manifest ref; a layer that is a rootfs template's tree is that template's rootfs ref. A node
// names its build-cache layers by the key of the step that made it, and two nodes running one
// step (a RUN) make different trees under one key, so the published manifest names each layer by
// its tree's digest instead (layers/<digest>): a node that fetches it never mistakes its own
// layer for the builder's. The manifest is always written last: a reader that finds it finds the
// whole build. It never builds a template and never touches sandboxes.
package tplstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/keylock"
	"github.com/vibemon/vmon/internal/snapshot"
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

// What a step-built manifest may name as a layer or started snapshot, never a path elsewhere in
// the data dir: the build cache's directories (a step key, or in a published manifest a tree
// digest), or the root filesystem of a rootfs template build (the bottom layer of a template
// built from base).
var (
	cacheLayerRe  = regexp.MustCompile(`^` + build.LayersDir + `/[0-9a-f]{32}$`)
	rootfsLayerRe = regexp.MustCompile(`^templates/([a-z0-9][a-z0-9_-]*)/rootfs-([a-zA-Z0-9][a-zA-Z0-9_-]{0,63})$`)
)

// checkLayer refuses a layer path that is neither the build cache's nor a template's tree.
func checkLayer(rel string) error {
	if cacheLayerRe.MatchString(rel) || rootfsLayerRe.MatchString(rel) {
		return nil
	}
	return fmt.Errorf("layer %q is neither the build cache's nor a template's root filesystem", rel)
}

// layerRef is where layer i of a build from steps (its started snapshot last) is kept: its own
// ref, or, for a rootfs template's tree, that template's.
func layerRef(id, build string, i int, rel string) string {
	if m := rootfsLayerRe.FindStringSubmatch(rel); m != nil {
		return rootfsRef(m[1], m[2])
	}
	return prefix + id + "/" + build + "/layer-" + strconv.Itoa(i)
}

// layersOf are a step-built build's directories: its layers and its started snapshot.
func layersOf(m template.Manifest) []string {
	out := slices.Clone(m.Layers)
	if m.StartSnapshot != "" {
		out = append(out, m.StartSnapshot)
	}
	return out
}

// Sync moves the rootfs templates of one data dir.
type Sync struct {
	store   Store
	dataDir string
	log     *slog.Logger

	mu sync.Mutex
	// fetching serialises fetches of one template (two creates need it at once). +checklocks:mu
	fetching map[string]*sync.Mutex
	// layers serialises pulls to one place (two templates sharing a layer).
	layers keylock.Map
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
		if err := s.PublishBuild(ctx, m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PublishBuild pushes one build of the data dir (a rootfs template, or one built from steps)
// unless the store has it.
func (s *Sync) PublishBuild(ctx context.Context, m template.Manifest) error {
	if _, err := s.store.Resolve(ctx, manifestRef(m.ID, m.BuildID)); err == nil {
		return nil
	} else if !errors.Is(err, artifacts.ErrNotFound) {
		return fmt.Errorf("template %s: %w", m.ID, err)
	}
	var st artifacts.PushStats
	if len(m.Layers) > 0 {
		// The published manifest names each build-cache layer by its tree's digest.
		pub := m
		pub.Layers = make([]string, len(m.Layers))
		for i, l := range layersOf(m) {
			if err := checkLayer(l); err != nil {
				return fmt.Errorf("publish template %s build %s: %w", m.ID, m.BuildID, err)
			}
			ref, name, rootfs := layerRef(m.ID, m.BuildID, i, l), l, rootfsLayerRe.MatchString(l)
			if rootfs {
				if _, err := s.store.Resolve(ctx, ref); err == nil {
					ref = "" // that template's build is there already
				} else if !errors.Is(err, artifacts.ErrNotFound) {
					return fmt.Errorf("template %s: %w", m.ID, err)
				}
			}
			if ref != "" {
				ls, err := s.store.Push(ctx, ref, filepath.Join(s.dataDir, l))
				if err != nil {
					return fmt.Errorf("publish template %s build %s: %w", m.ID, m.BuildID, err)
				}
				st.Files, st.Bytes = st.Files+ls.Files, st.Bytes+ls.Bytes
				if !rootfs {
					name = build.LayersDir + "/" + ls.Manifest[:32] // the tree's sha256, hex
				}
			}
			if i < len(m.Layers) {
				pub.Layers[i] = name
			} else {
				pub.StartSnapshot = name
			}
		}
		m = pub
	} else {
		var err error
		if st, err = s.store.Push(ctx, rootfsRef(m.ID, m.BuildID), m.RootfsDir()); err != nil {
			return fmt.Errorf("publish template %s build %s: %w", m.ID, m.BuildID, err)
		}
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

// Manifests lists the newest build of each rootfs template in the store. Templates built from
// steps are not listed: the driver that ran their build keeps their records.
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
		if len(m.Layers) > 0 {
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
	if m.ID != id || m.BuildID != build {
		return template.Manifest{}, fmt.Errorf("manifest of %s/%s is inconsistent", id, build)
	}
	if len(m.Layers) == 0 && (m.StartSnapshot != "" || !filepath.IsLocal(m.Rootfs)) {
		return template.Manifest{}, fmt.Errorf("manifest of %s/%s is inconsistent", id, build)
	}
	for _, l := range layersOf(m) {
		if err := checkLayer(l); err != nil {
			return template.Manifest{}, fmt.Errorf("manifest of %s/%s: %w", id, build, err)
		}
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
	if len(m.Layers) > 0 {
		return s.fetchLayered(ctx, m)
	}
	dir := template.Dir(s.dataDir, id)
	rootfs := filepath.Join(dir, m.Rootfs)
	if _, err := os.Stat(rootfs); errors.Is(err, os.ErrNotExist) {
		st, err := s.pullInto(ctx, rootfsRef(id, build), rootfs)
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

// fetchLayered brings a build made from steps: the layers and started snapshot the data dir
// lacks (named in the manifest by their trees' digests), then its build manifest, which names
// them. The started snapshot is told its layers' names here.
func (s *Sync) fetchLayered(ctx context.Context, m template.Manifest) (template.Manifest, error) {
	var pulled artifacts.PullStats
	for i, l := range layersOf(m) {
		st, err := s.pullInto(ctx, layerRef(m.ID, m.BuildID, i, l), filepath.Join(s.dataDir, l))
		if err != nil {
			return template.Manifest{}, fmt.Errorf("fetch template %s build %s: %w", m.ID, m.BuildID, err)
		}
		pulled.Files, pulled.Bytes = pulled.Files+st.Files, pulled.Bytes+st.Bytes
	}
	if m.StartSnapshot != "" {
		if err := snapshot.SetLowers(filepath.Join(s.dataDir, m.StartSnapshot), m.Layers); err != nil {
			return template.Manifest{}, fmt.Errorf("fetch template %s build %s: %w", m.ID, m.BuildID, err)
		}
	}
	if err := template.WriteBuild(s.dataDir, m); err != nil {
		return template.Manifest{}, err
	}
	s.log.Info("template fetched from the store", "template", m.ID, "build", m.BuildID, "layers", len(m.Layers),
		"files", pulled.Files, "bytes", pulled.Bytes)
	return template.LoadBuild(s.dataDir, m.ID, m.BuildID)
}

// pullInto pulls ref to dst unless dst is there. artifacts.Pull assembles the tree beside dst and
// renames it in whole; pulls to one place here wait for each other.
func (s *Sync) pullInto(ctx context.Context, ref, dst string) (artifacts.PullStats, error) {
	unlock := s.layers.Lock(dst)
	defer unlock()
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return artifacts.PullStats{}, nil
	}
	st, err := s.store.Pull(ctx, ref, dst)
	if errors.Is(err, fs.ErrExist) {
		return st, nil // placed meanwhile by a pull that does not share the lock
	}
	return st, err
}
