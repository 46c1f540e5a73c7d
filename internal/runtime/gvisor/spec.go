package gvisor

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
)

// idPattern is what runsc accepts as a container id.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$`)

func validateID(id string) error {
	if !idPattern.MatchString(id) {
		return errdefs.InvalidArgument("invalid sandbox id")
	}
	return nil
}

// allCaps is every capability gVisor implements. The guest gets all of them because gVisor's
// sentry, not the guest's capability set, is the security boundary: the guest's root is root of
// its own kernel, as it is in an E2B microVM (sudo, ptrace, ip, mount all behave as there).
var allCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// cpuPeriodUS is the CFS period limits are expressed in (the kernel's default).
const cpuPeriodUS = 100_000

// tmpDir is the rootfs-relative directory bind-mounted over the guest's /tmp.
const tmpDir = "tmp"

// buildSpec renders the OCI runtime spec for one sandbox. cgroupsPath is empty when runsc runs
// with --ignore-cgroups. It is a pure function so the result can be compared with a saved file.
func buildSpec(s runtime.Spec, cgroupsPath string) (*specs.Spec, error) {
	if err := validateID(s.ID); err != nil {
		return nil, err
	}
	if len(s.Args) == 0 {
		return nil, errdefs.InvalidArgument("sandbox init command is empty")
	}
	if !filepath.IsAbs(s.RootDir) {
		return nil, errdefs.InvalidArgument("sandbox root directory must be an absolute path")
	}
	if s.CPUs < 0 || s.MemoryMB < 0 {
		return nil, errdefs.InvalidArgument("negative resource limit")
	}
	if s.RootImage != "" && !filepath.IsAbs(s.RootImage) {
		return nil, errdefs.InvalidArgument("sandbox root image must be an absolute path")
	}
	if s.RootSizeBytes < 0 || (s.RootSizeBytes > 0 && s.RootImage == "") {
		return nil, errdefs.InvalidArgument("a root size needs a root image and must not be negative")
	}
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	env := slices.Clone(s.Env)
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		env = append([]string{defaultPath}, env...)
	}

	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts",
			Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: shmOptions(s.Limits.ShmBytes)},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		// The sentry's own cgroupfs (all v1 controllers): envd caps the guest's tasks through its
		// pids controller, and programs that size themselves from cgroup limits (JVMs, Node.js)
		// see the sandbox's memory and CPU.
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup"},
	}
	if s.RootImage == "" {
		// Without an explicit /tmp mount gVisor mounts an in-memory tmpfs over an empty /tmp.
		// Binding the rootfs's own /tmp keeps files there on disk (counted as the sandbox's disk,
		// not its memory) and part of the rootfs a checkpoint leaves on the host. Over a root
		// image the same holds without a mount, which would bring the gofer back: /tmp is part
		// of the image's writable layer as long as the image's /tmp is not empty.
		mounts = append(mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: filepath.Join(s.RootDir, tmpDir),
			Options: []string{"rbind", "rw"}})
	}
	for _, m := range s.Mounts {
		if !filepath.IsAbs(m.HostPath) || !filepath.IsAbs(m.GuestPath) {
			return nil, errdefs.InvalidArgument("mount paths must be absolute")
		}
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts = append(mounts, specs.Mount{
			Destination: filepath.Clean(m.GuestPath), Type: "bind", Source: filepath.Clean(m.HostPath),
			Options: []string{"rbind", mode},
		})
	}

	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: s.NetNSPath}
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: slices.Clone(s.Args),
			Env:  env,
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  allCaps,
				Effective: allCaps,
				Permitted: allCaps,
			},
			Rlimits: rlimits(s.Limits),
			// sudo must be able to raise privileges (runsc also needs --allow-suid for that).
			NoNewPrivileges: false,
		},
		Root:        &specs.Root{Path: s.RootDir, Readonly: false},
		Hostname:    hostname,
		Mounts:      mounts,
		Annotations: rootImageAnnotations(s),
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				netns,
			},
			CgroupsPath: cgroupsPath,
			Resources:   resources(s, cgroupsPath != ""),
		},
	}
	return spec, nil
}

// rootImageAnnotations tell runsc to mount the root from spec.RootImage (gVisor's rootfs hint)
// with a writable layer whose data lives in a host file in RootDir (rootUpperFlag), bounded by
// RootSizeBytes inside the sentry, so a full disk is ENOSPC in the guest rather than an I/O error
// from the host file.
func rootImageAnnotations(s runtime.Spec) map[string]string {
	if s.RootImage == "" {
		return nil
	}
	a := map[string]string{
		"dev.gvisor.spec.rootfs.source":  filepath.Clean(s.RootImage),
		"dev.gvisor.spec.rootfs.type":    "erofs",
		"dev.gvisor.spec.rootfs.overlay": "dir=" + filepath.Clean(s.RootDir),
	}
	if s.RootSizeBytes > 0 {
		a["dev.gvisor.spec.rootfs.options"] = fmt.Sprintf("size=%d", s.RootSizeBytes)
	}
	return a
}

// rootUpperFlag is the runsc flag that names the directory of a root image's writable layer. The
// rootfs hint says the layer is a host file, but runsc takes the file's directory from this
// global flag only, so run and restore of such a sandbox carry it.
func rootUpperFlag(s runtime.Spec) []string {
	if s.RootImage == "" {
		return nil
	}
	return []string{"--overlay2=root:dir=" + filepath.Clean(s.RootDir)}
}

// shmOptions sizes /dev/shm: without a size, gVisor's tmpfs may grow to half the host's memory,
// and filling it would take the sandbox over its memory limit instead of failing with ENOSPC.
func shmOptions(size int64) []string {
	opts := []string{"nosuid", "nodev", "mode=1777"}
	if size > 0 {
		opts = append(opts, fmt.Sprintf("size=%d", size))
	}
	return opts
}

// defaultNoFile is RLIMIT_NOFILE when the node sets none.
const defaultNoFile = 1 << 20

// rlimits are the guest processes' resource limits, inherited from envd by everything it starts.
// RLIMIT_NPROC binds unprivileged users only (root has CAP_SYS_RESOURCE in the guest); the
// guest-wide task limit is envd's (--max-tasks).
func rlimits(l runtime.Limits) []specs.POSIXRlimit {
	nofile := uint64(defaultNoFile)
	if l.NoFile > 0 {
		nofile = uint64(l.NoFile)
	}
	out := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile}}
	if l.NProc > 0 {
		out = append(out, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(l.NProc), Soft: uint64(l.NProc)})
	}
	return out
}

// resources renders the CPU and memory limits. runsc applies them to the sandbox's host cgroup and
// derives from that cgroup what the guest sees (--total-memory, --cpu-num), so they are only set
// when runsc manages cgroups.
func resources(s runtime.Spec, withCgroups bool) *specs.LinuxResources {
	if !withCgroups || (s.CPUs == 0 && s.MemoryMB == 0 && s.Limits.HostTasks == 0) {
		return nil
	}
	r := &specs.LinuxResources{}
	if s.CPUs > 0 {
		quota := int64(s.CPUs) * cpuPeriodUS
		period := uint64(cpuPeriodUS)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if s.MemoryMB > 0 {
		limit := int64(s.MemoryMB) << 20
		r.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	if s.Limits.HostTasks > 0 {
		// The sentry's threads and one or two host tasks per guest task: a guest that gets past
		// its own task limit stops its sandbox here instead of filling the host's process table.
		r.Pids = &specs.LinuxPids{Limit: int64(s.Limits.HostTasks)}
	}
	return r
}

// cgroupPath is the host cgroup runsc creates for sandbox id under parent.
func cgroupPath(parent, id string) string {
	return fmt.Sprintf("/%s/%s", strings.Trim(parent, "/"), id)
}
