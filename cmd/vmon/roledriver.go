package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/api"
	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/cluster"
	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/fleet"
	"github.com/vibemon/vmon/internal/httpguard"
	"github.com/vibemon/vmon/internal/ingress"
	"github.com/vibemon/vmon/internal/join"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/metrics"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/template"
	"github.com/vibemon/vmon/internal/templates"
	"github.com/vibemon/vmon/internal/tplstore"
)

// refreshEvery is how often the driver asks every node for its room: placement uses what it last
// heard, and a node that is full answers so and passes the create on.
const refreshEvery = 2 * time.Second

// serveDriver runs `vmon serve --role driver`: the E2B API, the edge ingress, placement over the
// cluster's nodes, the records and their expiry, and the cluster endpoint nodes join at. It runs
// no sandbox itself.
func serveDriver(ctx context.Context, c *config.Serve, stdout io.Writer) error {
	log, err := newLogger(c.LogLevel)
	if err != nil {
		return err
	}
	log = log.With("driver", c.Name)
	st, closeData, err := openDataDir(ctx, c)
	if err != nil {
		return err
	}
	defer closeData()
	apiKey, err := driverAdminKey(ctx, st, c)
	if err != nil {
		return err
	}
	// Templates are recorded from the cluster's store when there is one (nodes publish their
	// builds there), else from the driver's data dir, as --role all does.
	var arts *artifacts.Store
	if c.Store != "" {
		if arts, err = openStore(ctx, c, log); err != nil {
			return err
		}
		tpls := tplstore.New(arts, c.DataDir, log.With("component", "templates"))
		go recordStoreTemplates(ctx, tpls, st, c.SandboxDiskMB, log)
	} else {
		if _, err := template.Load(c.DataDir, "base"); err != nil {
			return fmt.Errorf("the driver's data dir has no template base (%w): run scripts/install.sh (it builds it), or give the cluster a --store", err)
		}
		if _, err := syncTemplates(ctx, st, c.DataDir, c.SandboxDiskMB); err != nil {
			return err
		}
	}
	auth, err := clusterAuthority(ctx, c.DataDir, st)
	if err != nil {
		return err
	}
	if err := ensureBootstrapToken(ctx, auth, c); err != nil {
		return err
	}
	hosts, err := certHosts(c)
	if err != nil {
		return err
	}
	own, err := auth.Driver(c.Name, hosts)
	if err != nil {
		return fmt.Errorf("the driver's cluster certificate: %w", err)
	}
	toNodes, err := join.MutualTLS(own, false)
	if err != nil {
		return err
	}

	router := cluster.NewRouter(func(ctx context.Context, id string) (string, error) {
		sb, err := st.GetSandbox(ctx, id)
		if errdefs.Is(err, errdefs.KindNotFound) {
			// A snapshot lives on the node of the sandbox it was taken of.
			if sn, serr := st.GetSnapshot(ctx, id); serr == nil {
				return sn.NodeID, nil
			}
		}
		if err != nil {
			return "", err
		}
		return sb.NodeID, nil
	})
	// The driver is made after the gossip starts (joins are served meanwhile); the fleet hands it
	// gossip's news once it exists.
	var fl atomic.Pointer[fleet.Fleet]
	cl, err := membership.Start(ctx, membership.Options{Name: c.Name, Bind: c.GossipListen, Advertise: c.GossipAdvertise,
		Meta: membership.Meta{Role: membership.RoleDriver, RPC: c.Advertise}, SecretKey: auth.GossipKey,
		OnEvent: func(m membership.Member, kind membership.EventKind) {
			if f := fl.Load(); f != nil {
				f.Event(m, kind)
			}
		}, Log: log.With("component", "membership")})
	if err != nil {
		return err
	}
	defer func() {
		_ = cl.Leave(5 * time.Second)
		_ = cl.Shutdown()
	}()
	auth.Gossip = func() []string { return gossipSeeds(cl) }
	go keepDriversJoined(ctx, cl, c, log.With("component", "membership"))
	if st.Shared() {
		go meetDrivers(ctx, st, c.Name, cl, log.With("component", "membership"))
	}
	stopCluster, err := serveClusterEndpoint(ctx, c, own, auth, cl, log)
	if err != nil {
		return err
	}
	defer stopCluster()

	var sandboxLogs *sandboxlog.Store
	if c.SandboxLogs {
		if sandboxLogs, err = openSandboxLogs(ctx, c, st, log.With("component", "sandboxlog")); err != nil {
			return err
		}
	}
	sealer, err := secretsSealer(ctx, c.DataDir, st)
	if err != nil {
		return err
	}
	m := metrics.New("driver")
	maxSandboxes := c.MaxSandboxes
	if maxSandboxes == 0 {
		// Each node refuses what it has no room for; the cluster's limit is theirs together.
		maxSandboxes = 1 << 20
	}
	// A volume lives on the node that made it: its sandboxes are placed there, and its content
	// is reached there.
	vols := cluster.NewVolumes(router, func(ctx context.Context, id string) (string, error) {
		v, err := st.GetVolume(ctx, id)
		if err != nil {
			return "", err
		}
		if v.NodeID == "" {
			return "", errdefs.Unavailable("volume %q has no node on record", id)
		}
		return v.NodeID, nil
	})
	dopts := driver.Options{
		Store:           st,
		Node:            router,
		Volumes:         vols,
		Logger:          log.With("component", "driver"),
		BootConcurrency: c.BootConcurrency,
		MaxSandboxes:    maxSandboxes,
		MaxTimeout:      c.MaxSandboxTimeout,
		DefaultDiskMB:   c.SandboxDiskMB,
		FeaturesNow:     router.Features,
		Secrets:         sealer,
		Observer:        m,
		// Alone on SQLite a driver names nothing: every creating record at its start is its own,
		// whatever its name was before (a Kubernetes pod's changes at each restart).
		Name: sharedName(st, c.Name),
	}
	var leader *store.Leadership
	if st.Shared() {
		// One driver among those sharing the database expires sandboxes and sweeps what drivers
		// that went away left; the others take over when it goes.
		leader = st.Leader(ctx, "expiry", log.With("component", "leader"))
		dopts.Leader = leader
	}
	if sandboxLogs != nil {
		// The driver writes the lifecycle part; the nodes keep what they saw (processes, limits,
		// egress refusals), and a read merges both.
		var part driver.SandboxLog = sandboxLogs
		if st.Shared() {
			part = sharedLogs{st: st, log: log.With("component", "sandboxlog")}
		}
		dopts.Logs = cluster.NewLogs(part, router)
	}
	d, err := driver.New(dopts)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Adopt(ctx); err != nil {
		return err
	}
	if st.Shared() {
		go followRecords(ctx, st, d, router, log.With("component", "records"))
		go sweepLeftovers(ctx, st, leader, d, cl, log.With("component", "leader"))
	}
	var fleetSandboxes fleet.Sandboxes = d
	if leader != nil {
		fleetSandboxes = leaderLoses{Driver: d, leader: leader}
	}
	f := fleet.New(fleet.Options{Router: router, Records: st, Sandboxes: fleetSandboxes, Grace: c.NodeLostGrace, Every: refreshEvery,
		Log: log.With("component", "fleet"), Connect: func(name, rpc string) cluster.NodeClient { return connectNode(toNodes, name, rpc) }})
	fl.Store(f)
	// Members gossip told of before the fleet existed.
	for _, m := range cl.Members() {
		if m.Name != c.Name {
			f.Event(m, membership.Joined)
		}
	}
	go f.Run(ctx)
	if sandboxLogs != nil {
		go sandboxLogs.Run(ctx, pruneKilled(ctx, st, log))
	}
	domain := ""
	if c.TLSEnabled() {
		domain = c.Domain
	}
	aopts := api.Options{Driver: d, Store: st, Logger: log.With("component", "api"), Domain: domain,
		Volumes: vols, Routes: map[string]http.Handler{"POST " + joinTokensPath: joinTokensHandler(auth)}}
	if c.Store != "" {
		// Builds run on the nodes, which publish them to the store; without one a build would
		// stay on the node that ran it, so the build API answers 501.
		// The COPY archives live in the store too, and drivers sharing a database sign upload
		// URLs with one key: a build's calls may land on any of them.
		files, err := tplstore.NewFiles(arts, c.DataDir)
		if err != nil {
			return err
		}
		uploadKey, err := buildUploadKey(ctx, st)
		if err != nil {
			return err
		}
		svc := templates.New(templates.Options{DataDir: c.DataDir, Store: st, Engine: cluster.NewBuilds(router, files),
			Files: files, Resolver: d, MaxConcurrent: c.BuildConcurrency, Log: log.With("component", "templates"),
			RemoteParents: true, Observe: m.BuildDone, Driver: sharedName(st, c.Name), UploadKey: uploadKey})
		if err := svc.Recover(ctx); err != nil {
			return fmt.Errorf("recover template builds: %w", err)
		}
		defer svc.Close()
		aopts.Builds = svc
	} else {
		log.Warn("template builds need a --store the nodes share: the build API answers 501")
	}
	apiHandler, err := api.New(aopts)
	if err != nil {
		return err
	}
	ing := ingress.New(log.With("component", "ingress"), &clusterTargets{d: d, r: router}, c.Domain)
	checks := []metrics.Check{databaseCheck(st)}
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
	stopMetrics, err := serveMetrics(c, m, checks, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	return listenAndServe(ctx, c, handler, log, stdout, apiKey)
}

// buildUploadKey is the key build upload URLs are signed with: the one all drivers sharing the
// database use, or (alone) one of this process's own.
func buildUploadKey(ctx context.Context, st *store.Store) ([]byte, error) {
	if !st.Shared() {
		return nil, nil
	}
	key, err := st.SharedKey(ctx, "build-upload-key", randomKey(32))
	if err != nil {
		return nil, fmt.Errorf("build upload key: %w", err)
	}
	return key, nil
}

// leaderLoses lets only the leading driver end a lost node's sandboxes: each driver's view of a
// node is its own (a partition may cut one driver off a node the others reach), and ending
// records is for the whole cluster.
type leaderLoses struct {
	*driver.Driver
	leader *store.Leadership
}

func (l leaderLoses) NodeLost(ctx context.Context, node string) error {
	if !l.leader.Leading() {
		return nil
	}
	return l.Driver.NodeLost(ctx, node)
}

// sharedName is the driver's name where drivers share the store, "" where it is alone.
func sharedName(st *store.Store, name string) string {
	if st.Shared() {
		return name
	}
	return ""
}

// followRecords keeps the driver's memory (routes, expiries) and the router's placements in line
// with sandbox records other drivers sharing the database change.
func followRecords(ctx context.Context, st *store.Store, d *driver.Driver, router *cluster.Router, log *slog.Logger) {
	st.Listen(ctx, log, func(ctx context.Context) error {
		recs, err := d.Resync(ctx)
		if err != nil {
			return err
		}
		for _, sb := range recs {
			router.Recorded(sb.ID, sb.NodeID, false)
		}
		return nil
	}, func(ctx context.Context, id string) {
		sb, found, err := d.Changed(ctx, id)
		if err != nil {
			return // the placement stays as it was; the next change or resync corrects it
		}
		router.Recorded(id, sb.NodeID, !found || sb.State == store.StateKilled)
	})
}

// driverBeat is how often a driver sharing the database says where it gossips, and joins the
// gossip of those it does not see there; driverSeen is how recent a word counts.
const (
	driverBeat   = 15 * time.Second
	driverSeen   = 4 * driverBeat
	driverForget = 24 * time.Hour
)

// meetDrivers makes the drivers sharing a database one gossip: each records where it gossips,
// and joins those others it does not already see (at its start, and after a partition healed).
func meetDrivers(ctx context.Context, st *store.Store, name string, cl *membership.Cluster, log *slog.Logger) {
	t := time.NewTicker(driverBeat)
	defer t.Stop()
	for {
		now := time.Now()
		if err := st.SeenDriver(ctx, name, cl.LocalGossip(), now); err != nil && ctx.Err() == nil {
			log.Warn("record this driver's gossip address", "err", err)
		}
		others, err := st.Drivers(ctx, now.Add(-driverSeen), now.Add(-driverForget))
		if err != nil && ctx.Err() == nil {
			log.Warn("list the other drivers", "err", err)
		}
		known := map[string]bool{}
		for _, m := range cl.Members() {
			if m.Alive {
				known[m.Name] = true
			}
		}
		var join []string
		for _, d := range others {
			if !known[d.Name] {
				join = append(join, d.Gossip)
			}
		}
		if len(join) > 0 {
			if n, err := cl.Join(join); err != nil {
				log.Warn("join the other drivers' gossip", "drivers", join, "answered", n, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepEvery is how often the leading driver looks for what drivers that went away left.
const sweepEvery = 30 * time.Second

// sweepLeftovers, while this driver leads, ends the creates and fails the builds of drivers that
// went away mid-way (each driver does so for its own when it starts again, but a replaced one,
// under a new name, never does).
func sweepLeftovers(ctx context.Context, st *store.Store, leader *store.Leadership, d *driver.Driver, cl *membership.Cluster, log *slog.Logger) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	var ledSince time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !leader.Leading() {
			ledSince = time.Time{}
			continue
		}
		if ledSince.IsZero() {
			// Not on the first tick of a lead: gossip, which tells which drivers are alive, has
			// had a sweep interval to settle first.
			ledSince = time.Now()
			continue
		}
		if _, err := d.SweepCreates(ctx); err != nil {
			log.Warn("end creates left behind", "err", err)
		}
		// A driver counts as gone when gossip does not see it alive and it has not recorded its
		// gossip address for a while either: a gossip blip alone never fails its builds. Builds
		// of no driver ("") are left to their driver's restart.
		drivers := []string{""}
		for _, m := range cl.Members() {
			if m.Alive && m.Meta.Role == membership.RoleDriver {
				drivers = append(drivers, m.Name)
			}
		}
		now := time.Now()
		seen, err := st.Drivers(ctx, now.Add(-driverSeen), now.Add(-driverForget))
		if err != nil {
			log.Warn("list the drivers", "err", err)
			continue
		}
		for _, d := range seen {
			drivers = append(drivers, d.Name)
		}
		n, err := st.FailUnfinishedBuilds(ctx, "the driver running the build went away", time.Now(), store.BuildsOf{NotAmong: drivers})
		if err != nil {
			log.Warn("fail builds left behind", "err", err)
		} else if n > 0 {
			log.Warn("failed builds their driver left behind", "builds", n)
		}
	}
}

// storeTemplatesEvery is how often a driver looks for template builds nodes published.
const storeTemplatesEvery = 10 * time.Second

// recordStoreTemplates records the newest build of each template in the store, at once and then
// every storeTemplatesEvery, until ctx ends.
func recordStoreTemplates(ctx context.Context, tpls *tplstore.Sync, st *store.Store, diskMB int, log *slog.Logger) {
	t := time.NewTicker(storeTemplatesEvery)
	defer t.Stop()
	for {
		ms, err := tpls.Manifests(ctx)
		if err == nil {
			err = registerTemplates(ctx, st, ms, diskMB)
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("recording the store's templates", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// joinTokensPath is the driver's API endpoint (an API key required) that issues join tokens, for
// `vmon node join-token --api-url` away from the driver's host.
const joinTokensPath = "/vmon/v1/cluster/join-tokens"

// joinTokenRequest and joinTokenResponse are its body and answer.
type joinTokenRequest struct {
	TTLSeconds int64 `json:"ttlSeconds"`
	Uses       int   `json:"uses"`
}

type joinTokenResponse struct {
	Token string `json:"token"`
}

func joinTokensHandler(auth *join.Authority) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := joinTokenRequest{TTLSeconds: int64(join.DefaultTTL / time.Second), Uses: 1}
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
			writeAPIError(w, errdefs.InvalidArgument("invalid body: %v", err))
			return
		}
		t, err := auth.IssueToken(r.Context(), time.Duration(req.TTLSeconds)*time.Second, req.Uses)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(joinTokenResponse{Token: t.String()})
	})
}

// writeAPIError answers err with E2B's error body.
func writeAPIError(w http.ResponseWriter, err error) {
	status := errdefs.HTTPStatus(err)
	msg := "internal error"
	var e *errdefs.Error
	if errors.As(err, &e) {
		msg = e.Msg
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// certHosts are the names and addresses nodes may reach the driver's cluster endpoint at: the
// advertised one, the host's name and every address of its interfaces.
func certHosts(c *config.Serve) ([]string, error) {
	host, _, err := net.SplitHostPort(c.Advertise)
	if err != nil {
		return nil, err
	}
	hosts := []string{host, "localhost"}
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			hosts = append(hosts, ipn.IP.String())
		}
	}
	return hosts, nil
}

// gossipSeeds are the gossip addresses of the members alive, this driver's first.
func gossipSeeds(cl *membership.Cluster) []string {
	out := []string{cl.LocalGossip()}
	for _, m := range cl.Members() {
		if m.Alive && m.Gossip != cl.LocalGossip() {
			out = append(out, m.Gossip)
		}
	}
	return out
}

// serveClusterEndpoint serves --cluster-listen: the join endpoint (a token proves the node) and
// the gossip seeds (a cluster certificate proves the member), under the driver's certificate.
func serveClusterEndpoint(ctx context.Context, c *config.Serve, own join.Credentials, auth *join.Authority, cl *membership.Cluster, log *slog.Logger) (func(), error) {
	pair, err := tls.X509KeyPair(own.CertPEM, own.KeyPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(own.CAPEM)
	mux := http.NewServeMux()
	mux.Handle(join.Path, auth)
	mux.Handle(join.DiscoveryPath, auth.DiscoveryHandler())
	mux.HandleFunc("GET "+clusterSeedsPath, func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, `{"code":401,"message":"a cluster certificate is required"}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(gossipSeeds(cl))
	})
	srv := &http.Server{
		Handler: mux,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair},
			ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	ln, err := net.Listen("tcp", c.ClusterListen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", c.ClusterListen, err)
	}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("the cluster endpoint stopped", "err", err)
		}
	}()
	return func() {
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}, nil
}

// remoteNode is a node across the network: its contract and its tunnels.
type remoteNode struct {
	*nodeapi.Client
	nodeapi.TunnelDialer
}

// connectNode makes the client of node name serving at rpc, under the driver's cluster TLS.
func connectNode(base *tls.Config, name, rpc string) cluster.NodeClient {
	conf := base.Clone()
	// The node's certificate names the node, wherever it listens.
	conf.ServerName = name
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: conf, ForceAttemptHTTP2: true,
		IdleConnTimeout: 90 * time.Second}}
	return remoteNode{
		Client:       nodeapi.NewClient(hc, "https://"+rpc),
		TunnelDialer: nodeapi.TunnelDialer{Addr: rpc, TLS: conf},
	}
}

// clusterTargets joins the driver's view of a sandbox with a tunnel to the node that holds it.
type clusterTargets struct {
	d *driver.Driver
	r *cluster.Router

	mu sync.Mutex
	// envd keeps one transport per sandbox, so requests to its envd reuse their tunnels.
	// +checklocks:mu
	envd map[string]*http.Transport
}

func (t *clusterTargets) Target(ctx context.Context, id string) (ingress.Target, error) {
	r, err := t.d.RouteOrResume(ctx, id)
	if err != nil {
		return ingress.Target{}, err
	}
	return t.target(r), nil
}

func (t *clusterTargets) target(r driver.Route) ingress.Target {
	return ingress.Target{
		ID: r.ID, AccessToken: r.EnvdAccessToken, TrafficToken: r.TrafficAccessToken, MaskHost: r.MaskRequestHost,
		Envd: t.envdTransport(r.ID),
		Dial: func(ctx context.Context, port int) (net.Conn, error) { return t.r.Dial(ctx, r.ID, port) },
	}
}

// maxEnvdTransports bounds the cache; past it, it starts again (idle tunnels close with it).
const maxEnvdTransports = 4096

func (t *clusterTargets) envdTransport(id string) *http.Transport {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr, ok := t.envd[id]; ok {
		return tr
	}
	if t.envd == nil || len(t.envd) >= maxEnvdTransports {
		for _, tr := range t.envd {
			tr.CloseIdleConnections()
		}
		t.envd = map[string]*http.Transport{}
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return t.r.Dial(ctx, id, agentproto.EnvdPort)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	t.envd[id] = tr
	return tr
}

func (t *clusterTargets) Targets(ctx context.Context) []ingress.Target {
	routes, err := t.d.RunningSandboxes(ctx)
	if err != nil {
		return nil
	}
	out := make([]ingress.Target, 0, len(routes))
	for _, r := range routes {
		out = append(out, t.target(r))
	}
	return out
}
