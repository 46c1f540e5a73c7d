// Package doctor checks whether this host can run vmon and says, per item, what is missing and
// how to fix it. It only reads the host; it never changes anything.
package doctor

import (
	"context"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/capability"
	"github.com/vibemon/vmon/internal/limits"
	"github.com/vibemon/vmon/internal/memmerge"
	"github.com/vibemon/vmon/internal/rootfs"
)

// Level of a check result.
type Level int

const (
	OK Level = iota
	Warn
	Fail
)

func (l Level) String() string { return [...]string{"ok", "warn", "FAIL"}[l] }

// Result of one check.
type Result struct {
	Name   string
	Level  Level
	Detail string
	Fix    string
}

// Options name what the checks look at.
type Options struct {
	DataDir   string
	RunscPath string
	// RunscVersion is the gVisor commit vmon is pinned to.
	RunscVersion string
	EnvdPath     string
	// TemplateReady reports whether the base template is built.
	TemplateReady bool
	// MemoryMB is the base template's memory, for the limits report.
	MemoryMB int
	// DiskMB and Limits are the node's --sandbox-disk-mb and task/file overrides.
	DiskMB int
	Limits limits.Overrides
	// RootImages is the node's --root-images: with it, template images are built with
	// mkfs.erofs, and serve refuses to start without it.
	RootImages bool
}

// Run performs every check.
func Run(ctx context.Context, o Options) []Result {
	return []Result{
		checkRoot(),
		checkRunsc(o),
		checkEnvd(o.EnvdPath),
		checkCodeInterpreter(o.EnvdPath),
		checkFilesystem("overlay", "overlayfs (each sandbox's writable root)", "load the module: modprobe overlay"),
		checkNetNS(),
		checkCgroup2(),
		checkTool("iptables", "iptables (sandbox networking)", "apt-get install -y iptables", Warn),
		checkTool("mmdebstrap", "mmdebstrap (builds the base template)", "apt-get install -y mmdebstrap", Warn),
		checkRootImageTool(o.RootImages),
		checkDisk(o.DataDir),
		checkDiskLimit(o.DiskMB),
		checkTaskLimit(),
		checkLimits(o),
		checkSocketPath(o.DataDir),
		checkTemplate(o.TemplateReady),
		checkKVM(),
		checkMemoryMerge(memmerge.SysDir, kernelRelease()),
	}
}

// Print writes results as a table and returns whether none failed.
func Print(w io.Writer, results []Result) bool {
	good := true
	for _, r := range results {
		fmt.Fprintf(w, "[%-4s] %s: %s\n", r.Level, r.Name, r.Detail)
		if r.Level != OK && r.Fix != "" {
			fmt.Fprintf(w, "       fix: %s\n", r.Fix)
		}
		if r.Level == Fail {
			good = false
		}
	}
	return good
}

func checkRoot() Result {
	r := Result{Name: "privileges"}
	caps, err := capability.Effective()
	if err != nil {
		return Result{Name: r.Name, Level: Fail, Detail: err.Error()}
	}
	var missing []string
	for _, c := range []struct {
		bit  uint
		name string
	}{{capability.SysAdmin, "CAP_SYS_ADMIN"}, {capability.NetAdmin, "CAP_NET_ADMIN"}, {capability.SysChroot, "CAP_SYS_CHROOT"}} {
		if caps&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		r.Level, r.Detail = Fail, "missing "+strings.Join(missing, ", ")
		r.Fix = "run vmon as root (sudo vmon serve)"
		return r
	}
	r.Detail = "CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SYS_CHROOT present"
	return r
}

func checkRunsc(o Options) Result {
	r := Result{Name: "runtime (gVisor runsc)"}
	fix := "bash scripts/install-runsc.sh (builds the pinned gVisor with CGO_ENABLED=0)"
	path, err := exec.LookPath(o.RunscPath)
	if err != nil {
		r.Level, r.Detail, r.Fix = Fail, fmt.Sprintf("%q not found", o.RunscPath), fix
		return r
	}
	// runsc built from the module proxy prints VERSION_MISSING; its build info names the module
	// version, which is the reliable pin.
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		r.Level, r.Detail, r.Fix = Fail, fmt.Sprintf("%s is not a Go-built runsc: %v", path, err), fix
		return r
	}
	version := info.Main.Version
	for _, dep := range info.Deps {
		if dep.Path == "gvisor.dev/gvisor" {
			version = dep.Version
		}
	}
	if o.RunscVersion != "" && !strings.HasSuffix(version, o.RunscVersion) {
		r.Level, r.Detail, r.Fix = Warn, fmt.Sprintf("%s is gVisor %s, not the pinned %s", path, version, o.RunscVersion), fix
		return r
	}
	if dynamic, err := isDynamic(path); err != nil || dynamic {
		r.Level, r.Detail, r.Fix = Fail, path+" is dynamically linked; its boot fails after pivot_root", fix
		return r
	}
	if err := checkRunscPatched(path); err != nil {
		r.Level, r.Detail, r.Fix = Fail, err.Error(), fix
		return r
	}
	r.Detail = path + " (gVisor " + version + ", static, with vmon's patches)"
	return r
}

// checkRunscPatched tells a runsc built with vmon's patches (runsc/patches) from a stock one by
// the flag one of them adds: without `restore --pass-fd` a sandbox boots and pauses, and then
// can never be resumed.
func checkRunscPatched(path string) error {
	out, err := exec.Command(path, "help", "restore").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s help restore: %v: %s", path, err, strings.TrimSpace(string(out)))
	}
	if !strings.Contains(string(out), "-pass-fd") {
		return fmt.Errorf("%s is a runsc without vmon's patches (its restore takes no --pass-fd): paused sandboxes could not be resumed", path)
	}
	return nil
}

// isDynamic reports whether an ELF binary has a program interpreter.
func isDynamic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true, nil
		}
	}
	return false, nil
}

func checkEnvd(path string) Result {
	r := Result{Name: "envd (guest agent)"}
	st, err := os.Stat(path)
	if err != nil || st.IsDir() {
		r.Level, r.Detail, r.Fix = Fail, fmt.Sprintf("%s not found", path), "make build (installs bin/envd beside bin/vmon) or pass --envd-path"
		return r
	}
	r.Detail = path
	return r
}

// CodeInterpreterBinary is the code-execution service of code-interpreter-v1; vmon serve
// installs it with envd when it lies beside envd.
const CodeInterpreterBinary = "vmon-code-interpreter"

// checkCodeInterpreter warns when the code-execution service is not beside envd: vmon runs
// without it, but code-interpreter-v1 (@e2b/code-interpreter's runCode) cannot.
func checkCodeInterpreter(envdPath string) Result {
	r := Result{Name: "code-execution service (code-interpreter-v1)"}
	path := filepath.Join(filepath.Dir(envdPath), CodeInterpreterBinary)
	if st, err := os.Stat(path); err != nil || st.IsDir() {
		r.Level, r.Detail, r.Fix = Warn, fmt.Sprintf("%s not found: code-interpreter-v1 cannot start", path),
			"make build (installs bin/vmon-code-interpreter beside bin/envd), or copy it beside envd"
		return r
	}
	r.Detail = path
	return r
}

func checkFilesystem(fs, what, fix string) Result {
	r := Result{Name: what}
	data, err := os.ReadFile("/proc/filesystems")
	if err != nil || !strings.Contains(string(data), "\t"+fs+"\n") {
		r.Level, r.Detail, r.Fix = Fail, fs+" is not available in this kernel", fix
		return r
	}
	r.Detail = fs + " available"
	return r
}

func checkNetNS() Result {
	r := Result{Name: "network namespaces"}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		r.Level, r.Detail, r.Fix = Fail, "the kernel has no network namespaces", "use a kernel built with CONFIG_NET_NS"
		return r
	}
	r.Detail = "available"
	return r
}

func checkCgroup2() Result {
	r := Result{Name: "cgroup v2 (CPU and memory limits)"}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, " - cgroup2 ") {
				fields := strings.Fields(line)
				r.Detail = "mounted at " + fields[4]
				return r
			}
		}
	}
	r.Level, r.Detail, r.Fix = Warn, "no cgroup2 mount found: sandboxes run without CPU and memory limits", "mount -t cgroup2 none /sys/fs/cgroup"
	return r
}

// checkRootImageTool: serve needs mkfs.erofs to build root images, unless they are off.
func checkRootImageTool(on bool) Result {
	const what = "mkfs.erofs (builds templates' root images)"
	if !on {
		return checkTool("mkfs.erofs", what, "apt-get install -y erofs-utils (needed once --root-images is on)", Warn)
	}
	return checkTool("mkfs.erofs", what, "apt-get install -y erofs-utils, or run vmon serve --root-images=false (each sandbox then has a gofer and an overlay mount)", Fail)
}

func checkTool(name, what, fix string, level Level) Result {
	r := Result{Name: what}
	p, err := exec.LookPath(name)
	if err != nil {
		r.Level, r.Detail, r.Fix = level, name+" not found", fix
		return r
	}
	r.Detail = p
	return r
}

func checkDisk(dir string) Result {
	r := Result{Name: "disk space (" + dir + ")"}
	probe := dir
	for {
		if _, err := os.Stat(probe); err == nil {
			break
		}
		parent := filepath.Dir(probe)
		if parent == probe {
			break
		}
		probe = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(probe, &st); err != nil {
		r.Level, r.Detail = Fail, err.Error()
		return r
	}
	free := st.Bavail * uint64(st.Bsize)
	r.Detail = fmt.Sprintf("%.1f GiB free", float64(free)/(1<<30))
	if free < 3<<30 {
		r.Level, r.Fix = Fail, "the base template needs about 1.5 GiB and each sandbox its own writes; free space or use --data-dir elsewhere"
	} else if free < 10<<30 {
		r.Level, r.Fix = Warn, "less than 10 GiB free; sandboxes that write a lot will fill it"
	}
	return r
}

func checkSocketPath(dir string) Result {
	r := Result{Name: "data dir path length"}
	// <dir>/sandboxes/<20-char id>/agent/agent.sock must fit a unix socket address (108 bytes).
	n := len(dir) + len("/sandboxes/") + 20 + len("/agent/agent.sock")
	if n >= 108 {
		r.Level, r.Detail, r.Fix = Fail, fmt.Sprintf("agent socket paths would be %d bytes (limit 107)", n), "use a shorter --data-dir"
		return r
	}
	r.Detail = fmt.Sprintf("agent socket paths are %d bytes", n)
	return r
}

func checkTemplate(ready bool) Result {
	r := Result{Name: "template base"}
	if !ready {
		r.Level, r.Detail, r.Fix = Warn, "not built yet", "vmon template build base (vmon serve builds it on first start)"
		return r
	}
	r.Detail = "built"
	return r
}

func checkKVM() Result {
	r := Result{Name: "/dev/kvm (Firecracker runtime)"}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		r.Detail = "absent: only the gvisor runtime can run here (the default)"
		return r
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		r.Detail = "present but provided by PVM (kvm_pvm): stock guest kernels do not boot under it and " +
			"gVisor's KVM platform panics, so VM runtimes cannot run here; gvisor with the systrap platform is used"
		return r
	}
	r.Detail = "present; the firecracker runtime is not implemented yet, gvisor is used"
	return r
}

// checkMemoryMerge says whether vmon serve --memory-merge can work here: a kernel with KSM that
// carries PR_SET_MEMORY_MERGE across exec (Linux 6.7), and in what state ksmd is.
func checkMemoryMerge(dir, release string) Result {
	r := Result{Name: "memory merging (KSM, for --memory-merge)"}
	h, err := memmerge.ReadHost(dir)
	switch {
	case err != nil:
		r.Level, r.Detail = Warn, err.Error()
		return r
	case !h.Available:
		r.Level, r.Detail = Warn, "this kernel has no KSM: --memory-merge cannot be used"
		r.Fix = "a kernel built with CONFIG_KSM, Linux 6.7 or later (optional: merging only saves memory)"
		return r
	}
	if major, minor, ok := kernelVersion(release); ok && (major < 6 || major == 6 && minor < 7) {
		r.Level, r.Detail = Warn, "Linux "+release+" does not carry the merge mark into the processes vmon starts: --memory-merge cannot be used"
		r.Fix = "Linux 6.7 or later (optional: merging only saves memory)"
		return r
	}
	switch h.Run {
	case 1:
		r.Detail = fmt.Sprintf("available; ksmd running, %d pages every %d ms", h.PagesToScan, h.SleepMillis)
	default:
		r.Detail = "available; ksmd stopped (vmon serve --memory-merge starts it)"
	}
	return r
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// kernelVersion parses the major and minor numbers of a kernel release such as "6.18.44-fc".
func kernelVersion(release string) (major, minor int, ok bool) {
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return 0, 0, false
	}
	return major, minor, true
}

// checkDiskLimit says whether sandboxes' disks can be capped here (a loop-mounted ext4 image per
// sandbox) and what --sandbox-disk-mb asks for.
func checkDiskLimit(diskMB int) Result {
	r := Result{Name: "sandbox disk limit"}
	err := rootfs.DiskSupported()
	if err == nil && !hasFilesystem("ext4") {
		err = fmt.Errorf("ext4 is not available in this kernel")
	}
	switch {
	case err != nil && diskMB > 0:
		r.Level, r.Detail = Fail, "cannot be enforced: "+err.Error()
		r.Fix = "provide loop devices, ext4 and e2fsprogs, or run vmon serve --sandbox-disk-mb 0 (no disk limit)"
	case err != nil:
		r.Level, r.Detail = Warn, "off (--sandbox-disk-mb 0), and could not be enforced here: "+err.Error()
	case diskMB == 0:
		r.Level, r.Detail = Warn, "off (--sandbox-disk-mb 0): sandboxes write to the host's disk without a limit"
		r.Fix = "run vmon serve with --sandbox-disk-mb (default 10240)"
	default:
		r.Detail = fmt.Sprintf("enforced: %d MiB per sandbox on its own ext4 image (loop device); the guest's df shows it", diskMB)
	}
	return r
}

// checkTaskLimit says whether the host can cap each sandbox's tasks (a pids cgroup controller).
func checkTaskLimit() Result {
	r := Result{Name: "sandbox host task limit (pids cgroup)"}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			_, right, ok := strings.Cut(line, " - ")
			f := strings.Fields(right)
			if !ok || len(f) < 3 {
				continue
			}
			if (f[0] == "cgroup" && strings.Contains(","+f[2]+",", ",pids,")) || f[0] == "cgroup2" && pidsInV2(strings.Fields(line)[4]) {
				r.Detail = "pids controller at " + strings.Fields(line)[4]
				return r
			}
		}
	}
	r.Level, r.Detail = Warn, "no pids cgroup controller: a sandbox's host tasks are bounded only by its guest task limit"
	r.Fix = "enable the pids controller (cgroup v1 pids hierarchy or cgroup v2 with +pids)"
	return r
}

func pidsInV2(mount string) bool {
	b, err := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
	return err == nil && strings.Contains(" "+strings.TrimSpace(string(b))+" ", " pids ")
}

// checkLimits reports the limits a sandbox of the base template's shape runs with.
func checkLimits(o Options) Result {
	mem := o.MemoryMB
	if mem == 0 {
		mem = 512
	}
	l := limits.Derive(mem, o.Limits)
	disk := "no disk limit"
	if o.DiskMB > 0 {
		disk = fmt.Sprintf("disk %d MiB", o.DiskMB)
	}
	return Result{Name: "sandbox limits", Detail: fmt.Sprintf(
		"a %d MiB sandbox gets %d tasks in the guest (RLIMIT_NPROC %d, %d host tasks), %d open files, /dev/shm %d MiB, %s",
		mem, l.GuestTasks, l.NProc, l.HostTasks, l.NoFile, l.ShmBytes>>20, disk)}
}

func hasFilesystem(fs string) bool {
	data, err := os.ReadFile("/proc/filesystems")
	return err == nil && strings.Contains(string(data), "\t"+fs+"\n")
}
