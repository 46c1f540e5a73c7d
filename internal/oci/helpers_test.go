//go:build linux

package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/vibemon/vmon/internal/errdefs"
)

var epoch = time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)

// ent is one tar entry of a test layer; zero fields get defaults.
type ent struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	uid, gid int
	mtime    time.Time
	xattrs   map[string]string
	major    int64
	minor    int64
}

func dir(name string, mode int64) ent { return ent{name: name, typ: tar.TypeDir, mode: mode} }
func file(name, body string, mode int64) ent {
	return ent{name: name, typ: tar.TypeReg, body: body, mode: mode}
}
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(name, target string) ent { return ent{name: name, typ: tar.TypeLink, link: target} }
func owned(e ent, uid, gid int) ent    { e.uid, e.gid = uid, gid; return e }
func withXattr(e ent, k, v string) ent { e.xattrs = map[string]string{k: v}; return e }
func withMtime(e ent, t time.Time) ent { e.mtime = t; return e }
func device(name string, typ byte, ma, mi int64) ent {
	return ent{name: name, typ: typ, mode: 0o666, major: ma, minor: mi}
}

func tarBytes(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{
			Name:     e.name,
			Typeflag: e.typ,
			Linkname: e.link,
			Mode:     e.mode,
			Uid:      e.uid,
			Gid:      e.gid,
			ModTime:  e.mtime,
			Devmajor: e.major,
			Devminor: e.minor,
			Format:   tar.FormatPAX,
		}
		if h.ModTime.IsZero() {
			h.ModTime = epoch
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[xattrPAXPrefix+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %s: %v", e.name, err)
		}
		if e.typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layer(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := tarBytes(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func image(t testing.TB, arch string, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func digestOf(t testing.TB, img interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// testRegistry is an in-process registry on 127.0.0.1.
type testRegistry struct {
	host       string
	user, pass string
}

func newRegistry(t testing.TB, user, pass string) *testRegistry {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if user != "" {
		h = basicAuth(h, user, pass)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testRegistry{host: strings.TrimPrefix(srv.URL, "http://"), user: user, pass: pass}
}

// basicAuth answers the way registries doing basic auth do, so ggcr's ping picks basic auth.
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

func (r *testRegistry) opts() []remote.Option {
	if r.user == "" {
		return nil
	}
	return []remote.Option{remote.WithAuth(&authn.Basic{Username: r.user, Password: r.pass})}
}

func (r *testRegistry) push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, r.opts()...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref.String()
}

func (r *testRegistry) pushIndex(t testing.TB, repoTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, r.opts()...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref.String()
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func wantKind(t testing.TB, err error, k errdefs.Kind) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want kind %d", k)
	}
	if got := errdefs.KindOf(err); got != k {
		t.Fatalf("got kind %d (%v), want %d", got, err, k)
	}
}
