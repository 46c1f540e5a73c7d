package templates_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/templates"
)

// baseBuildID is the build of the base template the test env registers.
const baseBuildID = "basebuild1"

// plan is what the fake engine does for one build.
type plan struct {
	// lines are logged (step "1") before anything else.
	lines int
	// gate, when set, blocks the build until closed (or the service shuts down).
	gate chan struct{}
	// err fails the build (after the gate).
	err error
}

// fakeEngine implements templates.Engine: it records requests, logs, optionally blocks and fails,
// and on success writes a build manifest like the real engine does.
type fakeEngine struct {
	dataDir    string
	mu         sync.Mutex
	started    []string
	plans      map[string]plan
	reqs       []build.Request
	running    int
	maxRunning int
	// gcs counts GC calls; gcDuringRun those made while a build ran.
	gcs, gcDuringRun int
}

// GC implements the service's optional layer collector.
func (f *fakeEngine) GC(context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gcs++
	if f.running > 0 {
		f.gcDuringRun++
	}
	return 0, nil
}

func (f *fakeEngine) gcCount() (calls, duringRun int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gcs, f.gcDuringRun
}

func newFakeEngine(dataDir string) *fakeEngine {
	return &fakeEngine{dataDir: dataDir, plans: map[string]plan{}}
}

func (f *fakeEngine) setPlan(buildID string, p plan) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plans[buildID] = p
}

func (f *fakeEngine) requests() []build.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

func (f *fakeEngine) peak() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxRunning
}

func (f *fakeEngine) Run(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.started = append(f.started, req.BuildID)
	p := f.plans[req.BuildID]
	f.running++
	f.maxRunning = max(f.maxRunning, f.running)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running--
		f.mu.Unlock()
	}()
	for i := range p.lines {
		log.Add("info", "1", "line %d", i)
	}
	if p.gate != nil {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return template.Manifest{}, &build.StepError{Step: "1", Msg: "cancelled", Cause: ctx.Err()}
		}
	}
	if p.err != nil {
		return template.Manifest{}, p.err
	}
	m := template.Manifest{ID: req.TemplateID, BuildID: req.BuildID, Layers: []string{"layers/x"},
		CPUs: req.CPUs, MemoryMB: req.MemoryMB, DefaultUser: "user", DefaultWorkdir: "/home/user",
		BuiltAt: time.Now().UTC()}
	if err := template.WriteBuild(f.dataDir, m); err != nil {
		return template.Manifest{}, err
	}
	return m, nil
}

type env struct {
	t     *testing.T
	ctx   context.Context
	dir   string
	st    *store.Store
	eng   *fakeEngine
	files *build.Files
	drv   *driver.Driver
	svc   *templates.Service
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newEnv opens a store in a temp data dir holding a built "base" template (store record, manifest
// and rootfs dir), a real driver as the Resolver and a Service over a fake engine. The service is
// closed when the test ends.
func newEnv(t *testing.T, mod func(*templates.Options)) *env {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	writeBase(t, dir)
	now := time.Now().UTC()
	if err := st.PutTemplate(ctx, store.Template{ID: template.BaseID, Aliases: []string{template.BaseID},
		BuildID: baseBuildID, CPU: 2, MemoryMB: 512, Status: store.TemplateReady, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	drv, err := driver.New(driver.Options{Store: st, Node: drivertest.NewNode(), Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.Close() })
	e := &env{t: t, ctx: ctx, dir: dir, st: st, eng: newFakeEngine(dir), files: build.NewFiles(dir), drv: drv}
	e.svc = e.newService(mod)
	return e
}

// newService starts a Service over the env (a second one simulates a restart).
func (e *env) newService(mod func(*templates.Options)) *templates.Service {
	e.t.Helper()
	o := templates.Options{DataDir: e.dir, Store: e.st, Engine: e.eng, Files: e.files, Resolver: e.drv, Log: discard()}
	if mod != nil {
		mod(&o)
	}
	svc := templates.New(o)
	e.t.Cleanup(svc.Close)
	if err := svc.Recover(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	return svc
}

// writeBase writes a minimal base template: <dir>/templates/base/manifest.json and its rootfs.
func writeBase(t *testing.T, dir string) {
	t.Helper()
	tdir := template.Dir(dir, template.BaseID)
	if err := os.MkdirAll(filepath.Join(tdir, "rootfs-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(template.Manifest{Format: 1, ID: template.BaseID, BuildID: baseBuildID, Rootfs: "rootfs-1",
		CPUs: 2, MemoryMB: 512, DefaultUser: "user", Env: map[string]string{"BASE": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tdir, "manifest.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (e *env) create(name string, tags ...string) templates.Created {
	e.t.Helper()
	c, err := e.svc.Create(e.ctx, templates.CreateRequest{Name: name, Tags: tags})
	if err != nil {
		e.t.Fatalf("Create(%q): %v", name, err)
	}
	return c
}

func (e *env) start(c templates.Created, spec templates.StartSpec) {
	e.t.Helper()
	if err := e.svc.StartBuild(e.ctx, c.TemplateID, c.BuildID, spec); err != nil {
		e.t.Fatalf("StartBuild(%s): %v", c.BuildID, err)
	}
}

// wait waits for a build to finish and returns its record.
func (e *env) wait(c templates.Created) store.Build {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	b, err := e.svc.Wait(ctx, c.TemplateID, c.BuildID)
	if err != nil {
		e.t.Fatalf("Wait(%s): %v", c.BuildID, err)
	}
	return b
}

// build creates, starts and waits for one build of name, which must succeed.
func (e *env) build(name string, tags ...string) templates.Created {
	e.t.Helper()
	c := e.create(name, tags...)
	e.start(c, templates.StartSpec{})
	if b := e.wait(c); b.Status != store.TemplateReady {
		e.t.Fatalf("build %s of %q: status %s (%s), want ready", c.BuildID, name, b.Status, b.ReasonMessage)
	}
	return c
}

// entered waits until the fake engine has started running buildID.
func (e *env) entered(buildID string) {
	e.t.Helper()
	waitFor(e.t, "the engine to start build "+buildID, func() bool {
		e.eng.mu.Lock()
		defer e.eng.mu.Unlock()
		return slices.Contains(e.eng.started, buildID)
	})
}

func (e *env) status(c templates.Created, offset int) templates.Status {
	e.t.Helper()
	s, err := e.svc.Status(e.ctx, c.TemplateID, c.BuildID, offset)
	if err != nil {
		e.t.Fatalf("Status(%s, %d): %v", c.BuildID, offset, err)
	}
	return s
}

func (e *env) template(id string) store.Template {
	e.t.Helper()
	tpl, err := e.st.GetTemplate(e.ctx, id)
	if err != nil {
		e.t.Fatalf("GetTemplate(%s): %v", id, err)
	}
	return tpl
}

// tags returns a template's tags as tag → build id.
func (e *env) tags(id string) map[string]string {
	e.t.Helper()
	ts, err := e.st.ListTags(e.ctx, id)
	if err != nil {
		e.t.Fatalf("ListTags(%s): %v", id, err)
	}
	out := map[string]string{}
	for _, tg := range ts {
		out[tg.Tag] = tg.BuildID
	}
	return out
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// wantKind fails unless err has kind k.
func wantKind(t *testing.T, what string, err error, k errdefs.Kind) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want kind %v", what, k)
	}
	if got := errdefs.KindOf(err); got != k {
		t.Fatalf("%s: error %v has kind %v, want %v", what, err, got, k)
	}
}

func hasEntry(entries []templates.LogEntry, substr string) bool {
	return slices.ContainsFunc(entries, func(en templates.LogEntry) bool { return strings.Contains(en.Message, substr) })
}
