package mountns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/atomicfile"
	"github.com/vibemon/vmon/internal/rootfs"
)

// Enter puts the calling process into the data dir's mount namespace, creating and pinning it
// the first time. A process outside it is re-executed inside it (same pid, arguments, environment
// and working directory), so Enter returns only in a process that is in it already, or with an
// error. Call it before anything is mounted; the goroutines running meanwhile are lost with the
// old process image.
func Enter(dataDir string) error {
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	dir, pin := Dir(dataDir), Pin(dataDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mount namespace: create %s: %w", dir, err)
	}
	cur, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	marker, reexecuted := os.LookupEnv(envMarker)
	_ = os.Unsetenv(envMarker) // children (runsc, tools) need not carry it
	if inside(dir, cur) {
		return nil
	}
	if reexecuted {
		// Never loop: an exec that did not land in the namespace will not the next time either.
		return fmt.Errorf("mount namespace: re-executed into %s but running in %s", marker, cur)
	}
	if os.Getenv(InheritEnv) == "inherit" {
		// The caller gave vmon a private mount namespace of its own (a test harness's copy of
		// the host's, a container): what vmon mounts there is already out of the host's
		// namespace. Such a copy does not carry the host's pin (the kernel does not copy nsfs
		// pins), and pinning another from it failed with EINVAL at times on this kernel.
		return ErrInherited
	}
	return enter(dir, pin)
}

// inside reports whether mount namespace cur ("mnt:[inode]") is the one recorded in dir's id
// file. The pin itself cannot tell: inside the namespace it is the plain file it was when the
// namespace was copied from the host's. The id carries the boot id, so a namespace number reused
// after a reboot is not taken for it.
func inside(dir, cur string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "id"))
	return err == nil && strings.TrimSpace(string(b)) == cur+" "+bootID()
}

func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// enter joins the pinned namespace, creating it if needed, and re-executes the process there.
func enter(dir, pin string) error {
	// Never unlocked: this thread's namespace changes, and on success the exec from it replaces
	// the whole process (the kernel makes it the thread group leader, keeping the pid).
	runtime.LockOSThread()
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	// Held until the exec closes it (O_CLOEXEC): two vmon processes starting at once make one
	// namespace. Closed on the error paths.
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		return fmt.Errorf("mount namespace: lock: %w", err)
	}
	err = enterLocked(dir, pin)
	lock.Close()
	return err
}

func enterLocked(dir, pin string) error {
	if err := privateBind(dir); err != nil {
		return err
	}
	ns, err := openPinned(pin)
	if err != nil {
		return err
	}
	if ns == nil {
		if ns, err = create(dir, pin); err != nil {
			return err
		}
	}
	defer ns.Close()
	wd, _ := os.Getwd()
	// setns(CLONE_NEWNS) needs a thread whose root and working directory are its own.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("mount namespace: unshare fs: %w", err)
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("mount namespace: enter %s: %w", pin, err)
	}
	// setns moved this thread to the namespace's root directory.
	if wd != "" {
		_ = unix.Chdir(wd)
	}
	id, err := os.Readlink("/proc/thread-self/ns/mnt")
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	// The pin may have been made from another namespace than the one that wrote the id last (a
	// vmon started from a private mount namespace, as the networking tests do, pins its own: a
	// copied namespace does not carry the host's pin). Whatever was entered is what the id names.
	if err := writeFileAtomic(filepath.Join(dir, "id"), []byte(id+" "+bootID()+"\n")); err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	if err := os.Setenv(envMarker, id); err != nil {
		return err
	}
	// The binary by its path, not /proc/self/exe: the process is named after the file it runs
	// (ps, pgrep -x), and "exe" would name nothing.
	exe, err := os.Executable()
	if err != nil {
		exe = "/proc/self/exe"
	}
	err = unix.Exec(exe, os.Args, os.Environ())
	if exe != "/proc/self/exe" {
		// Replaced or removed on disk since it started: the running image is still there.
		err = unix.Exec("/proc/self/exe", os.Args, os.Environ())
	}
	return fmt.Errorf("mount namespace: re-execute vmon: %w", err)
}

// openPinned opens the namespace pinned at pin, or returns nil when none is (first start, or a
// plain file left from before a reboot).
func openPinned(pin string) (*os.File, error) {
	f, err := os.Open(pin)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mount namespace: open %s: %w", pin, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("mount namespace: statfs %s: %w", pin, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, nil
	}
	return f, nil
}

// create makes a new mount namespace on this (locked) thread, a copy of the current one whose
// mounts are all slaves (the host's mounts and unmounts still reach it, its own stay in it), pins
// it at pin from the current namespace and returns it open, with this thread back where it was.
func create(dir, pin string) (*os.File, error) {
	host, err := os.Open("/proc/thread-self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("mount namespace: %w", err)
	}
	defer host.Close()
	if f, err := os.OpenFile(pin, os.O_RDONLY|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("mount namespace: create %s: %w", pin, err)
	} else {
		f.Close()
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("mount namespace: unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return nil, fmt.Errorf("mount namespace: make / a slave: %w", err)
	}
	ns, err := os.Open("/proc/thread-self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("mount namespace: %w", err)
	}
	id, err := os.Readlink("/proc/thread-self/ns/mnt")
	if err == nil {
		// Pinned from the older namespace: the kernel refuses the reverse (a namespace loop).
		err = unix.Setns(int(host.Fd()), unix.CLONE_NEWNS)
	}
	if err == nil {
		err = unix.Mount(fmt.Sprintf("/proc/self/fd/%d", ns.Fd()), pin, "", unix.MS_BIND, "")
	}
	if err == nil {
		err = writeFileAtomic(filepath.Join(dir, "id"), []byte(id+" "+bootID()+"\n"))
	}
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("mount namespace: pin at %s: %w", pin, err)
	}
	return ns, nil
}

// privateBind makes dir a bind mount of itself with private propagation in the current
// namespace, unless it is a mount already (then only its propagation is set).
func privateBind(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	mounted, err := rootfs.Mounted(real)
	if err != nil {
		return err
	}
	if !mounted {
		if err := unix.Mount(real, real, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mount namespace: bind %s: %w", real, err)
		}
	}
	if err := unix.Mount("", real, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("mount namespace: make %s private: %w", real, err)
	}
	return nil
}

func writeFileAtomic(path string, b []byte) error { return atomicfile.Replace(path, b, 0o600) }
