package build

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/fsroot"
	"github.com/vibemon/vmon/internal/rootfs"
	"github.com/vibemon/vmon/internal/template"
)

type hostMounts struct{}

func (hostMounts) Prepare(ctx context.Context, lowers []string, dir string) (string, error) {
	return rootfs.Prepare(ctx, lowers, dir, rootfs.Options{})
}
func (hostMounts) Commit(ctx context.Context, dir, dst string) error {
	return rootfs.Commit(ctx, dir, dst)
}
func (hostMounts) Release(ctx context.Context, dir string) error { return rootfs.Release(ctx, dir) }

// noSandboxes fails the test if a step needs a sandbox: the steps used here run on the host.
type noSandboxes struct{ t *testing.T }

func (n noSandboxes) StartBuild(context.Context, SandboxSpec) (Sandbox, error) {
	n.t.Error("a build sandbox was started for a host-side step")
	return nil, errors.New("no sandboxes in this test")
}

func newTestEngine(t *testing.T) (*Engine, string, *Parent) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("builds mount overlays and must run as root (CI runs them as root)")
	}
	data := t.TempDir()
	base := filepath.Join(data, "parent")
	for _, d := range []string{"etc", "home/user", "tmp"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(base, "home/user"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "etc/passwd"),
		[]byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{DataDir: data, Sandboxes: noSandboxes{t}, Mounts: hostMounts{}, Files: NewFiles(data)})
	if err != nil {
		t.Fatal(err)
	}
	return e, data, &Parent{TemplateID: "parent", BuildID: "p1", Layers: []string{"parent"},
		Env: map[string]string{"FROM_PARENT": "1"}, User: "user", Workdir: "/home/user"}
}

func upload(t *testing.T, e *Engine, tpl, hash string, r *bytes.Reader) {
	t.Helper()
	if err := e.opts.Files.Put(context.Background(), tpl, hash, r, r.Size()); err != nil {
		t.Fatal(err)
	}
}

const hashA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

func TestEngineHostStepsAndCache(t *testing.T) {
	e, data, parent := newTestEngine(t)
	ctx := context.Background()
	upload(t, e, "tpl", hashA, makeTar(t, true, tarEntry{name: "app", dir: true}, tarEntry{name: "app/main.txt", body: "main"}))
	req := Request{TemplateID: "tpl", BuildID: "b1", FromTemplate: parent, CPUs: 1, MemoryMB: 256, Steps: []Step{
		{Type: "COPY", Args: []string{"app", "srv/app", "", "0640"}, FilesHash: hashA},
		{Type: "ENV", Args: []string{"A", "1", "B", "two words"}},
		{Type: "WORKDIR", Args: []string{"/work/dir"}},
		{Type: "USER", Args: []string{"root"}},
	}}
	log1 := memLog(t)
	m, err := e.Run(ctx, req, log1)
	if err != nil {
		t.Fatal(err)
	}
	if m.DefaultUser != "root" || m.DefaultWorkdir != "/work/dir" || m.Env["A"] != "1" || m.Env["B"] != "two words" ||
		m.Env["FROM_PARENT"] != "1" {
		t.Fatalf("manifest = %+v", m)
	}
	// COPY and WORKDIR add layers; ENV and USER do not.
	if len(m.Layers) != 3 || m.Layers[2] != "parent" {
		t.Fatalf("layers = %v", m.Layers)
	}
	// The relative dest resolved against the parent's workdir; the files are the user's.
	root := mountLayers(t, data, m.Layers)
	if st, err := root.Stat("/home/user/srv/app/main.txt"); err != nil || st.Uid != 1000 || st.Mode&0o777 != 0o640 {
		t.Fatalf("copied file: %+v %v", st, err)
	}
	if st, err := root.Stat("/work/dir"); err != nil || st.Mode&0o170000 != 0o040000 {
		t.Fatalf("workdir: %v", err)
	}
	got, err := template.LoadBuild(data, "tpl", "b1")
	if err != nil || got.DefaultUser != "root" {
		t.Fatalf("LoadBuild = %+v, %v", got, err)
	}

	// The same steps again: every one is cached and the layers are the same directories.
	req.BuildID = "b2"
	log2 := memLog(t)
	m2, err := e.Run(ctx, req, log2)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(m2.Layers, ",") != strings.Join(m.Layers, ",") {
		t.Fatalf("cached build layers %v, first build %v", m2.Layers, m.Layers)
	}
	if n := countMsg(log2, "CACHED ["); n != 4 {
		t.Fatalf("%d cached steps, want 4:\n%s", n, dump(log2))
	}
	// Changing step 3 reuses steps 1-2 and redoes 3-4.
	req.BuildID, req.Steps[2].Args = "b3", []string{"/other"}
	log3 := memLog(t)
	m3, err := e.Run(ctx, req, log3)
	if err != nil {
		t.Fatal(err)
	}
	if n := countMsg(log3, "CACHED ["); n != 2 || m3.Layers[1] != m.Layers[1] || m3.Layers[0] == m.Layers[0] {
		t.Fatalf("partial cache: %d cached, layers %v vs %v", n, m3.Layers, m.Layers)
	}
	// force: nothing is reused.
	req.BuildID, req.Force = "b4", true
	log4 := memLog(t)
	m4, err := e.Run(ctx, req, log4)
	if err != nil {
		t.Fatal(err)
	}
	if n := countMsg(log4, "CACHED"); n != 0 || m4.Layers[1] == m.Layers[1] {
		t.Fatalf("forced build reused %d steps (layers %v)", n, m4.Layers)
	}
}

func TestEngineFailures(t *testing.T) {
	e, data, parent := newTestEngine(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  Request
		step string
		msg  string
	}{
		{"copy without upload", Request{Steps: []Step{{Type: "ENV", Args: []string{"A", "1"}},
			{Type: "COPY", Args: []string{"x", "/x"}, FilesHash: hashA}}}, "2", "never uploaded"},
		{"unknown user", Request{Steps: []Step{{Type: "USER", Args: []string{"ghost"}}}}, "finalize", `user "ghost" does not exist`},
		{"copy as unknown user", Request{Steps: []Step{{Type: "COPY", Args: []string{"x", "/x", "ghost"}, FilesHash: hashA}}},
			"1", "ghost"},
		{"invalid step", Request{Steps: []Step{{Type: "EXPOSE", Args: []string{"80"}}}}, "base", "unknown step type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "copy as unknown user" {
				upload(t, e, "bad", hashA, makeTar(t, false, tarEntry{name: "x", body: "x"}))
			}
			req := tc.req
			req.TemplateID, req.BuildID, req.FromTemplate = "bad", "f-"+strings.ReplaceAll(tc.name, " ", "-"), parent
			_, err := e.Run(ctx, req, memLog(t))
			var se *StepError
			if !errors.As(err, &se) || se.Step != tc.step || !strings.Contains(se.Msg, tc.msg) {
				t.Fatalf("err = %v, want step %s mentioning %q", err, tc.step, tc.msg)
			}
			if _, err := template.LoadBuild(data, "bad", req.BuildID); err == nil {
				t.Fatal("a failed build left a manifest")
			}
		})
	}
	// Nothing is left mounted or half-written.
	if ents, _ := os.ReadDir(filepath.Join(data, scratchDir)); len(ents) != 0 {
		t.Fatalf("scratch left behind: %v", ents)
	}
	ents, _ := os.ReadDir(filepath.Join(data, LayersDir))
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), ".tmp-") {
			t.Fatalf("unfinished layer left behind: %s", ent.Name())
		}
	}
}

func TestStepValidation(t *testing.T) {
	for _, tc := range []struct {
		step Step
		ok   bool
	}{
		{Step{Type: "RUN", Args: []string{"echo hi"}}, true},
		{Step{Type: "run", Args: []string{"echo hi", "root"}}, true},
		{Step{Type: "RUN", Args: []string{""}}, false},
		{Step{Type: "RUN", Args: []string{"x", "bad user!"}}, false},
		{Step{Type: "COPY", Args: []string{"a", "/b", "", "0755"}, FilesHash: hashA}, true},
		{Step{Type: "COPY", Args: []string{"a", "/b"}}, false},
		{Step{Type: "COPY", Args: []string{"a", "/b", "", "999"}, FilesHash: hashA}, false},
		{Step{Type: "ENV", Args: []string{"A", "1", "B"}}, false},
		{Step{Type: "ENV", Args: []string{"1A", "1"}}, false},
		{Step{Type: "WORKDIR", Args: []string{"rel/dir"}}, true},
		{Step{Type: "USER", Args: []string{"1000:1000"}}, true},
		{Step{Type: "USER", Args: []string{}}, false},
		{Step{Type: "HEALTHCHECK", Args: []string{"x"}}, false},
	} {
		if err := tc.step.validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: err = %v, want ok=%v", tc.step, err, tc.ok)
		}
	}
	a, same := Step{Type: "RUN", Args: []string{"echo"}}, Step{Type: "run", Args: []string{"echo"}}
	if a.key("p") != same.key("p") || a.key("p") == a.key("q") || a.key("p") == (Step{Type: "RUN", Args: []string{"echo "}}).key("p") {
		t.Fatal("step keys are not a function of parent and step")
	}
	tooMany := Request{FromImage: "x", Steps: make([]Step, MaxSteps+1)}
	if err := tooMany.Validate(); err == nil {
		t.Fatal("too many steps accepted")
	}
}

func TestProvision(t *testing.T) {
	dir, root := openRoot(t)
	if err := os.MkdirAll(filepath.Join(dir, "etc/sudoers.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/sudoers"), nil, 0o440); err != nil {
		t.Fatal(err)
	}
	// uid 1000 is taken: the default user gets the next free one.
	if err := os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("app:x:1000:1000::/home/app:/bin/sh"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := provision(root, t.Logf); err != nil {
		t.Fatal(err)
	}
	uid, gid, err := lookupUser(root, DefaultUser)
	if err != nil || uid != 1001 || gid != 1001 {
		t.Fatalf("user = %d:%d, %v", uid, gid, err)
	}
	if _, _, err := lookupUser(root, "root"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"home/user", "tmp", "etc/hosts", "etc/resolv.conf", "etc/sudoers.d/90-vmon-user"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dir, "tmp")); fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode = %v", fi.Mode())
	}
	before := readIn(t, dir, "etc/passwd")
	if err := provision(root, t.Logf); err != nil {
		t.Fatal(err)
	}
	if readIn(t, dir, "etc/passwd") != before {
		t.Fatal("provisioning twice changed /etc/passwd")
	}
}

func memLog(t *testing.T) *Log {
	t.Helper()
	l, err := NewLog(filepath.Join(t.TempDir(), "log.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func countMsg(l *Log, prefix string) int {
	n := 0
	for _, e := range l.Since(0, 1<<30) {
		if strings.HasPrefix(e.Message, prefix) {
			n++
		}
	}
	return n
}

func dump(l *Log) string {
	var b strings.Builder
	for _, e := range l.Since(0, 1<<30) {
		b.WriteString(e.Step + ": " + e.Message + "\n")
	}
	return b.String()
}

// mountLayers mounts a layer stack read-write in a scratch dir for inspection.
func mountLayers(t *testing.T, data string, layers []string) *fsroot.Root {
	t.Helper()
	abs := make([]string, len(layers))
	for i, l := range layers {
		abs[i] = filepath.Join(data, l)
	}
	dir := filepath.Join(t.TempDir(), "view")
	merged, err := rootfs.Prepare(context.Background(), abs, dir, rootfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rootfs.Release(context.Background(), dir) })
	r, err := fsroot.Open(merged)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestGCKeepsWhatBuildsAndSandboxesUse(t *testing.T) {
	e, data, parent := newTestEngine(t)
	ctx := context.Background()
	req := func(id, dir string) Request {
		return Request{TemplateID: id, BuildID: id + "-b", FromTemplate: parent, Steps: []Step{{Type: "WORKDIR", Args: []string{dir}}}}
	}
	keep, err := e.Run(ctx, req("keep", "/kept"), memLog(t))
	if err != nil {
		t.Fatal(err)
	}
	gone, err := e.Run(ctx, req("gone", "/gone"), memLog(t))
	if err != nil {
		t.Fatal(err)
	}
	mounted, err := e.Run(ctx, req("mounted", "/mounted"), memLog(t))
	if err != nil {
		t.Fatal(err)
	}
	// A sandbox still runs on "mounted" after its template is deleted.
	mountLayers(t, data, mounted.Layers)
	for _, id := range []string{"gone", "mounted"} {
		if err := template.RemoveBuilds(data, id); err != nil {
			t.Fatal(err)
		}
	}
	n, err := e.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	exists := func(rel string) bool { _, err := os.Stat(filepath.Join(data, rel)); return err == nil }
	if n != 1 || exists(gone.Layers[0]) || !exists(keep.Layers[0]) || !exists(mounted.Layers[0]) || !exists("parent") {
		t.Fatalf("GC removed %d; gone %v kept %v mounted %v", n, exists(gone.Layers[0]), exists(keep.Layers[0]), exists(mounted.Layers[0]))
	}
	// The collected step is no longer a cache hit; the kept one still is.
	log := memLog(t)
	if _, err := e.Run(ctx, Request{TemplateID: "again", BuildID: "again-b", FromTemplate: parent, Steps: []Step{
		{Type: "WORKDIR", Args: []string{"/kept"}}}}, log); err != nil || countMsg(log, "CACHED [") != 1 {
		t.Fatalf("kept step not cached: %v\n%s", err, dump(log))
	}
	log = memLog(t)
	if _, err := e.Run(ctx, req("gone2", "/gone"), log); err != nil || countMsg(log, "CACHED [") != 0 {
		t.Fatalf("collected step still cached: %v\n%s", err, dump(log))
	}
}

// startSandboxes hands out build sandboxes whose start check passes and which save themselves as
// a directory with one file.
type startSandboxes struct {
	starts int
	// unmarked counts start checks asked for without SandboxSpec.Start.
	unmarked int
}

func (s *startSandboxes) StartBuild(_ context.Context, spec SandboxSpec) (Sandbox, error) {
	s.starts++
	if !spec.Start {
		s.unmarked++
	}
	return startSandbox{}, nil
}

type startSandbox struct{}

func (startSandbox) Run(context.Context, string, string, string, map[string]string, func(bool, []byte)) (int, error) {
	return 0, errors.New("no steps run in this test")
}
func (startSandbox) CheckStart(context.Context, string, string, string, string, time.Duration, func(int, []byte)) error {
	return nil
}
func (startSandbox) Commit(context.Context, string) error {
	return errors.New("no commits in this test")
}
func (startSandbox) Discard(context.Context) error { return nil }
func (startSandbox) CheckpointStart(_ context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "checkpoint"), []byte("started"), 0o644)
}

// --template-start-snapshots is honoured whatever the cache holds: off, a cached started snapshot
// is not used; on again, a start check cached without one is done again to make it.
func TestStartSnapshotCacheFollowsTheSetting(t *testing.T) {
	e, _, parent := newTestEngine(t)
	sbs := &startSandboxes{}
	e.opts.Sandboxes = sbs
	ctx := context.Background()
	build := func(id string, snapshots bool) (template.Manifest, *Log) {
		t.Helper()
		e.opts.NoStartSnapshot = !snapshots
		log := memLog(t)
		m, err := e.Run(ctx, Request{TemplateID: "tpl", BuildID: id, FromTemplate: parent, CPUs: 1, MemoryMB: 256,
			StartCmd: "serve", ReadyCmd: "true"}, log)
		if err != nil {
			t.Fatal(err)
		}
		return m, log
	}
	if m, _ := build("b1", false); m.StartSnapshot != "" || sbs.starts != 1 {
		t.Fatalf("snapshots off: snapshot %q after %d checks", m.StartSnapshot, sbs.starts)
	}
	m2, _ := build("b2", true)
	if m2.StartSnapshot == "" || sbs.starts != 2 {
		t.Fatalf("snapshots on after a check cached without one: snapshot %q after %d checks", m2.StartSnapshot, sbs.starts)
	}
	if m, log := build("b3", false); m.StartSnapshot != "" || sbs.starts != 2 || countMsg(log, "CACHED start command") != 1 {
		t.Fatalf("snapshots off with one cached: snapshot %q after %d checks:\n%s", m.StartSnapshot, sbs.starts, dump(log))
	}
	if m, _ := build("b4", true); m.StartSnapshot != m2.StartSnapshot || sbs.starts != 2 {
		t.Fatalf("snapshots on with one cached: snapshot %q (cached %q) after %d checks", m.StartSnapshot, m2.StartSnapshot, sbs.starts)
	}
}

// The start check's sandbox is marked as such (the node boots it as the template's sandboxes),
// and a node that boots start checks another way (StartOn) checks the start command again on a
// rebuild, while switching back finds the overlay's check cached under its old key.
func TestStartCheckFollowsStartOn(t *testing.T) {
	e, _, parent := newTestEngine(t)
	sbs := &startSandboxes{}
	e.opts.Sandboxes = sbs
	ctx := context.Background()
	build := func(id, on string) template.Manifest {
		t.Helper()
		e.opts.StartOn = on
		m, err := e.Run(ctx, Request{TemplateID: "tpl", BuildID: id, FromTemplate: parent, CPUs: 1, MemoryMB: 256,
			StartCmd: "serve", ReadyCmd: "true"}, memLog(t))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	overlay := build("b1", "")
	if sbs.starts != 1 || sbs.unmarked != 0 {
		t.Fatalf("%d start checks, %d not marked as the start check", sbs.starts, sbs.unmarked)
	}
	image := build("b2", "root-image format 2, disk 10240 MiB")
	if sbs.starts != 2 || image.StartSnapshot == overlay.StartSnapshot {
		t.Fatalf("a new StartOn: %d checks, snapshot %q (the overlay's %q)", sbs.starts, image.StartSnapshot, overlay.StartSnapshot)
	}
	if m := build("b3", "root-image format 2, disk 10240 MiB"); sbs.starts != 2 || m.StartSnapshot != image.StartSnapshot {
		t.Fatalf("the same StartOn: %d checks, snapshot %q (cached %q)", sbs.starts, m.StartSnapshot, image.StartSnapshot)
	}
	if m := build("b4", ""); sbs.starts != 2 || m.StartSnapshot != overlay.StartSnapshot {
		t.Fatalf("back to overlays: %d checks, snapshot %q (cached %q)", sbs.starts, m.StartSnapshot, overlay.StartSnapshot)
	}
}
