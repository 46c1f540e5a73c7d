package nodeapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/volumes"
)

// memVolumes keeps files in memory; a write commits only what it read whole.
type memVolumes struct {
	mu    sync.Mutex
	files map[string][]byte
	fails int
}

func (m *memVolumes) Create(context.Context, string, int) error { return nil }
func (m *memVolumes) Delete(string) error                       { return nil }
func (m *memVolumes) SizeBytes(string) (int64, error)           { return 1 << 30, nil }

func (m *memVolumes) Stat(id, p string) (volumes.Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[id+p]
	if !ok {
		return volumes.Entry{}, errdefs.NotFound("path %q not found", p)
	}
	return volumes.Entry{Name: p, Path: p, Type: "file", Size: int64(len(b))}, nil
}

func (m *memVolumes) List(id, p string, _ int) ([]volumes.Entry, error) {
	e, err := m.Stat(id, p)
	return []volumes.Entry{e}, err
}

func (m *memVolumes) Mkdir(_, p string, a volumes.Attrs, _ bool) (volumes.Entry, error) {
	return volumes.Entry{Name: p, Path: p, Type: "directory", Mode: *a.Mode}, nil
}

func (m *memVolumes) Chattr(id, p string, _ volumes.Attrs) (volumes.Entry, error) {
	return m.Stat(id, p)
}

func (m *memVolumes) Open(id, p string) (io.ReadCloser, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[id+p]
	if !ok {
		return nil, 0, errdefs.NotFound("path %q not found", p)
	}
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
}

func (m *memVolumes) Write(id, p string, body io.Reader, _ volumes.Attrs, _ bool) (volumes.Entry, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		m.mu.Lock()
		m.fails++
		m.mu.Unlock()
		return volumes.Entry{}, err
	}
	m.mu.Lock()
	m.files[id+p] = b
	m.mu.Unlock()
	return volumes.Entry{Name: p, Path: p, Type: "file", Size: int64(len(b))}, nil
}

func (m *memVolumes) Remove(id, p string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.files, id+p)
	return nil
}

// brokenReader fails after n bytes, as an upload cut off midway.
type brokenReader struct{ n int }

func (b *brokenReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, errors.New("client went away")
	}
	n := min(len(p), b.n)
	b.n -= n
	return n, nil
}

// A volume's content crosses the wire both ways in chunks; errors keep their kind; an upload cut
// off midway leaves nothing on the node.
func TestVolumeContent(t *testing.T) {
	ctx := context.Background()
	mem := &memVolumes{files: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.Handle(NewServer(drivertest.NewNode(), nil).WithVolumes(mem).Handler())
	ts := httptest.NewUnstartedServer(mux)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	defer ts.Close()
	c := NewClient(ts.Client(), ts.URL)

	data := make([]byte, 3<<20+17)
	_, _ = rand.Read(data)
	e, err := c.VolumeWrite(ctx, "v1", "/big", bytes.NewReader(data), volumes.Attrs{}, false)
	if err != nil || e.Size != int64(len(data)) {
		t.Fatalf("write: %+v, %v", e, err)
	}
	r, size, err := c.VolumeOpen(ctx, "v1", "/big")
	if err != nil || size != int64(len(data)) {
		t.Fatalf("open: size %d, %v", size, err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (want %d), %v", len(got), len(data), err)
	}
	if _, _, err := c.VolumeOpen(ctx, "v1", "/missing"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("open of a missing file: %v, want NotFound", err)
	}
	mode := uint32(0o750)
	if e, err := c.VolumeMkdir(ctx, "v1", "/d", volumes.Attrs{Mode: &mode}, true); err != nil || e.Mode != mode || e.Type != "directory" {
		t.Fatalf("mkdir: %+v, %v", e, err)
	}
	if es, err := c.VolumeList(ctx, "v1", "/big", 1); err != nil || len(es) != 1 || es[0].Size != int64(len(data)) {
		t.Fatalf("list: %+v, %v", es, err)
	}
	if size, err := c.VolumeSize(ctx, "v1"); err != nil || size != 1<<30 {
		t.Fatalf("size %d, %v", size, err)
	}

	if _, err := c.VolumeWrite(ctx, "v1", "/cut", &brokenReader{n: 1 << 20}, volumes.Attrs{}, false); err == nil {
		t.Fatal("a broken upload succeeded")
	}
	if _, err := c.VolumeStat(ctx, "v1", "/cut"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("a broken upload left a file: %v", err)
	}
	if err := c.VolumeRemove(ctx, "v1", "/big"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.VolumeStat(ctx, "v1", "/big"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("stat after remove: %v", err)
	}
	// A node without volumes says so.
	bare := serve(t, drivertest.NewNode())
	if _, err := bare.VolumeCreate(ctx, "v2", 0); !errors.Is(err, driver.ErrNotImplemented) {
		t.Fatalf("a node without volumes: %v, want ErrNotImplemented", err)
	}
}
