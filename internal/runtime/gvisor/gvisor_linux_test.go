package gvisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/netns"
	"github.com/vibemon/vmon/internal/rootfs"
	"github.com/vibemon/vmon/internal/runtime"
)

// These tests boot real gVisor sandboxes. They need root, runsc on PATH (scripts/install-runsc.sh)
// and /bin/busybox from Debian's busybox-static (scripts/install-deps.sh); CI provides all three,
// so a missing one is a failure, not a skip.

// childEnv makes the test binary act as a short-lived "vmon" that starts one sandbox and is then
// killed with SIGKILL by the parent test (TestSurvivesCreatorKill).
const childEnv = "VMON_GVISOR_TEST_CHILD"

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		os.Exit(runChild(v))
	}
	code := m.Run()
	if fixtureVal.lower != "" {
		removeFixture(filepath.Dir(fixtureVal.lower))
	}
	os.Exit(code)
}

// removeFixture deletes the test's temp tree. runsc pins an empty network namespace for its gofers
// at <root>/null-netns, which has to be unmounted first; the per-test cgroup parent goes too.
func removeFixture(base string) {
	_ = syscall.Unmount(filepath.Join(base, "runsc", "null-netns"), syscall.MNT_DETACH)
	_ = os.RemoveAll(base)
	if mounts, err := cgroupMounts(); err == nil {
		for _, m := range mounts {
			_ = syscall.Rmdir(filepath.Join(m, "vmon-test"))
		}
	}
}

type childArgs struct {
	Options Options
	Spec    runtime.Spec
	Ready   string
}

func runChild(arg string) int {
	var a childArgs
	if err := json.Unmarshal([]byte(arg), &a); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rt, err := New(a.Options)
	if err == nil {
		err = rt.Start(context.Background(), a.Spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child start:", err)
		return 1
	}
	if err := os.WriteFile(a.Ready, []byte("ok"), 0o644); err != nil {
		return 1
	}
	select {} // wait for SIGKILL
}

// fixture is what every sandbox test shares: a busybox template and a runsc root.
type fixture struct {
	lower string
	opts  Options
}

var (
	fixtureOnce sync.Once
	fixtureVal  fixture
	fixtureErr  error
	seq         atomic.Int32
)

func setup(t *testing.T) (*Runtime, fixture) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("gVisor tests must run as root (CI runs them as root)")
	}
	fixtureOnce.Do(func() { fixtureVal, fixtureErr = buildFixture() })
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	opts := fixtureVal.opts
	if testing.Verbose() {
		// runsc invocations and their durations, to see where start latency goes.
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	rt, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return rt, fixtureVal
}

// buildFixture makes a tiny template rootfs: static busybox plus the static udsdial helper.
func buildFixture() (fixture, error) {
	base, err := os.MkdirTemp("", "vmon-gvisor-test-")
	if err != nil {
		return fixture{}, err
	}
	lower := filepath.Join(base, "template")
	for _, d := range []string{"bin", "etc", "proc", "dev", "sys", "tmp", "root", "run/vmon", "mnt/ro", "mnt/rw"} {
		if err := os.MkdirAll(filepath.Join(lower, d), 0o755); err != nil {
			return fixture{}, err
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fixture{}, fmt.Errorf("need /bin/busybox (apt-get install busybox-static): %w", err)
	}
	if err := os.WriteFile(filepath.Join(lower, "bin", "busybox"), bb, 0o755); err != nil {
		return fixture{}, err
	}
	if err := os.Symlink("busybox", filepath.Join(lower, "bin", "sh")); err != nil {
		return fixture{}, err
	}
	if err := os.WriteFile(filepath.Join(lower, "etc", "template-file"), []byte("template\n"), 0o644); err != nil {
		return fixture{}, err
	}
	build := exec.Command("go", "build", "-o", filepath.Join(lower, "bin", "udsdial"), "./testdata/udsdial")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fixture{}, fmt.Errorf("build udsdial: %v: %s", err, out)
	}
	return fixture{
		lower: lower,
		opts:  Options{RootDir: filepath.Join(base, "runsc"), CgroupParent: "vmon-test"},
	}, nil
}

// sandbox is one prepared sandbox: rootfs, netns and host directories, torn down by t.Cleanup.
type sandbox struct {
	spec     runtime.Spec
	dir      string
	agentDir string
	rwDir    string
}

func newSandbox(t *testing.T, fx fixture, rt *Runtime, mutate func(*runtime.Spec)) *sandbox {
	t.Helper()
	ctx := context.Background()
	id := fmt.Sprintf("vmontest-%d-%d", os.Getpid(), seq.Add(1))
	dir := filepath.Join(filepath.Dir(fx.lower), "sandboxes", id)
	root, err := rootfs.Prepare(ctx, []string{fx.lower}, dir, rootfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nsPath, err := netns.Create(ctx, netns.Name(id))
	if err != nil {
		t.Fatal(err)
	}
	s := &sandbox{dir: dir, agentDir: filepath.Join(dir, "agent"), rwDir: filepath.Join(dir, "rw")}
	roDir := filepath.Join(dir, "ro")
	for _, d := range []string{s.agentDir, s.rwDir, roDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(roDir, "hello"), []byte("from host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.spec = runtime.Spec{
		ID:        id,
		RootDir:   root,
		StateDir:  filepath.Join(dir, "state"),
		Hostname:  "sbx-" + fmt.Sprint(seq.Load()),
		NetNSPath: nsPath,
		Mounts: []runtime.Mount{
			{HostPath: s.agentDir, GuestPath: "/run/vmon"},
			{HostPath: roDir, GuestPath: "/mnt/ro", ReadOnly: true},
			{HostPath: s.rwDir, GuestPath: "/mnt/rw"},
		},
		Args: []string{"/bin/busybox", "sh", "-c", "echo init-started; exec /bin/busybox sleep 1000000"},
	}
	if mutate != nil {
		mutate(&s.spec)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := rt.Destroy(ctx, id); err != nil {
			t.Errorf("cleanup destroy: %v", err)
		}
		if err := rootfs.Release(ctx, dir); err != nil {
			t.Errorf("cleanup rootfs: %v", err)
		}
		if err := netns.Delete(ctx, netns.Name(id)); err != nil {
			t.Errorf("cleanup netns: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	return s
}

func exec1(t *testing.T, rt *Runtime, id string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := rt.Exec(ctx, id, args...)
	if err != nil {
		t.Fatalf("exec %v: %v: %s", args, err, out)
	}
	return string(out)
}

func wantStatus(t *testing.T, rt *Runtime, id string, want runtime.Status) {
	t.Helper()
	got, err := rt.Status(context.Background(), id)
	if err != nil || got != want {
		t.Fatalf("Status(%s) = %v, %v; want %v", id, got, err, want)
	}
}

// cgroupDirs returns the sandbox's cgroup directory in every hierarchy where it exists.
func cgroupDirs(t *testing.T, id string) []string {
	t.Helper()
	mounts, err := cgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, m := range mounts {
		d := filepath.Join(m, "vmon-test", id)
		if _, err := os.Stat(d); err == nil {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// readCgroupFile returns the first cgroup file with one of names among the sandbox's cgroups.
func readCgroupFile(t *testing.T, id string, names ...string) string {
	t.Helper()
	for _, d := range cgroupDirs(t, id) {
		for _, n := range names {
			if b, err := os.ReadFile(filepath.Join(d, n)); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
	}
	t.Fatalf("none of %v found in the cgroups of %s", names, id)
	return ""
}

func TestSandboxLifecycle(t *testing.T) {
	rt, fx := setup(t)
	ctx := context.Background()
	s := newSandbox(t, fx, rt, nil)
	id := s.spec.ID

	// The agent channel: a host socket in the bind-mounted agent dir, dialled from inside.
	ln, err := net.Listen("unix", filepath.Join(s.agentDir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			fmt.Fprintf(c, "pong %s", line)
			c.Close()
		}
	}()

	began := time.Now()
	if err := rt.Start(ctx, s.spec); err != nil {
		t.Fatal(err)
	}
	started := time.Since(began)
	wantStatus(t, rt, id, runtime.StatusRunning)
	if out := exec1(t, rt, id, "/bin/busybox", "true"); out != "" {
		t.Fatalf("true printed %q", out)
	}
	t.Logf("start %v, start+first exec %v", started.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))

	if err := rt.Start(ctx, s.spec); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("second Start = %v, want Conflict", err)
	}
	// The host's view of its memory (the node's memory watch): the runtime and guest hold some,
	// and a guest that takes 64 MiB more shows at least that much more.
	before, err := rt.MemoryUsage(id)
	if err != nil || before == 0 {
		t.Fatalf("MemoryUsage = %d, %v", before, err)
	}
	// The kernel signals when the use crosses a threshold, without anyone reading it.
	evCtx, evCancel := context.WithCancel(ctx)
	events, err := rt.MemoryEvents(evCtx, id, before+32<<20)
	if err != nil {
		t.Fatalf("MemoryEvents: %v", err)
	}
	select {
	case <-events:
		t.Fatal("a crossing was signalled before the guest took any memory")
	case <-time.After(100 * time.Millisecond):
	}
	exec1(t, rt, id, "/bin/busybox", "sh", "-c", "head -c 67108864 /dev/zero > /dev/shm/fill")
	if after, err := rt.MemoryUsage(id); err != nil || after < before+60<<20 {
		t.Fatalf("MemoryUsage after 64 MiB in /dev/shm = %d (before %d), %v", after, before, err)
	}
	select {
	case <-events:
	case <-time.After(5 * time.Second):
		t.Fatal("no signal when the use crossed its threshold")
	}
	evCancel()
	for range events { // closed once its context ends
	}
	exec1(t, rt, id, "/bin/busybox", "rm", "/dev/shm/fill")
	if _, err := rt.MemoryUsage("../x"); err == nil {
		t.Fatal("MemoryUsage of a bad id succeeded")
	}
	wantStatus(t, rt, id, runtime.StatusRunning)

	if got := strings.TrimSpace(exec1(t, rt, id, "/bin/busybox", "hostname")); got != s.spec.Hostname {
		t.Fatalf("hostname = %q, want %q", got, s.spec.Hostname)
	}
	// Loopback only: lo is up and there is no other link.
	links := exec1(t, rt, id, "/bin/busybox", "cat", "/proc/net/dev")
	if !strings.Contains(links, "lo:") || strings.Count(links, ":") != 1 {
		t.Fatalf("guest links:\n%s", links)
	}

	// Bind mounts: read-only stays read-only, read-write reaches the host.
	if got := exec1(t, rt, id, "/bin/busybox", "cat", "/mnt/ro/hello"); got != "from host\n" {
		t.Fatalf("ro mount content = %q", got)
	}
	if out, err := rt.Exec(ctx, id, "/bin/busybox", "sh", "-c", "echo x > /mnt/ro/new"); err == nil {
		t.Fatalf("write to a read-only mount succeeded: %s", out)
	}
	exec1(t, rt, id, "/bin/busybox", "sh", "-c", "echo guest > /mnt/rw/out")
	if b, err := os.ReadFile(filepath.Join(s.rwDir, "out")); err != nil || string(b) != "guest\n" {
		t.Fatalf("rw mount on host = %q, %v", b, err)
	}

	// Root filesystem writes (including /tmp) land in the host overlay's upper dir, never in the
	// template.
	exec1(t, rt, id, "/bin/busybox", "sh", "-c",
		"echo root > /root/f && echo tmp > /tmp/t && echo changed > /etc/template-file")
	upper := rootfs.UpperDir(s.dir)
	for path, want := range map[string]string{"root/f": "root\n", "tmp/t": "tmp\n", "etc/template-file": "changed\n"} {
		if b, err := os.ReadFile(filepath.Join(upper, path)); err != nil || string(b) != want {
			t.Fatalf("upper %s = %q, %v; want %q", path, b, err, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(fx.lower, "etc", "template-file")); string(b) != "template\n" {
		t.Fatalf("template modified: %q", b)
	}
	if _, err := os.Stat(filepath.Join(fx.lower, "tmp", "t")); !os.IsNotExist(err) {
		t.Fatalf("guest /tmp write reached the template: %v", err)
	}

	if got := exec1(t, rt, id, "/bin/udsdial", "/run/vmon/agent.sock", "ping"); got != "pong ping\n" {
		t.Fatalf("host socket reply = %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(s.spec.StateDir, consoleLog)); !strings.Contains(string(b), "init-started") {
		t.Fatalf("console log = %q", b)
	}

	// A fresh Runtime value (what vmon has after a restart) sees the sandbox.
	fresh, err := New(fx.opts)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, fresh, id, runtime.StatusRunning)
	ids, err := fresh.List(ctx)
	if err != nil || !slices.Contains(ids, id) {
		t.Fatalf("List = %v, %v", ids, err)
	}

	st, err := rt.cli.state(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, rt, id, runtime.StatusNotFound)
	if err := fresh.Destroy(ctx, id); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if sandboxAlive(st.Pid, id) {
		t.Fatalf("sandbox process %d alive after Destroy", st.Pid)
	}
	if d := cgroupDirs(t, id); len(d) != 0 {
		t.Fatalf("cgroups left after Destroy: %v", d)
	}
	if ids, _ := rt.List(ctx); slices.Contains(ids, id) {
		t.Fatalf("List after Destroy = %v", ids)
	}
}

// TestSurvivesCreatorKill starts a sandbox from a child process, kills that process with SIGKILL
// (what happens to vmon in the recovery test) and checks the sandbox still runs and is usable.
func TestSurvivesCreatorKill(t *testing.T) {
	rt, fx := setup(t)
	ctx := context.Background()
	s := newSandbox(t, fx, rt, nil)
	ready := filepath.Join(s.dir, "ready")
	arg, err := json.Marshal(childArgs{Options: fx.opts, Spec: s.spec, Ready: ready})
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), childEnv+"="+string(arg))
	child.Stdout, child.Stderr = os.Stdout, os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = child.Process.Kill()
			t.Fatal("child never reported the sandbox started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	time.Sleep(200 * time.Millisecond) // anything tied to the child would be dying by now

	wantStatus(t, rt, s.spec.ID, runtime.StatusRunning)
	if got := strings.TrimSpace(exec1(t, rt, s.spec.ID, "/bin/busybox", "echo", "alive")); got != "alive" {
		t.Fatalf("exec after creator kill = %q", got)
	}

	// Another state dir (no pid file), or a pid file naming some other process: not this sandbox.
	if st, err := rt.Reattach(ctx, s.spec.ID, t.TempDir()); err != nil || st != runtime.StatusStopped {
		t.Fatalf("Reattach without a pid file = %v, %v; want stopped", st, err)
	}
	// Reattach finds it from the pid file alone, and watches it from then on.
	if st, err := rt.Reattach(ctx, s.spec.ID, s.spec.StateDir); err != nil || st != runtime.StatusRunning {
		t.Fatalf("Reattach = %v, %v; want running", st, err)
	}
	if rt.watch.lookup(s.spec.ID) == nil {
		t.Fatal("Reattach did not start watching the sandbox process")
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, pidFileName), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := rt.Reattach(ctx, "other", other); err != nil || st != runtime.StatusStopped {
		t.Fatalf("Reattach of a pid that is not the sandbox = %v, %v; want stopped", st, err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := rt.Wait(ctx, s.spec.ID)
		waited <- err
	}()
	if err := rt.Destroy(ctx, s.spec.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("Wait on the reattached sandbox: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait on the reattached sandbox did not return after Destroy")
	}
	wantStatus(t, rt, s.spec.ID, runtime.StatusNotFound)
	if st, err := rt.Reattach(ctx, s.spec.ID, s.spec.StateDir); err != nil || st != runtime.StatusStopped {
		t.Fatalf("Reattach after Destroy = %v, %v; want stopped", st, err)
	}
}

// TestLimits checks that CPU and memory limits reach the host cgroup, that the guest sees its
// memory size, and that exceeding the memory limit stops the sandbox (Status notices).
func TestLimits(t *testing.T) {
	rt, fx := setup(t)
	ctx := context.Background()
	s := newSandbox(t, fx, rt, func(s *runtime.Spec) { s.CPUs, s.MemoryMB = 1, 128 })
	id := s.spec.ID
	if err := rt.Start(ctx, s.spec); err != nil {
		t.Fatal(err)
	}
	meminfo := exec1(t, rt, id, "/bin/busybox", "head", "-1", "/proc/meminfo")
	if f := strings.Fields(meminfo); len(f) < 2 || f[1] != "131072" {
		t.Fatalf("guest MemTotal line = %q, want 131072 kB", meminfo)
	}
	if got := readCgroupFile(t, id, "memory.max", "memory.limit_in_bytes"); got != "134217728" {
		t.Fatalf("host memory limit = %s", got)
	}
	if got := readCgroupFile(t, id, "cpu.max", "cpu.cfs_quota_us"); got != "100000" && got != "100000 100000" {
		t.Fatalf("host cpu quota = %s", got)
	}

	// Fill guest memory (tmpfs pages live in the sentry's memory) past the limit.
	_, _ = rt.Exec(ctx, id, "/bin/busybox", "dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=256")
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := rt.Status(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st == runtime.StatusStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %v after exceeding its memory limit", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if d := cgroupDirs(t, id); len(d) != 0 {
		t.Fatalf("cgroups left after Destroy: %v", d)
	}
}

// TestFailedStartLeavesNothing starts an init that cannot run.
func TestFailedStartLeavesNothing(t *testing.T) {
	rt, fx := setup(t)
	ctx := context.Background()
	s := newSandbox(t, fx, rt, func(s *runtime.Spec) { s.Args = []string{"/no/such/init"} })
	err := rt.Start(ctx, s.spec)
	if err == nil {
		t.Fatal("Start with a missing init succeeded")
	}
	t.Logf("start error: %v", err)
	wantStatus(t, rt, s.spec.ID, runtime.StatusNotFound)
	if d := cgroupDirs(t, s.spec.ID); len(d) != 0 {
		t.Fatalf("cgroups left after failed Start: %v", d)
	}
}

func TestNewWithoutRunsc(t *testing.T) {
	_, err := New(Options{RunscPath: "/no/such/runsc", RootDir: t.TempDir()})
	if err == nil || !errors.Is(err, runtime.ErrUnsupported) {
		t.Fatalf("New without runsc = %v, want ErrUnsupported", err)
	}
}

// TestIgnoreCgroups covers hosts where runsc cannot manage cgroups: the sandbox runs without any
// host cgroup of its own (and without limits).
func TestIgnoreCgroups(t *testing.T) {
	_, fx := setup(t)
	opts := fx.opts
	opts.IgnoreCgroups = true
	rt, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := newSandbox(t, fx, rt, func(s *runtime.Spec) { s.CPUs, s.MemoryMB = 1, 128 })
	if err := rt.Start(ctx, s.spec); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, rt, s.spec.ID, runtime.StatusRunning)
	if d := cgroupDirs(t, s.spec.ID); len(d) != 0 {
		t.Fatalf("cgroups created with IgnoreCgroups: %v", d)
	}
	if _, err := rt.MemoryEvents(ctx, s.spec.ID, 1<<20); !errors.Is(err, runtime.ErrUnsupported) {
		t.Fatalf("MemoryEvents without cgroups = %v, want ErrUnsupported", err)
	}
	if err := rt.Destroy(ctx, s.spec.ID); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, rt, s.spec.ID, runtime.StatusNotFound)
}
