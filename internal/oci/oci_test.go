//go:build linux

package oci

import (
	"context"
	"encoding/base64"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/vibemon/vmon/internal/errdefs"
)

// anonymous returns a Puller whose keychain is an empty docker config, so that whatever the
// machine's ~/.docker/config.json holds cannot change the outcome.
func anonymous(t *testing.T, o Options) *Puller {
	t.Helper()
	if o.DockerConfig == "" {
		o.DockerConfig = filepath.Join(t.TempDir(), "config.json")
		if err := os.WriteFile(o.DockerConfig, []byte(`{}`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	o.Log = quietLog()
	return New(o)
}

func TestResolveConfig(t *testing.T) {
	reg := newRegistry(t, "", "")
	cfg := v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "A=b"},
		WorkingDir: "/opt/app",
		User:       "app",
		Entrypoint: []string{"/bin/tini", "--"},
		Cmd:        []string{"/bin/sh", "-c", "echo hi"},
	}
	img := image(t, "amd64", cfg, layer(t, file("hello", "hi\n", 0o644)))
	ref := reg.push(t, "team/app:v1", img)

	got, err := anonymous(t, Options{}).Resolve(testCtx(t), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Ref != reg.host+"/team/app:v1" {
		t.Errorf("Ref = %q", got.Ref)
	}
	if want := digestOf(t, img); got.Digest != want {
		t.Errorf("Digest = %s, want %s", got.Digest, want)
	}
	want := ImageConfig{Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd}
	if !slices.Equal(got.Config.Env, want.Env) || got.Config.WorkingDir != want.WorkingDir ||
		got.Config.User != want.User || !slices.Equal(got.Config.Entrypoint, want.Entrypoint) ||
		!slices.Equal(got.Config.Cmd, want.Cmd) {
		t.Errorf("Config = %+v, want %+v", got.Config, want)
	}
}

func TestResolveIndexPicksAmd64(t *testing.T) {
	reg := newRegistry(t, "", "")
	arm := image(t, "arm64", v1.Config{}, layer(t, file("arch", "arm64\n", 0o644)))
	amd := image(t, "amd64", v1.Config{}, layer(t, file("arch", "amd64\n", 0o644)))
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	ref := reg.pushIndex(t, "multi:latest", idx)

	p := anonymous(t, Options{})
	got, err := p.Resolve(testCtx(t), ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := digestOf(t, amd); got.Digest != want {
		t.Fatalf("Digest = %s, want the amd64 manifest %s", got.Digest, want)
	}
	if idxDigest := digestOf(t, idx); got.Digest == idxDigest {
		t.Fatal("Digest is the index digest")
	}
	dir := t.TempDir()
	if err := p.Unpack(testCtx(t), got, dir, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "arch")); string(b) != "amd64\n" {
		t.Fatalf("unpacked arch file = %q", b)
	}

	// The same index pinned by digest resolves the same way.
	byDigest, err := p.Resolve(testCtx(t), reg.host+"/multi@"+digestOf(t, idx), nil)
	if err != nil {
		t.Fatal(err)
	}
	if byDigest.Digest != got.Digest {
		t.Fatalf("by-digest Digest = %s, want %s", byDigest.Digest, got.Digest)
	}
}

func TestResolveNoAmd64(t *testing.T) {
	reg := newRegistry(t, "", "")
	arm := image(t, "arm64", v1.Config{}, layer(t, file("arch", "arm64\n", 0o644)))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	ref := reg.pushIndex(t, "armonly:latest", idx)
	single := reg.push(t, "armsingle:latest", arm)

	p := anonymous(t, Options{})
	for _, r := range []string{ref, single} {
		_, err := p.Resolve(testCtx(t), r, nil)
		wantKind(t, err, errdefs.KindInvalidArgument)
		if msg := errdefs.PublicMessage(err); !strings.Contains(msg, "no linux/amd64 variant") {
			t.Errorf("%s: message %q", r, msg)
		}
	}
}

func TestResolveInvalidReference(t *testing.T) {
	p := anonymous(t, Options{})
	for _, r := range []string{"", "UPPER/case", "a b", "busybox:tag:extra", "busybox@sha256:short"} {
		_, err := p.Resolve(testCtx(t), r, nil)
		wantKind(t, err, errdefs.KindInvalidArgument)
		if msg := errdefs.PublicMessage(err); !strings.HasPrefix(msg, "invalid image reference") {
			t.Errorf("%q: message %q", r, msg)
		}
	}
}

func TestResolveNotFound(t *testing.T) {
	reg := newRegistry(t, "", "")
	reg.push(t, "exists:v1", image(t, "amd64", v1.Config{}, layer(t, file("x", "x", 0o644))))
	p := anonymous(t, Options{})
	for _, r := range []string{
		reg.host + "/exists:nope",
		reg.host + "/missing/repo:latest",
		reg.host + "/exists@sha256:" + strings.Repeat("0", 64),
	} {
		_, err := p.Resolve(testCtx(t), r, nil)
		wantKind(t, err, errdefs.KindNotFound)
		if msg := errdefs.PublicMessage(err); msg != `image "`+r+`" not found` {
			t.Errorf("message %q", msg)
		}
	}
}

func TestResolveCredentials(t *testing.T) {
	reg := newRegistry(t, "alice", "s3cret")
	ref := reg.push(t, "private:v1", image(t, "amd64", v1.Config{}, layer(t, file("secret", "42\n", 0o600))))

	t.Run("none", func(t *testing.T) {
		_, err := anonymous(t, Options{}).Resolve(testCtx(t), ref, nil)
		wantKind(t, err, errdefs.KindUnauthorized)
	})
	t.Run("wrong", func(t *testing.T) {
		_, err := anonymous(t, Options{}).Resolve(testCtx(t), ref, &Credentials{Username: "alice", Password: "nope"})
		wantKind(t, err, errdefs.KindUnauthorized)
		if msg := errdefs.PublicMessage(err); !strings.Contains(msg, "refused the credentials") || strings.Contains(msg, "nope") {
			t.Errorf("message %q", msg)
		}
	})
	t.Run("explicit", func(t *testing.T) {
		p := anonymous(t, Options{})
		img, err := p.Resolve(testCtx(t), ref, &Credentials{Username: "alice", Password: "s3cret"})
		if err != nil {
			t.Fatal(err)
		}
		// Unpack fetches layers with the same credentials.
		dir := t.TempDir()
		if err := p.Unpack(testCtx(t), img, dir, nil); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "secret")); string(b) != "42\n" {
			t.Fatalf("secret = %q", b)
		}
	})
	dockerConfig := func(t *testing.T, user, pass string) string {
		path := filepath.Join(t.TempDir(), "config.json")
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
		body := `{"auths":{"` + reg.host + `":{"auth":"` + auth + `"}}}`
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	t.Run("docker config", func(t *testing.T) {
		p := anonymous(t, Options{DockerConfig: dockerConfig(t, "alice", "s3cret")})
		img, err := p.Resolve(testCtx(t), ref, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Unpack(testCtx(t), img, t.TempDir(), nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("docker config wrong", func(t *testing.T) {
		p := anonymous(t, Options{DockerConfig: dockerConfig(t, "alice", "bad")})
		_, err := p.Resolve(testCtx(t), ref, nil)
		wantKind(t, err, errdefs.KindUnauthorized)
	})
	t.Run("explicit overrides docker config", func(t *testing.T) {
		p := anonymous(t, Options{DockerConfig: dockerConfig(t, "alice", "bad")})
		if _, err := p.Resolve(testCtx(t), ref, &Credentials{Username: "alice", Password: "s3cret"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("docker config missing", func(t *testing.T) {
		p := anonymous(t, Options{DockerConfig: filepath.Join(t.TempDir(), "absent.json")})
		if _, err := p.Resolve(testCtx(t), ref, nil); err == nil {
			t.Fatal("want an error for a missing docker config")
		}
	})
}

func TestResolveMirror(t *testing.T) {
	reg := newRegistry(t, "", "")
	img := image(t, "amd64", v1.Config{Cmd: []string{"/bin/foo"}}, layer(t, file("foo", "mirrored\n", 0o755)))
	reg.push(t, "library/foo:1", img)
	want := digestOf(t, img)

	for _, key := range []string{"docker.io", "index.docker.io"} {
		p := anonymous(t, Options{Mirrors: map[string]string{key: reg.host}, Insecure: []string{reg.host}})
		for _, r := range []string{"docker.io/library/foo:1", "foo:1", "index.docker.io/library/foo:1"} {
			got, err := p.Resolve(testCtx(t), r, nil)
			if err != nil {
				t.Fatalf("mirror key %s, ref %s: %v", key, r, err)
			}
			if got.Ref != "index.docker.io/library/foo:1" || got.Digest != want {
				t.Fatalf("got Ref %q Digest %s", got.Ref, got.Digest)
			}
		}
	}

	p := anonymous(t, Options{Mirrors: map[string]string{"docker.io": reg.host}})
	got, err := p.Resolve(testCtx(t), "foo:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := p.Unpack(testCtx(t), got, dir, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "foo")); string(b) != "mirrored\n" {
		t.Fatalf("foo = %q", b)
	}
}

func TestResolveUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = anonymous(t, Options{}).Resolve(ctx, addr+"/gone:latest", nil)
	wantKind(t, err, errdefs.KindUnavailable)
	if ctx.Err() != nil {
		t.Fatal("Resolve only returned once the context expired")
	}
	if msg := errdefs.PublicMessage(err); strings.Contains(msg, "connection refused") {
		t.Errorf("message leaks the cause: %q", msg)
	}
}

func TestResolveDeadline(t *testing.T) {
	// A registry that accepts connections but never answers.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	defer func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = anonymous(t, Options{}).Resolve(ctx, l.Addr().String()+"/slow:latest", nil)
	wantKind(t, err, errdefs.KindDeadlineExceeded)
}

func TestResolveContextOutlivedByUnpack(t *testing.T) {
	reg := newRegistry(t, "", "")
	ref := reg.push(t, "ctx:v1", image(t, "amd64", v1.Config{}, layer(t, file("f", "data", 0o644))))
	p := anonymous(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	img, err := p.Resolve(ctx, ref, nil)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Unpack(testCtx(t), img, t.TempDir(), nil); err != nil {
		t.Fatalf("Unpack after Resolve's context ended: %v", err)
	}
}
