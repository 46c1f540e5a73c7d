package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vibemon/vmon/internal/artifacts"
	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/egressproxy"
	"github.com/vibemon/vmon/internal/metrics"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/template"
)

// serveMetrics serves m's /metrics, /healthz and /readyz on --metrics-listen, if set; the
// returned stop ends it.
func serveMetrics(c *config.Serve, m *metrics.Metrics, checks []metrics.Check, log *slog.Logger) (func(), error) {
	if c.MetricsListen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", c.MetricsListen)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w", c.MetricsListen, err)
	}
	srv := &http.Server{Handler: m.Handler(checks...), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", "err", err)
		}
	}()
	log.Info("serving metrics and probes", "listen", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// withProbes answers /healthz and /readyz before h: the API listener's probes, without a key.
func withProbes(h http.Handler, checks []metrics.Check) http.Handler {
	healthz, readyz := metrics.Healthz(), metrics.Readyz(checks...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			switch r.URL.Path {
			case "/healthz":
				healthz.ServeHTTP(w, r)
				return
			case "/readyz":
				readyz.ServeHTTP(w, r)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// databaseCheck: the records can be read.
func databaseCheck(st *store.Store) metrics.Check {
	return metrics.Check{Name: "database", Fn: st.Ping}
}

// nodeChecks: what a node needs to take sandboxes: the sandboxes it found at its start settled,
// a network for them, and the base template.
func nodeChecks(n *node.Node, recovery *node.Recovery, dataDir string) []metrics.Check {
	return []metrics.Check{
		{Name: "recovery", Fn: func(ctx context.Context) error {
			if recovery == nil {
				return nil
			}
			return recovery.Wait(ctx)
		}},
		{Name: "network", Fn: func(context.Context) error {
			if f := n.Features(); !slices.Contains(f, driver.FeatureNetTap) && !slices.Contains(f, driver.FeatureNetUser) {
				return errors.New("this node cannot network sandboxes: creates are refused")
			}
			return nil
		}},
		{Name: "templates", Fn: func(context.Context) error {
			if _, err := template.Load(dataDir, template.BaseID); err != nil {
				return fmt.Errorf("no base template: %w", err)
			}
			return nil
		}},
	}
}

// registerMetrics adds collectors to m.
// databaseUse reports what the store asked its database (metrics.DatabaseUse).
func databaseUse(st *store.Store) prometheus.Collector {
	return metrics.DatabaseUse(func() metrics.Database {
		s := st.Stats()
		return metrics.Database{Engine: st.Engine(), Queries: s.Queries, Busy: s.Busy}
	})
}

// proxyMetrics reports what the node's egress proxy relayed; none without a proxy
// (--egress-proxy-port 0).
func proxyMetrics(p *egressproxy.Proxy) []prometheus.Collector {
	if p == nil {
		return nil
	}
	return []prometheus.Collector{metrics.EgressProxyBytes(p.Relayed)}
}

func registerMetrics(m *metrics.Metrics, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := m.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}

// warmPoolMetrics reports node n's warm pool.
func warmPoolMetrics(n *node.Node) prometheus.Collector {
	return metrics.WarmPool(func() []metrics.WarmPoolSpec {
		var out []metrics.WarmPoolSpec
		for _, s := range n.WarmPool() {
			out = append(out, metrics.WarmPoolSpec{TemplateID: s.TemplateID, Size: s.Size, Ready: s.Ready, Hits: s.Hits, Misses: s.Misses})
		}
		return out
	})
}

// nodeRoom is what node n has and uses, as it reports it for placement.
func nodeRoom(n *node.Node, maxSandboxes int, dataDir string) metrics.Room {
	running := n.Running()
	return metrics.Room{Running: running, FreeSlots: max(0, maxSandboxes-running), FreeMemoryMB: memAvailableMB(), FreeDiskMB: freeDiskMB(dataDir)}
}

// meteredStore is the artifact store with what moves through it counted.
type meteredStore struct {
	*artifacts.Store
	m *metrics.Metrics
}

func (s meteredStore) failed(op string, err error) {
	if err != nil && !errors.Is(err, artifacts.ErrNotFound) {
		s.m.StoreFailed(op)
	}
}

func (s meteredStore) Push(ctx context.Context, ref, dir string) (artifacts.PushStats, error) {
	st, err := s.Store.Push(ctx, ref, dir)
	s.m.StoreMoved("up", st.UploadedBytes)
	s.failed("push", err)
	return st, err
}

func (s meteredStore) Pull(ctx context.Context, ref, dir string) (artifacts.PullStats, error) {
	st, err := s.Store.Pull(ctx, ref, dir)
	s.m.StoreMoved("down", st.FetchedBytes)
	s.failed("pull", err)
	return st, err
}

func (s meteredStore) Resolve(ctx context.Context, ref string) (artifacts.RefInfo, error) {
	ri, err := s.Store.Resolve(ctx, ref)
	s.failed("resolve", err)
	return ri, err
}

func (s meteredStore) Refs(ctx context.Context, prefix string) ([]artifacts.RefInfo, error) {
	rs, err := s.Store.Refs(ctx, prefix)
	s.failed("list", err)
	return rs, err
}

func (s meteredStore) Delete(ctx context.Context, ref string) error {
	err := s.Store.Delete(ctx, ref)
	s.failed("delete", err)
	return err
}
