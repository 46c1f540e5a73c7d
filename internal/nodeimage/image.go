// Package nodeimage assembles vmon's container image (`make image`, cmd/vmon-image) without a
// container engine: layers are tars written here, reproducibly, and the image is put together
// with go-containerregistry and written as an OCI image layout. The same inputs give the same
// bytes, so the same digest: entries sorted, numeric owners, mtimes clamped to one epoch, gzip
// without a timestamp or name, a fixed creation time in the config.
package nodeimage

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file WriteFiles puts into a layer.
type File struct {
	// Path is where the file goes in the image, absolute ("/usr/local/bin/vmon").
	Path string
	// Source is the file on this machine whose contents it gets.
	Source string
	// Mode is its permission bits.
	Mode int64
}

// WriteFiles writes an uncompressed layer tar holding files (and their parent directories, mode
// 0755) to w: owned by root, every mtime epoch, in lexical order.
func WriteFiles(w io.Writer, files []File, epoch time.Time) error {
	entries := map[string]*tar.Header{}
	sources := map[string]string{}
	for _, f := range files {
		name := strings.TrimPrefix(path.Clean(f.Path), "/")
		if name == "" || name == "." || !path.IsAbs(f.Path) {
			return fmt.Errorf("image path %q: want an absolute file path", f.Path)
		}
		st, err := os.Stat(f.Source)
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s is not a regular file", f.Source)
		}
		entries[name] = &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: f.Mode, Size: st.Size(), ModTime: epoch.UTC()}
		sources[name] = f.Source
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			entries[dir+"/"] = &tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: epoch.UTC()}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		hdr := entries[n]
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if src, ok := sources[n]; ok {
			if err := copyFile(tw, src, hdr.Size); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// Layer is one layer of the image: an uncompressed tar on disk and what made it (the image's
// history).
type Layer struct {
	Tar       string
	CreatedBy string
}

// Config is the image's run configuration and metadata.
type Config struct {
	// Created is the image's creation time (SOURCE_DATE_EPOCH), also every history entry's.
	Created    time.Time
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	Volumes    []string
	Labels     map[string]string
}

// Assemble makes a linux/amd64 OCI image of layers (bottom first; each tar is compressed next to
// itself as <tar>.gz) and cfg.
func Assemble(layers []Layer, cfg Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: cfg.Created.UTC()}
	var adds []mutate.Addendum
	for _, l := range layers {
		gz := l.Tar + ".gz"
		if err := compress(l.Tar, gz); err != nil {
			return nil, err
		}
		layer, err := tarball.LayerFromFile(gz, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", gz, err)
		}
		adds = append(adds, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
			History: v1.History{Created: created, CreatedBy: l.CreatedBy}})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = created
	cf.Config = v1.Config{
		Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Env: cfg.Env, WorkingDir: cfg.WorkingDir, Labels: cfg.Labels,
	}
	if len(cfg.Volumes) > 0 {
		cf.Config.Volumes = map[string]struct{}{}
		for _, v := range cfg.Volumes {
			cf.Config.Volumes[v] = struct{}{}
		}
	}
	return mutate.ConfigFile(img, cf)
}

// compress gzips src into dst reproducibly: no name, no mtime in the header (compress/gzip writes
// 0 for a zero ModTime), the default level.
func compress(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(out)
	if _, err := io.Copy(zw, in); err != nil {
		out.Close()
		return fmt.Errorf("compress %s: %w", src, err)
	}
	if err := zw.Close(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// WriteLayout writes img as the only image of a new OCI image layout at dir (replacing whatever
// was there once the new one is complete), tagged ref (the org.opencontainers.image.ref.name
// annotation), and returns its manifest digest.
func WriteLayout(dir string, img v1.Image, ref string) (v1.Hash, error) {
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return v1.Hash{}, err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return v1.Hash{}, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, err
	}
	if err := os.Rename(tmp, filepath.Clean(dir)); err != nil {
		return v1.Hash{}, err
	}
	return digest, nil
}
