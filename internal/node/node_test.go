package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/envd/channel"
	"github.com/vibemon/vmon/internal/envd/gen/process"
	"github.com/vibemon/vmon/internal/envd/gen/process/processconnect"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
)

// fakeRuntime "runs" a sandbox by serving envd's channel (channel.RunControl on the control
// socket the node passed, or dialling the agent socket as envd did before) and answering /init.
type fakeRuntime struct {
	mu       sync.Mutex
	running  map[string]func() // id -> stop
	exits    map[string]chan runtime.Exit
	inits    map[string]map[string]any
	failNext error
	// events, when set, serves envd's events stream (agentproto.EventsPath).
	events http.Handler
	// mem is each sandbox's host memory use (MemoryUsage; absent: unknown); hints are the memory
	// hints each envd was sent; oldEnvd's envds do not know the hint endpoint.
	mem     map[string]uint64
	hints   map[string][]bool
	oldEnvd map[string]bool
	// dials, when set, holds every envd's dialling until it is closed (holdDials).
	dials chan struct{}
}

// holdDials keeps the envds from dialling the node until the returned func is called.
func (f *fakeRuntime) holdDials() (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.dials = ch
	return func() { close(ch) }
}

func (f *fakeRuntime) dialGate() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dials
}

func (f *fakeRuntime) MemoryUsage(id string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.mem[id]
	if !ok {
		return 0, errors.New("no memory cgroup")
	}
	return v, nil
}

func (f *fakeRuntime) setMem(id string, mib uint64) {
	f.mu.Lock()
	f.mem[id] = mib << 20
	f.mu.Unlock()
}

func (f *fakeRuntime) hintsOf(id string) []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bool(nil), f.hints[id]...)
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{running: map[string]func(){}, inits: map[string]map[string]any{},
		exits: map[string]chan runtime.Exit{}, mem: map[string]uint64{}, hints: map[string][]bool{}, oldEnvd: map[string]bool{}}
}

// exitChan returns the channel id's end is announced on.
func (f *fakeRuntime) exitChan(id string) chan runtime.Exit {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exitChanLocked(id)
}

func (f *fakeRuntime) exitChanLocked(id string) chan runtime.Exit {
	ch := f.exits[id]
	if ch == nil {
		ch = make(chan runtime.Exit, 1)
		f.exits[id] = ch
	}
	return ch
}

// crash ends sandbox id as if its runtime died on its own.
func (f *fakeRuntime) crash(id string, exit runtime.Exit) {
	f.mu.Lock()
	stop := f.running[id]
	delete(f.running, id)
	f.mu.Unlock()
	if stop != nil {
		stop()
	}
	f.exitChan(id) <- exit
}

func (f *fakeRuntime) Wait(ctx context.Context, id string) (runtime.Exit, error) {
	select {
	case e := <-f.exitChan(id):
		return e, nil
	case <-ctx.Done():
		return runtime.Exit{}, ctx.Err()
	}
}

func (f *fakeRuntime) Start(_ context.Context, spec runtime.Spec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failNext; err != nil {
		f.failNext = nil
		return err
	}
	if len(spec.Files) == 0 {
		f.running[spec.ID] = f.envd(spec.ID, filepath.Join(spec.Mounts[0].HostPath, agentproto.SocketName))
		return nil
	}
	// The control socket the node passed, as envd gets it: a descriptor of its own.
	fd, err := unix.Dup(int(spec.Files[0].Fd()))
	if err != nil {
		return err
	}
	ctl, err := agentctl.FromFile(os.NewFile(uintptr(fd), "control"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	handoff := f.handoffSocket(spec.ID)
	go func() {
		defer close(done)
		_ = channel.RunControl(ctx, channel.ControlOptions{Control: ctl, Handoff: handoff, Handler: f.handler(spec.ID)})
	}()
	f.running[spec.ID] = func() { cancel(); <-done }
	return nil
}

// handoffSocket is where sandbox id's envd takes a new control socket.
func (f *fakeRuntime) handoffSocket(id string) string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("vmon-node-test-%d", os.Getpid()), id, "handoff.sock")
}

// ExecFiles runs the only command the node runs with files, `envd handoff`: it hands the file to
// sandbox id's envd, unless holdDials holds envds back.
func (f *fakeRuntime) ExecFiles(_ context.Context, id string, files []*os.File, args ...string) ([]byte, error) {
	if len(args) < 2 || args[1] != "handoff" || len(files) != 1 {
		return nil, fmt.Errorf("fake runtime: unexpected exec %v", args)
	}
	if gate := f.dialGate(); gate != nil {
		select {
		case <-gate:
		default:
			return []byte("envd is not answering yet"), errors.New("exit status 1")
		}
	}
	if err := agentctl.Handoff(f.handoffSocket(id), files[0]); err != nil {
		return []byte(err.Error()), errors.New("exit status 1")
	}
	return nil, nil
}

// envd connects to the socket and keeps redialling, as envd did before the control socket.
func (f *fakeRuntime) envd(id, sock string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	handler := f.handler(id)
	go func() {
		for ctx.Err() == nil {
			if gate := f.dialGate(); gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return
				}
			}
			conn, err := net.Dial("unix", sock)
			if err != nil {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			sess, err := yamux.Server(conn, agentproto.YamuxConfig())
			if err != nil {
				conn.Close()
				continue
			}
			go func() { <-ctx.Done(); sess.Close() }()
			_ = (&http.Server{Handler: handler}).Serve(sess)
		}
	}()
	return cancel
}

// handler is sandbox id's envd: /init, commands, memory hints and events.
func (f *fakeRuntime) handler(id string) http.Handler {
	handler := http.NewServeMux()
	handler.HandleFunc("POST /init", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.inits[id] = body
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	path, h := processconnect.NewProcessHandler(fakeProcess{})
	handler.Handle(path, h)
	if !f.oldEnvd[id] {
		handler.HandleFunc("POST "+agentproto.MemoryHintPath, func(w http.ResponseWriter, r *http.Request) {
			var hint agentproto.MemoryHint
			if err := json.NewDecoder(r.Body).Decode(&hint); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			f.mu.Lock()
			f.hints[id] = append(f.hints[id], hint.Near)
			f.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		})
	}
	if f.events != nil {
		handler.Handle("GET "+agentproto.EventsPath, f.events)
	}
	return handler
}

// fakeProcess answers Start with a start and a successful end event, as envd does for `true`.
type fakeProcess struct {
	processconnect.UnimplementedProcessHandler
}

func (fakeProcess) Start(_ context.Context, _ *connect.Request[process.StartRequest], s *connect.ServerStream[process.StartResponse]) error {
	if err := s.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 1}}}}); err != nil {
		return err
	}
	return s.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}}}})
}

func (f *fakeRuntime) Status(_ context.Context, id string) (runtime.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.running[id]; ok {
		return runtime.StatusRunning, nil
	}
	return runtime.StatusNotFound, nil
}

func (f *fakeRuntime) Destroy(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if stop, ok := f.running[id]; ok {
		stop()
		delete(f.running, id)
		select {
		case f.exitChanLocked(id) <- runtime.Exit{Reason: runtime.ExitKilled, Code: -1, Signal: "SIGKILL"}:
		default:
		}
	}
	return nil
}

func (f *fakeRuntime) List(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.running {
		ids = append(ids, id)
	}
	return ids, nil
}

type fakeRootFS struct{}

// fakeRootFS keeps a sandbox's files in dir/root, which is its writable layer too.
func (fakeRootFS) Prepare(_ context.Context, _ []string, dir string, w Writable) (string, error) {
	root := filepath.Join(dir, "root")
	if w.From != "" {
		if w.Copy {
			return root, os.CopyFS(root, os.DirFS(filepath.Join(w.From, "upper")))
		}
		return root, os.Rename(filepath.Join(w.From, "upper"), root)
	}
	return root, os.MkdirAll(root, 0o755)
}
func (fakeRootFS) CopyWritable(_ context.Context, dir, dst string) error {
	return os.CopyFS(filepath.Join(dst, "upper"), os.DirFS(filepath.Join(dir, "root")))
}
func (fakeRootFS) Stash(_ context.Context, dir, dst string) error {
	return os.Rename(filepath.Join(dir, "root"), filepath.Join(dst, "upper"))
}
func (fakeRootFS) Release(_ context.Context, dir string) error {
	return os.RemoveAll(filepath.Join(dir, "root"))
}
func (fakeRootFS) Commit(_ context.Context, dir, dst string) error {
	return os.Rename(filepath.Join(dir, "root"), dst)
}

type fakeNetNS struct {
	mu    sync.Mutex
	names map[string]bool
}

func (f *fakeNetNS) Create(_ context.Context, name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names[name] = true
	return "/run/netns/" + name, nil
}
func (f *fakeNetNS) Delete(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.names, name)
	return nil
}
func (f *fakeNetNS) List(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

type fakeTemplates struct{}

func (fakeTemplates) Image(_ context.Context, id, _ string) (Image, error) {
	if id != "base" {
		return Image{}, errors.New("unknown template")
	}
	return Image{Lowers: []string{"/nonexistent/base"}}, nil
}

type env struct {
	dir string
	rt  *fakeRuntime
	// wrap, when set, is the runtime nodes get around rt.
	wrap runtime.Runtime
	ns   *fakeNetNS
	// guestLog, when set, follows handed-out sandboxes' events.
	guestLog GuestLog
}

func newEnv(t *testing.T) *env {
	// Agent socket paths must fit a unix address (108 bytes); t.TempDir() names are too long.
	dir, err := os.MkdirTemp("", "vn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &env{dir: dir, rt: newFakeRuntime(), ns: &fakeNetNS{names: map[string]bool{}}}
}

func (e *env) node(t *testing.T, warm []WarmSpec) *Node {
	t.Helper()
	var rt runtime.Runtime = e.rt
	if e.wrap != nil {
		rt = e.wrap
	}
	n, err := New(Options{
		DataDir: e.dir, Runtime: rt, RootFS: fakeRootFS{}, NetNS: e.ns, Templates: fakeTemplates{},
		EnvdPath: "/usr/local/bin/envd", BootTimeout: 5 * time.Second, Warm: warm, GuestLog: e.guestLog,
		Log: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	return n
}

// testLogger discards the node's log unless VMON_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("VMON_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func spec(id string) CreateSpec {
	return CreateSpec{ID: id, TemplateID: "base", CPUs: 2, MemoryMB: 512, AccessToken: "tok-" + id,
		DefaultUser: "user", EnvVars: map[string]string{"A": "1"}}
}

func (e *env) sandboxDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.dir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range ents {
		out = append(out, d.Name())
	}
	return out
}

func TestCreateDeliversInitAndDestroyCleansUp(t *testing.T) {
	e := newEnv(t)
	n := e.node(t, nil)
	ctx := context.Background()
	if _, err := n.CreateSandbox(ctx, spec("abc")); err != nil {
		t.Fatal(err)
	}
	e.rt.mu.Lock()
	init := e.rt.inits["abc"]
	e.rt.mu.Unlock()
	if init["accessToken"] != "tok-abc" || init["defaultUser"] != "user" {
		t.Fatalf("init body %v", init)
	}
	if _, ok := n.Channel("abc"); !ok {
		t.Fatal("no channel for a created sandbox")
	}
	if err := n.DestroySandbox(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if err := n.DestroySandbox(ctx, "abc"); err != nil {
		t.Fatalf("destroying a gone sandbox: %v", err)
	}
	if d := e.sandboxDirs(t); len(d) != 0 {
		t.Fatalf("left dirs %v", d)
	}
	if ns, _ := e.ns.List(ctx); len(ns) != 0 {
		t.Fatalf("left namespaces %v", ns)
	}
}

func TestFailedStartRollsBack(t *testing.T) {
	e := newEnv(t)
	n := e.node(t, nil)
	e.rt.failNext = errors.New("boom")
	if _, err := n.CreateSandbox(context.Background(), spec("abc")); err == nil {
		t.Fatal("create succeeded")
	}
	if d := e.sandboxDirs(t); len(d) != 0 {
		t.Fatalf("left dirs %v", d)
	}
	if ns, _ := e.ns.List(context.Background()); len(ns) != 0 {
		t.Fatalf("left namespaces %v", ns)
	}
	if _, err := n.CreateSandbox(context.Background(), spec("BAD-id")); err == nil {
		t.Fatal("invalid id accepted")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWarmPoolHandsOutMatchingShapeAndRefills(t *testing.T) {
	e := newEnv(t)
	n := e.node(t, []WarmSpec{{TemplateID: "base", CPUs: 2, MemoryMB: 512, Size: 1}})
	n.StartWarmPool()
	ready := func() int {
		n.pool.mu.Lock()
		defer n.pool.mu.Unlock()
		return len(n.pool.ready[0])
	}
	waitFor(t, "the pool to fill", func() bool { return ready() == 1 })
	n.pool.mu.Lock()
	warmID := n.pool.ready[0][0].runtimeID
	n.pool.mu.Unlock()

	// Another shape boots fresh and leaves the pool alone.
	other := spec("big")
	other.MemoryMB = 1024
	if _, err := n.CreateSandbox(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	if ready() != 1 {
		t.Fatal("a create of another shape took the warm sandbox")
	}
	if got := n.WarmPool(); len(got) != 1 || got[0] != (WarmPoolStats{TemplateID: "base", Size: 1, Ready: 1}) {
		t.Fatalf("pool stats after a create of another shape: %+v, want it neither a hit nor a miss", got)
	}
	// The matching shape gets the pre-started one, bound to its API id.
	if _, err := n.CreateSandbox(context.Background(), spec("abc")); err != nil {
		t.Fatal(err)
	}
	sb, _ := n.lookup("abc")
	if sb.runtimeID != warmID {
		t.Fatalf("abc runs as %s, want the warm %s", sb.runtimeID, warmID)
	}
	b, err := os.ReadFile(filepath.Join(e.dir, "sandboxes", warmID, sandboxIDFile))
	if err != nil || string(b) != "abc" {
		t.Fatalf("sandbox-id file: %q %v", b, err)
	}
	if got := n.WarmPool()[0]; got.Hits != 1 || got.Misses != 0 {
		t.Fatalf("pool stats after a warm create: %+v, want 1 hit", got)
	}
	waitFor(t, "the pool to refill", func() bool { return ready() == 1 })

	// Destroy by API id reaches the runtime id.
	if err := n.DestroySandbox(context.Background(), "abc"); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.rt.Status(context.Background(), warmID); st != runtime.StatusNotFound {
		t.Fatalf("warm runtime still %v", st)
	}
	// Close destroys the unclaimed pre-started sandbox but keeps handed-out ones.
	if err := n.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids, _ := e.rt.List(context.Background())
	if len(ids) != 1 || ids[0] != "big" {
		t.Fatalf("after Close runtime has %v, want only [big]", ids)
	}
}

// A create of a pooled shape that finds the pool empty boots its own sandbox and counts as a miss
// (the pool here never fills: its refill loop is not started).
func TestWarmPoolCountsAMissWhenEmpty(t *testing.T) {
	e := newEnv(t)
	n := e.node(t, []WarmSpec{{TemplateID: "base", CPUs: 2, MemoryMB: 512, Size: 1}})
	if _, err := n.CreateSandbox(context.Background(), spec("abc")); err != nil {
		t.Fatal(err)
	}
	if got := n.WarmPool(); len(got) != 1 || got[0] != (WarmPoolStats{TemplateID: "base", Size: 1, Misses: 1}) {
		t.Fatalf("pool stats: %+v, want one miss and nothing ready", got)
	}
	if sb, ok := n.lookup("abc"); !ok || sb.runtimeID != "abc" {
		t.Fatal("the missed create did not boot its own sandbox")
	}
}

func TestRecoverAdoptsHandedOutAndDiscardsTheRest(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	n1 := e.node(t, []WarmSpec{{TemplateID: "base", CPUs: 2, MemoryMB: 512, Size: 1}})
	n1.StartWarmPool()
	for _, id := range []string{"alive", "dead"} {
		if _, err := n1.CreateSandbox(ctx, spec(id)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the pool to fill", func() bool {
		n1.pool.mu.Lock()
		defer n1.pool.mu.Unlock()
		return len(n1.pool.ready[0]) == 1
	})
	// The previous process dies without cleaning up; one sandbox's runtime dies with it and an
	// orphan namespace is left behind.
	n1.pool.mu.Lock()
	n1.pool.cancel()
	n1.pool.cancel = nil
	n1.pool.mu.Unlock()
	for _, id := range []string{"alive", "dead"} {
		sb, _ := n1.lookup(id)
		sb.ch.Close()
	}
	deadRID := func() string { sb, _ := n1.lookup("dead"); return sb.runtimeID }()
	_ = e.rt.Destroy(ctx, deadRID)
	_, _ = e.ns.Create(ctx, "vmon-orphan")
	// Another node on the same host uses another prefix; recovery must leave its namespaces alone.
	_, _ = e.ns.Create(ctx, "vmon-0other-abc")

	n2 := e.node(t, nil)
	rec, err := n2.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rec.IDs(), []string{"alive"}) {
		t.Fatalf("recovering %v, want [alive]", rec.IDs())
	}
	var outcomes []Recovered
	var omu sync.Mutex
	rec.Run(func(r Recovered) { omu.Lock(); outcomes = append(outcomes, r); omu.Unlock() })
	if err := rec.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if len(outcomes) != 1 || outcomes[0] != (Recovered{ID: "alive", State: RecoveredRunning}) {
		t.Fatalf("outcomes %+v, want alive running", outcomes)
	}
	sb, ok := n2.lookup("alive")
	if !ok || sb.token != "tok-alive" {
		t.Fatalf("adopted sandbox lost its token: %+v", sb)
	}
	// Only the adopted sandbox remains: the dead one, the unclaimed warm one and the orphan
	// namespace are gone.
	aliveRID := sb.runtimeID
	if d := e.sandboxDirs(t); !slices.Equal(d, []string{aliveRID}) {
		t.Fatalf("dirs %v, want [%s]", d, aliveRID)
	}
	if ids, _ := e.rt.List(ctx); !slices.Equal(ids, []string{aliveRID}) {
		t.Fatalf("runtime %v, want [%s]", ids, aliveRID)
	}
	if ns, _ := e.ns.List(ctx); !slices.Equal(ns, []string{"vmon-0other-abc", "vmon-" + aliveRID}) {
		t.Fatalf("namespaces %v", ns)
	}
	// The adopted sandbox's envd is reachable again.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, envdURL("/init"), nil)
	resp, err := sb.ch.Transport().RoundTrip(req)
	if err != nil {
		t.Fatalf("envd after recovery: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

func TestRuntimeExitIsReportedAndFailsRequestsAtOnce(t *testing.T) {
	e := newEnv(t)
	n := e.node(t, nil)
	ctx := context.Background()
	type stop struct {
		id   string
		exit runtime.Exit
	}
	got := make(chan stop, 4)
	if _, err := n.CreateSandbox(ctx, spec("early")); err != nil {
		t.Fatal(err)
	}
	// Before anyone listens, the event waits.
	e.rt.crash(e.runtimeID(t, n, "early"), runtime.Exit{Reason: runtime.ExitOOM, Code: -1})
	waitFor(t, "the pending stop", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return len(n.pendingStops) == 1
	})
	n.OnStopped(func(id string, exit runtime.Exit) { got <- stop{id, exit} })
	select {
	case s := <-got:
		if s.id != "early" || s.exit.Reason != runtime.ExitOOM {
			t.Fatalf("pending stop delivered as %+v", s)
		}
		_ = n.DestroySandbox(ctx, s.id)
	case <-time.After(5 * time.Second):
		t.Fatal("pending stop not delivered")
	}

	if _, err := n.CreateSandbox(ctx, spec("abc")); err != nil {
		t.Fatal(err)
	}
	ch, _ := n.Channel("abc")
	e.rt.crash(e.runtimeID(t, n, "abc"), runtime.Exit{Reason: runtime.ExitInit, Code: 137})
	select {
	case s := <-got:
		if s.id != "abc" || s.exit.Reason != runtime.ExitInit || s.exit.Code != 137 {
			t.Fatalf("stop reported as %+v", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("runtime exit not reported")
	}
	// A request on the dead sandbox fails with NotFound (the reason), not with a session wait
	// running into its deadline.
	_, err := ch.DialPort(ctx, 8080)
	if !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("dial on a stopped sandbox: %v", err)
	}
	_ = n.DestroySandbox(ctx, "abc")
	waitFor(t, "the stopped sandbox's directory to go", func() bool { return len(e.sandboxDirs(t)) == 0 })

	// A kill the node itself does is not news.
	if _, err := n.CreateSandbox(ctx, spec("def")); err != nil {
		t.Fatal(err)
	}
	if err := n.DestroySandbox(ctx, "def"); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		t.Fatalf("a destroy was reported as a stop: %+v", s)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestStoppedPreStartedSandboxIsReplaced(t *testing.T) {
	e := newEnv(t)
	n := e.node(t, []WarmSpec{{TemplateID: "base", CPUs: 2, MemoryMB: 512, Size: 1}})
	n.OnStopped(func(id string, _ runtime.Exit) { t.Errorf("pre-started sandbox reported to the driver as %s", id) })
	n.StartWarmPool()
	first := func() *sandbox {
		n.pool.mu.Lock()
		defer n.pool.mu.Unlock()
		for _, q := range n.pool.ready {
			if len(q) > 0 {
				return q[0]
			}
		}
		return nil
	}
	waitFor(t, "a pre-started sandbox", func() bool { return first() != nil })
	old := first()
	e.rt.crash(old.runtimeID, runtime.Exit{Reason: runtime.ExitKilled, Code: -1, Signal: "SIGKILL"})
	waitFor(t, "a replacement", func() bool { sb := first(); return sb != nil && sb != old })
	waitFor(t, "the dead one's directory to go", func() bool {
		_, err := os.Stat(n.sandboxDir(old.runtimeID))
		return errors.Is(err, os.ErrNotExist)
	})
}

// runtimeID returns the runtime id behind API sandbox id.
func (e *env) runtimeID(t *testing.T, n *Node, id string) string {
	t.Helper()
	sb, ok := n.lookup(id)
	if !ok {
		t.Fatalf("sandbox %s not found", id)
	}
	return sb.runtimeID
}
