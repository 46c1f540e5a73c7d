package main

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestOCILayout: an image from an OCI layout on disk (make image's bin/image) is served by its
// own digest.
func TestOCILayout(t *testing.T) {
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Addr: "127.0.0.1:0", Busybox: "/bin/busybox", Bash: "/bin/bash-static", Layouts: map[string]string{"vmon": dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Images["vmon"] != s.Addr+"/vmon-test/vmon:latest" {
		t.Fatalf("announced %q", s.Images["vmon"])
	}
	ref, err := name.ParseReference(s.Images["vmon"])
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest != want {
		t.Errorf("served %s, want the layout's %s", desc.Digest, want)
	}

	if _, err := Start(ctx, Config{Addr: "127.0.0.1:0", Busybox: "/bin/busybox", Bash: "/bin/bash-static", Layouts: map[string]string{"x": t.TempDir()}}); err == nil {
		t.Error("an empty directory was taken for an OCI layout")
	}
}
