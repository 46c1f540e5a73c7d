//go:build linux

// Command vmon-image assembles vmon's container image without a container engine (`make image`):
//
//	SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) vmon-image --bin bin --out bin/image
//
// Two layers: a Debian root made with mmdebstrap from rootPackages (what a node needs: iptables,
// iproute2, mmdebstrap and its keyring, ca-certificates, e2fsprogs, erofs-utils), and vmon, envd,
// vmon-code-interpreter and runsc in /usr/local/bin, as scripts/install.sh puts them. The image is
// written as an OCI image layout at --out; its manifest digest is printed and written to
// <out>.digest. The same inputs give the same digest (see internal/nodeimage).
//
// The Debian root is built once per (suite, mirror, package list, rootEpoch) and kept in
// --cache-dir (rebuilt after --root-max-age, for security updates); each run assembles the image
// from it again. Needs root (mmdebstrap --mode=root), like the base template's build.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/nodeimage"
	"github.com/vibemon/vmon/internal/template"
)

// rootPackages are installed into the image's Debian root on top of the minbase variant
// (Essential packages and apt): what vmon serve and the base template's build run on a node.
var rootPackages = []string{
	"ca-certificates",
	"debian-archive-keyring",
	"e2fsprogs",   // mkfs.ext4: each sandbox's size-limited disk
	"erofs-utils", // mkfs.erofs: templates' root images (serve --root-images)
	"iproute2",
	"iptables",
	"mmdebstrap", // builds the base template
	"mount",      // mmdebstrap mounts /proc and /sys into the root it builds
}

// rootEpoch is the SOURCE_DATE_EPOCH of the Debian root: what mmdebstrap and the maintainer
// scripts stamp into it (the days in /etc/shadow) and the clamp of its files' mtimes. It is fixed
// rather than the commit's time so that the root (cached) and its layer stay the same across
// commits; change it with rootPackages.
var rootEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// rootFormat changes when the way the root is built does (arguments, hooks), to miss the cache.
const rootFormat = 1

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory holding vmon, envd and vmon-code-interpreter (make build)")
	flag.StringVar(&o.runsc, "runsc", "runsc", "the runsc binary to put into the image (scripts/install-runsc.sh)")
	flag.StringVar(&o.out, "out", "bin/image", "the OCI image layout to write (replaced)")
	flag.StringVar(&o.cacheDir, "cache-dir", "/var/cache/vmon-image", "where the Debian root and downloaded packages are kept between builds")
	flag.StringVar(&o.suite, "suite", "bookworm", "Debian release")
	flag.Func("source", "apt one-line source for the root, repeatable (default: this machine's entries for the suite, as the base template's build)", func(s string) error {
		o.sources = append(o.sources, s)
		return nil
	})
	flag.DurationVar(&o.maxAge, "root-max-age", 7*24*time.Hour, "build the Debian root again when the cached one is older (security updates)")
	flag.BoolVar(&o.rebuildRoot, "rebuild-root", false, "build the Debian root again even if a cached one is fresh")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "vmon-image:", err)
		os.Exit(1)
	}
}

type options struct {
	bin, runsc, out, cacheDir, suite string
	sources                          []string
	maxAge                           time.Duration
	rebuildRoot                      bool
}

func run(ctx context.Context, o options) error {
	epoch, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	runsc, err := exec.LookPath(o.runsc)
	if err != nil {
		return fmt.Errorf("runsc: %w (scripts/install-runsc.sh installs it)", err)
	}
	vmon := filepath.Join(o.bin, "vmon")
	out, err := exec.CommandContext(ctx, vmon, "version").Output()
	if err != nil {
		return fmt.Errorf("%s version: %w (make build first)", vmon, err)
	}
	version := strings.TrimSpace(string(out))
	if len(o.sources) == 0 {
		if o.sources, err = template.HostSources(o.suite); err != nil {
			return err
		}
	}

	root, err := debianRoot(ctx, o)
	if err != nil {
		return err
	}

	work, err := os.MkdirTemp(filepath.Dir(filepath.Clean(o.out)), ".image-work-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	base := filepath.Join(work, "debian.tar")
	if err := writeTo(base, func(f *os.File) error {
		// The runtime provides /dev, /proc and /sys; /tmp starts empty.
		return nodeimage.WriteTree(f, root, nodeimage.TreeOptions{Epoch: rootEpoch, Empty: []string{"dev", "proc", "sys", "tmp"}})
	}); err != nil {
		return fmt.Errorf("debian layer: %w", err)
	}
	bins := filepath.Join(work, "vmon.tar")
	files := []nodeimage.File{
		{Path: "/usr/local/bin/vmon", Source: vmon, Mode: 0o755},
		{Path: "/usr/local/bin/envd", Source: filepath.Join(o.bin, "envd"), Mode: 0o755},
		{Path: "/usr/local/bin/vmon-code-interpreter", Source: filepath.Join(o.bin, "vmon-code-interpreter"), Mode: 0o755},
		{Path: "/usr/local/bin/runsc", Source: runsc, Mode: 0o755},
	}
	if err := writeTo(bins, func(f *os.File) error { return nodeimage.WriteFiles(f, files, epoch) }); err != nil {
		return fmt.Errorf("vmon layer: %w", err)
	}

	img, err := nodeimage.Assemble([]nodeimage.Layer{
		{Tar: base, CreatedBy: fmt.Sprintf("mmdebstrap --variant=minbase --include=%s %s (SOURCE_DATE_EPOCH=%d)",
			strings.Join(rootPackages, ","), o.suite, rootEpoch.Unix())},
		{Tar: bins, CreatedBy: "vmon " + version + ": vmon, envd, vmon-code-interpreter, runsc in /usr/local/bin"},
	}, nodeimage.Config{
		Created:    epoch,
		Entrypoint: []string{"vmon"},
		Cmd:        []string{"serve"},
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			// vmon stays in the container's mount namespace (internal/mountns): it cannot pin one
			// of its own there, as container runtimes pivot_root and detach the old root, after
			// which the pin's bind mount (made back in the namespace vmon started in) fails with
			// EINVAL. Seen with unshare + pivot_root + umount -l; with the old root kept it works.
			"VMON_MOUNT_NAMESPACE_MODE=inherit",
		},
		WorkingDir: "/",
		Volumes:    []string{"/var/lib/vmon"},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "vmon",
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.created": epoch.UTC().Format(time.RFC3339),
		},
	})
	if err != nil {
		return err
	}
	digest, err := nodeimage.WriteLayout(o.out, img, version)
	if err != nil {
		return fmt.Errorf("write %s: %w", o.out, err)
	}
	if err := os.WriteFile(filepath.Clean(o.out)+".digest", []byte(digest.String()+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("vmon-image: %s (vmon %s) at %s\n", digest, version, o.out)
	return nil
}

func sourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Time{}, errors.New("SOURCE_DATE_EPOCH is not set (make image sets it to the commit's time)")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

func writeTo(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// debianRoot returns the cached Debian root for o, building it first if there is none, it is
// older than o.maxAge, or o.rebuildRoot.
func debianRoot(ctx context.Context, o options) (string, error) {
	key, err := json.Marshal(struct {
		Format   int
		Suite    string
		Sources  []string
		Packages []string
		Epoch    int64
	}{rootFormat, o.suite, o.sources, rootPackages, rootEpoch.Unix()})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(key)
	roots := filepath.Join(o.cacheDir, "roots")
	dir := filepath.Join(roots, hex.EncodeToString(sum[:8]))
	root, stamp := filepath.Join(dir, "rootfs"), filepath.Join(dir, "built")
	if err := os.MkdirAll(roots, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(o.cacheDir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", o.cacheDir, err)
	}
	if st, err := os.Stat(stamp); err == nil && !o.rebuildRoot && time.Since(st.ModTime()) < o.maxAge {
		fmt.Fprintf(os.Stderr, "vmon-image: Debian root from the cache (%s, built %s)\n", dir, st.ModTime().UTC().Format(time.RFC3339))
		return root, nil
	}
	// Nothing else is kept: an older root (another key, or this one going stale) is removed.
	entries, err := os.ReadDir(roots)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(roots, e.Name())); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	debs := filepath.Join(o.cacheDir, "apt-archives")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "vmon-image: building the Debian root with mmdebstrap in %s\n", dir)
	tmp := root + ".tmp"
	args := []string{
		"--mode=root", "--variant=minbase", "--format=directory",
		"--include=" + strings.Join(rootPackages, ","),
		"--aptopt=Acquire::Retries \"3\"",
	}
	// As the base template: no documentation but the copyrights.
	args = append(args, template.SlimDpkgOpts...)
	args = append(args,
		`--setup-hook=mkdir -p "$1"/var/cache/apt/archives/`,
		"--setup-hook=sync-in "+debs+" /var/cache/apt/archives/",
		"--customize-hook=sync-out /var/cache/apt/archives "+debs,
		// mmdebstrap copies this machine's resolv.conf and hostname in; they are the runtime's
		// to provide (vmon's template builds write a resolv.conf and hosts when they are missing).
		`--customize-hook=rm -f "$1"/etc/resolv.conf "$1"/etc/hostname`,
		o.suite, tmp,
	)
	args = append(args, o.sources...)
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(rootEpoch.Unix(), 10),
		"DEBIAN_FRONTEND=noninteractive", "LC_ALL=C.UTF-8")
	var tail bytes.Buffer
	cmd.Stdout, cmd.Stderr = &tail, &tail
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("mmdebstrap: %w\n%s", err, lastLines(tail.String(), 30))
	}
	if err := os.Rename(tmp, root); err != nil {
		return "", err
	}
	if err := os.WriteFile(stamp, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return "", err
	}
	return root, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
