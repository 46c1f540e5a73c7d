package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/api"
	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/capability"
	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/denied"
	"github.com/vibemon/vmon/internal/doctor"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/egressdns"
	"github.com/vibemon/vmon/internal/egressproxy"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/httpguard"
	"github.com/vibemon/vmon/internal/ingress"
	"github.com/vibemon/vmon/internal/limits"
	"github.com/vibemon/vmon/internal/memmerge"
	"github.com/vibemon/vmon/internal/metrics"
	"github.com/vibemon/vmon/internal/mountns"
	"github.com/vibemon/vmon/internal/netclaim"
	"github.com/vibemon/vmon/internal/netpool"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/oci"
	"github.com/vibemon/vmon/internal/rootfs"
	"github.com/vibemon/vmon/internal/rootimage"
	"github.com/vibemon/vmon/internal/runtime"
	"github.com/vibemon/vmon/internal/runtime/gvisor"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/secrets"
	"github.com/vibemon/vmon/internal/snapshot"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/templates"
	"github.com/vibemon/vmon/internal/tlsutil"
	"github.com/vibemon/vmon/internal/volumes"
)

func serveCmd() *cobra.Command {
	var c config.Serve
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "run the E2B-compatible API, ingress and a node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.Validate(); err != nil {
				return err
			}
			// Before anything is mounted: sandbox mounts must not be copied into mount
			// namespaces other processes make (a pause would seal a disk still mounted there).
			// A process not in the data dir's namespace yet is re-executed in it. A driver
			// mounts nothing.
			if c.Role == "driver" {
				return serve(cmd.Context(), &c, cmd.OutOrStdout())
			}
			if err := mountns.Enter(c.DataDir); errors.Is(err, mountns.ErrInherited) {
				fmt.Fprintf(cmd.ErrOrStderr(), "vmon: %v\n", err)
			} else if err != nil {
				return err
			}
			return serve(cmd.Context(), &c, cmd.OutOrStdout())
		},
	}
	config.BindServe(cmd.Flags(), &c)
	return cmd
}

func serve(ctx context.Context, c *config.Serve, stdout io.Writer) error {
	switch c.Role {
	case "driver":
		return serveDriver(ctx, c, stdout)
	case "node":
		return serveNode(ctx, c, stdout)
	}
	log, err := newLogger(c.LogLevel)
	if err != nil {
		return err
	}
	st, closeData, err := openDataDir(ctx, c)
	if err != nil {
		return err
	}
	defer closeData()
	apiKey, err := ensureAdminKey(ctx, st, c.DataDir)
	if err != nil {
		return err
	}

	var sandboxLogs *sandboxlog.Store
	if c.SandboxLogs {
		if sandboxLogs, err = openSandboxLogs(ctx, c, st, log.With("component", "sandboxlog")); err != nil {
			return err
		}
	}
	var guest node.GuestLog
	if sandboxLogs != nil {
		guest = guestLog{logs: sandboxLogs}
	}
	ns, closeNode, err := startNodeStack(ctx, c, st, guest, nil, log)
	defer closeNode()
	if err != nil {
		return err
	}
	n, recovery, network, vols, egressProxy, envdPath := ns.n, ns.recovery, ns.network, ns.vols, ns.egressProxy, ns.envdPath
	// Secret values are sealed under a key beside the database, so a copy of the database alone
	// (a backup, a support bundle) holds no value in the clear.
	sealer, err := secrets.LoadOrCreateKey(filepath.Join(c.DataDir, secrets.KeyFile))
	if err != nil {
		return err
	}
	m := metrics.New("all")
	if network != nil {
		logRefusals(ctx, network.hub, sandboxLogs, m.EgressRefused)
	}
	maxSandboxes := c.MaxSandboxes
	if maxSandboxes == 0 {
		maxSandboxes = defaultCapacity(c.RootImages, log)
	}
	dopts := driver.Options{
		Store:           st,
		Node:            n,
		Logger:          log.With("component", "driver"),
		BootConcurrency: c.BootConcurrency,
		MaxSandboxes:    maxSandboxes,
		MaxTimeout:      c.MaxSandboxTimeout,
		DefaultDiskMB:   c.SandboxDiskMB,
		Features:        n.Features(),
		Volumes:         vols,
		Secrets:         sealer,
		Observer:        m,
	}
	if sandboxLogs != nil {
		// Set only when on: a nil *sandboxlog.Store in the interface would look like a store.
		dopts.Logs = sandboxLogs
	}
	d, err := driver.New(dopts)
	if err != nil {
		return err
	}
	defer d.Close()
	if egressProxy != nil {
		egressProxy.SetSecrets(d)
	}
	recoveringSet := map[string]bool{}
	for _, id := range recovery.IDs() {
		recoveringSet[id] = true
	}
	pausedIDs, err := n.Paused()
	if err != nil {
		return fmt.Errorf("list paused sandboxes: %w", err)
	}
	pausedSet := map[string]bool{}
	for _, id := range pausedIDs {
		pausedSet[id] = true
	}
	if err := d.Recover(ctx, func(id string) bool { return recoveringSet[id] }, func(id string) bool { return pausedSet[id] }); err != nil {
		return fmt.Errorf("recover sandbox records: %w", err)
	}
	// Swept only once the records say which sandboxes still live.
	if sandboxLogs != nil {
		go sandboxLogs.Run(ctx, pruneKilled(ctx, st, log))
	}
	orphans, err := d.PausedOrphans(ctx, pausedIDs)
	if err != nil {
		return fmt.Errorf("find paused sandboxes no record owns: %w", err)
	}
	for _, id := range orphans {
		log.Info("deleting paused sandbox no record owns", "sandbox", id)
		if err := n.DeletePaused(ctx, id); err != nil {
			log.Warn("delete paused orphan", "sandbox", id, "err", err)
		}
	}
	// A crash between making a volume's directory and recording it leaves a directory no record
	// owns.
	if ids, err := vols.IDs(); err == nil {
		for _, id := range ids {
			if _, err := st.GetVolume(ctx, id); errdefs.Is(err, errdefs.KindNotFound) {
				log.Info("deleting volume directory no record owns", "volume", id)
				_ = vols.Delete(id)
			}
		}
	}
	if err := vols.MountAll(); err != nil {
		log.Warn("mounting volumes", "err", err)
	}
	snaps, err := n.Snapshots()
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	snapOrphans, err := d.SnapshotOrphans(ctx, snaps)
	if err != nil {
		return fmt.Errorf("find snapshots no record owns: %w", err)
	}
	for _, id := range snapOrphans {
		log.Info("deleting snapshot no record owns", "snapshot", id)
		if err := n.DeleteSnapshot(ctx, id); err != nil {
			log.Warn("delete snapshot orphan", "snapshot", id, "err", err)
		}
	}
	// A sandbox whose runtime stops on its own is marked killed with the reason at once.
	n.OnStopped(func(id string, exit runtime.Exit) {
		d.SandboxStopped(context.Background(), id, exit.String())
	})
	// The sandboxes a restart found are settled in the background (an envd to redial, a
	// checkpoint to finish): the API serves meanwhile and answers 503 for them.
	recovery.Run(func(r node.Recovered) { d.Recovered(context.WithoutCancel(ctx), r) })
	n.StartWarmPool()
	defer func() {
		if err := n.Close(context.WithoutCancel(ctx)); err != nil {
			log.Warn("stopping the warm pool", "err", err)
		}
	}()

	domain := ""
	if c.TLSEnabled() {
		domain = c.Domain
	}
	builds, err := startTemplateBuilds(ctx, c, st, n, d, m.BuildDone, log)
	if err != nil {
		return err
	}
	defer builds.Close()
	ensureCodeInterpreter(ctx, builds, st, c.DataDir, envdPath, log.With("component", "templates"))
	apiHandler, err := api.New(api.Options{Driver: d, Store: st, Logger: log.With("component", "api"), Domain: domain,
		Builds: builds, Volumes: localVolumes{d: vols}})
	if err != nil {
		return err
	}
	ing := ingress.New(log.With("component", "ingress"), ingressTargets{d: d, n: n}, c.Domain)
	checks := append([]metrics.Check{databaseCheck(st)}, nodeChecks(n, recovery, c.DataDir)...)
	// Only the API is guarded: requests to guest ports reach the guest as the client sent them.
	guarded := withProbes(httpguard.Handler(apiHandler), checks)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ing.Match(r) {
			ing.ServeHTTP(w, r)
			return
		}
		guarded.ServeHTTP(w, r)
	})
	if err := registerMetrics(m, append(metrics.BootQueue(d.BootQueue), metrics.SandboxStates(st.TallySandboxes), databaseUse(st))...); err != nil {
		return err
	}
	if err := registerMetrics(m, append(proxyMetrics(egressProxy), metrics.NodeRoom(func() metrics.Room { return nodeRoom(n, maxSandboxes, c.DataDir) }), warmPoolMetrics(n))...); err != nil {
		return err
	}
	stopMetrics, err := serveMetrics(c, m, checks, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	return listenAndServe(ctx, c, handler, log, stdout, apiKey)
}

// templateFetcher brings a template build the data dir lacks (from the cluster's store).
type templateFetcher = func(ctx context.Context, id, buildID string) (template.Manifest, error)

// nodeStack is a node and what it runs on, as `vmon serve` starts it for --role all and node.
type nodeStack struct {
	n           *node.Node
	recovery    *node.Recovery
	network     *networkSetup
	vols        *volumes.Dir
	egressProxy *egressproxy.Proxy
	envdPath    string
	manifests   []template.Manifest
}

// startNodeStack builds the templates it lacks, then the runtime, the network, the volumes and
// the node over them, and recovers what a restart left; guest, when set, keeps envd's events, and
// fetch, when set, brings the template builds the data dir lacks.
// The cleanup, never nil (an error leaves it something to stop too), stops what it started, in
// reverse.
func startNodeStack(ctx context.Context, c *config.Serve, st *store.Store, guest node.GuestLog, fetch templateFetcher, log *slog.Logger) (*nodeStack, func(), error) {
	var cleanups []func()
	closeAll := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	// Nodes sharing this network namespace must not share links, chains, addresses or the
	// refusal log: a second one with the same settings stops here, before it builds or touches
	// anything.
	if capability.Has(capability.NetAdmin) {
		pool, err := netpool.ParsePrefix(c.NetPool)
		if err != nil {
			return nil, closeAll, fmt.Errorf("--net-pool: %w", err)
		}
		claims, err := netclaim.Claim(netclaim.DefaultDir, netclaim.Want{Scope: c.NetScope, Pool: pool, LogGroup: uint16(c.NFLogGroup)})
		if err != nil {
			return nil, closeAll, err
		}
		cleanups = append(cleanups, claims.Release)
	}
	// Before the first sandbox: the mark reaches only processes started after it.
	if c.MemoryMerge {
		h, started, err := memmerge.Enable(ctx)
		if err != nil {
			return nil, closeAll, fmt.Errorf("--memory-merge: %w", err)
		}
		log.Info("memory merging on: the kernel merges identical pages of the sandboxes' sentries and gofers",
			"started_ksmd", started, "ksm_pages_to_scan", h.PagesToScan, "ksm_sleep_millisecs", h.SleepMillis)
	}
	if _, err := template.Load(c.DataDir, "base"); err != nil {
		fmt.Fprintln(os.Stderr, "vmon: building template base (first start; cached afterwards)")
		if _, err := template.BuildBase(ctx, template.BaseOptions{DataDir: c.DataDir, Progress: os.Stderr, Logger: log}); err != nil {
			return nil, closeAll, fmt.Errorf("build template base: %w", err)
		}
	}
	if c.SandboxDiskMB > 0 {
		if err := rootfs.DiskSupported(); err != nil {
			return nil, closeAll, fmt.Errorf("sandbox disk limits (--sandbox-disk-mb %d) cannot be enforced on this host: %w; "+
				"fix that, or run with --sandbox-disk-mb 0 to let sandboxes write to the host's disk without a limit",
				c.SandboxDiskMB, err)
		}
	}
	manifests, err := syncTemplates(ctx, st, c.DataDir, c.SandboxDiskMB)
	if err != nil {
		return nil, closeAll, err
	}
	envdPath, err := installEnvd(c, log)
	if err != nil {
		return nil, closeAll, err
	}

	rt, err := gvisor.New(gvisor.Options{
		RunscPath: c.RunscPath,
		RootDir:   filepath.Join(c.DataDir, "runsc"),
		Platform:  c.Platform,
		Adopt:     true,
		Logger:    log.With("component", "gvisor"),
	})
	if err != nil {
		return nil, closeAll, fmt.Errorf("runtime: %w (run `vmon doctor`)", err)
	}
	var nodeRef atomic.Pointer[node.Node]
	network, closeNetwork, err := setupNetwork(ctx, c, log, &nodeRef)
	if err != nil {
		return nil, closeAll, err
	}
	cleanups = append(cleanups, closeNetwork)
	vols, err := volumes.New(c.DataDir, volumes.Options{DefaultSizeMB: c.VolumeSizeMB, MaxSizeMB: c.MaxVolumeSizeMB,
		ImageDir: filepath.Join(c.DataDir, "disk-images"), Log: log.With("component", "volumes")})
	if err != nil {
		return nil, closeAll, err
	}
	nopts := node.Options{
		// Mount, not Path: a sandbox must bind the volume's filesystem, never the directory
		// under it (after a reboot the filesystem is not mounted yet).
		VolumePath:       vols.Mount,
		ReadyTimeout:     c.ReadyTimeout,
		DataDir:          c.DataDir,
		Runtime:          rt,
		RootFS:           rootfsAdapter{imageDir: filepath.Join(c.DataDir, "disk-images"), log: log.With("component", "rootfs")},
		Templates:        templateRoots{dataDir: c.DataDir, fetch: fetch},
		EnvdPath:         envdPath,
		NetNSPrefix:      netnsPrefix(c.DataDir),
		Warm:             warmSpecs(manifests, c.WarmPool, c.SandboxDiskMB),
		Limits:           limits.Overrides{Tasks: c.SandboxMaxTasks, Files: c.SandboxMaxFiles},
		Log:              log.With("component", "node"),
		MaxSnapshotBytes: int64(c.MaxSnapshotDiskMB) << 20,
		DiskMB:           c.SandboxDiskMB,
	}
	var images *rootimage.Store
	if c.RootImages {
		if _, err := exec.LookPath("mkfs.erofs"); err != nil {
			return nil, closeAll, fmt.Errorf("root images (--root-images, on by default) need mkfs.erofs: apt-get install erofs-utils, or run with --root-images=false (each sandbox then has a gofer and an overlay mount): %w", err)
		}
		if images, err = rootimage.New(rootimage.Options{Dir: filepath.Join(c.DataDir, "root-images"), DataDir: c.DataDir,
			GuestBinDir: node.GuestBinDir, Log: log.With("component", "rootimage")}); err != nil {
			return nil, closeAll, err
		}
		cleanups = append(cleanups, images.Close)
		nopts.RootImages = images
	}
	var egressProxy *egressproxy.Proxy
	if network != nil {
		// Set only when non-nil: a nil *netpool.Pool in the interface would look networked.
		nopts.Network = network.pool
		nopts.Denied, nopts.Env = network.hub, network.env
		if network.names != nil {
			nopts.Names = network.names
		}
		if egressProxy = network.proxy; egressProxy != nil {
			nopts.EgressProxy = true
			nopts.CABundle = egressProxy.CABundle()
		}
	} else {
		// Without networking, sandboxes get loopback-only namespaces (creates are refused anyway).
		nopts.NetNS = netnsAdapter{}
	}
	if guest != nil {
		nopts.GuestLog = guest
	}
	n, err := node.New(nopts)
	if err != nil {
		return nil, closeAll, err
	}
	nodeRef.Store(n)
	recovery, err := n.Recover(ctx)
	if err != nil {
		log.Warn("recovery left errors", "err", err)
	}
	if err := node.SweepEnvd(c.DataDir, envdPath, build.LayersDir); err != nil {
		log.Warn("old envd builds were kept", "err", err)
	}
	if images != nil {
		prepareRootImages(ctx, images, c.DataDir, envdPath, manifests, log)
	}
	return &nodeStack{n: n, recovery: recovery, network: network, vols: vols, egressProxy: egressProxy,
		envdPath: envdPath, manifests: manifests}, closeAll, nil
}

// openDataDir makes the data dir, takes its lock (one vmon serve per data dir) and opens its
// store; the returned func closes the store and gives the lock back.
func openDataDir(ctx context.Context, c *config.Serve) (*store.Store, func(), error) {
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("create data dir: %w", err)
	}
	unlock, err := lockDataDir(ctx, c.DataDir, lockWait)
	if err != nil {
		return nil, nil, err
	}
	var st *store.Store
	if c.Database != "" {
		st, err = store.OpenPostgres(ctx, c.Database)
	} else {
		st, err = store.Open(ctx, c.DataDir)
	}
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return st, func() { st.Close(); unlock() }, nil
}

func listenAndServe(ctx context.Context, c *config.Serve, h http.Handler, log *slog.Logger, stdout io.Writer, apiKey string) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    httpguard.ServerMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	var caPath string
	switch {
	case c.TLS == "self-signed":
		iss, err := tlsutil.NewIssuer(filepath.Join(c.DataDir, "tls"), c.Domain)
		if err != nil {
			return err
		}
		srv.TLSConfig = &tls.Config{GetCertificate: iss.GetCertificate, MinVersion: tls.VersionTLS12}
		caPath = iss.CAPath
	case c.TLSCert != "":
		pair, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return fmt.Errorf("load TLS certificate: %w", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	}
	lns, err := listen(c.Listen, srv.TLSConfig != nil)
	if err != nil {
		return err
	}
	printEnv(stdout, c, lns[0].Addr().String(), apiKey, caPath)
	errc := make(chan error, len(lns))
	for _, ln := range lns {
		if srv.TLSConfig != nil {
			ln = tls.NewListener(ln, srv.TLSConfig)
		} else {
			ln = httpguard.Listener(ln)
		}
		go func() { errc <- srv.Serve(ln) }()
	}
	log.Info("vmon serving", "listen", c.Listen, "tls", srv.TLSConfig != nil, "data_dir", c.DataDir)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	// Sandboxes keep running across a restart of vmon; the next start adopts them.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return srv.Close()
	}
	return nil
}

// listen opens addr and, when it is IPv4 loopback with TLS on, also the IPv6 loopback on the same
// port: `*.localhost` names resolve to ::1 first in Node, and only TLS mode uses names.
func listen(addr string, tlsOn bool) ([]net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	lns := []net.Listener{ln}
	host, port, _ := net.SplitHostPort(addr)
	if tlsOn && host == "127.0.0.1" {
		if ln6, err := net.Listen("tcp", net.JoinHostPort("::1", port)); err == nil {
			lns = append(lns, ln6)
		}
	}
	return lns, nil
}

func printEnv(w io.Writer, c *config.Serve, addr, apiKey, caPath string) {
	keyLine := "E2B_API_KEY=" + apiKey
	if apiKey == "" {
		keyLine = "E2B_API_KEY=<a key from `vmon keys create`>"
	}
	if c.TLSEnabled() {
		_, port, _ := net.SplitHostPort(addr)
		fmt.Fprintln(w, keyLine)
		fmt.Fprintln(w, "E2B_DOMAIN="+c.Domain)
		if caPath != "" {
			fmt.Fprintln(w, "NODE_EXTRA_CA_CERTS="+caPath)
		}
		if port != "443" {
			fmt.Fprintf(w, "# the SDK reaches https://api.%s on port 443 only; this listener is on port %s\n", c.Domain, port)
		}
		return
	}
	base := "http://" + addr
	fmt.Fprintln(w, keyLine)
	fmt.Fprintln(w, "E2B_API_URL="+base)
	fmt.Fprintln(w, "E2B_SANDBOX_URL="+base)
}

// ensureAdminKey creates the first admin key on first start and writes it to <data-dir>/api-key
// (0600); only its hash is stored. Later starts read the file to print the env lines again.
func ensureAdminKey(ctx context.Context, st *store.Store, dataDir string) (string, error) {
	path := filepath.Join(dataDir, "api-key")
	n, err := st.CountActiveAPIKeys(ctx)
	if err != nil {
		return "", err
	}
	if n == 0 {
		_, plain, err := st.CreateAPIKey(ctx, "admin", time.Now())
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(path, []byte(plain+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("write api key file: %w", err)
		}
		return plain, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil
	}
	plain := strings.TrimSpace(string(data))
	if _, err := st.VerifyAPIKey(ctx, plain); err != nil {
		return "", nil // revoked since; don't advertise it
	}
	return plain, nil
}

// lockWait is how long a start waits for the data dir's lock. A node restarted right after a
// crash can find it held for a moment: a child forked at the instant of the crash keeps a copy
// of the descriptor until its exec closes it.
const lockWait = 5 * time.Second

// lockDataDir makes sure one vmon serve owns a data dir: a second one would adopt the first one's
// sandboxes while their agents stay connected to the first, and remove its links and rules.
func lockDataDir(ctx context.Context, dir string, wait time.Duration) (func(), error) {
	path := filepath.Join(dir, "serve.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open data dir lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock data dir: %w", err)
		}
		if !time.Now().Before(deadline) {
			holder := ""
			if pid := lockHolder(f); pid != "" {
				holder = " (pid " + pid + " holds " + path + ")"
			}
			f.Close()
			return nil, fmt.Errorf("another vmon serve is running on %s%s", dir, holder)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// lockHolder finds the process holding the flock on f in /proc/locks ("" if it cannot tell).
func lockHolder(f *os.File) string {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return ""
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return ""
	}
	// "1: FLOCK  ADVISORY  WRITE 1234 08:01:1024615 0 EOF"; the device is major:minor in hex.
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	for line := range strings.Lines(string(locks)) {
		fields := strings.Fields(line)
		if len(fields) >= 6 && fields[1] == "FLOCK" && fields[5] == want {
			return fields[4]
		}
	}
	return ""
}

// noNetAdmin is the seed's exact warning for --net auto without CAP_NET_ADMIN.
const noNetAdmin = "no CAP_NET_ADMIN: this node cannot network sandboxes and will reject creates"

// networkSetup is what a networked node runs beside its pool.
type networkSetup struct {
	pool  *netpool.Pool
	proxy *egressproxy.Proxy // nil with --egress-proxy-port 0
	hub   *denied.Hub
	env   egress.Env
	names *egressdns.Resolver // nil with --egress-dns off or without the proxy
}

// upstreamResolver resolves through servers (host:port, in turn) instead of those of
// /etc/resolv.conf; none: nil, the system's resolver.
func upstreamResolver(servers []string) egressproxy.Resolver {
	if len(servers) == 0 {
		return nil
	}
	// Go's resolver dials once per try: each dial starts at the next server, so a server that
	// does not answer (a UDP dial succeeds all the same) costs one try, not every one.
	var next atomic.Uint32
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		var errs []error
		first := int(next.Add(1)-1) % len(servers)
		for i := range servers {
			s := servers[(first+i)%len(servers)]
			conn, err := d.DialContext(ctx, network, s)
			if err == nil {
				return conn, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}}
}

// startEgressResolver starts the filtering resolver on every address at port; like the proxy it
// only answers guests whose links redirected their DNS to it.
func startEgressResolver(port int, upstreams []string, refusedTo *atomic.Pointer[node.Node], log *slog.Logger) (*egressdns.Resolver, func(), error) {
	res, err := egressdns.New(egressdns.Config{Log: log, Upstreams: upstreams, OnRefuse: func(r egressdns.Refusal) {
		if n := refusedTo.Load(); n != nil {
			n.DNSRefused(r.Guest, r.Name, r.Type)
		}
	}})
	if err != nil {
		return nil, nil, err
	}
	stop, err := res.ListenAndServe(fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		return nil, nil, fmt.Errorf("egress resolver: %w (choose another --egress-dns-port)", err)
	}
	return res, stop, nil
}

// setupNetwork makes the link pool per --net: auto without CAP_NET_ADMIN starts without one
// (creates then fail with a clear error), tap without it refuses to start. With a pool it starts
// the transparent egress proxy on --egress-proxy-port and the reader of the firewall's refusals;
// both report to the node once refusedTo holds it. The returned close runs after the node's own
// shutdown so links in use stay for the next start to recover.
func setupNetwork(ctx context.Context, c *config.Serve, log *slog.Logger, refusedTo *atomic.Pointer[node.Node]) (*networkSetup, func(), error) {
	nop := func() {}
	if !capability.Has(capability.NetAdmin) {
		if c.Net == "tap" {
			return nil, nop, errors.New("--net tap needs CAP_NET_ADMIN (run vmon serve as root)")
		}
		log.Warn(noNetAdmin)
		return nil, nop, nil
	}
	prefix, err := netpool.ParsePrefix(c.NetPool)
	if err != nil {
		return nil, nop, fmt.Errorf("--net-pool: %w", err)
	}
	internal, err := egress.ParseInternalAllow(c.EgressInternal)
	if err != nil {
		return nil, nop, fmt.Errorf("--egress-internal-allow: %w", err)
	}
	uid, gid, err := lookupVMMUser(c.VMMUser)
	if err != nil {
		return nil, nop, err
	}
	ns := &networkSetup{env: egress.NewEnv(internal), hub: denied.New(0, 0)}
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	logGroup := uint16(c.NFLogGroup)
	err = denied.Listen(bg, logGroup, log.With("component", "denied"), func(p denied.Packet) {
		if n := refusedTo.Load(); n != nil {
			n.KernelRefused(p)
		}
	})
	if err != nil {
		// The policy is enforced all the same; only the report of the kernel's refusals is lost.
		log.Warn("refusals of the address rules will not be reported", "err", err)
		logGroup = 0
	}
	onRefuse := func(r egressproxy.Refusal) {
		if n := refusedTo.Load(); n != nil {
			n.ProxyRefused(r.Guest, r.Dst, r.Port, r.Name, string(r.Stage), r.Rule)
		}
	}
	proxy, proxyPort, stopProxy, err := startEgressProxy(c.EgressProxyPort, c.DataDir, ns.env, upstreamResolver(c.EgressUpstreamDNS), onRefuse, log.With("component", "egressproxy"))
	if err != nil {
		stopBG()
		return nil, nop, err
	}
	ns.proxy = proxy
	cfg := netpool.Config{
		Prefix: prefix, Target: c.ReadyLinks(), Kind: netpool.Veth, NetNSScope: dataDirScope(c.DataDir), LinkPrefix: c.NetScope,
		VMMUser: uid, VMMGroup: gid, Env: ns.env, Log: log.With("component", "netpool"),
		ProxyPort: proxyPort, LogGroup: logGroup,
	}
	if proxy != nil {
		cfg.Proxies = append(cfg.Proxies, proxy)
	}
	// The resolver serves policies with allowOut domains (firewall.filtersDNS), which only a
	// node running the proxy accepts: without the proxy it would have nobody to answer.
	switch c.EgressDNS {
	case "off":
	case "filter", "":
		if proxy == nil {
			break
		}
		res, stopRes, err := startEgressResolver(c.EgressDNSPort, c.EgressUpstreamDNS, refusedTo, log.With("component", "egressdns"))
		if err != nil {
			stopProxy()
			stopBG()
			return nil, nop, err
		}
		ns.names = res
		cfg.Proxies = append(cfg.Proxies, res)
		cfg.DNSPort = uint16(c.EgressDNSPort)
		prevStop := stopProxy
		stopProxy = func() { prevStop(); stopRes() }
	default:
		stopProxy()
		stopBG()
		return nil, nop, fmt.Errorf("--egress-dns %q: must be off or filter", c.EgressDNS)
	}
	if ns.pool, err = netpool.New(ctx, cfg); err != nil {
		stopProxy()
		stopBG()
		return nil, nop, fmt.Errorf("network pool: %w", err)
	}
	return ns, func() {
		if err := ns.pool.Close(context.WithoutCancel(ctx)); err != nil {
			log.Warn("closing the network pool", "err", err)
		}
		stopProxy()
		stopBG()
	}, nil
}

// startEgressProxy listens on every address at port (0: no proxy). Only flows a link's nat
// chain redirected reach it from guests (INPUT accepts ctstate DNAT alone); anything else that
// connects is reset at once, since its addresses match no guest's link. Its CA (header rules) is
// created once in <data-dir>/egress.
func startEgressProxy(port int, dataDir string, env egress.Env, res egressproxy.Resolver, onRefuse func(egressproxy.Refusal), log *slog.Logger) (*egressproxy.Proxy, uint16, func(), error) {
	if port == 0 {
		log.Info("egress proxy disabled (--egress-proxy-port 0): allowOut domains, header rules and egressProxy are refused with 503")
		return nil, 0, func() {}, nil
	}
	if port < 0 || port > 65535 {
		return nil, 0, nil, fmt.Errorf("--egress-proxy-port %d: must be 1-65535, or 0 to disable", port)
	}
	ca, err := tlsutil.LoadOrCreateCA(filepath.Join(dataDir, "egress"), "vmon egress CA")
	if err != nil {
		return nil, 0, nil, err
	}
	roots, err := originRoots()
	if err != nil {
		return nil, 0, nil, err
	}
	ln, err := net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		return nil, 0, nil, fmt.Errorf("egress proxy: %w (choose another --egress-proxy-port, or 0 to run without allowOut domains)", err)
	}
	p := egressproxy.New(egressproxy.Config{Env: env, Log: log, CA: ca, OriginRoots: roots, OnRefuse: onRefuse, Resolver: res})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := p.Serve(ln); err != nil {
			log.Error("egress proxy stopped", "err", err)
		}
	}()
	return p, uint16(port), func() {
		p.Close()
		ln.Close()
		<-done
	}, nil
}

// testOriginCAEnv names a PEM file of extra roots the egress proxy trusts for the origins of
// intercepted HTTPS flows, beside the host's own. It exists for the networking tests, whose fake
// internet has its own CA; production nodes trust the host's roots only.
const testOriginCAEnv = "VMON_TEST_EGRESS_ORIGIN_CA"

func originRoots() (*x509.CertPool, error) {
	path := os.Getenv(testOriginCAEnv)
	if path == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", testOriginCAEnv, err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", testOriginCAEnv, path)
	}
	return pool, nil
}

// lookupVMMUser resolves --vmm-user (a user name or uid) to the owner of TAP links.
func lookupVMMUser(name string) (uint32, uint32, error) {
	if name == "" {
		return 0, 0, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.LookupId(name); err != nil {
			return 0, 0, fmt.Errorf("--vmm-user %q: no such user", name)
		}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("--vmm-user %q: non-numeric ids", name)
	}
	return uint32(uid), uint32(gid), nil
}

// netnsPrefix scopes this node's network namespace names by its data dir, because /run/netns is
// shared by every vmon on the host and recovery removes the namespaces it does not own.
func netnsPrefix(dataDir string) string { return "vmon-" + dataDirScope(dataDir) + "-" }

// dataDirScope is a short name for this data dir, unique per host in practice.
func dataDirScope(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:3])
}

// warmSpecs keeps size pre-started sandboxes of the base template in its default shape.
func warmSpecs(ms []template.Manifest, size, diskMB int) []node.WarmSpec {
	if size == 0 {
		return nil
	}
	for _, m := range ms {
		if m.ID == template.BaseID {
			return []node.WarmSpec{{TemplateID: m.ID, CPUs: m.CPUs, MemoryMB: m.MemoryMB, DiskMB: diskMB, Size: size}}
		}
	}
	return nil
}

// checkGuestPrograms refuses a start command that runs one of vmon's own guest programs
// (/opt/vmon/bin/…, the node's envd directory mounted in every sandbox) this node does not have:
// it could only fail once its ready command timed out.
func checkGuestPrograms(startCmd, envdDir string) error {
	for _, f := range strings.FieldsFunc(startCmd, func(r rune) bool { return unicode.IsSpace(r) || strings.ContainsRune(";&|()'\"", r) }) {
		name, ok := strings.CutPrefix(f, node.GuestBinDir+"/")
		if !ok || name == "" || strings.Contains(name, "/") {
			continue
		}
		if _, err := os.Stat(filepath.Join(envdDir, name)); err != nil {
			fix := "install it beside envd"
			if name == doctor.CodeInterpreterBinary {
				fix = "make build puts bin/vmon-code-interpreter beside bin/envd; install it there and restart vmon serve"
			}
			return errdefs.InvalidArgument("the start command runs %s, which this node does not have: %s", f, fix)
		}
	}
	return nil
}

// syncTemplates registers every built template with the store so the API can resolve it. Their
// sandboxes get diskMB of disk (E2B's diskSizeMB is the sandbox's disk, not the image's size).
func syncTemplates(ctx context.Context, st *store.Store, dataDir string, diskMB int) ([]template.Manifest, error) {
	ms, err := template.List(dataDir)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	return ms, registerTemplates(ctx, st, ms, diskMB)
}

// registerTemplates records ms as ready templates.
func registerTemplates(ctx context.Context, st *store.Store, ms []template.Manifest, diskMB int) error {
	for _, m := range ms {
		err := st.PutTemplate(ctx, store.Template{
			ID: m.ID, Aliases: []string{m.ID}, BuildID: m.BuildID,
			CPU: m.CPUs, MemoryMB: m.MemoryMB, DiskMB: diskMB,
			EnvdVersion: agentproto.EnvdVersion, Status: store.TemplateReady,
			Rootfs: m.RootfsDir(), DefaultUser: m.DefaultUser, DefaultWorkdir: m.DefaultWorkdir,
			CreatedAt: m.BuiltAt, UpdatedAt: m.BuiltAt,
		})
		if err != nil {
			return fmt.Errorf("register template %s: %w", m.ID, err)
		}
	}
	return nil
}

// installEnvd copies envd, with the code-execution service of code-interpreter-v1 when it is
// installed beside vmon, into <data-dir>/envd/<content hash>/, the directory sandboxes mount
// read-only at /opt/vmon/bin. Each build gets its own directory and keeps it while any checkpoint
// holds a process of it: a restore maps the binary from the same path again, and another build's
// bytes there would crash it. The node removes directories nothing refers to (node.SweepEnvd).
func installEnvd(c *config.Serve, log *slog.Logger) (string, error) {
	src := c.EnvdPath
	if src == "" {
		src = defaultEnvdPath()
	}
	envd, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("read envd binary (build it with `make build`, or pass --envd-path): %w", err)
	}
	files := map[string][]byte{"envd": envd}
	h := sha256.New()
	h.Write(envd)
	if svc, err := os.ReadFile(filepath.Join(filepath.Dir(src), codeInterpreterBinary)); err == nil {
		files[codeInterpreterBinary] = svc
		h.Write([]byte{0})
		h.Write(svc)
	} else {
		log.Warn("no code-execution service beside envd: code-interpreter-v1 cannot start", "err", err)
	}
	dir := filepath.Join(c.DataDir, node.EnvdDir, hex.EncodeToString(h.Sum(nil)[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for name, data := range files {
		dst := filepath.Join(dir, name)
		if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, data) {
			continue
		}
		tmp := dst + ".tmp"
		if err := os.WriteFile(tmp, data, 0o755); err != nil {
			return "", err
		}
		if err := os.Rename(tmp, dst); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, "envd"), nil
}

// defaultCapacity is the node's bound on live sandboxes when --max-sandboxes is not set: the
// model of limits.NodeCapacity over this host's memory and cores. Past it, creates get E2B's
// capacity error at once instead of slowing every sandbox on the node.
func defaultCapacity(rootImages bool, log *slog.Logger) int {
	memMiB := int64(0)
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb int64
				if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d", &kb); err == nil {
					memMiB = kb / 1024
				}
			}
		}
	}
	perSandbox := int64(limits.IdleSandboxMiB)
	if rootImages {
		perSandbox = limits.IdleImageSandboxMiB
	}
	c := limits.NodeCapacity(memMiB, goruntime.NumCPU(), perSandbox)
	log.Info("sandbox capacity derived from the host (set --max-sandboxes to override)",
		"max_sandboxes", c.Max, "bound", c.Bound, "memory_bound", c.MemoryBound, "cpu_bound", c.CPUBound,
		"mem_total_mib", memMiB, "cpus", goruntime.NumCPU(), "mib_per_sandbox", perSandbox)
	return c.Max
}

// ingressTargets joins the driver's view (is it running, its tokens) with the node's agent
// channel for ingress.
type ingressTargets struct {
	d *driver.Driver
	n *node.Node
}

func (t ingressTargets) Target(ctx context.Context, id string) (ingress.Target, error) {
	r, err := t.d.RouteOrResume(ctx, id)
	if err != nil {
		return ingress.Target{}, err
	}
	return t.target(r)
}

func (t ingressTargets) target(r driver.Route) (ingress.Target, error) {
	ch, ok := t.n.Channel(r.ID)
	if !ok {
		return ingress.Target{}, errdefs.NotFound("sandbox %q is not on this node", r.ID)
	}
	return ingress.Target{
		ID: r.ID, AccessToken: r.EnvdAccessToken, TrafficToken: r.TrafficAccessToken,
		MaskHost: r.MaskRequestHost, Envd: ch.Transport(), Dial: ch.DialPort,
	}, nil
}

func (t ingressTargets) Targets(ctx context.Context) []ingress.Target {
	routes, err := t.d.RunningSandboxes(ctx)
	if err != nil {
		return nil
	}
	out := make([]ingress.Target, 0, len(routes))
	for _, r := range routes {
		if tg, err := t.target(r); err == nil {
			out = append(out, tg)
		}
	}
	return out
}

// startTemplateBuilds sets up the template build flow: image pulls, the build engine over the
// node's build sandboxes, and the service behind the build API.
func startTemplateBuilds(ctx context.Context, c *config.Serve, st *store.Store, n *node.Node, d *driver.Driver,
	observe func(time.Duration, int, int, error), log *slog.Logger) (*templates.Service, error) {
	engine, files, err := newBuildEngine(c, n, log)
	if err != nil {
		return nil, err
	}
	svc := templates.New(templates.Options{DataDir: c.DataDir, Store: st, Engine: engine, Files: files, Resolver: d,
		MaxConcurrent: c.BuildConcurrency, Log: log.With("component", "templates"), Observe: observe,
		Rescan: func(ctx context.Context) error {
			_, err := syncTemplates(ctx, st, c.DataDir, c.SandboxDiskMB)
			return err
		},
		CheckStart: func(startCmd string) error { return checkGuestPrograms(startCmd, filepath.Dir(n.EnvdPath())) }})
	if err := svc.Recover(ctx); err != nil {
		return nil, fmt.Errorf("recover template builds: %w", err)
	}
	return svc, nil
}

// newBuildEngine is the build engine over n's build sandboxes, with image pulls and the COPY
// archives it takes.
func newBuildEngine(c *config.Serve, n *node.Node, log *slog.Logger) (*build.Engine, *build.Files, error) {
	mirrors, err := c.Mirrors()
	if err != nil {
		return nil, nil, err
	}
	puller := oci.New(oci.Options{Mirrors: mirrors, Insecure: c.InsecureRegistries, DockerConfig: c.DockerConfig,
		Log: log.With("component", "oci")})
	files := build.NewFiles(c.DataDir)
	engine, err := build.New(build.Options{DataDir: c.DataDir, Images: puller, Sandboxes: buildSandboxes{n: n},
		Mounts: buildMounts{}, Files: files, ReadyTimeout: c.ReadyTimeout, NoStartSnapshot: !c.StartSnapshots,
		EnvdBuild: filepath.Base(filepath.Dir(n.EnvdPath())), StartOn: startOn(c),
		Log: log.With("component", "build")})
	if err != nil {
		return nil, nil, err
	}
	return engine, files, nil
}

// startOn names how this node boots template start checks (build.Options.StartOn).
func startOn(c *config.Serve) string {
	if !c.RootImages {
		return ""
	}
	return fmt.Sprintf("root-image format %s, disk %d MiB", rootimage.FormatVersion, c.SandboxDiskMB)
}

// prepareRootImages removes the root images no sandbox, snapshot or current template needs and
// starts building the current templates' missing ones, so the first creates find them.
func prepareRootImages(ctx context.Context, images *rootimage.Store, dataDir, envdPath string, ms []template.Manifest, log *slog.Logger) {
	envdDir := filepath.Dir(envdPath)
	current := map[string]bool{}
	roots := templateRoots{dataDir: dataDir}
	type image struct {
		lowers []string
		envd   string
	}
	var want []image
	for _, m := range ms {
		img, err := roots.Image(ctx, m.ID, m.BuildID)
		if err != nil {
			continue
		}
		want = append(want, image{img.Lowers, envdDir})
		if img.StartSnapshot == "" {
			continue
		}
		// Its sandboxes restore the started snapshot on the image it was taken on, which may hold
		// an older envd build.
		if meta, err := snapshot.Read(img.StartSnapshot); err == nil && meta.RootImage != "" && meta.Envd != "" {
			want = append(want, image{img.Lowers, filepath.Join(dataDir, filepath.FromSlash(meta.Envd))})
		}
	}
	for _, w := range want {
		current[images.Key(w.lowers, w.envd)] = true
	}
	if inUse, err := node.RootImagesInUse(dataDir, build.LayersDir); err != nil {
		log.Warn("old root images were kept", "err", err)
	} else if err := images.Sweep(func(img rootimage.Image) bool {
		return inUse[img.Path] || current[images.Key(img.Lowers, img.Envd)]
	}); err != nil {
		log.Warn("old root images were kept", "err", err)
	}
	for _, w := range want {
		images.Lookup(w.lowers, w.envd)
	}
}
