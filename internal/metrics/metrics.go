// Package metrics owns what vmon tells Prometheus and probes: its metrics (named by Prometheus
// conventions with a vmon_ prefix, in a registry of their own), and the endpoints that serve
// them with the health checks: /metrics, /healthz (the process answers) and /readyz (it can
// serve: each part's check passes). It counts and reports only; it never changes what it
// observes, and the packages it observes know it only through their own small interfaces.
package metrics

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/placement"
)

// Sandbox operations the driver reports.
const (
	OpCreate = "create"
	OpPause  = "pause"
	OpResume = "resume"
	OpFork   = "fork"
)

// Operation durations span a warm create (tens of ms) to a cold resume of a large sandbox from
// another node (tens of s).
var opBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// Metrics are one process's metrics.
type Metrics struct {
	reg       *prometheus.Registry
	created   *prometheus.CounterVec
	ops       *prometheus.CounterVec
	durations map[string]prometheus.Observer
	placement *prometheus.CounterVec
	refusals  *prometheus.CounterVec
	builds    *prometheus.HistogramVec
	steps     *prometheus.CounterVec
	storeIO   *prometheus.CounterVec
	storeErrs *prometheus.CounterVec
}

// New makes the metrics of a process serving role (all, driver or node), with the Go runtime's
// and the process's own.
func New(role string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		created: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmon_sandboxes_created_total",
			Help: "Sandboxes created, by template (forks and creates from snapshots included)."}, []string{"template"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmon_sandbox_operations_total",
			Help: "Sandbox creates, pauses, resumes and forks, by operation and outcome (ok, or the error's kind)."}, []string{"op", "outcome"}),
		durations: map[string]prometheus.Observer{},
		placement: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmon_placement_failures_total",
			Help: "Creates and resumes no node could take, by reason (capacity, no_compatible_node)."}, []string{"reason"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmon_egress_refusals_total",
			Help: "Guest connections and lookups the egress policy refused, by the stage that refused them."}, []string{"stage"}),
		builds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vmon_template_build_duration_seconds",
			Help: "Template builds, by outcome (ok or error).", Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 3600}},
			[]string{"outcome"}),
		steps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmon_template_build_steps_total",
			Help: "Steps of template builds, by whether the build cache had their result (cached) or they ran (built)."}, []string{"result"}),
		storeIO: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmon_store_transferred_bytes_total",
			Help: "Bytes moved to (up) and from (down) the cluster's artifact store; what the store or the local cache already had is not counted."},
			[]string{"direction"}),
		storeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vmon_store_errors_total",
			Help: "Artifact store operations that failed (a missing ref is not a failure), by operation."}, []string{"op"}),
	}
	for _, op := range []string{OpCreate, OpPause, OpResume, OpFork} {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vmon_sandbox_" + op + "_duration_seconds",
			Help: "How long a sandbox " + op + " took, as its caller saw it (failures included).", Buckets: opBuckets})
		reg.MustRegister(h)
		m.durations[op] = h
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vmon_info", Help: "Always 1; its labels say what this process is.",
		ConstLabels: prometheus.Labels{"role": role}})
	info.Set(1)
	reg.MustRegister(m.created, m.ops, m.placement, m.refusals, m.builds, m.steps, m.storeIO, m.storeErrs, info,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Register adds a collector of a part that reports its own state at each scrape (the driver's
// records, a node's room).
func (m *Metrics) Register(c prometheus.Collector) error { return m.reg.Register(c) }

// SandboxOp records one driver operation on a sandbox (driver.Observer).
func (m *Metrics) SandboxOp(op, template string, took time.Duration, err error) {
	if h, ok := m.durations[op]; ok {
		h.Observe(took.Seconds())
	}
	m.ops.WithLabelValues(op, outcome(err)).Inc()
	if err == nil && op == OpCreate {
		m.created.WithLabelValues(template).Inc()
	}
	if op == OpCreate || op == OpResume || op == OpFork {
		switch errdefs.CodeOf(err) {
		case placement.Capacity:
			m.placement.WithLabelValues("capacity").Inc()
		case placement.NoCompatibleNode:
			m.placement.WithLabelValues("no_compatible_node").Inc()
		}
	}
}

// SandboxesMade records count sandboxes of template a fork made (driver.Observer).
func (m *Metrics) SandboxesMade(template string, count int) {
	m.created.WithLabelValues(template).Add(float64(count))
}

// EgressRefused records n refusals by stage (the firewall's rules, the proxy's, the resolver's).
func (m *Metrics) EgressRefused(stage string, n int) {
	m.refusals.WithLabelValues(stage).Add(float64(n))
}

// BuildDone records a finished template build: how long it took, and how many of its steps the
// cache had.
func (m *Metrics) BuildDone(took time.Duration, steps, cached int, err error) {
	o := "ok"
	if err != nil {
		o = "error"
	}
	m.builds.WithLabelValues(o).Observe(took.Seconds())
	m.steps.WithLabelValues("cached").Add(float64(cached))
	m.steps.WithLabelValues("built").Add(float64(max(0, steps-cached)))
}

// StoreMoved records bytes moved to ("up") or from ("down") the artifact store.
func (m *Metrics) StoreMoved(direction string, bytes int64) {
	m.storeIO.WithLabelValues(direction).Add(float64(bytes))
}

// StoreFailed records a failed artifact store operation.
func (m *Metrics) StoreFailed(op string) {
	m.storeErrs.WithLabelValues(op).Inc()
}

// outcome labels an operation's end: ok, or its error's kind.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	if errors.Is(err, context.Canceled) {
		return "canceled"
	}
	if k, ok := kindNames[errdefs.KindOf(err)]; ok {
		return k
	}
	return "error"
}

var kindNames = map[errdefs.Kind]string{
	errdefs.KindInvalidArgument:     "invalid_argument",
	errdefs.KindNotFound:            "not_found",
	errdefs.KindConflict:            "conflict",
	errdefs.KindUnauthorized:        "unauthorized",
	errdefs.KindForbidden:           "forbidden",
	errdefs.KindUnavailable:         "unavailable",
	errdefs.KindResourceExhausted:   "resource_exhausted",
	errdefs.KindDeadlineExceeded:    "deadline_exceeded",
	errdefs.KindDataLoss:            "data_loss",
	errdefs.KindInsufficientStorage: "insufficient_storage",
}

// Check is one part's readiness: nil when it can serve.
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
}

// readyTimeout bounds one readiness check.
const readyTimeout = 2 * time.Second

// Handler serves /metrics, /healthz and /readyz; readiness is every check passing (the body
// names those that do not).
func (m *Metrics) Handler(checks ...Check) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.Handle("GET /healthz", Healthz())
	mux.Handle("GET /readyz", Readyz(checks...))
	return mux
}

// Healthz answers 200 while the process serves HTTP at all.
func Healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
}

// Readyz answers 200 when every check passes, else 503 naming the failing ones.
func Readyz(checks ...Check) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		var failed []string
		for _, c := range checks {
			if err := c.Fn(ctx); err != nil {
				failed = append(failed, c.Name+": "+errdefs.PublicMessage(err))
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if len(failed) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n" + strings.Join(failed, "\n") + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
}
