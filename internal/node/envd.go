package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/snapshot"
)

// EnvdDir, under the data directory, holds one directory per envd build (named by its content
// hash), each mounted read-only into the sandboxes that run it. A checkpoint holds envd's
// process, whose code is mapped from that path again at every restore: a different build
// there crashes it, so a snapshot names the directory it needs and keeps it alive.
const EnvdDir = "envd"

// legacyEnvdDir is where envd lived before it was versioned; snapshots without a recorded
// directory were taken with the binary that is still there.
const legacyEnvdDir = "bin"

// EnvdPath is the envd binary new sandboxes run.
func (n *Node) EnvdPath() string { return n.opts.EnvdPath }

func relEnvd(dataDir, dir string) string {
	rel, err := filepath.Rel(dataDir, dir)
	if err != nil || !filepath.IsLocal(rel) {
		return ""
	}
	return filepath.ToSlash(rel)
}

// envdFor returns the host directory holding the envd build whose processes meta's checkpoint
// holds ("" means the running one). A snapshot whose build is gone from this node cannot be
// restored with its memory.
func (n *Node) envdFor(meta snapshot.Meta) (string, error) {
	name := filepath.Base(n.opts.EnvdPath)
	rel := meta.Envd
	if rel == "" {
		if _, err := os.Stat(filepath.Join(n.opts.DataDir, legacyEnvdDir, name)); err == nil {
			return filepath.Join(n.opts.DataDir, legacyEnvdDir), nil
		}
		return "", nil
	}
	dir := filepath.Join(n.opts.DataDir, filepath.FromSlash(rel))
	if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
		return "", errdefs.Unavailable("snapshot %s was taken with envd build %s, which this node does not have; it can only be started afresh from its files",
			meta.SandboxID, filepath.Base(rel))
	}
	return dir, nil
}

// SweepEnvd removes the envd builds under dataDir that neither the running one (current, its
// binary's path) nor any sandbox or snapshot needs. roots name further directories of snapshots
// (template builds' started snapshots). A record it cannot read stops the sweep: removing a
// build a paused sandbox needs is never worth a guess.
func SweepEnvd(dataDir, current string, roots ...string) error {
	refs, err := readReferences(dataDir, roots)
	if err != nil {
		return fmt.Errorf("sweep envd builds: %w", err)
	}
	keep := refs.envd
	keep[relEnvd(dataDir, filepath.Dir(current))] = true
	ents, err := os.ReadDir(filepath.Join(dataDir, EnvdDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if rel := EnvdDir + "/" + e.Name(); e.IsDir() && !keep[rel] {
			errs = append(errs, os.RemoveAll(filepath.Join(dataDir, EnvdDir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// RootImagesInUse returns the root images (absolute paths) that the sandboxes and snapshots
// under dataDir (and roots, as for SweepEnvd) booted from: their checkpoints reopen them.
func RootImagesInUse(dataDir string, roots ...string) (map[string]bool, error) {
	refs, err := readReferences(dataDir, roots)
	if err != nil {
		return nil, fmt.Errorf("find the root images in use: %w", err)
	}
	return refs.images, nil
}

// references are what the records of sandboxes and snapshots need kept.
type references struct {
	// envd holds envd builds relative to the data directory, images root images' absolute paths.
	envd, images map[string]bool
}

func readReferences(dataDir string, roots []string) (references, error) {
	refs := references{envd: map[string]bool{}, images: map[string]bool{}}
	image := func(p string) {
		if p == "" {
			return
		}
		if p = filepath.FromSlash(p); !filepath.IsAbs(p) {
			p = filepath.Join(dataDir, p)
		}
		refs.images[filepath.Clean(p)] = true
	}
	for _, root := range append(slices.Clone(snapshot.Roots), roots...) {
		metas, err := filepath.Glob(filepath.Join(dataDir, root, "*", snapshot.MetaFile))
		if err != nil {
			return refs, err
		}
		for _, p := range metas {
			m, err := snapshot.Read(filepath.Dir(p))
			if err != nil {
				return refs, fmt.Errorf("read snapshot %s: %w", filepath.Dir(p), err)
			}
			refs.envd[m.Envd] = true
			image(m.RootImage)
		}
	}
	boots, err := filepath.Glob(filepath.Join(dataDir, "sandboxes", "*", bootFile))
	if err != nil {
		return refs, err
	}
	for _, p := range boots {
		b, err := os.ReadFile(p)
		if err != nil {
			return refs, err
		}
		var rec bootRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return refs, fmt.Errorf("%s: %w", p, err)
		}
		refs.envd[rec.Envd] = true
		image(rec.Runtime.RootImage)
	}
	return refs, nil
}
