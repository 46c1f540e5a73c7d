package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/atomicfile"
	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/join"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/metrics"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/pausedstore"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/tplstore"
)

// clusterDir, under a node's data dir, keeps what it got when it joined.
const clusterDir = "cluster"

// nodeCredsFile holds a node's join credentials (its key, certificate, the cluster CA, the gossip
// key): a join token is spent once, so a restart must not need it again.
const nodeCredsFile = "node-credentials.json"

// clusterSeedsPath is the driver's endpoint (mutual TLS) where a member asks for the gossip
// addresses of the cluster's members, to join the gossip through them.
const clusterSeedsPath = "/cluster/v1/seeds"

// rejoinEvery is how often a node with no driver in sight contacts its seeds again.
const rejoinEvery = 5 * time.Second

// serveNode runs `vmon serve --role node`: sandboxes, templates, snapshots and egress enforcement,
// served to the cluster's drivers over mutual TLS (the node contract and tunnels to sandboxes),
// and advertised by gossip. No E2B API, no records: those are the driver's.
func serveNode(ctx context.Context, c *config.Serve, stdout io.Writer) error {
	log, err := newLogger(c.LogLevel)
	if err != nil {
		return err
	}
	log = log.With("node", c.Name)
	// The node's own store holds only what its template scan finds, as --role all's does.
	st, closeData, err := openDataDir(ctx, c)
	if err != nil {
		return err
	}
	defer closeData()
	creds, err := nodeCredentials(ctx, c, log)
	if err != nil {
		return err
	}
	m := metrics.New("node")
	var fetch templateFetcher
	var tpls *tplstore.Sync
	var art meteredStore
	if c.Store != "" {
		store, err := openStore(ctx, c, log)
		if err != nil {
			return err
		}
		art = meteredStore{Store: store, m: m}
		tpls = tplstore.New(art, c.DataDir, log.With("component", "templates"))
		fetch = tpls.Fetch
		// A node that has no base takes the cluster's rather than building one of its own.
		if _, err := template.Load(c.DataDir, template.BaseID); err != nil {
			if _, ferr := tpls.Fetch(ctx, template.BaseID, ""); ferr != nil {
				log.Info("no base template here or in the store; building one", "err", ferr)
			}
		}
	}
	// The node's part of sandbox logs (guest processes, limits, egress refusals) is kept here and
	// read by the drivers, which keep the lifecycle part and merge both.
	var logs *sandboxlog.Store
	var guest node.GuestLog
	var holder atomic.Pointer[node.Node]
	if c.SandboxLogs {
		logs, err = openSandboxLogsOf(c, func(id string) bool {
			n := holder.Load()
			return n == nil || n.Holds(id)
		}, log.With("component", "sandboxlog"))
		if err != nil {
			return err
		}
		guest = guestLog{logs: logs}
	}
	ns, closeNode, err := startNodeStack(ctx, c, st, guest, fetch, log)
	defer closeNode()
	if err != nil {
		return err
	}
	n := ns.n
	holder.Store(n)
	if ns.network != nil {
		logRefusals(ctx, ns.network.hub, logs, m.EgressRefused)
	}
	if logs != nil {
		go logs.Run(ctx, nil)
	}
	if tpls != nil {
		// In the background: the node serves meanwhile, and a build the store has is skipped.
		go func() {
			if err := tpls.Publish(ctx); err != nil {
				log.Warn("publishing templates to the store", "err", err)
			}
		}()
	}
	// What a restart found goes on running; the drivers' records still name it.
	ns.recovery.Run(func(r node.Recovered) {
		log.Info("sandbox found at start", "sandbox", r.ID, "state", r.State)
	})
	n.StartWarmPool()
	defer func() {
		if err := n.Close(context.WithoutCancel(ctx)); err != nil {
			log.Warn("stopping the warm pool", "err", err)
		}
	}()

	maxSandboxes := c.MaxSandboxes
	if maxSandboxes == 0 {
		maxSandboxes = defaultCapacity(c.RootImages, log)
	}
	status := func() nodeapi.Status {
		// Listed at each ask: builds fetched from the store since the start count.
		var templates []string
		if ms, err := template.List(c.DataDir); err == nil {
			for _, m := range ms {
				templates = append(templates, m.ID)
			}
		}
		room := nodeRoom(n, maxSandboxes, c.DataDir)
		return nodeapi.Status{Features: n.Features(), FreeMemoryMB: room.FreeMemoryMB, FreeSlots: room.FreeSlots,
			FreeDiskMB: room.FreeDiskMB, Load: min(1, float64(room.Running)/float64(maxSandboxes)), Templates: templates}
	}
	if err := registerMetrics(m, append(proxyMetrics(ns.egressProxy), metrics.NodeRoom(func() metrics.Room { return nodeRoom(n, maxSandboxes, c.DataDir) }), warmPoolMetrics(n))...); err != nil {
		return err
	}
	stopMetrics, err := serveMetrics(c, m, nodeChecks(n, ns.recovery, c.DataDir), log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	gate := capacityGate{Node: n, max: maxSandboxes, recovery: ns.recovery}
	if art.Store != nil {
		if gate.paused, err = pausedstore.New(n, art, tpls.Fetch, filepath.Join(c.DataDir, clusterDir), log.With("component", "paused")); err != nil {
			return err
		}
		gate.snaps = pausedstore.NewSnapshots(n, art, tpls.Fetch, log.With("component", "snapshots"))
	}
	srvAPI := nodeapi.NewServer(gate, status).WithVolumes(ns.vols)
	if logs != nil {
		srvAPI.WithLogs(logs)
	}
	if tpls != nil {
		// Builds need the store: their result must reach every node.
		engine, files, err := newBuildEngine(c, n, log)
		if err != nil {
			return err
		}
		srvAPI.WithBuilds(nodeBuilds{dataDir: c.DataDir, engine: engine, files: files, tpls: tpls,
			checkStart: func(startCmd string) error { return checkGuestPrograms(startCmd, filepath.Dir(n.EnvdPath())) }})
	}
	rpcPath, rpc := srvAPI.Handler()
	mux := http.NewServeMux()
	mux.Handle(rpcPath, rpc)
	tunnels := nodeapi.TunnelHandler{Lookup: func(id string) (nodeapi.Tunnels, bool) {
		ch, ok := n.Channel(id)
		if !ok || ch == nil {
			return nil, false
		}
		return ch, true
	}}
	tlsConf, err := join.MutualTLS(creds, true)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodConnect {
				tunnels.ServeHTTP(w, r)
				return
			}
			mux.ServeHTTP(w, r)
		}),
		TLSConfig:         tlsConf,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.Listen, err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	defer func() {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			_ = srv.Close()
		}
	}()

	cl, err := membership.Start(ctx, membership.Options{Name: c.Name, Bind: c.GossipListen, Advertise: c.GossipAdvertise,
		Meta:      membership.Meta{Role: membership.RoleNode, RPC: c.Advertise, State: membership.StateReady, Features: n.Features()},
		SecretKey: creds.GossipKey, Log: log.With("component", "membership")})
	if err != nil {
		return err
	}
	defer func() {
		_ = cl.Leave(5 * time.Second)
		_ = cl.Shutdown()
	}()
	go keepJoined(ctx, cl, c, creds, log)
	log.Info("vmon node serving", "listen", c.Listen, "advertise", c.Advertise, "gossip", cl.LocalGossip(), "data_dir", c.DataDir)
	fmt.Fprintf(stdout, "vmon node %s serving on %s\n", c.Name, c.Advertise)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	if c.DrainOnExit {
		drainBeforeExit(cl, c, n, gate.paused, log)
		publishSnapshots(n, gate.snaps, c.DrainTimeout, log)
	}
	return nil
}

// publishSnapshots puts the node's snapshots in the store before it leaves: a snapshot goes
// there only when another node needs it, and a node that is drained to be retired would take the
// rest with it.
func publishSnapshots(n *node.Node, snaps *pausedstore.Snapshots, timeout time.Duration, log *slog.Logger) {
	if snaps == nil {
		return
	}
	ids, err := n.Snapshots()
	if err != nil {
		log.Warn("listing snapshots to put in the store before exit", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, id := range ids {
		if err := snaps.PublishSnapshot(ctx, id); err != nil {
			log.Warn("a snapshot could not be put in the store before exit; it stays on this node", "snapshot", id, "err", err)
		}
	}
	if len(ids) > 0 {
		log.Info("snapshots in the store before exit", "snapshots", len(ids))
	}
}

// drainBeforeExit tells the drivers, by gossip, that the node is draining, and waits until they
// paused its sandboxes (they resume wherever placement puts them next) or the drain timeout
// passes; the node contract stays served meanwhile.
func drainBeforeExit(cl *membership.Cluster, c *config.Serve, n *node.Node, paused *pausedstore.Carrier, log *slog.Logger) {
	meta := membership.Meta{Role: membership.RoleNode, RPC: c.Advertise, State: membership.StateDraining, Features: n.Features()}
	if err := cl.SetMeta(meta, 5*time.Second); err != nil {
		log.Warn("telling the cluster this node drains", "err", err)
	}
	log.Info("draining before exit: waiting for the drivers to pause this node's sandboxes", "sandboxes", n.Running(), "timeout", c.DrainTimeout)
	deadline := time.Now().Add(c.DrainTimeout)
	// A pause is done once its copy is in the store, after the sandbox stopped running here.
	busy := func() bool { return n.Running() > 0 || paused.Pausing() > 0 }
	for busy() && time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
	}
	if busy() {
		log.Warn("drain timed out; these sandboxes stay on this node", "sandboxes", n.Running(), "pauses unfinished", paused.Pausing())
		return
	}
	log.Info("drained")
}

// openStore opens --store.
func openStore(ctx context.Context, c *config.Serve, log *slog.Logger) (*artifacts.Store, error) {
	b, err := artifacts.OpenBackend(ctx, c.Store)
	if err != nil {
		return nil, fmt.Errorf("--store %s: %w", c.Store, err)
	}
	opts := artifacts.Options{Backend: b, Logger: log.With("component", "artifacts")}
	if c.Role == "node" && c.StoreCacheMB > 0 {
		opts.CacheDir, opts.CacheLimit = filepath.Join(c.DataDir, "store-cache"), c.StoreCacheMB<<20
	}
	s, err := artifacts.New(opts)
	if err != nil {
		return nil, fmt.Errorf("--store %s: %w", c.Store, err)
	}
	return s, nil
}

// keepJoined joins the gossip through the drivers, and again whenever no driver is in sight (the
// node started before them, or a partition healed after memberlist gave up on them).
func keepJoined(ctx context.Context, cl *membership.Cluster, c *config.Serve, creds join.Credentials, log *slog.Logger) {
	for {
		if !driverInSight(cl) {
			seeds := clusterSeeds(ctx, c, creds, log)
			if n, err := cl.Join(seeds); err != nil {
				log.Warn("joining the cluster's gossip", "seeds", seeds, "err", err)
			} else {
				log.Info("joined the cluster's gossip", "seeds", seeds, "answered", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(rejoinEvery):
		}
	}
}

func driverInSight(cl *membership.Cluster) bool {
	for _, m := range cl.Members() {
		if m.Alive && m.Meta.Role == membership.RoleDriver {
			return true
		}
	}
	return false
}

// clusterSeeds asks the drivers for the gossip addresses of the cluster's members; the ones the
// join answered with stand in for drivers that do not answer.
func clusterSeeds(ctx context.Context, c *config.Serve, creds join.Credentials, log *slog.Logger) []string {
	conf, err := join.MutualTLS(creds, false)
	if err != nil {
		return creds.Gossip
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: conf}}
	seen := map[string]bool{}
	var out []string
	add := func(addrs []string) {
		for _, a := range addrs {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	for _, addr := range c.Join {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+clusterSeedsPath, nil)
		if err != nil {
			continue
		}
		resp, err := hc.Do(req)
		if err != nil {
			log.Debug("asking a driver for gossip seeds", "driver", addr, "err", err)
			continue
		}
		var seeds []string
		err = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&seeds)
		resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK {
			add(seeds)
		}
	}
	add(creds.Gossip)
	return out
}

// nodeCredentials returns the credentials this data dir joined with, or joins the cluster with
// --join-token through the first driver of --join that answers, and keeps them.
func nodeCredentials(ctx context.Context, c *config.Serve, log *slog.Logger) (join.Credentials, error) {
	path := filepath.Join(c.DataDir, clusterDir, nodeCredsFile)
	if b, err := os.ReadFile(path); err == nil {
		var creds join.Credentials
		if err := json.Unmarshal(b, &creds); err != nil {
			return join.Credentials{}, fmt.Errorf("%s: %w", path, err)
		}
		if name, err := certName(creds.CertPEM); err != nil || name != c.Name {
			return join.Credentials{}, fmt.Errorf("this data dir joined the cluster as node %q, not %q: start it with --name %s, or use another --data-dir", name, c.Name, name)
		}
		return creds, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return join.Credentials{}, err
	}
	token, err := c.ReadJoinToken()
	if err != nil {
		return join.Credentials{}, err
	}
	if token == "" {
		return join.Credentials{}, errors.New("this node has not joined a cluster yet: give it --join-token or --join-token-file (`vmon node join-token` prints one on the driver's host)")
	}
	var errs []error
	for _, addr := range c.Join {
		creds, err := join.Node(ctx, "https://"+addr, token, c.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b, _ := json.Marshal(creds)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return join.Credentials{}, err
		}
		if err := atomicfile.ReplaceDurably(path, b, 0o600); err != nil {
			return join.Credentials{}, fmt.Errorf("keep the node's credentials: %w", err)
		}
		log.Info("joined the cluster", "driver", addr)
		return creds, nil
	}
	return join.Credentials{}, fmt.Errorf("join the cluster: %w", errors.Join(errs...))
}

func certName(certPEM []byte) (string, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return "", errors.New("no certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", err
	}
	return cert.Subject.CommonName, nil
}

// capacityGate refuses what would take the node past its sandbox limit, so that the driver
// passes it to the next node rather than overloading this one (its view of the room here may be
// a few seconds old).
type capacityGate struct {
	*node.Node
	max int
	// recovery is what the node found at its start; its list waits until that is settled.
	recovery *node.Recovery
	// paused, with a cluster store, carries paused sandboxes between nodes.
	paused *pausedstore.Carrier
	// snaps, with a cluster store, shares snapshots between nodes.
	snaps *pausedstore.Snapshots
}

// PauseSandbox pauses; with a cluster store, the pause is done when the paused sandbox is there.
func (g capacityGate) PauseSandbox(ctx context.Context, id string, memory bool) (node.PauseInfo, error) {
	if g.paused == nil {
		return g.Node.PauseSandbox(ctx, id, memory)
	}
	return g.paused.PauseSandbox(ctx, id, memory)
}

// ResumeSandbox resumes a sandbox paused here, or, with a cluster store, one paused on another
// node.
func (g capacityGate) ResumeSandbox(ctx context.Context, spec node.CreateSpec, memory bool) (node.Info, error) {
	if err := g.full(); err != nil {
		return node.Info{}, err
	}
	if g.paused == nil {
		return g.Node.ResumeSandbox(ctx, spec, memory)
	}
	return g.paused.ResumeSandbox(ctx, spec, memory)
}

// DeletePaused deletes a paused sandbox here, and its copy in the cluster store.
func (g capacityGate) DeletePaused(ctx context.Context, id string) error {
	if g.paused == nil {
		return g.Node.DeletePaused(ctx, id)
	}
	return g.paused.DeletePaused(ctx, id)
}

var (
	_ driver.Pauser             = capacityGate{}
	_ driver.Snapshotter        = capacityGate{}
	_ nodeapi.SnapshotPublisher = capacityGate{}
)

// ListSandboxes names what the node holds: the sandboxes handed out, and the paused ones. Not
// before the sandboxes found at the start are settled: one still being recovered is neither.
func (g capacityGate) ListSandboxes(ctx context.Context) (nodeapi.Holdings, error) {
	if g.recovery != nil {
		if err := g.recovery.Wait(ctx); err != nil {
			return nodeapi.Holdings{}, errdefs.Unavailable("the node is still recovering the sandboxes it found at its start")
		}
	}
	paused, err := g.Paused()
	if err != nil {
		return nodeapi.Holdings{}, err
	}
	return nodeapi.Holdings{Running: g.RunningIDs(), Paused: paused}, nil
}

func (g capacityGate) full() error {
	if n := g.Running(); n >= g.max {
		return errdefs.ResourceExhausted("node is full: %d of %d sandboxes", n, g.max)
	}
	return nil
}

func (g capacityGate) CreateSandbox(ctx context.Context, spec node.CreateSpec) (node.Info, error) {
	if err := g.full(); err != nil {
		return node.Info{}, err
	}
	return g.Node.CreateSandbox(ctx, spec)
}

func (g capacityGate) CreateFromSnapshot(ctx context.Context, spec node.CreateSpec, snapID, pausedID string) (node.Info, error) {
	if err := g.full(); err != nil {
		return node.Info{}, err
	}
	if g.snaps == nil {
		return g.Node.CreateFromSnapshot(ctx, spec, snapID, pausedID)
	}
	return g.snaps.CreateFromSnapshot(ctx, spec, snapID, pausedID)
}

// DeleteSnapshot deletes a snapshot here, and its copy in the cluster store.
func (g capacityGate) DeleteSnapshot(ctx context.Context, snapID string) error {
	if g.snaps == nil {
		return g.Node.DeleteSnapshot(ctx, snapID)
	}
	return g.snaps.DeleteSnapshot(ctx, snapID)
}

// PublishSnapshot puts a snapshot of this node in the cluster store, for another node to start
// sandboxes from.
func (g capacityGate) PublishSnapshot(ctx context.Context, snapID string) error {
	if g.snaps == nil {
		return fmt.Errorf("sharing snapshots without a --store is %w", driver.ErrNotImplemented)
	}
	return g.snaps.PublishSnapshot(ctx, snapID)
}

// memAvailableMB is the host memory the kernel says can be had without swapping.
func memAvailableMB() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			var kb int64
			_, _ = fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb / 1024
		}
	}
	return 0
}

// freeDiskMB is the space left to unprivileged writers on dir's filesystem.
func freeDiskMB(dir string) int64 {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0
	}
	return int64(fs.Bavail) * fs.Bsize >> 20
}
