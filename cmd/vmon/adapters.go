package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/netns"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/rootfs"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/volumes"
)

// These adapters bind the node's consumer interfaces to the OS packages.

type rootfsAdapter struct {
	// imageDir keeps the formatted disk images sandbox disks are copied from.
	imageDir string
	log      *slog.Logger
}

func (a rootfsAdapter) Prepare(ctx context.Context, lowers []string, sandboxDir string, w node.Writable) (string, error) {
	return rootfs.Prepare(ctx, lowers, sandboxDir, rootfs.Options{DiskBytes: int64(w.DiskMB) << 20, ImageDir: a.imageDir,
		Layer: w.From, CopyLayer: w.Copy})
}

func (a rootfsAdapter) Stash(ctx context.Context, sandboxDir, dst string) error {
	err := rootfs.Stash(ctx, sandboxDir, dst)
	if errors.Is(err, rootfs.ErrDiskBusy) {
		return fmt.Errorf("%w: %w", node.ErrDiskBusy, err)
	}
	return err
}

func (rootfsAdapter) DiskHolders(sandboxDir string) ([]string, error) {
	return rootfs.DiskHolders(sandboxDir)
}

func (rootfsAdapter) CopyWritable(ctx context.Context, sandboxDir, dst string) error {
	return rootfs.CopyWritable(ctx, sandboxDir, dst)
}

func (rootfsAdapter) Release(ctx context.Context, sandboxDir string) error {
	return rootfs.Release(ctx, sandboxDir)
}

func (rootfsAdapter) Commit(ctx context.Context, sandboxDir, dst string) error {
	return rootfs.Commit(ctx, sandboxDir, dst)
}

// buildMounts gives template build steps their mounts: no disk limit, since a step's writes
// become a layer by moving the upper directory.
type buildMounts struct{ rootfsAdapter }

func (buildMounts) Prepare(ctx context.Context, lowers []string, dir string) (string, error) {
	return rootfs.Prepare(ctx, lowers, dir, rootfs.Options{})
}

type netnsAdapter struct{}

func (netnsAdapter) Create(ctx context.Context, name string) (string, error) {
	return netns.Create(ctx, name)
}
func (netnsAdapter) Delete(ctx context.Context, name string) error { return netns.Delete(ctx, name) }
func (netnsAdapter) List(ctx context.Context) ([]string, error)    { return netns.List(ctx) }

type templateRoots struct {
	dataDir string
	// fetch, when set, brings a rootfs template build the data dir lacks from the cluster's store.
	fetch func(ctx context.Context, id, buildID string) (template.Manifest, error)
}

func (t templateRoots) Image(ctx context.Context, id, buildID string) (node.Image, error) {
	m, err := loadOrFetch(ctx, t.dataDir, t.fetch, id, buildID)
	if err != nil {
		return node.Image{}, err
	}
	img := node.Image{Lowers: m.LowerDirs(t.dataDir), Env: m.Env, StartCmd: m.StartCmd, ReadyCmd: m.ReadyCmd}
	if m.StartSnapshot != "" && filepath.IsLocal(m.StartSnapshot) {
		img.StartSnapshot = filepath.Join(t.dataDir, m.StartSnapshot)
	}
	return img, nil
}

// loadOrFetch is build buildID of template id in dataDir, brought by fetch (when set) if the data
// dir lacks it.
func loadOrFetch(ctx context.Context, dataDir string, fetch templateFetcher, id, buildID string) (template.Manifest, error) {
	m, err := template.LoadBuild(dataDir, id, buildID)
	if fetch != nil && (errdefs.Is(err, errdefs.KindNotFound) || (err == nil && len(m.Layers) == 0 && buildID != "" && m.BuildID != buildID)) {
		m, err = fetch(ctx, id, buildID)
	}
	return m, err
}

// buildSandboxes runs template build steps in the node's build sandboxes.
type buildSandboxes struct{ n *node.Node }

func (b buildSandboxes) StartBuild(ctx context.Context, spec build.SandboxSpec) (build.Sandbox, error) {
	sb, err := b.n.StartBuild(ctx, node.BuildSpec{Lowers: spec.Lowers, CPUs: spec.CPUs, MemoryMB: spec.MemoryMB, Env: spec.Env, Start: spec.Start})
	if err != nil {
		return nil, err
	}
	return sb, nil
}

// localVolumes serves the volume content API from this process's volumes; calls on local files
// take no context.
type localVolumes struct{ d *volumes.Dir }

func (l localVolumes) Stat(_ context.Context, id, p string) (volumes.Entry, error) {
	return l.d.Stat(id, p)
}

func (l localVolumes) List(_ context.Context, id, p string, depth int) ([]volumes.Entry, error) {
	return l.d.List(id, p, depth)
}

func (l localVolumes) Mkdir(_ context.Context, id, p string, a volumes.Attrs, force bool) (volumes.Entry, error) {
	return l.d.Mkdir(id, p, a, force)
}

func (l localVolumes) Chattr(_ context.Context, id, p string, a volumes.Attrs) (volumes.Entry, error) {
	return l.d.Chattr(id, p, a)
}

func (l localVolumes) Open(_ context.Context, id, p string) (io.ReadCloser, int64, error) {
	return l.d.Open(id, p)
}

func (l localVolumes) Write(_ context.Context, id, p string, body io.Reader, a volumes.Attrs, force bool) (volumes.Entry, error) {
	return l.d.Write(id, p, body, a, force)
}

func (l localVolumes) Remove(_ context.Context, id, p string) error { return l.d.Remove(id, p) }
