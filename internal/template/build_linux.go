package template

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/rootfs"
)

//go:embed customize.sh
var customizeScript string

//go:embed customize-code-interpreter.sh
var customizeCodeInterpreter string

// BuildBase builds the base template with mmdebstrap from Debian packages, unless it is already
// built and opts.Force is false. The build goes to a temporary directory next to the final one;
// only a complete build is renamed into place and made current by rewriting the manifest, so an
// interrupted build leaves the previous template untouched. Builds of the same data dir are
// serialised with a lock file.
func BuildBase(ctx context.Context, opts BaseOptions) (Manifest, error) {
	return buildRootfs(ctx, opts, rootfsSpec{id: BaseID, packages: opts.packages(), hooks: []string{customizeScript}})
}

// BuildCodeInterpreterRootfs builds CodeInterpreterRootfsID as BuildBase builds base, with
// CodeInterpreterPackages on top. The code-execution service is not in it: like envd, the node
// mounts it into every sandbox, so it follows vmon's upgrades without a rebuild of the rootfs.
func BuildCodeInterpreterRootfs(ctx context.Context, opts BaseOptions) (Manifest, error) {
	pkgs := append(opts.packages(), CodeInterpreterPackages...)
	slices.Sort(pkgs)
	return buildRootfs(ctx, opts, rootfsSpec{id: CodeInterpreterRootfsID, packages: slices.Compact(pkgs),
		hooks: []string{customizeScript, customizeCodeInterpreter}})
}

// rootfsSpec is what one mmdebstrap template is made of.
type rootfsSpec struct {
	id       string
	packages []string
	// hooks are shell scripts run in order after the packages are installed, with the rootfs as $1.
	hooks []string
}

func buildRootfs(ctx context.Context, opts BaseOptions, spec rootfsSpec) (Manifest, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	progress := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		log.Info("template: " + msg)
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "template %s: %s\n", spec.id, msg)
		}
	}
	if !filepath.IsAbs(opts.DataDir) {
		return Manifest{}, errors.New("template: DataDir must be an absolute path")
	}
	if !opts.Force {
		if m, err := Load(opts.DataDir, spec.id); err == nil {
			progress("ready (built %s)", m.BuiltAt.Format(time.RFC3339))
			return m, nil
		}
	}
	dir := Dir(opts.DataDir, spec.id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("create template dir: %w", err)
	}
	unlock, err := lock(ctx, dir, func() { progress("waiting for another build to finish") })
	if err != nil {
		return Manifest{}, err
	}
	defer unlock()
	// Another process may have built it while this one waited for the lock.
	if !opts.Force {
		if m, err := Load(opts.DataDir, spec.id); err == nil {
			progress("ready (built %s)", m.BuiltAt.Format(time.RFC3339))
			return m, nil
		}
	}
	if err := prune(dir); err != nil {
		log.Warn("template: removing leftovers of earlier builds", "err", err)
	}

	mmdebstrap := opts.Mmdebstrap
	if mmdebstrap == "" {
		mmdebstrap = "mmdebstrap"
	}
	if mmdebstrap, err = exec.LookPath(mmdebstrap); err != nil {
		return Manifest{}, fmt.Errorf("%w: mmdebstrap not found (run scripts/install-deps.sh): %v", ErrUnsupported, err)
	}
	suite := opts.Suite
	if suite == "" {
		suite = "bookworm"
	}
	sources := opts.Sources
	if len(sources) == 0 {
		if sources, err = hostSources("/etc/apt", suite); err != nil {
			return Manifest{}, err
		}
	}
	cacheDir := opts.CacheDir
	if cacheDir == "" {
		cacheDir = filepath.Join(opts.DataDir, "cache", "apt-archives")
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("create package cache: %w", err)
	}

	began := time.Now()
	buildID, final, tmp, err := newBuildDirs(dir, began)
	if err != nil {
		return Manifest{}, err
	}
	ok := false
	defer func() {
		if !ok {
			if err := rootfs.RemoveTree(tmp); err != nil {
				log.Warn("template: removing failed build", "err", err)
			}
		}
	}()
	var scripts []string
	for i, h := range spec.hooks {
		script := filepath.Join(dir, fmt.Sprintf(".customize-%s-%d.sh", buildID, i))
		if err := os.WriteFile(script, []byte(h), 0o755); err != nil {
			return Manifest{}, fmt.Errorf("write customize hook: %w", err)
		}
		defer os.Remove(script)
		scripts = append(scripts, script)
	}

	pkgs := spec.packages
	progress("building from %s (%d packages); this takes a few minutes the first time", suite, len(pkgs))
	for _, s := range sources {
		progress("package source: %s", s)
	}
	args := mmdebstrapArgs(suite, tmp, sources, pkgs, cacheDir, scripts...)
	if err := runLogged(ctx, mmdebstrap, args, func(line string) {
		if progressLine(line) {
			progress("%s", line)
		} else {
			log.Debug("template: mmdebstrap", "out", line)
		}
	}); err != nil {
		return Manifest{}, fmt.Errorf("build template %s: %w", spec.id, err)
	}
	size, err := diskUsage(tmp)
	if err != nil {
		return Manifest{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return Manifest{}, fmt.Errorf("install template rootfs: %w", err)
	}
	ok = true
	m := Manifest{
		Format: manifestFormat, ID: spec.id, BuildID: buildID, Rootfs: filepath.Base(final),
		CPUs: baseCPUs, MemoryMB: baseMemoryMB, DefaultUser: defaultUser, DefaultWorkdir: defaultHome,
		DiskSizeMB: (size + 1<<20 - 1) >> 20, Suite: suite, Packages: pkgs,
		BuiltAt: began.UTC().Truncate(time.Second), BuildSeconds: time.Since(began).Round(100 * time.Millisecond).Seconds(),
	}
	if err := writeManifest(dir, m); err != nil {
		_ = rootfs.RemoveTree(final)
		return Manifest{}, err
	}
	if err := prune(dir); err != nil {
		log.Warn("template: removing the previous build", "err", err)
	}
	progress("built in %s, %d MB on disk", time.Since(began).Round(time.Second), m.DiskSizeMB)
	m.Dir = dir
	return m, nil
}

// newBuildDirs picks a build id not used yet in dir and creates its temporary build directory.
func newBuildDirs(dir string, now time.Time) (id, final, tmp string, err error) {
	base := now.UTC().Format("20060102T150405Z")
	for i := 0; i < 100; i++ {
		id = base
		if i > 0 {
			id = fmt.Sprintf("%s-%d", base, i)
		}
		final = filepath.Join(dir, rootfsPrefix+id)
		tmp = filepath.Join(dir, tmpPrefix+id+tmpSuffix)
		if _, err := os.Lstat(final); err == nil {
			continue
		}
		if err := os.Mkdir(tmp, 0o755); errors.Is(err, os.ErrExist) {
			continue
		} else if err != nil {
			return "", "", "", fmt.Errorf("create build dir: %w", err)
		}
		return id, final, tmp, nil
	}
	return "", "", "", errors.New("create build dir: no free build id")
}

// mmdebstrapArgs renders the mmdebstrap command line. minbase is Debian's required set (like the
// debian Docker image), which has useradd and su; recommends are not installed. Documentation
// and translations are left out to keep the template small (copyright files stay). Downloaded packages are synced
// with cacheDir so a rebuild does not download them again.
// SlimDpkgOpts leave documentation and translations out of a Debian root built with mmdebstrap,
// keeping the copyright files (the base template's, and vmon's container image's).
var SlimDpkgOpts = []string{
	"--dpkgopt=path-exclude=/usr/share/man/*",
	"--dpkgopt=path-exclude=/usr/share/info/*",
	"--dpkgopt=path-exclude=/usr/share/doc/*",
	"--dpkgopt=path-include=/usr/share/doc/*/copyright",
	"--dpkgopt=path-exclude=/usr/share/locale/*",
	"--dpkgopt=path-include=/usr/share/locale/locale.alias",
}

func mmdebstrapArgs(suite, target string, sources, pkgs []string, cacheDir string, customize ...string) []string {
	args := []string{
		"--mode=root", "--variant=minbase", "--format=directory",
		"--include=" + strings.Join(pkgs, ","),
		// Verbose for dpkg's "Setting up <package>" lines: progress through the longest step.
		"--verbose",
		"--aptopt=Acquire::Retries \"3\"",
	}
	args = append(args, SlimDpkgOpts...)
	args = append(args,
		"--skip=essential/unlink",
		`--setup-hook=mkdir -p "$1"/var/cache/apt/archives/`,
		// The man pages are left out, but maintainer scripts still link into man1: openjdk's
		// postinst has update-alternatives make java.1.gz there, and fails (dpkg error, mmdebstrap
		// exit 25) when the directory does not exist.
		`--setup-hook=mkdir -p "$1"/usr/share/man/man1`,
		"--setup-hook=sync-in "+shellQuote(cacheDir)+" /var/cache/apt/archives/",
		"--customize-hook=sync-out /var/cache/apt/archives "+shellQuote(cacheDir),
	)
	for _, c := range customize {
		args = append(args, "--customize-hook="+shellQuote(c)+` "$1"`)
	}
	args = append(args, suite, target)
	return append(args, sources...)
}

// progressLine picks the mmdebstrap --verbose lines worth showing: its own steps, warnings and
// errors, and one line per installed package.
func progressLine(l string) bool {
	for _, p := range []string{"I: ", "W: ", "E: ", "Setting up "} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// runLogged runs a command, passing each output line (stdout and stderr) to line.
func runLogged(ctx context.Context, bin string, args []string, line func(string)) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C.UTF-8")
	// Let mmdebstrap unmount what it mounted in the target instead of dying mid-hook.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	var last []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := strings.TrimRight(sc.Text(), "\r")
			if l == "" {
				continue
			}
			line(l)
			if last = append(last, l); len(last) > 5 {
				last = last[1:]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%s: %w (last output: %s)", filepath.Base(bin), err, strings.Join(last, " | "))
	}
	return nil
}

// diskUsage returns the bytes a tree occupies on disk, counting hard links once.
func diskUsage(dir string) (int64, error) {
	type key struct{ dev, ino uint64 }
	seen := map[key]bool{}
	var total int64
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		k := key{uint64(st.Dev), st.Ino}
		if st.Nlink > 1 && seen[k] {
			return nil
		}
		seen[k] = true
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure template size: %w", err)
	}
	return total, nil
}

// lock takes the build lock of a template directory, waiting (and calling waiting once) while
// another process holds it.
func lock(ctx context.Context, dir string, waiting func()) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open template lock: %w", err)
	}
	told := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock template: %w", err)
		}
		if !told {
			waiting()
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// tryLock takes the build lock if it is free; ok is false if a build is running.
func tryLock(dir string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("open template lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock template: %w", err)
	}
	return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, true, nil
}

// Prune removes rootfs directories of template id that its manifest no longer names and no
// sandbox overlay uses, and leftovers of interrupted builds. Call it at start-up; BuildBase
// prunes after a rebuild itself. While a build is running it does nothing.
func Prune(ctx context.Context, dataDir, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	dir := Dir(dataDir, id)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	unlock, ok, err := tryLock(dir)
	if err != nil || !ok {
		return err
	}
	defer unlock()
	return prune(dir)
}
