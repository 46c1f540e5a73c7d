package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Config configures a fixture registry.
type Config struct {
	// Addr is the listen address; it must be a loopback one (tests never leave the machine).
	Addr string
	// User and Password, when User is set, make every request require basic auth.
	User, Password string
	// Busybox and Bash are the statically linked binaries put into the images.
	Busybox, Bash string
	// Log receives the registry's request log; nil discards it.
	Log io.Writer
	// Layouts maps a name to an OCI image layout on disk (one image, e.g. `make image`'s
	// bin/image) pushed as vmon-test/<name>:latest and announced under that name.
	Layouts map[string]string
}

// Server is a running fixture registry with its images pushed.
type Server struct {
	Addr string `json:"addr"`
	// Images maps a fixture name to its reference, e.g. "busybox" ->
	// "127.0.0.1:PORT/vmon-test/busybox:latest".
	Images map[string]string `json:"images"`

	srv      *http.Server
	done     chan struct{}
	serveErr error
}

const (
	appUID  = 1234
	pathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// fixtureTime is every entry's mtime, so that the fixture digests are the same on every run.
var fixtureTime = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Start listens on cfg.Addr, serves an in-memory registry there and pushes the fixture images.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	busybox, err := readStatic(cfg.Busybox, "busybox", "busybox-static")
	if err != nil {
		return nil, err
	}
	bash, err := readStatic(cfg.Bash, "bash", "bash-static")
	if err != nil {
		return nil, err
	}
	applets, err := appletList(ctx, cfg.Busybox)
	if err != nil {
		return nil, err
	}

	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if host, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("--addr %q: %w", cfg.Addr, err)
	} else if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("refusing to serve fixtures on non-loopback address %s", cfg.Addr)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		ln.Close()
		return nil, fmt.Errorf("refusing to serve fixtures on non-loopback address %s", ln.Addr())
	}
	logOut := cfg.Log
	if logOut == nil {
		logOut = io.Discard
	}
	var h http.Handler = registry.New(registry.Logger(log.New(logOut, "registry: ", log.LstdFlags)))
	if cfg.User != "" {
		h = basicAuth(h, cfg.User, cfg.Password)
	}
	s := &Server{
		Addr:   ln.Addr().String(),
		Images: map[string]string{},
		srv:    &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second},
		done:   make(chan struct{}),
	}
	go func() {
		s.serveErr = s.srv.Serve(ln)
		close(s.done)
	}()

	if err := s.push(ctx, cfg, busybox, bash, applets); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close stops serving at once. Not a graceful Shutdown: clients such as ggcr leave dialled
// connections that never carry a request, and Shutdown waits 5s for each of those.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	if !errors.Is(s.serveErr, http.ErrServerClosed) && err == nil {
		err = s.serveErr
	}
	return err
}

// Done is closed when the server has stopped serving, on its own or through Close.
func (s *Server) Done() <-chan struct{} { return s.done }

// Err is why the server stopped; valid once Done is closed.
func (s *Server) Err() error { return s.serveErr }

// readStatic reads a binary that must run inside an otherwise empty guest, hence statically
// linked. A missing binary is an error, never a reason to skip: the e2e tests depend on it.
func readStatic(path, what, pkg string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fixture %s binary %s: %w (install the Debian package %s, or pass --%s)", what, path, err, pkg, what)
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("fixture %s binary %s is not an ELF executable: %w", what, path, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("fixture %s binary %s is %s, not x86-64", what, path, f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, fmt.Errorf("fixture %s binary %s is dynamically linked; the image has no libc (install %s)", what, path, pkg)
		}
	}
	return b, nil
}

// appletList asks the host's busybox which applets it has. This runs the host binary, before
// it is copied into any image.
func appletList(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	var names []string
	for _, n := range strings.Fields(string(out)) {
		if !strings.Contains(n, "/") && n != "." && n != ".." {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s --list printed no applets", busybox)
	}
	for _, need := range []string{"sh", "ls", "cat", "id"} {
		if !slices.Contains(names, need) {
			return nil, fmt.Errorf("%s has no %q applet; a shell image needs it", busybox, need)
		}
	}
	slices.Sort(names)
	return names, nil
}

func (s *Server) push(ctx context.Context, cfg Config, busybox, bash []byte, applets []string) error {
	base, err := baseLayer(busybox, bash, applets)
	if err != nil {
		return err
	}
	l2, err := newLayer(
		file("etc/removed-later", "this file is deleted by the next layer\n", 0o644, 0),
		dir("opt/", 0o755, 0),
		dir("opt/app/", 0o755, 0),
		file("opt/app/data.txt", "fixture-data\n", 0o640, appUID),
		dir("opt/app/dir-replaced/", 0o755, 0),
		file("opt/app/dir-replaced/old.txt", "hidden by the opaque whiteout above\n", 0o644, 0),
	)
	if err != nil {
		return err
	}
	l3, err := newLayer(
		// Whiteouts are plain empty files in the tar; the unpacker gives them meaning.
		file("etc/.wh.removed-later", "", 0o644, 0),
		dir("opt/app/dir-replaced/", 0o755, 0),
		file("opt/app/dir-replaced/.wh..wh..opq", "", 0o644, 0),
		file("opt/app/dir-replaced/new.txt", "replacement\n", 0o644, 0),
	)
	if err != nil {
		return err
	}
	amd64, err := newImage("amd64", v1.Config{
		Env:        []string{pathEnv, "FIXTURE_ENV=from-image"},
		WorkingDir: "/opt/app",
		User:       "app",
		Cmd:        []string{"/bin/sh"},
	}, base, l2, l3)
	if err != nil {
		return err
	}
	armLayer, err := newLayer(file("arch.txt", "arm64 variant: never picked on amd64\n", 0o644, 0))
	if err != nil {
		return err
	}
	arm64, err := newImage("arm64", v1.Config{Env: []string{pathEnv}, Cmd: []string{"/bin/sh"}}, armLayer)
	if err != nil {
		return err
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm64, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	root, err := newImage("amd64", v1.Config{Env: []string{pathEnv}, Cmd: []string{"/bin/sh"}}, base)
	if err != nil {
		return err
	}

	opts := []remote.Option{remote.WithContext(ctx)}
	if cfg.User != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: cfg.User, Password: cfg.Password}))
	}
	busyboxRef, err := name.ParseReference(s.Addr + "/vmon-test/busybox:latest")
	if err != nil {
		return err
	}
	if err := remote.WriteIndex(busyboxRef, idx, opts...); err != nil {
		return fmt.Errorf("push %s: %w", busyboxRef, err)
	}
	rootRef, err := name.ParseReference(s.Addr + "/vmon-test/busybox-root:latest")
	if err != nil {
		return err
	}
	if err := remote.Write(rootRef, root, opts...); err != nil {
		return fmt.Errorf("push %s: %w", rootRef, err)
	}
	s.Images["busybox"] = busyboxRef.String()
	s.Images["busybox-root"] = rootRef.String()
	for n, dir := range cfg.Layouts {
		img, err := layoutImage(dir)
		if err != nil {
			return err
		}
		ref, err := name.ParseReference(s.Addr + "/vmon-test/" + n + ":latest")
		if err != nil {
			return err
		}
		if err := remote.Write(ref, img, opts...); err != nil {
			return fmt.Errorf("push %s: %w", ref, err)
		}
		s.Images[n] = ref.String()
	}
	return nil
}

// layoutImage is the one image of the OCI image layout at dir.
func layoutImage(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("OCI layout %s holds %d manifests, want one image", dir, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}

// baseLayer is the shell userland both amd64 fixtures share.
func baseLayer(busybox, bash []byte, applets []string) (v1.Layer, error) {
	passwd := "root:x:0:0:root:/root:/bin/sh\n" +
		"app:x:1234:1234:app:/home/app:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
	group := "root:x:0:\napp:x:1234:\nnogroup:x:65534:\n"
	ents := []entry{
		dir("bin/", 0o755, 0),
		{hdr: tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, body: busybox},
		{hdr: tar.Header{Name: "bin/bash", Typeflag: tar.TypeReg, Mode: 0o755}, body: bash},
	}
	have := map[string]bool{"busybox": true, "bash": true}
	for _, a := range applets {
		if !have[a] {
			have[a] = true
			ents = append(ents, entry{hdr: tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}})
		}
	}
	ents = append(ents,
		dir("etc/", 0o755, 0),
		file("etc/passwd", passwd, 0o644, 0),
		file("etc/group", group, 0o644, 0),
		dir("tmp/", 0o1777, 0),
		dir("root/", 0o700, 0),
		dir("home/", 0o755, 0),
		dir("home/app/", 0o755, appUID),
		dir("usr/", 0o755, 0),
		dir("usr/bin/", 0o755, 0),
		dir("var/", 0o755, 0),
	)
	return newLayer(ents...)
}

type entry struct {
	hdr  tar.Header
	body []byte
}

func dir(name string, mode int64, owner int) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode, Uid: owner, Gid: owner}}
}

func file(name, body string, mode int64, owner int) entry {
	return entry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode, Uid: owner, Gid: owner}, body: []byte(body)}
}

// newLayer writes ents into an uncompressed tar; ggcr gzips it when pushing.
func newLayer(ents ...entry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		h.ModTime = fixtureTime
		h.Format = tar.FormatPAX
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", h.Name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, fmt.Errorf("tar %s: %w", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

func newImage(arch string, cfg v1.Config, layers ...v1.Layer) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: fixtureTime}
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}

// basicAuth demands HTTP basic auth the way registries that use it do: 401 with a Basic
// challenge, which is what makes clients (ggcr's transport included) send credentials.
func basicAuth(next http.Handler, user, pass string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		next.ServeHTTP(w, r)
	})
}
