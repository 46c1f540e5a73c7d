package templates_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/templates"
	"github.com/vibemon/vmon/internal/testutil/pgtest"
	"github.com/vibemon/vmon/internal/tplstore"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// sharedDriver is one driver's build service among several sharing a PostgreSQL database and an
// artifact store.
type sharedDriver struct {
	svc   *templates.Service
	eng   *fakeEngine
	files *tplstore.Files
}

func newSharedDrivers(t *testing.T, names ...string) []sharedDriver {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	backend, err := artifacts.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	arts, err := artifacts.New(artifacts.Options{Backend: backend, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte{7}, 32)
	var out []sharedDriver
	for i, name := range names {
		st, err := store.OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if i == 0 {
			now := time.Now().UTC()
			if err := st.PutTemplate(ctx, store.Template{ID: template.BaseID, Aliases: []string{template.BaseID},
				BuildID: baseBuildID, CPU: 2, MemoryMB: 512, Status: store.TemplateReady, CreatedAt: now, UpdatedAt: now}); err != nil {
				t.Fatal(err)
			}
		}
		drv, err := driver.New(driver.Options{Store: st, Node: drivertest.NewNode(), Logger: discard(), Name: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drv.Close() })
		dir := t.TempDir()
		files, err := tplstore.NewFiles(arts, dir)
		if err != nil {
			t.Fatal(err)
		}
		eng := newFakeEngine(dir)
		svc := templates.New(templates.Options{DataDir: dir, Store: st, Engine: eng, Files: files, Resolver: drv,
			Log: discard(), RemoteParents: true, Driver: name, UploadKey: key})
		t.Cleanup(svc.Close)
		if err := svc.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		out = append(out, sharedDriver{svc: svc, eng: eng, files: files})
	}
	return out
}

// One build's calls land on whichever driver a load balancer picks: created through one, its
// archive's URL asked of one and the upload sent to the other, started through one (and only
// once), its status and log read through the other while it runs and when it ends, its template
// deleted through either only once it is done.
func TestBuildAcrossDrivers(t *testing.T) {
	ctx := context.Background()
	ds := newSharedDrivers(t, "driver-a", "driver-b")
	a, b := ds[0], ds[1]

	c, err := a.svc.Create(ctx, templates.CreateRequest{Name: "shared", Tags: []string{"v1"}})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("the archive of a COPY step")
	hash := strings.Repeat("c", 64)
	present, token, err := b.svc.FileStatus(ctx, c.TemplateID, hash)
	if err != nil || present {
		t.Fatalf("FileStatus through b = %v, %v", present, err)
	}
	if err := a.svc.Upload(ctx, c.TemplateID, hash, token, bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatalf("upload through a with b's URL: %v", err)
	}
	if present, _, err := b.svc.FileStatus(ctx, c.TemplateID, hash); err != nil || !present {
		t.Fatalf("b sees the archive a stored: %v, %v", present, err)
	}
	if err := a.svc.Upload(ctx, c.TemplateID, hash, token[:len(token)-2]+"00", bytes.NewReader(body), int64(len(body))); !errdefs.Is(err, errdefs.KindUnauthorized) {
		t.Fatalf("a forged URL = %v, want Unauthorized", err)
	}

	// Started through both at once: one runs it, the other is refused.
	gate := make(chan struct{})
	for _, d := range ds {
		d.eng.setPlan(c.BuildID, plan{lines: 300, gate: gate})
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, d := range ds {
		wg.Go(func() { errs[i] = d.svc.StartBuild(ctx, c.TemplateID, c.BuildID, templates.StartSpec{}) })
	}
	wg.Wait()
	runner, other := b, a
	switch {
	case errs[0] == nil && errdefs.Is(errs[1], errdefs.KindConflict):
		runner, other = a, b
	case errs[1] == nil && errdefs.Is(errs[0], errdefs.KindConflict):
	default:
		t.Fatalf("two starts: %v, %v; want one started and one Conflict", errs[0], errs[1])
	}

	// The other driver follows the running build's log, page by page.
	waitFor(t, "the log to reach the other driver", func() bool {
		st, err := other.svc.Status(ctx, c.TemplateID, c.BuildID, 300)
		return err == nil && len(st.Entries) == 1
	})
	st, err := other.svc.Status(ctx, c.TemplateID, c.BuildID, 0)
	if err != nil || len(st.Entries) != templates.MaxLogPage || st.Build.Status == store.TemplateReady ||
		!strings.Contains(st.Entries[0].Message, "building template") || st.Entries[1].Message != "line 0" || st.Entries[1].Step != "1" {
		t.Fatalf("status through the other driver: %v, %s, %d entries, first %+v", err, st.Build.Status, len(st.Entries), st.Entries[:2])
	}
	if st, _ := other.svc.Status(ctx, c.TemplateID, c.BuildID, 250); len(st.Entries) != 51 || st.Entries[0].Message != "line 249" {
		t.Fatalf("page from 250: %d entries, first %+v", len(st.Entries), st.Entries[0])
	}
	if err := other.svc.Delete(ctx, "shared"); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("delete through the other driver while the build runs = %v, want Conflict", err)
	}
	if err := other.svc.StartBuild(ctx, c.TemplateID, c.BuildID, templates.StartSpec{}); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("a later start through the other driver = %v, want Conflict", err)
	}

	// Ready is never seen before the whole log: the first status that says ready has the tags.
	close(gate)
	var final templates.Status
	waitFor(t, "the build to finish, seen through the other driver", func() bool {
		st, err := other.svc.Status(ctx, c.TemplateID, c.BuildID, 301)
		final = st
		return err == nil && st.Build.Status != store.TemplateWaiting && st.Build.Status != store.TemplateBuilding
	})
	if final.Build.Status != store.TemplateReady || len(final.Entries) != 1 || final.Entries[0].Message != "tagged v1, default" {
		t.Fatalf("finished build through the other driver: %s (%s), entries %+v", final.Build.Status, final.Build.ReasonMessage, final.Entries)
	}
	if n := len(other.eng.requests()); n != 0 {
		t.Fatalf("the driver that did not start the build ran it too (%d runs)", n)
	}
	if reqs := runner.eng.requests(); len(reqs) != 1 || reqs[0].FromTemplate == nil || reqs[0].FromTemplate.TemplateID != template.BaseID {
		t.Fatalf("runner's requests: %+v", reqs)
	}
	if tpl, _, err := b.svc.AssignTags(ctx, "shared:v1", []string{"prod"}); err != nil || tpl != c.BuildID {
		t.Fatalf("the built tag through b: %q, %v", tpl, err)
	}

	if err := other.svc.Delete(ctx, "shared"); err != nil {
		t.Fatalf("delete once done: %v", err)
	}
	if ok, err := runner.files.Has(ctx, c.TemplateID, hash); err != nil || ok {
		t.Fatalf("the archive outlived its template: %v, %v", ok, err)
	}
}
