package mountns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A child process of the test binary that enters the namespace of the data dir in childDir and
// does childAction there (Enter re-executes it, so it runs from TestMain again).
const (
	childAction = "MOUNTNS_TEST_ACTION"
	childDir    = "MOUNTNS_TEST_DIR"
)

func TestMain(m *testing.M) {
	if action := os.Getenv(childAction); action != "" {
		os.Exit(child(action, os.Getenv(childDir)))
	}
	os.Exit(m.Run())
}

// child is a vmon process: it enters the namespace, then mounts (a sandbox's mount, as a first
// vmon serve would) or looks for that mount (a restarted vmon serve).
func child(action, dataDir string) int {
	if err := Enter(dataDir); errors.Is(err, ErrInherited) && action == "outside" {
		fmt.Print("stayed")
		return 0
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "enter:", err)
		return 2
	}
	probe := filepath.Join(dataDir, "probe")
	id, _ := os.Readlink("/proc/self/ns/mnt")
	switch action {
	case "mount":
		if err := unix.Mount("tmpfs", probe, "tmpfs", 0, "size=1m"); err != nil {
			fmt.Fprintln(os.Stderr, "mount:", err)
			return 2
		}
		if err := os.WriteFile(filepath.Join(probe, "f"), []byte("kept"), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	case "check":
		b, err := os.ReadFile(filepath.Join(probe, "f"))
		if err != nil || string(b) != "kept" {
			fmt.Fprintf(os.Stderr, "the earlier process's mount is not here: %q %v\n", b, err)
			return 3
		}
	}
	fmt.Print(id)
	return 0
}

func runChild(t *testing.T, action, dataDir string) string {
	t.Helper()
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), childAction+"="+action, childDir+"="+dataDir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s child: %v: %s", action, err, stderr.String())
	}
	return string(out)
}

func mountinfo(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).Output()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return string(out)
}

// A mount made by a vmon process in its namespace is neither in the host's namespace nor in a
// private namespace another process creates afterwards (what broke pauses), and a later vmon
// process (a restart) enters the same namespace and finds it.
func TestMountsStayInVmonsNamespace(t *testing.T) {
	dataDir, probe := newDataDir(t)
	host, _ := os.Readlink("/proc/self/ns/mnt")

	first := runChild(t, "mount", dataDir)
	if first == "" || first == host {
		t.Fatalf("the vmon process ran in namespace %q (host %q)", first, host)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(Pin(dataDir), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		t.Fatalf("%s does not pin a namespace (statfs type %#x, %v)", Pin(dataDir), st.Type, err)
	}
	if mi := mountinfo(t, "cat", "/proc/self/mountinfo"); strings.Contains(mi, " "+probe+" ") {
		t.Fatalf("vmon's mount is in the host's namespace:\n%s", mi)
	}
	// The foreign namespace is made while vmon's mount exists, as in the pause failure.
	if mi := mountinfo(t, "unshare", "-m", "--propagation", "private", "cat", "/proc/self/mountinfo"); strings.Contains(mi, " "+probe+" ") {
		t.Fatalf("vmon's mount was copied into a namespace made afterwards:\n%s", mi)
	}
	if mi := mountinfo(t, "nsenter", "--mount="+Pin(dataDir), "cat", "/proc/self/mountinfo"); !strings.Contains(mi, " "+probe+" ") {
		t.Fatalf("nsenter --mount=%s does not show vmon's mount:\n%s", Pin(dataDir), mi)
	}

	// A restart: the first process is gone, the next enters the same namespace and sees its mount.
	if second := runChild(t, "check", dataDir); second != first {
		t.Fatalf("the restarted process runs in %q, the first ran in %q", second, first)
	}
	// Entering again neither stacks the private bind nor the pin.
	mi := mountinfo(t, "cat", "/proc/self/mountinfo")
	for _, p := range []string{Dir(dataDir), Pin(dataDir)} {
		if n := strings.Count(mi, " "+p+" "); n != 1 {
			t.Fatalf("%s is mounted %d times in the host's namespace, want once:\n%s", p, n, mi)
		}
	}
}

// A vmon told to stay in the private mount namespace it was started in (a test harness's copy of
// the host's) neither pins another namespace nor changes the record of the host's pinned one,
// which a vmon started from the host afterwards still enters.
func TestOutsideTheHostNamespaceVmonStays(t *testing.T) {
	dataDir, _ := newDataDir(t)
	first := runChild(t, "mount", dataDir)
	id, err := os.ReadFile(filepath.Join(Dir(dataDir), "id"))
	if err != nil {
		t.Fatal(err)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-m", "--propagation", "private", exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childAction+"=outside", childDir+"="+dataDir, InheritEnv+"=inherit")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || string(out) != "stayed" {
		t.Fatalf("vmon from a private namespace: %q %v: %s", out, err, stderr.String())
	}
	if again, _ := os.ReadFile(filepath.Join(Dir(dataDir), "id")); string(again) != string(id) {
		t.Fatalf("a vmon outside the host's namespace rewrote the pin's record: %q, was %q", again, id)
	}
	if again := runChild(t, "check", dataDir); again != first {
		t.Fatalf("back on the host, vmon runs in %q, want the host's pinned %q", again, first)
	}
}

// newDataDir is a data dir with a probe directory the children mount on; whatever namespace and
// mounts the test leaves are given up afterwards.
func newDataDir(t *testing.T) (dataDir, probe string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test makes mount namespaces and must run as root (CI runs it as root)")
	}
	dataDir = t.TempDir()
	probe = filepath.Join(dataDir, "probe")
	if err := os.Mkdir(probe, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = exec.Command("nsenter", "--mount="+Pin(dataDir), "umount", probe).Run()
		_ = unix.Unmount(Pin(dataDir), 0)
		_ = unix.Unmount(Dir(dataDir), 0)
	})
	return dataDir, probe
}
