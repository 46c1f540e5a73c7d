// Package template owns sandbox templates on a node: the read-only root filesystems sandboxes
// boot from, each with a small JSON manifest, under <data-dir>/templates/<id>/. It builds the
// `base` template from the host's Debian package sources with mmdebstrap, caches it, and rebuilds
// it only on request.
//
// A template's rootfs is never modified after its build completes: sandboxes mount it as the
// lower layer of their overlay (internal/rootfs). A rebuild therefore goes to a new directory and
// switches the manifest atomically; the old rootfs is removed only when no overlay uses it. This
// package must never touch sandbox directories, mounts other than its own build's, or envd (the
// node bind-mounts envd into every sandbox at run time, so templates do not contain it).
package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/rootfs"
	"github.com/vibemon/vmon/internal/snapshot"
)

// BaseID is the id of the default template.
const BaseID = "base"

// ErrUnsupported is returned (wrapped) where templates cannot be built (non-Linux builds).
var ErrUnsupported = errors.New("building templates is not supported on this OS")

const (
	manifestName   = "manifest.json"
	rootfsPrefix   = "rootfs-"
	tmpPrefix      = ".rootfs-"
	tmpSuffix      = ".tmp"
	manifestFormat = 1
)

// Manifest describes one built template.
type Manifest struct {
	Format  int    `json:"format"`
	ID      string `json:"id"`
	BuildID string `json:"buildId"`
	// Rootfs is the rootfs directory's name inside the template directory.
	Rootfs string `json:"rootfs"`
	// Default resources and user of sandboxes made from this template (E2B's base: 2 vCPU, 512 MB).
	CPUs           int    `json:"cpuCount"`
	MemoryMB       int    `json:"memoryMB"`
	DefaultUser    string `json:"defaultUser"`
	DefaultWorkdir string `json:"defaultWorkdir"`
	// DiskSizeMB is the rootfs's size on disk, shared by all sandboxes of the template.
	DiskSizeMB int64     `json:"diskSizeMB"`
	Suite      string    `json:"suite,omitempty"`
	Packages   []string  `json:"packages,omitempty"`
	BuiltAt    time.Time `json:"builtAt"`
	// BuildSeconds is how long the build took.
	BuildSeconds float64 `json:"buildSeconds"`

	// Layers, when set, replace Rootfs: layer directories relative to the data dir, topmost
	// first, stacked as the overlay's lower layers (templates built from steps).
	Layers []string `json:"layers,omitempty"`
	// Env is set in every process of the template's sandboxes (the image's and the steps' ENV).
	Env map[string]string `json:"env,omitempty"`
	// StartCmd runs in every new sandbox, as DefaultUser in DefaultWorkdir; the sandbox is
	// handed out once ReadyCmd exits 0.
	StartCmd string `json:"startCmd,omitempty"`
	ReadyCmd string `json:"readyCmd,omitempty"`
	// StartSnapshot (relative to the data dir) is a snapshot of a sandbox of this build with the
	// start command running and ready; sandboxes are restored from it.
	StartSnapshot string `json:"startSnapshot,omitempty"`

	// Dir is the template's directory; set by Load, never stored.
	Dir string `json:"-"`
}

// RootfsDir is the read-only root filesystem sandboxes of this template mount as lower layer.
func (m Manifest) RootfsDir() string { return filepath.Join(m.Dir, m.Rootfs) }

// LowerDirs are the read-only layers a sandbox of this template stacks its overlay on, topmost
// first.
func (m Manifest) LowerDirs(dataDir string) []string {
	if len(m.Layers) == 0 {
		return []string{m.RootfsDir()}
	}
	out := make([]string, len(m.Layers))
	for i, l := range m.Layers {
		out[i] = filepath.Join(dataDir, l)
	}
	return out
}

// buildsDir keeps one manifest per build of a template built from steps; tags point at builds.
func buildsDir(dataDir, id string) string { return filepath.Join(Dir(dataDir, id), "builds") }

// ValidBuildID reports whether id can name a build (and its files).
func ValidBuildID(id string) bool { return buildIDPattern.MatchString(id) }

// LoadBuild returns the manifest of one build of a template. An empty buildID, or the build the
// template's own manifest describes, is Load.
func LoadBuild(dataDir, id, buildID string) (Manifest, error) {
	if err := validateID(id); err != nil {
		return Manifest{}, errdefs.Wrap(errdefs.KindNotFound, err, "template %q not found", id)
	}
	path := filepath.Join(buildsDir(dataDir, id), buildID+".json")
	if buildID == "" || !buildIDPattern.MatchString(buildID) {
		return Load(dataDir, id)
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Load(dataDir, id)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("read build manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("decode build manifest %s/%s: %w", id, buildID, err)
	}
	if m.ID != id || m.BuildID != buildID || len(m.Layers) == 0 {
		return Manifest{}, fmt.Errorf("build manifest %s/%s is inconsistent", id, buildID)
	}
	for _, l := range m.Layers {
		if !filepath.IsLocal(l) {
			return Manifest{}, fmt.Errorf("build manifest %s/%s names a layer outside the data dir", id, buildID)
		}
	}
	m.Dir = Dir(dataDir, id)
	return m, nil
}

// WriteBuild records a finished build. It is the last step of a build: until it returns, no
// sandbox can start from the build.
func WriteBuild(dataDir string, m Manifest) error {
	if err := validateID(m.ID); err != nil {
		return err
	}
	if !buildIDPattern.MatchString(m.BuildID) || len(m.Layers) == 0 {
		return fmt.Errorf("build manifest for %s needs a build id and layers", m.ID)
	}
	m.Format = manifestFormat
	dir := buildsDir(dataDir, m.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create builds dir: %w", err)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode build manifest: %w", err)
	}
	tmp := filepath.Join(dir, m.BuildID+".json.tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write build manifest: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, m.BuildID+".json")); err != nil {
		return fmt.Errorf("write build manifest: %w", err)
	}
	return nil
}

// RemoveBuilds deletes a template built from steps: its build manifests and directory. Layers
// are shared through the build cache and stay.
func RemoveBuilds(dataDir, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	if id == BaseID {
		return errdefs.InvalidArgument("the base template cannot be deleted")
	}
	if err := os.RemoveAll(Dir(dataDir, id)); err != nil {
		return fmt.Errorf("remove template %s: %w", id, err)
	}
	return nil
}

var (
	idPattern      = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	buildIDPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$`)
)

func validateID(id string) error {
	if !idPattern.MatchString(id) {
		return errdefs.InvalidArgument("invalid template id %q", id)
	}
	return nil
}

// TemplatesDir holds every template of a node.
func TemplatesDir(dataDir string) string { return filepath.Join(dataDir, "templates") }

// Dir is the directory of template id.
func Dir(dataDir, id string) string { return filepath.Join(TemplatesDir(dataDir), id) }

// Load returns the manifest of a built template. A template that does not exist, or whose build
// never completed, is NotFound.
func Load(dataDir, id string) (Manifest, error) {
	if err := validateID(id); err != nil {
		return Manifest{}, errdefs.Wrap(errdefs.KindNotFound, err, "template %q not found", id)
	}
	dir := Dir(dataDir, id)
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, os.ErrNotExist) {
		return Manifest{}, errdefs.NotFound("template %q not found", id)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("read template %s manifest: %w", id, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("decode template %s manifest: %w", id, err)
	}
	if m.ID != id || m.Rootfs == "" || strings.ContainsAny(m.Rootfs, `/\`) || m.Rootfs == ".." {
		return Manifest{}, fmt.Errorf("template %s manifest is inconsistent (id %q, rootfs %q)", id, m.ID, m.Rootfs)
	}
	m.Dir = dir
	if fi, err := os.Stat(m.RootfsDir()); err != nil || !fi.IsDir() {
		return Manifest{}, errdefs.Wrap(errdefs.KindNotFound, fmt.Errorf("template %s rootfs: %v", id, err),
			"template %q not found", id)
	}
	return m, nil
}

// List returns every built template, sorted by id.
func List(dataDir string) ([]Manifest, error) {
	ents, err := os.ReadDir(TemplatesDir(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Manifest
	for _, e := range ents {
		if !e.IsDir() || validateID(e.Name()) != nil {
			continue
		}
		m, err := Load(dataDir, e.Name())
		if errdefs.Is(err, errdefs.KindNotFound) {
			continue // a build in progress or one that failed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// writeManifest switches a template to m atomically: readers see the old or the new manifest.
func writeManifest(dir string, m Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	tmp := filepath.Join(dir, manifestName+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, manifestName)); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// prune removes rootfs directories the manifest in dir no longer names and no sandbox overlay
// uses, and leftovers of interrupted builds. The caller holds the build lock. Without a readable
// manifest no rootfs is removed: there is no telling which one is current.
func prune(dir string) error {
	current := ""
	if b, err := os.ReadFile(filepath.Join(dir, manifestName)); err == nil {
		var m Manifest
		if json.Unmarshal(b, &m) == nil {
			current = m.Rootfs
		}
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("prune template: %w", err)
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		old := current != "" && strings.HasPrefix(name, rootfsPrefix) && name != current
		stale := strings.HasPrefix(name, tmpPrefix) && strings.HasSuffix(name, tmpSuffix)
		if !e.IsDir() || (!old && !stale) {
			continue
		}
		path := filepath.Join(dir, name)
		if old && referencedByBuilds(filepath.Dir(filepath.Dir(dir)), path) {
			// Templates built on top of this rootfs stack it under their layers.
			continue
		}
		if old {
			inUse, err := rootfs.LowerInUse(path)
			if err != nil {
				errs = append(errs, err)
			}
			if err != nil || inUse {
				continue
			}
		}
		if err := rootfs.RemoveTree(path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// referencedByBuilds reports whether a build manifest of any template stacks its layers on
// layerDir. Unreadable manifests count as references: keeping a rootfs is always safe.
func referencedByBuilds(dataDir, layerDir string) bool {
	rel, err := filepath.Rel(dataDir, layerDir)
	if err != nil {
		return true
	}
	// Paused sandboxes keep the layers they were started from, whatever was built since.
	if snaps, err := snapshot.ReferencedLayers(dataDir); err != nil || snaps[filepath.Clean(rel)] {
		return true
	}
	paths, err := filepath.Glob(filepath.Join(TemplatesDir(dataDir), "*", "builds", "*.json"))
	if err != nil {
		return true
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return true
		}
		var m Manifest
		if json.Unmarshal(b, &m) != nil {
			return true
		}
		for _, l := range m.Layers {
			if filepath.Clean(l) == rel {
				return true
			}
		}
	}
	return false
}
