package templates_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/templates"
)

const aUUID = "123e4567-e89b-12d3-a456-426614174000"

func TestParseName(t *testing.T) {
	long := strings.Repeat("a", 128)
	for _, tc := range []struct {
		ref, name, tag string
		bad            bool
	}{
		{ref: "app", name: "app"},
		{ref: "my-tpl_1", name: "my-tpl_1"},
		{ref: "0app", name: "0app"},
		{ref: "  app  ", name: "app"},
		{ref: "ns/app", name: "app"},
		{ref: "ns/app:v1", name: "app", tag: "v1"},
		{ref: "App:V1", name: "app", tag: "v1"},
		{ref: "NS/App:Release_1.2-rc", name: "app", tag: "release_1.2-rc"},
		{ref: "app:default", name: "app", tag: "default"},
		{ref: "app:" + long, name: "app", tag: long},
		{ref: long, name: long},
		{ref: "app:" + aUUID, bad: true},
		{ref: "app:" + strings.ToUpper(aUUID), bad: true},
		{ref: "app:" + long + "a", bad: true},
		{ref: long + "a", bad: true},
		{ref: "app:", bad: true},
		{ref: "app:bad tag", bad: true},
		{ref: "app:v/1", bad: true},
		{ref: "app:v@1", bad: true},
		{ref: "", bad: true},
		{ref: ":v1", bad: true},
		{ref: "-app", bad: true},
		{ref: "_app", bad: true},
		{ref: "a.pp", bad: true},
		{ref: "a pp", bad: true},
		{ref: "ns/", bad: true},
		{ref: "/app", bad: true},
		{ref: "a/b/c", bad: true},
		{ref: "bad ns/app", bad: true},
		{ref: "-ns/app", bad: true},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			name, tag, err := templates.ParseName(tc.ref)
			if tc.bad {
				wantKind(t, "ParseName", err, errdefs.KindInvalidArgument)
				if name != "" || tag != "" {
					t.Errorf("ParseName(%q) = %q, %q with an error, want empty", tc.ref, name, tag)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseName(%q): %v", tc.ref, err)
			}
			if name != tc.name || tag != tc.tag {
				t.Errorf("ParseName(%q) = %q, %q, want %q, %q", tc.ref, name, tag, tc.name, tc.tag)
			}
		})
	}
}

var templateIDRe = regexp.MustCompile(`^[a-z0-9]{20}$`)

func TestCreate(t *testing.T) {
	e := newEnv(t, nil)
	c1 := e.create("app")
	if !templateIDRe.MatchString(c1.TemplateID) {
		t.Errorf("template id %q, want 20 lowercase letters and digits", c1.TemplateID)
	}
	if c1.BuildID == "" || c1.BuildID == c1.TemplateID {
		t.Errorf("build id %q", c1.BuildID)
	}
	if !slices.Equal(c1.Names, []string{"app"}) || len(c1.Tags) != 0 || !slices.Equal(c1.Aliases, []string{"app"}) {
		t.Errorf("created %+v: want names [app], no tags, aliases [app]", c1)
	}
	tpl := e.template(c1.TemplateID)
	if tpl.Status != store.TemplateWaiting || tpl.BuildID != c1.BuildID || !slices.Equal(tpl.Aliases, []string{"app"}) {
		t.Errorf("template %+v: want waiting, build %s, aliases [app]", tpl, c1.BuildID)
	}
	b, err := e.st.GetBuild(e.ctx, c1.TemplateID, c1.BuildID)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != store.TemplateWaiting || b.CPU != templates.DefaultCPUs || b.MemoryMB != templates.DefaultMemoryMB {
		t.Errorf("build %+v: want waiting with the default resources", b)
	}

	// The same name (with or without a namespace, any case) is a new build of the same template.
	for _, name := range []string{"app", "ns/App", "app:v1"} {
		c := e.create(name)
		if c.TemplateID != c1.TemplateID {
			t.Errorf("Create(%q): template %s, want %s", name, c.TemplateID, c1.TemplateID)
		}
		if c.BuildID == c1.BuildID {
			t.Errorf("Create(%q) reused build id %s", name, c.BuildID)
		}
		if tpl := e.template(c.TemplateID); tpl.BuildID != c.BuildID || tpl.Status != store.TemplateWaiting {
			t.Errorf("template after Create(%q): build %s status %s, want the new build, waiting", name, tpl.BuildID, tpl.Status)
		}
	}
	if c2 := e.create("other"); c2.TemplateID == c1.TemplateID {
		t.Errorf("another name got the same template id %s", c2.TemplateID)
	}

	// Tags from the name and the request, lowercased and deduplicated.
	c := e.create("tagged:v1", "V2", "v1", " v3 ")
	if !slices.Equal(c.Tags, []string{"v1", "v2", "v3"}) ||
		!slices.Equal(c.Names, []string{"tagged", "tagged:v1", "tagged:v2", "tagged:v3"}) {
		t.Errorf("created %+v: want tags v1 v2 v3 and their names", c)
	}

	for _, tc := range []struct {
		name string
		req  templates.CreateRequest
		kind errdefs.Kind
	}{
		{"base", templates.CreateRequest{Name: "base"}, errdefs.KindInvalidArgument},
		{"base with tag", templates.CreateRequest{Name: "base:v1"}, errdefs.KindInvalidArgument},
		{"base with namespace", templates.CreateRequest{Name: "ns/base"}, errdefs.KindInvalidArgument},
		{"bad name", templates.CreateRequest{Name: "bad name"}, errdefs.KindInvalidArgument},
		{"uuid tag in request", templates.CreateRequest{Name: "app", Tags: []string{aUUID}}, errdefs.KindInvalidArgument},
		{"bad tag in request", templates.CreateRequest{Name: "app", Tags: []string{"a b"}}, errdefs.KindInvalidArgument},
		{"empty tag in request", templates.CreateRequest{Name: "app", Tags: []string{""}}, errdefs.KindInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.svc.Create(e.ctx, tc.req)
			wantKind(t, "Create", err, tc.kind)
		})
	}
	if tpl := e.template(template.BaseID); tpl.Status != store.TemplateReady || tpl.BuildID != baseBuildID {
		t.Errorf("base template changed by a refused create: %+v", tpl)
	}
}

func TestCreateResources(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name              string
		cpus, mem         int
		wantCPUs, wantMem int
		bad               bool
	}{
		{name: "defaults", wantCPUs: 2, wantMem: 512},
		{name: "cpu 1", cpus: 1, wantCPUs: 1, wantMem: 512},
		{name: "cpu 64", cpus: 64, wantCPUs: 64, wantMem: 512},
		{name: "cpu 65", cpus: 65, bad: true},
		{name: "cpu -1", cpus: -1, bad: true},
		{name: "mem 128", mem: 128, wantCPUs: 2, wantMem: 128},
		{name: "mem 130", mem: 130, wantCPUs: 2, wantMem: 130},
		{name: "mem max", mem: 256 << 10, wantCPUs: 2, wantMem: 256 << 10},
		{name: "mem 127", mem: 127, bad: true},
		{name: "mem 126", mem: 126, bad: true},
		{name: "mem odd", mem: 513, bad: true},
		{name: "mem over max", mem: 256<<10 + 2, bad: true},
		{name: "mem -2", mem: -2, bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := e.svc.Create(e.ctx, templates.CreateRequest{Name: "res", CPUs: tc.cpus, MemoryMB: tc.mem})
			if tc.bad {
				wantKind(t, "Create", err, errdefs.KindInvalidArgument)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := e.st.GetBuild(e.ctx, c.TemplateID, c.BuildID)
			if err != nil {
				t.Fatal(err)
			}
			if b.CPU != tc.wantCPUs || b.MemoryMB != tc.wantMem {
				t.Errorf("build resources %d CPUs %d MB, want %d, %d", b.CPU, b.MemoryMB, tc.wantCPUs, tc.wantMem)
			}
		})
	}
}

func TestStartBuildErrors(t *testing.T) {
	e := newEnv(t, nil)
	ready := e.build("ready")
	hash := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name string
		// ids, when set, replace the created build's template and build ids.
		tid, bid string
		spec     templates.StartSpec
		kind     errdefs.Kind
	}{
		{name: "unknown build", bid: "no-such-build", kind: errdefs.KindNotFound},
		{name: "build of another template", tid: ready.TemplateID, kind: errdefs.KindNotFound},
		{name: "unknown template", tid: "nosuchtemplate", kind: errdefs.KindNotFound},
		{name: "unknown step type", spec: templates.StartSpec{Steps: []templates.Step{{Type: "BOGUS"}}}, kind: errdefs.KindInvalidArgument},
		{name: "empty RUN", spec: templates.StartSpec{Steps: []templates.Step{{Type: "RUN", Args: []string{" "}}}}, kind: errdefs.KindInvalidArgument},
		{name: "COPY without hash", spec: templates.StartSpec{Steps: []templates.Step{{Type: "COPY", Args: []string{"a", "/b"}}}}, kind: errdefs.KindInvalidArgument},
		{name: "bad ENV name", spec: templates.StartSpec{Steps: []templates.Step{{Type: "ENV", Args: []string{"1A", "x"}}}}, kind: errdefs.KindInvalidArgument},
		{name: "a bad step after good ones", spec: templates.StartSpec{Steps: []templates.Step{
			{Type: "RUN", Args: []string{"true"}}, {Type: "COPY", Args: []string{"a", "/b"}, FilesHash: hash}, {Type: "USER", Args: []string{"bad user"}}}},
			kind: errdefs.KindInvalidArgument},
		{name: "too many steps", spec: templates.StartSpec{Steps: slices.Repeat([]templates.Step{{Type: "RUN", Args: []string{"true"}}}, build.MaxSteps+1)},
			kind: errdefs.KindInvalidArgument},
		{name: "fromImage and fromTemplate", spec: templates.StartSpec{FromImage: "debian:12", FromTemplate: "base"}, kind: errdefs.KindInvalidArgument},
		{name: "e2bdev/base and fromTemplate", spec: templates.StartSpec{FromImage: "e2bdev/base", FromTemplate: "base"}, kind: errdefs.KindInvalidArgument},
		{name: "unsupported registry", spec: templates.StartSpec{FromImage: "debian:12", FromImageRegistry: &templates.Registry{Type: "aws"}},
			kind: errdefs.KindInvalidArgument},
		{name: "unknown fromTemplate", spec: templates.StartSpec{FromTemplate: "nope"}, kind: errdefs.KindNotFound},
		{name: "unknown fromTemplate tag", spec: templates.StartSpec{FromTemplate: "ready:v9"}, kind: errdefs.KindNotFound},
		// The template's first build: it is not ready, so it cannot be a parent at all.
		{name: "fromTemplate self while not ready", spec: templates.StartSpec{FromTemplate: "fresh"}, kind: errdefs.KindNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.create("fresh")
			tid, bid := c.TemplateID, c.BuildID
			if tc.tid != "" {
				tid = tc.tid
			}
			if tc.bid != "" {
				bid = tc.bid
			}
			before := len(e.eng.requests())
			err := e.svc.StartBuild(e.ctx, tid, bid, tc.spec)
			wantKind(t, "StartBuild", err, tc.kind)
			if n := len(e.eng.requests()); n != before {
				t.Errorf("the engine ran %d builds after a refused start", n-before)
			}
			if _, err := os.Stat(filepath.Join(e.dir, "build-logs", c.BuildID+".jsonl")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a refused start created a build log (stat: %v)", err)
			}
			if b, err := e.st.GetBuild(e.ctx, c.TemplateID, c.BuildID); err != nil || b.Status != store.TemplateWaiting {
				t.Errorf("build after a refused start: %+v, %v; want waiting", b, err)
			}
			if e.svc.Log(c.BuildID) != nil {
				t.Errorf("a refused start left a live log")
			}
		})
	}

	// A refused start leaves the build startable.
	c := e.create("retry")
	err := e.svc.StartBuild(e.ctx, c.TemplateID, c.BuildID, templates.StartSpec{Steps: []templates.Step{{Type: "BOGUS"}}})
	wantKind(t, "invalid start", err, errdefs.KindInvalidArgument)
	e.start(c, templates.StartSpec{})
	if b := e.wait(c); b.Status != store.TemplateReady {
		t.Fatalf("retried build: %s (%s)", b.Status, b.ReasonMessage)
	}

	// A ready template cannot be rebuilt from itself, by name, name:tag or id.
	for _, from := range []string{"ready", "ready:default", ready.TemplateID} {
		c := e.create("ready")
		err := e.svc.StartBuild(e.ctx, c.TemplateID, c.BuildID, templates.StartSpec{FromTemplate: from})
		wantKind(t, "fromTemplate "+from, err, errdefs.KindInvalidArgument)
	}
}

func TestStartBuildTwice(t *testing.T) {
	e := newEnv(t, nil)
	c := e.create("twice")
	gate := make(chan struct{})
	e.eng.setPlan(c.BuildID, plan{gate: gate})
	e.start(c, templates.StartSpec{})
	e.entered(c.BuildID)
	err := e.svc.StartBuild(e.ctx, c.TemplateID, c.BuildID, templates.StartSpec{})
	wantKind(t, "second start while running", err, errdefs.KindConflict)
	close(gate)
	e.wait(c)
	err = e.svc.StartBuild(e.ctx, c.TemplateID, c.BuildID, templates.StartSpec{})
	wantKind(t, "start after the build finished", err, errdefs.KindConflict)
	if n := len(e.eng.requests()); n != 1 {
		t.Errorf("engine ran %d builds, want 1", n)
	}

	// A build created before a restart is started by the new service: its record is all a start
	// needs (drivers sharing a database start each other's).
	c2 := e.create("twice")
	svc2 := e.newService(nil)
	if err := svc2.StartBuild(e.ctx, c2.TemplateID, c2.BuildID, templates.StartSpec{}); err != nil {
		t.Fatalf("start after restart: %v", err)
	}
	b, err := svc2.Wait(e.ctx, c2.TemplateID, c2.BuildID)
	if err != nil || b.Status != store.TemplateReady {
		t.Fatalf("the build started after a restart: %+v, %v", b, err)
	}
}

func TestStartBuildConcurrent(t *testing.T) {
	e := newEnv(t, nil)
	for range 20 {
		c := e.create("race")
		const n = 8
		var wg sync.WaitGroup
		errs := make([]error, n)
		startCh := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-startCh
				errs[i] = e.svc.StartBuild(e.ctx, c.TemplateID, c.BuildID, templates.StartSpec{})
			})
		}
		close(startCh)
		wg.Wait()
		ok := 0
		for _, err := range errs {
			if err == nil {
				ok++
			} else if !errdefs.Is(err, errdefs.KindConflict) {
				t.Errorf("concurrent start: %v, want nil or Conflict", err)
			}
		}
		if ok != 1 {
			t.Fatalf("%d of %d concurrent starts of build %s succeeded, want exactly 1", ok, n, c.BuildID)
		}
		e.wait(c)
	}
}

func TestStartBuildRequest(t *testing.T) {
	e := newEnv(t, nil)
	parent := e.build("parent:v1")
	hash := strings.Repeat("0f", 32)
	steps := []templates.Step{
		{Type: "RUN", Args: []string{"apt-get install -y git", "root"}},
		{Type: "COPY", Args: []string{"src", "/app", "user", "0755"}, FilesHash: hash},
		{Type: "ENV", Args: []string{"A", "1", "B", "2"}},
		{Type: "WORKDIR", Args: []string{"/app"}},
		{Type: "USER", Args: []string{"user"}, Force: true},
	}
	for _, tc := range []struct {
		name string
		spec templates.StartSpec
		// want checks the parent part of the request.
		wantImage  string
		wantParent *build.Parent
	}{
		{name: "neither builds from base", spec: templates.StartSpec{Steps: steps, StartCmd: "srv", ReadyCmd: "true", Force: true},
			wantParent: &build.Parent{TemplateID: template.BaseID, BuildID: baseBuildID,
				Layers: []string{filepath.Join("templates", "base", "rootfs-1")}, Env: map[string]string{"BASE": "1"}, User: "user"}},
		{name: "fromTemplate base", spec: templates.StartSpec{FromTemplate: "base"},
			wantParent: &build.Parent{TemplateID: template.BaseID, BuildID: baseBuildID,
				Layers: []string{filepath.Join("templates", "base", "rootfs-1")}, Env: map[string]string{"BASE": "1"}, User: "user"}},
		{name: "fromTemplate name:tag", spec: templates.StartSpec{FromTemplate: "ns/parent:v1"},
			wantParent: &build.Parent{TemplateID: parent.TemplateID, BuildID: parent.BuildID, Layers: []string{"layers/x"},
				User: "user", Workdir: "/home/user"}},
		{name: "fromTemplate id", spec: templates.StartSpec{FromTemplate: parent.TemplateID},
			wantParent: &build.Parent{TemplateID: parent.TemplateID, BuildID: parent.BuildID, Layers: []string{"layers/x"},
				User: "user", Workdir: "/home/user"}},
		{name: "fromImage", spec: templates.StartSpec{FromImage: "debian:12", FromImageRegistry: &templates.Registry{Type: "registry", Username: "u"}},
			wantImage: "debian:12"},
		{name: "fromImage e2bdev/base is base", spec: templates.StartSpec{FromImage: "e2bdev/base"},
			wantParent: &build.Parent{TemplateID: template.BaseID, BuildID: baseBuildID,
				Layers: []string{filepath.Join("templates", "base", "rootfs-1")}, Env: map[string]string{"BASE": "1"}, User: "user"}},
		{name: "fromImage docker.io/e2bdev/base:latest is base", spec: templates.StartSpec{FromImage: "docker.io/e2bdev/base:latest"},
			wantParent: &build.Parent{TemplateID: template.BaseID, BuildID: baseBuildID,
				Layers: []string{filepath.Join("templates", "base", "rootfs-1")}, Env: map[string]string{"BASE": "1"}, User: "user"}},
		{name: "fromImage e2bdev/base:other is an image", spec: templates.StartSpec{FromImage: "e2bdev/base:other"},
			wantImage: "e2bdev/base:other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := e.svc.Create(e.ctx, templates.CreateRequest{Name: "child", CPUs: 4, MemoryMB: 1024})
			if err != nil {
				t.Fatal(err)
			}
			e.start(c, tc.spec)
			if b := e.wait(c); b.Status != store.TemplateReady {
				t.Fatalf("build: %s (%s)", b.Status, b.ReasonMessage)
			}
			reqs := e.eng.requests()
			req := reqs[len(reqs)-1]
			if req.TemplateID != c.TemplateID || req.BuildID != c.BuildID || req.CPUs != 4 || req.MemoryMB != 1024 {
				t.Errorf("request ids/resources %s %s %d %d", req.TemplateID, req.BuildID, req.CPUs, req.MemoryMB)
			}
			if req.StartCmd != tc.spec.StartCmd || req.ReadyCmd != tc.spec.ReadyCmd || req.Force != tc.spec.Force ||
				len(req.Steps) != len(tc.spec.Steps) || req.FromImageRegistry != tc.spec.FromImageRegistry {
				t.Errorf("request %+v does not carry the spec %+v", req, tc.spec)
			}
			if req.FromImage != tc.wantImage {
				t.Errorf("FromImage %q, want %q", req.FromImage, tc.wantImage)
			}
			switch {
			case tc.wantParent == nil && req.FromTemplate != nil:
				t.Errorf("FromTemplate %+v, want none", req.FromTemplate)
			case tc.wantParent != nil && req.FromTemplate == nil:
				t.Errorf("no FromTemplate, want %+v", tc.wantParent)
			case tc.wantParent != nil:
				p, w := req.FromTemplate, tc.wantParent
				if p.TemplateID != w.TemplateID || p.BuildID != w.BuildID || !slices.Equal(p.Layers, w.Layers) ||
					p.User != w.User || p.Workdir != w.Workdir || len(p.Env) != len(w.Env) || p.Env["BASE"] != w.Env["BASE"] {
					t.Errorf("parent %+v, want %+v", p, w)
				}
			}
		})
	}
}

func TestStatusLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	c := e.create("life")
	st := e.status(c, 0)
	if st.Build.Status != store.TemplateWaiting || len(st.Entries) != 0 {
		t.Fatalf("before start: %s with %d entries, want waiting, none", st.Build.Status, len(st.Entries))
	}
	_, err := e.svc.Status(e.ctx, c.TemplateID, c.BuildID, -1)
	wantKind(t, "negative offset", err, errdefs.KindInvalidArgument)
	_, err = e.svc.Status(e.ctx, c.TemplateID, "nope", 0)
	wantKind(t, "unknown build", err, errdefs.KindNotFound)

	gate := make(chan struct{})
	const lines = 150
	e.eng.setPlan(c.BuildID, plan{lines: lines, gate: gate})
	e.start(c, templates.StartSpec{})
	e.entered(c.BuildID)
	// The engine logged every line before blocking: 1 "building" line + 150.
	waitFor(t, "the build's log lines", func() bool { return e.svc.Log(c.BuildID).Len() == 1+lines })
	st = e.status(c, 0)
	if st.Build.Status != store.TemplateBuilding {
		t.Errorf("running build: %s, want building", st.Build.Status)
	}
	if tpl := e.template(c.TemplateID); tpl.Status != store.TemplateBuilding {
		t.Errorf("template of a running first build: %s, want building", tpl.Status)
	}
	for _, p := range []struct{ offset, want int }{{0, 100}, {1, 100}, {100, 51}, {150, 1}, {151, 0}, {1000, 0}} {
		if got := len(e.status(c, p.offset).Entries); got != p.want {
			t.Errorf("running build, offset %d: %d entries, want %d", p.offset, got, p.want)
		}
	}
	if first := e.status(c, 0).Entries[0]; !strings.Contains(first.Message, "building template "+c.TemplateID) {
		t.Errorf("first entry %+v", first)
	}
	if en := e.status(c, 1).Entries[0]; en.Message != "line 0" || en.Step != "1" {
		t.Errorf("entry at offset 1: %+v, want line 0 of step 1", en)
	}

	close(gate)
	if b := e.wait(c); b.Status != store.TemplateReady || b.FinishedAt.IsZero() || b.DefaultUser != "user" {
		t.Fatalf("finished build %+v: want ready with a finish time and the manifest's user", b)
	}
	if e.svc.Log(c.BuildID) != nil {
		t.Fatal("the service still holds the finished build's log")
	}
	// From the log file now: 1 + 150 + "tagged default".
	st = e.status(c, 0)
	if st.Build.Status != store.TemplateReady || len(st.Entries) != 100 {
		t.Errorf("finished build: %s with %d entries, want ready, 100", st.Build.Status, len(st.Entries))
	}
	rest := e.status(c, 100).Entries
	if len(rest) != 52 || !strings.Contains(rest[len(rest)-1].Message, "tagged default") {
		t.Errorf("finished build, offset 100: %d entries (%+v), want 52 ending with the tagging", len(rest), rest[len(rest)-1:])
	}
	tpl := e.template(c.TemplateID)
	if tpl.Status != store.TemplateReady || tpl.BuildID != c.BuildID || tpl.DefaultUser != "user" || tpl.DefaultWorkdir != "/home/user" {
		t.Errorf("template %+v: want ready on build %s with the manifest's user and workdir", tpl, c.BuildID)
	}
	if _, err := template.LoadBuild(e.dir, c.TemplateID, c.BuildID); err != nil {
		t.Errorf("build manifest: %v", err)
	}

	// A restarted service reads the log file too.
	svc2 := e.newService(nil)
	st2, err := svc2.Status(e.ctx, c.TemplateID, c.BuildID, 0)
	if err != nil || st2.Build.Status != store.TemplateReady || len(st2.Entries) != 100 {
		t.Errorf("after restart: %s, %d entries, %v", st2.Build.Status, len(st2.Entries), err)
	}
}

func TestMaxConcurrent(t *testing.T) {
	e := newEnv(t, func(o *templates.Options) { o.MaxConcurrent = 1 })
	a, b := e.create("first"), e.create("second")
	gate := make(chan struct{})
	e.eng.setPlan(a.BuildID, plan{gate: gate})
	e.start(a, templates.StartSpec{})
	e.entered(a.BuildID)
	e.start(b, templates.StartSpec{})
	waitFor(t, "the second build to queue", func() bool {
		return hasEntry(e.status(b, 0).Entries, "waiting for one of 1 build slots")
	})
	if st := e.status(b, 0); st.Build.Status != store.TemplateWaiting {
		t.Errorf("queued build: %s, want waiting", st.Build.Status)
	}
	if tpl := e.template(b.TemplateID); tpl.Status != store.TemplateWaiting {
		t.Errorf("template of a queued build: %s, want waiting", tpl.Status)
	}
	if n := len(e.eng.requests()); n != 1 {
		t.Errorf("engine runs %d builds, want 1", n)
	}
	// A queued build is in progress: it cannot be started again nor its template deleted.
	wantKind(t, "start queued build", e.svc.StartBuild(e.ctx, b.TemplateID, b.BuildID, templates.StartSpec{}), errdefs.KindConflict)
	wantKind(t, "delete template with queued build", e.svc.Delete(e.ctx, "second"), errdefs.KindConflict)

	close(gate)
	if st := e.wait(a); st.Status != store.TemplateReady {
		t.Errorf("first build: %s", st.Status)
	}
	if st := e.wait(b); st.Status != store.TemplateReady {
		t.Errorf("second build: %s", st.Status)
	}
	if p := e.eng.peak(); p != 1 {
		t.Errorf("%d builds ran at once, want at most 1", p)
	}
}

func TestCloseFailsQueuedAndRunningBuilds(t *testing.T) {
	e := newEnv(t, func(o *templates.Options) { o.MaxConcurrent = 1 })
	a, b := e.create("first"), e.create("second")
	e.eng.setPlan(a.BuildID, plan{gate: make(chan struct{})})
	e.start(a, templates.StartSpec{})
	e.entered(a.BuildID)
	e.start(b, templates.StartSpec{})
	waitFor(t, "the second build to queue", func() bool {
		return hasEntry(e.status(b, 0).Entries, "waiting for one of 1 build slots")
	})
	e.svc.Close()
	for _, c := range []templates.Created{a, b} {
		bd, err := e.st.GetBuild(e.ctx, c.TemplateID, c.BuildID)
		if err != nil {
			t.Fatal(err)
		}
		if bd.Status != store.TemplateError {
			t.Errorf("build %s after Close: %s, want error", c.BuildID, bd.Status)
		}
		if tpl := e.template(c.TemplateID); tpl.Status != store.TemplateError {
			t.Errorf("template %s after Close: %s, want error", c.TemplateID, tpl.Status)
		}
	}
	bd, _ := e.st.GetBuild(e.ctx, b.TemplateID, b.BuildID)
	if bd.ReasonStep != "base" || bd.ReasonMessage != "base image: the server shut down before the build started" {
		t.Errorf("queued build after Close: step %q message %q", bd.ReasonStep, bd.ReasonMessage)
	}
}

func TestTags(t *testing.T) {
	e := newEnv(t, nil)

	// A name without a tag builds "default", and so does every later untagged build.
	app1 := e.build("app")
	if got := e.tags(app1.TemplateID); len(got) != 1 || got["default"] != app1.BuildID {
		t.Errorf("app tags %v, want default → %s", got, app1.BuildID)
	}
	app2 := e.build("app")
	if got := e.tags(app1.TemplateID); len(got) != 1 || got["default"] != app2.BuildID {
		t.Errorf("app tags after a rebuild %v, want default → %s", got, app2.BuildID)
	}
	if tpl := e.template(app1.TemplateID); tpl.BuildID != app2.BuildID {
		t.Errorf("app template on build %s, want %s", tpl.BuildID, app2.BuildID)
	}

	// The first build gets its tag and default; later tagged builds leave default alone.
	v1 := e.build("svc:v1")
	if got := e.tags(v1.TemplateID); len(got) != 2 || got["default"] != v1.BuildID || got["v1"] != v1.BuildID {
		t.Errorf("svc tags after v1 %v, want default and v1 → %s", got, v1.BuildID)
	}
	v2 := e.build("svc:v2")
	want := map[string]string{"default": v1.BuildID, "v1": v1.BuildID, "v2": v2.BuildID}
	if got := e.tags(v1.TemplateID); !mapsEqual(got, want) {
		t.Errorf("svc tags after v2 %v, want %v", got, want)
	}
	if tpl := e.template(v1.TemplateID); tpl.BuildID != v1.BuildID || tpl.Status != store.TemplateReady {
		t.Errorf("svc template on build %s (%s), want %s ready", tpl.BuildID, tpl.Status, v1.BuildID)
	}

	// Moving default re-points the template record.
	bid, tags, err := e.svc.AssignTags(e.ctx, "svc:v2", []string{"Default"})
	if err != nil {
		t.Fatal(err)
	}
	if bid != v2.BuildID || !slices.Equal(tags, []string{"default"}) {
		t.Errorf("AssignTags = %s, %v; want %s, [default]", bid, tags, v2.BuildID)
	}
	want["default"] = v2.BuildID
	if got := e.tags(v1.TemplateID); !mapsEqual(got, want) {
		t.Errorf("svc tags after assigning default %v, want %v", got, want)
	}
	if tpl := e.template(v1.TemplateID); tpl.BuildID != v2.BuildID {
		t.Errorf("svc template on build %s after moving default, want %s", tpl.BuildID, v2.BuildID)
	}

	// Assigning other tags leaves the record alone.
	if _, _, err := e.svc.AssignTags(e.ctx, "svc:v1", []string{"stable", "lts", "stable"}); err != nil {
		t.Fatal(err)
	}
	want["stable"], want["lts"] = v1.BuildID, v1.BuildID
	if got := e.tags(v1.TemplateID); !mapsEqual(got, want) {
		t.Errorf("svc tags %v, want %v", got, want)
	}
	if tpl := e.template(v1.TemplateID); tpl.BuildID != v2.BuildID {
		t.Errorf("svc template on build %s, want %s", tpl.BuildID, v2.BuildID)
	}

	if err := e.svc.RemoveTags(e.ctx, "svc", []string{"LTS"}); err != nil {
		t.Fatal(err)
	}
	delete(want, "lts")
	got, err := e.svc.Tags(e.ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("Tags(svc) = %v, want %v", got, want)
	}
	for _, tg := range got {
		if want[tg.Tag] != tg.BuildID {
			t.Errorf("Tags(svc): %s → %s, want %s", tg.Tag, tg.BuildID, want[tg.Tag])
		}
	}

	for _, tc := range []struct {
		name string
		err  error
		kind errdefs.Kind
	}{
		{"remove missing tag", e.svc.RemoveTags(e.ctx, "svc", []string{"nope"}), errdefs.KindNotFound},
		{"remove from unknown template", e.svc.RemoveTags(e.ctx, "nope", []string{"v1"}), errdefs.KindNotFound},
		{"remove no tags", e.svc.RemoveTags(e.ctx, "svc", nil), errdefs.KindInvalidArgument},
		{"remove uuid tag", e.svc.RemoveTags(e.ctx, "svc", []string{aUUID}), errdefs.KindInvalidArgument},
		{"assign no tags", second(e.svc.AssignTags(e.ctx, "svc:v1", nil)), errdefs.KindInvalidArgument},
		{"assign bad tag", second(e.svc.AssignTags(e.ctx, "svc:v1", []string{"a b"})), errdefs.KindInvalidArgument},
		{"assign uuid tag", second(e.svc.AssignTags(e.ctx, "svc:v1", []string{aUUID})), errdefs.KindInvalidArgument},
		{"assign to unknown tag", second(e.svc.AssignTags(e.ctx, "svc:v9", []string{"x"})), errdefs.KindNotFound},
		{"assign to unknown template", second(e.svc.AssignTags(e.ctx, "nope", []string{"x"})), errdefs.KindNotFound},
		{"tags of unknown template", second2(e.svc.Tags(e.ctx, "nope")), errdefs.KindNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) { wantKind(t, tc.name, tc.err, tc.kind) })
	}
	// A failed removal removes nothing, even of the tags before the missing one.
	wantKind(t, "remove partly missing", e.svc.RemoveTags(e.ctx, "svc", []string{"stable", "nope"}), errdefs.KindNotFound)
	if got := e.tags(v1.TemplateID); !mapsEqual(got, want) {
		t.Errorf("svc tags after a failed removal %v, want %v", got, want)
	}
}

func second[A, B any](_ A, _ B, err error) error { return err }

func second2[A any](_ A, err error) error { return err }

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestFailure(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		step       string
		msgPrefix  string
		msgContain string
	}{
		{"numbered step", &build.StepError{Step: "3", Msg: "command exited with 1", Cause: errors.New("internal")},
			"3", "step 3:", "step 3: command exited with 1"},
		{"base", &build.StepError{Step: "base", Msg: "pull failed"}, "base", "base image:", "base image: pull failed"},
		{"finalize", &build.StepError{Step: "finalize", Msg: "ready command timed out"}, "finalize", "start/ready command:",
			"start/ready command: ready command timed out"},
		{"wrapped step error", errors.Join(errors.New("x"), &build.StepError{Step: "2", Msg: "no space"}), "2", "step 2:", "step 2: no space"},
		{"not a step error", errors.New("disk on fire"), "", "build failed:", "build failed: internal error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			c := e.create("broken")
			e.eng.setPlan(c.BuildID, plan{err: tc.err})
			e.start(c, templates.StartSpec{})
			b := e.wait(c)
			if b.Status != store.TemplateError || b.ReasonStep != tc.step || !strings.HasPrefix(b.ReasonMessage, tc.msgPrefix) ||
				!strings.Contains(b.ReasonMessage, tc.msgContain) || b.FinishedAt.IsZero() {
				t.Errorf("failed build: status %s step %q message %q finished %v", b.Status, b.ReasonStep, b.ReasonMessage, b.FinishedAt)
			}
			if strings.Contains(b.ReasonMessage, "internal") && tc.step != "" {
				t.Errorf("reason %q leaks the internal cause", b.ReasonMessage)
			}
			tpl := e.template(c.TemplateID)
			if tpl.Status != store.TemplateError {
				t.Errorf("template of a failed first build: %s, want error", tpl.Status)
			}
			if got := e.tags(c.TemplateID); len(got) != 0 {
				t.Errorf("failed build got tags %v", got)
			}
			entries := e.status(c, 0).Entries
			last := entries[len(entries)-1]
			if last.Level != "error" || last.Step != tc.step || !strings.Contains(last.Message, tc.msgContain) {
				t.Errorf("last log entry %+v", last)
			}
			// The name does not resolve to a failed template.
			if _, _, err := e.drv.ResolveTemplate(e.ctx, "broken"); !errdefs.Is(err, errdefs.KindNotFound) {
				t.Errorf("resolve a failed template: %v, want NotFound", err)
			}
			// A later good build recovers it.
			good := e.build("broken")
			if tpl := e.template(c.TemplateID); tpl.Status != store.TemplateReady || tpl.BuildID != good.BuildID {
				t.Errorf("template after a good rebuild: %s on %s, want ready on %s", tpl.Status, tpl.BuildID, good.BuildID)
			}
		})
	}
}

func TestFailedRebuildKeepsTemplate(t *testing.T) {
	e := newEnv(t, nil)
	good := e.build("keep:v1")
	c := e.create("keep")
	gate := make(chan struct{})
	e.eng.setPlan(c.BuildID, plan{gate: gate, err: &build.StepError{Step: "2", Msg: "exit 1"}})
	e.start(c, templates.StartSpec{})
	e.entered(c.BuildID)
	if st := e.status(c, 0); st.Build.Status != store.TemplateBuilding {
		t.Errorf("rebuild: %s, want building", st.Build.Status)
	}
	if tpl := e.template(c.TemplateID); tpl.Status != store.TemplateReady || tpl.BuildID != good.BuildID {
		t.Errorf("template during a rebuild: %s on %s, want ready on %s", tpl.Status, tpl.BuildID, good.BuildID)
	}
	close(gate)
	if b := e.wait(c); b.Status != store.TemplateError || b.ReasonMessage != "step 2: exit 1" {
		t.Errorf("rebuild: %s %q, want error \"step 2: exit 1\"", b.Status, b.ReasonMessage)
	}
	if tpl := e.template(c.TemplateID); tpl.Status != store.TemplateReady || tpl.BuildID != good.BuildID {
		t.Errorf("template after a failed rebuild: %s on %s, want ready on %s", tpl.Status, tpl.BuildID, good.BuildID)
	}
	want := map[string]string{"default": good.BuildID, "v1": good.BuildID}
	if got := e.tags(c.TemplateID); !mapsEqual(got, want) {
		t.Errorf("tags after a failed rebuild %v, want %v", got, want)
	}
	if tpl, _, err := e.drv.ResolveTemplate(e.ctx, "keep"); err != nil || tpl.BuildID != good.BuildID {
		t.Errorf("resolve keep: build %s, %v; want %s", tpl.BuildID, err, good.BuildID)
	}
}

func TestRecover(t *testing.T) {
	e := newEnv(t, nil)
	now := time.Now().UTC()
	put := func(tpl store.Template, builds ...store.Build) {
		t.Helper()
		tpl.CPU, tpl.MemoryMB, tpl.CreatedAt, tpl.UpdatedAt = 2, 512, now, now
		if err := e.st.PutTemplate(e.ctx, tpl); err != nil {
			t.Fatal(err)
		}
		for _, b := range builds {
			b.TemplateID, b.CPU, b.MemoryMB, b.CreatedAt, b.UpdatedAt = tpl.ID, 2, 512, now, now
			if err := e.st.PutBuild(e.ctx, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A first build that was running, and a rebuild of a ready template that was running.
	put(store.Template{ID: "interruptedtpl000001", Aliases: []string{"interrupted"}, BuildID: "ib1", Status: store.TemplateBuilding},
		store.Build{ID: "ib1", Status: store.TemplateBuilding})
	put(store.Template{ID: "readytemplate0000001", Aliases: []string{"stillready"}, BuildID: "rb1", Status: store.TemplateBuilding},
		store.Build{ID: "rb1", Status: store.TemplateReady}, store.Build{ID: "rb2", Status: store.TemplateBuilding},
		store.Build{ID: "rb3", Status: store.TemplateWaiting})
	if err := e.st.SetTags(e.ctx, "readytemplate0000001", "rb1", []string{"default"}, now); err != nil {
		t.Fatal(err)
	}

	svc := e.newService(nil) // runs Recover
	for _, tc := range []struct {
		tid, bid string
		want     store.TemplateStatus
	}{
		{"interruptedtpl000001", "ib1", store.TemplateError},
		{"readytemplate0000001", "rb1", store.TemplateReady},
		{"readytemplate0000001", "rb2", store.TemplateError},
		// Never started: its start may still come, through this driver or another.
		{"readytemplate0000001", "rb3", store.TemplateWaiting},
	} {
		st, err := svc.Status(e.ctx, tc.tid, tc.bid, 0)
		if err != nil {
			t.Fatal(err)
		}
		if st.Build.Status != tc.want {
			t.Errorf("build %s after Recover: %s, want %s", tc.bid, st.Build.Status, tc.want)
		}
		if tc.want == store.TemplateError && !strings.Contains(st.Build.ReasonMessage, "interrupted") {
			t.Errorf("build %s reason %q", tc.bid, st.Build.ReasonMessage)
		}
	}
	if tpl := e.template("interruptedtpl000001"); tpl.Status != store.TemplateError {
		t.Errorf("template whose only build was interrupted: %s, want error", tpl.Status)
	}
	if tpl := e.template("readytemplate0000001"); tpl.Status != store.TemplateReady {
		t.Errorf("template with a good build: %s, want ready", tpl.Status)
	}
	err := svc.StartBuild(e.ctx, "readytemplate0000001", "rb2", templates.StartSpec{})
	wantKind(t, "start an interrupted build", err, errdefs.KindConflict)
}

func TestUploads(t *testing.T) {
	e := newEnv(t, nil)
	c := e.create("files")
	other := e.create("other")
	body := []byte("archive contents")
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	otherHash := strings.Repeat("0", 64)

	present, token, err := e.svc.FileStatus(e.ctx, c.TemplateID, hash)
	if err != nil {
		t.Fatal(err)
	}
	if present || len(token) < 32 {
		t.Fatalf("FileStatus = %v, %q; want absent with a token", present, token)
	}
	_, token2, err := e.svc.FileStatus(e.ctx, c.TemplateID, hash)
	if err != nil || token2 == token {
		t.Errorf("second FileStatus token %q (%v), want a fresh one", token2, err)
	}
	_, _, err = e.svc.FileStatus(e.ctx, c.TemplateID, "nothex")
	wantKind(t, "FileStatus bad hash", err, errdefs.KindInvalidArgument)
	_, _, err = e.svc.FileStatus(e.ctx, "nosuchtemplate", hash)
	wantKind(t, "FileStatus unknown template", err, errdefs.KindNotFound)

	upload := func(tid, h, tok string, data []byte, size int64) error {
		return e.svc.Upload(e.ctx, tid, h, tok, bytes.NewReader(data), size)
	}
	n := int64(len(body))
	for _, tc := range []struct {
		name string
		err  error
		kind errdefs.Kind
	}{
		{"wrong token", upload(c.TemplateID, hash, strings.Repeat("f", len(token)), body, n), errdefs.KindUnauthorized},
		{"empty token", upload(c.TemplateID, hash, "", body, n), errdefs.KindUnauthorized},
		{"token prefix", upload(c.TemplateID, hash, token[:len(token)-1], body, n), errdefs.KindUnauthorized},
		{"other hash", upload(c.TemplateID, otherHash, token, body, n), errdefs.KindUnauthorized},
		{"other template", upload(other.TemplateID, hash, token, body, n), errdefs.KindUnauthorized},
		{"short body", upload(c.TemplateID, hash, token, body[:5], n), errdefs.KindInvalidArgument},
		{"long body", upload(c.TemplateID, hash, token, append(slices.Clone(body), 'x'), n), errdefs.KindInvalidArgument},
		{"no length", upload(c.TemplateID, hash, token, body, -1), errdefs.KindInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) { wantKind(t, tc.name, tc.err, tc.kind) })
	}
	if ok, err := e.files.Has(e.ctx, c.TemplateID, hash); err != nil || ok {
		t.Fatalf("a refused upload was stored (%v, %v)", ok, err)
	}
	if err := upload(c.TemplateID, hash, token, body, n); err != nil {
		t.Fatalf("upload: %v", err)
	}
	if ok, err := e.files.Has(e.ctx, c.TemplateID, hash); err != nil || !ok {
		t.Fatalf("upload not stored (%v, %v)", ok, err)
	}
	f, err := e.files.Open(e.ctx, c.TemplateID, hash)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got bytes.Buffer
	if _, err := got.ReadFrom(f); err != nil || !bytes.Equal(got.Bytes(), body) {
		t.Errorf("stored %q (%v), want %q", got.Bytes(), err, body)
	}
	if present, _, err := e.svc.FileStatus(e.ctx, c.TemplateID, hash); err != nil || !present {
		t.Errorf("FileStatus after upload: %v, %v; want present", present, err)
	}
	// The token is not valid for another template's copy of the same hash either.
	if ok, _ := e.files.Has(e.ctx, other.TemplateID, hash); ok {
		t.Error("upload stored under the other template")
	}
}

func TestUploadTokenExpires(t *testing.T) {
	e := newEnv(t, func(o *templates.Options) { o.UploadTTL = time.Millisecond })
	c := e.create("files")
	hash := strings.Repeat("ab", 32)
	_, token, err := e.svc.FileStatus(e.ctx, c.TemplateID, hash)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // let the 1 ms token expire (a logical expiry, not a timing assertion)
	err = e.svc.Upload(e.ctx, c.TemplateID, hash, token, strings.NewReader("x"), 1)
	wantKind(t, "expired token", err, errdefs.KindUnauthorized)
	if ok, _ := e.files.Has(e.ctx, c.TemplateID, hash); ok {
		t.Error("an upload with an expired token was stored")
	}
}

func TestDelete(t *testing.T) {
	e := newEnv(t, nil)
	wantKind(t, "delete base", e.svc.Delete(e.ctx, "base"), errdefs.KindInvalidArgument)
	wantKind(t, "delete base by name:tag", e.svc.Delete(e.ctx, "base:default"), errdefs.KindInvalidArgument)
	wantKind(t, "delete unknown", e.svc.Delete(e.ctx, "nope"), errdefs.KindNotFound)
	wantKind(t, "delete bad name", e.svc.Delete(e.ctx, "bad name"), errdefs.KindNotFound)
	if _, err := template.Load(e.dir, template.BaseID); err != nil {
		t.Fatalf("base template damaged: %v", err)
	}

	// A template with a running build cannot be deleted, by name or id.
	done := e.build("gone:v1")
	c := e.create("gone")
	gate := make(chan struct{})
	e.eng.setPlan(c.BuildID, plan{gate: gate})
	e.start(c, templates.StartSpec{})
	e.entered(c.BuildID)
	wantKind(t, "delete while building", e.svc.Delete(e.ctx, "gone"), errdefs.KindConflict)
	wantKind(t, "delete while building, by id", e.svc.Delete(e.ctx, c.TemplateID), errdefs.KindConflict)
	close(gate)
	e.wait(c)

	hash := strings.Repeat("cd", 32)
	_, token, err := e.svc.FileStatus(e.ctx, c.TemplateID, hash)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Upload(e.ctx, c.TemplateID, hash, token, strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	uploads := filepath.Join(e.dir, "build-files", c.TemplateID)
	if _, err := os.Stat(uploads); err != nil {
		t.Fatalf("uploads dir: %v", err)
	}
	// A created but never started build does not block a delete.
	waiting := e.create("gone")

	if err := e.svc.Delete(e.ctx, "ns/Gone:v1"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := e.st.GetTemplate(e.ctx, c.TemplateID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("GetTemplate after Delete: %v, want NotFound", err)
	}
	for _, bid := range []string{done.BuildID, c.BuildID, waiting.BuildID} {
		if _, err := e.st.GetBuild(e.ctx, c.TemplateID, bid); !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("GetBuild(%s) after Delete: %v, want NotFound", bid, err)
		}
		if _, err := template.LoadBuild(e.dir, c.TemplateID, bid); err == nil {
			t.Errorf("LoadBuild(%s) after Delete succeeded", bid)
		}
	}
	if got := e.tags(c.TemplateID); len(got) != 0 {
		t.Errorf("tags after Delete: %v", got)
	}
	if _, err := os.Stat(uploads); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("uploads dir after Delete: %v, want gone", err)
	}
	if _, err := os.Stat(template.Dir(e.dir, c.TemplateID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("template dir after Delete: %v, want gone", err)
	}
	err = e.svc.StartBuild(e.ctx, waiting.TemplateID, waiting.BuildID, templates.StartSpec{})
	wantKind(t, "start a build of a deleted template", err, errdefs.KindNotFound)
	wantKind(t, "delete again", e.svc.Delete(e.ctx, "gone"), errdefs.KindNotFound)
	if _, _, err := e.drv.ResolveTemplate(e.ctx, "gone"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("resolve a deleted template: %v, want NotFound", err)
	}

	// The name is free again, for a new template.
	again := e.create("gone")
	if again.TemplateID == c.TemplateID {
		t.Errorf("a new template reused deleted id %s", again.TemplateID)
	}

	// Deleting a template whose build waits to start drops it.
	w := e.create("waiter")
	if err := e.svc.Delete(e.ctx, w.TemplateID); err != nil {
		t.Fatalf("Delete with a waiting build: %v", err)
	}
	if _, err := e.st.GetTemplate(e.ctx, w.TemplateID); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("GetTemplate after Delete: %v, want NotFound", err)
	}
}

func TestLayerCollection(t *testing.T) {
	e := newEnv(t, nil)
	if calls, _ := e.eng.gcCount(); calls != 1 {
		t.Fatalf("GC ran %d times at Recover, want 1", calls)
	}
	e.build("victim")
	if calls, _ := e.eng.gcCount(); calls != 1 {
		t.Errorf("GC ran %d times after a build, want still 1", calls)
	}

	// While a build runs, a delete skips collection.
	busy := e.create("busy")
	gate := make(chan struct{})
	e.eng.setPlan(busy.BuildID, plan{gate: gate})
	e.start(busy, templates.StartSpec{})
	e.entered(busy.BuildID)
	if err := e.svc.Delete(e.ctx, "victim"); err != nil {
		t.Fatal(err)
	}
	if calls, _ := e.eng.gcCount(); calls != 1 {
		t.Errorf("GC ran %d times after a delete during a build, want still 1", calls)
	}
	close(gate)
	e.wait(busy)

	e.build("victim2")
	if err := e.svc.Delete(e.ctx, "victim2"); err != nil {
		t.Fatal(err)
	}
	if calls, during := e.eng.gcCount(); calls != 2 || during != 0 {
		t.Errorf("GC ran %d times (%d during a build), want 2 (0)", calls, during)
	}
	// A refused delete collects nothing.
	wantKind(t, "delete base", e.svc.Delete(e.ctx, "base"), errdefs.KindInvalidArgument)
	if calls, _ := e.eng.gcCount(); calls != 2 {
		t.Errorf("GC ran %d times after a refused delete, want 2", calls)
	}
}
