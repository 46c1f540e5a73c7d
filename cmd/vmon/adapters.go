package main

import (
	"context"

	"github.com/vibemon/vmon/internal/netns"
	"github.com/vibemon/vmon/internal/rootfs"
	"github.com/vibemon/vmon/internal/template"
)

// These adapters bind the node's consumer interfaces to the OS packages.

type rootfsAdapter struct{}

func (rootfsAdapter) Prepare(ctx context.Context, templateRoot, sandboxDir string) (string, error) {
	return rootfs.Prepare(ctx, templateRoot, sandboxDir)
}

func (rootfsAdapter) Release(ctx context.Context, sandboxDir string) error {
	return rootfs.Release(ctx, sandboxDir)
}

type netnsAdapter struct{}

func (netnsAdapter) Create(ctx context.Context, name string) (string, error) {
	return netns.Create(ctx, name)
}
func (netnsAdapter) Delete(ctx context.Context, name string) error { return netns.Delete(ctx, name) }
func (netnsAdapter) List(ctx context.Context) ([]string, error)    { return netns.List(ctx) }

type templateRoots struct{ dataDir string }

func (t templateRoots) RootFS(_ context.Context, id string) (string, error) {
	m, err := template.Load(t.dataDir, id)
	if err != nil {
		return "", err
	}
	return m.RootfsDir(), nil
}
