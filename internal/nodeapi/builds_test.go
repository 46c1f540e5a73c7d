package nodeapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/template"
)

// fakeBuilder keeps files with the real build.Files and "builds" by logging each step, failing
// the step whose first argument is "fail" and ending in a kinded error on "broken".
type fakeBuilder struct {
	files *build.Files
	dir   string
	got   build.Request
}

func (f *fakeBuilder) PutFile(ctx context.Context, templateID, hash string, r io.Reader, size int64) error {
	return f.files.Put(ctx, templateID, hash, r, size)
}

func (f *fakeBuilder) LogPath(buildID string) string { return filepath.Join(f.dir, buildID+".jsonl") }

func (f *fakeBuilder) Build(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error) {
	f.got = req
	for i, s := range req.Steps {
		// Enough lines to need several flushes of the stream.
		for j := range 1500 {
			log.Add("info", s.Type, "step %d line %d", i+1, j)
		}
		switch s.Args[0] {
		case "fail":
			return template.Manifest{}, &build.StepError{Step: "2", Msg: "exit status 3", Cause: errors.New("internal detail")}
		case "broken":
			return template.Manifest{}, errdefs.Unavailable("the build sandbox went away")
		}
		if s.FilesHash != "" {
			if ok, err := f.files.Has(ctx, req.TemplateID, s.FilesHash); err != nil || !ok {
				return template.Manifest{}, errors.New("the COPY archive never arrived")
			}
		}
	}
	return template.Manifest{ID: req.TemplateID, BuildID: req.BuildID, DefaultUser: "user", DefaultWorkdir: "/home/user", BuildSeconds: 1.5}, nil
}

// A build crosses the wire whole: the request with its parent named by ids, the COPY archive
// (checked by size), every log line in order, and how it ended: done with the image settings, a
// failed step as the *build.StepError the template service reports, or a kinded error.
func TestBuildTemplate(t *testing.T) {
	ctx := context.Background()
	fb := &fakeBuilder{files: build.NewFiles(t.TempDir()), dir: t.TempDir()}
	mux := http.NewServeMux()
	mux.Handle(NewServer(drivertest.NewNode(), nil).WithBuilds(fb).Handler())
	ts := httptest.NewUnstartedServer(mux)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	defer ts.Close()
	c := NewClient(ts.Client(), ts.URL)

	archive := make([]byte, 1<<20+5)
	_, _ = rand.Read(archive)
	hash := strings.Repeat("c", 64)
	if err := c.PutBuildFile(ctx, "tpl", hash, bytes.NewReader(archive), int64(len(archive))); err != nil {
		t.Fatal(err)
	}
	if err := c.PutBuildFile(ctx, "tpl", strings.Repeat("d", 64), bytes.NewReader(archive[:10]), int64(len(archive))); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("a short archive: %v, want InvalidArgument", err)
	}
	if ok, _ := fb.files.Has(ctx, "tpl", strings.Repeat("d", 64)); ok {
		t.Fatal("a short archive was kept")
	}

	req := build.Request{TemplateID: "tpl", BuildID: "b1", FromTemplate: &build.Parent{TemplateID: "base", BuildID: "x", Layers: []string{"local/only"}},
		StartCmd: "sleep infinity", CPUs: 2, MemoryMB: 512,
		Steps: []build.Step{{Type: "COPY", Args: []string{"a", "/a"}, FilesHash: hash}, {Type: "RUN", Args: []string{"true"}, Force: true}}}
	log, err := build.NewLog(filepath.Join(t.TempDir(), "driver.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.BuildTemplate(ctx, req, log)
	if err != nil || m.DefaultUser != "user" || m.DefaultWorkdir != "/home/user" || m.ID != "tpl" || m.BuildID != "b1" {
		t.Fatalf("build: %+v, %v", m, err)
	}
	if p := fb.got.FromTemplate; p == nil || p.TemplateID != "base" || p.BuildID != "x" || p.Layers != nil {
		t.Fatalf("the node got parent %+v: ids only, its layers are the node's to resolve", p)
	}
	if !fb.got.Steps[1].Force || fb.got.StartCmd != "sleep infinity" || fb.got.MemoryMB != 512 {
		t.Fatalf("the node got %+v", fb.got)
	}
	if n := log.Len(); n != 3000 {
		t.Fatalf("the driver's log has %d lines, want 3000", n)
	}
	if es := log.Since(1500, 1); es[0].Message != "step 2 line 0" || es[0].Step != "RUN" {
		t.Fatalf("line 1500: %+v", es[0])
	}

	req.BuildID, req.Steps[1].Args = "b2", []string{"fail"}
	log2, _ := build.NewLog(filepath.Join(t.TempDir(), "driver2.jsonl"))
	_, err = c.BuildTemplate(ctx, req, log2)
	var se *build.StepError
	if !errors.As(err, &se) || se.Step != "2" || se.Msg != "exit status 3" {
		t.Fatalf("a failed step: %v, want a StepError of step 2", err)
	}

	req.BuildID, req.Steps[1].Args = "b3", []string{"broken"}
	log3, _ := build.NewLog(filepath.Join(t.TempDir(), "driver3.jsonl"))
	if _, err = c.BuildTemplate(ctx, req, log3); !errdefs.Is(err, errdefs.KindUnavailable) || errors.As(err, &se) {
		t.Fatalf("a node error: %v, want Unavailable", err)
	}

	// A node without builds says so.
	mux2 := http.NewServeMux()
	mux2.Handle(NewServer(drivertest.NewNode(), nil).Handler())
	ts2 := httptest.NewServer(mux2)
	defer ts2.Close()
	if _, err := NewClient(ts2.Client(), ts2.URL).BuildTemplate(ctx, req, log3); !errors.Is(err, driver.ErrNotImplemented) {
		t.Fatalf("a node without builds: %v", err)
	}
}
