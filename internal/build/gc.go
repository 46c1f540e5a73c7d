package build

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vibemon/vmon/internal/rootfs"
	"github.com/vibemon/vmon/internal/snapshot"
	"github.com/vibemon/vmon/internal/template"
)

// GC removes the layers no template build names and no sandbox mounts, and the cache entries
// that named them. Cached steps of deleted or failed builds go with them. The caller must make
// sure no build runs meanwhile: a running build's fresh layers are not in any manifest yet.
func (e *Engine) GC(ctx context.Context) (int, error) {
	live, err := e.liveLayers()
	if err != nil {
		return 0, err
	}
	dir := filepath.Join(e.opts.DataDir, LayersDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list layers: %w", err)
	}
	removed := 0
	var errs []error
	for _, ent := range ents {
		if ctx.Err() != nil {
			return removed, ctx.Err()
		}
		rel := filepath.Join(LayersDir, ent.Name())
		if strings.HasPrefix(ent.Name(), ".") || live[rel] {
			continue
		}
		abs := filepath.Join(e.opts.DataDir, rel)
		if inUse, err := rootfs.LowerInUse(abs); err != nil || inUse {
			errs = append(errs, err)
			continue
		}
		if err := rootfs.RemoveTree(abs); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	errs = append(errs, e.dropStaleEntries())
	return removed, errors.Join(errs...)
}

// liveLayers lists every layer a template build manifest stacks. A manifest it cannot read
// aborts the collection: deleting a layer is never worth a guess.
func (e *Engine) liveLayers() (map[string]bool, error) {
	paths, err := filepath.Glob(filepath.Join(template.TemplatesDir(e.opts.DataDir), "*", "builds", "*.json"))
	if err != nil {
		return nil, err
	}
	// Paused sandboxes keep the layers they run on even after their template's builds are gone.
	live, err := snapshot.ReferencedLayers(e.opts.DataDir)
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("read build manifest: %w", err)
		}
		var m template.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("decode build manifest %s: %w", p, err)
		}
		for _, l := range m.Layers {
			live[filepath.Clean(l)] = true
		}
		if m.StartSnapshot != "" {
			live[filepath.Clean(m.StartSnapshot)] = true
		}
	}
	return live, nil
}

// dropStaleEntries removes cache entries whose layers are gone; get already ignores them.
func (e *Engine) dropStaleEntries() error {
	dir := filepath.Join(e.opts.DataDir, cacheDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, ent := range ents {
		key, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || !keyPattern.MatchString(key) {
			continue
		}
		if _, ok := e.cache.get(key); !ok {
			if err := os.Remove(filepath.Join(dir, ent.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
