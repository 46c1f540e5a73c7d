package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/placement"
	"github.com/vibemon/vmon/internal/store"
)

// scrape reads /metrics as Prometheus does, with its text parser.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// value is the sample of family name whose labels include want (a histogram's count).
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no %s in /metrics", name)
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no %s%v in /metrics", name, want)
	return 0
}

// filled is a process's metrics after one of each thing they report happened.
func filled(t *testing.T) *Metrics {
	t.Helper()
	m := New("all")
	full := errdefs.WithCode(errdefs.ResourceExhausted("every node is full"), placement.Capacity)
	m.SandboxOp(OpCreate, "base", 120*time.Millisecond, nil)
	m.SandboxOp(OpCreate, "base", 80*time.Millisecond, nil)
	m.SandboxOp(OpCreate, "base", time.Millisecond, full)
	m.SandboxOp(OpResume, "base", time.Second, errdefs.WithCode(errdefs.Unavailable("none"), placement.NoCompatibleNode))
	m.SandboxOp(OpPause, "", 300*time.Millisecond, nil)
	m.SandboxesMade("base", 3)
	m.EgressRefused("denyOut", 1)
	m.EgressRefused("denyOut", 4)
	m.BuildDone(40*time.Second, 7, 5, nil)
	m.BuildDone(time.Second, 2, 0, errors.New("step 2 failed"))
	if err := m.Register(SandboxStates(func(context.Context) ([]store.SandboxTally, error) {
		return []store.SandboxTally{{State: store.StateRunning, TemplateID: "base", Count: 3}, {State: store.StatePaused, TemplateID: "tpl", Count: 1}}, nil
	})); err != nil {
		t.Fatal(err)
	}
	m.StoreMoved("up", 3<<20)
	m.StoreMoved("down", 1<<20)
	m.StoreFailed("push")
	for _, c := range append(BootQueue(func() (int, int) { return 4, 7 }),
		NodeRoom(func() Room { return Room{Running: 2, FreeSlots: 18, FreeMemoryMB: 1024, FreeDiskMB: 2048} }),
		EgressProxyBytes(func() (int64, int64) { return 1500, 64000 }),
		WarmPool(func() []WarmPoolSpec {
			return []WarmPoolSpec{{TemplateID: "base", Size: 2, Ready: 1, Hits: 9, Misses: 3}}
		}),
		DatabaseUse(func() Database { return Database{Engine: "postgres", Queries: 12, Busy: 4 * time.Millisecond} })) {
		if err := m.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// What the driver, a node and the build service report comes out of /metrics under its
// vmon_ name, as Prometheus parses it: counters by label, histograms' counts, the records'
// tally and a node's room at the scrape.
func TestMetrics(t *testing.T) {
	m := filled(t)
	fams := scrape(t, m.Handler())
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vmon_sandboxes_created_total", map[string]string{"template": "base"}, 5},
		{"vmon_sandbox_operations_total", map[string]string{"op": "create", "outcome": "ok"}, 2},
		{"vmon_sandbox_operations_total", map[string]string{"op": "create", "outcome": "resource_exhausted"}, 1},
		{"vmon_sandbox_create_duration_seconds", nil, 3},
		{"vmon_sandbox_pause_duration_seconds", nil, 1},
		{"vmon_sandbox_fork_duration_seconds", nil, 0},
		{"vmon_placement_failures_total", map[string]string{"reason": "capacity"}, 1},
		{"vmon_placement_failures_total", map[string]string{"reason": "no_compatible_node"}, 1},
		{"vmon_egress_refusals_total", map[string]string{"stage": "denyOut"}, 5},
		{"vmon_template_build_duration_seconds", map[string]string{"outcome": "ok"}, 1},
		{"vmon_template_build_steps_total", map[string]string{"result": "cached"}, 5},
		{"vmon_template_build_steps_total", map[string]string{"result": "built"}, 4},
		{"vmon_sandboxes", map[string]string{"state": "running", "template": "base"}, 3},
		{"vmon_sandboxes", map[string]string{"state": "paused", "template": "tpl"}, 1},
		{"vmon_node_free_slots", nil, 18},
		{"vmon_node_free_memory_bytes", nil, 1 << 30},
		{"vmon_info", map[string]string{"role": "all"}, 1},
		{"vmon_store_transferred_bytes_total", map[string]string{"direction": "up"}, 3 << 20},
		{"vmon_store_transferred_bytes_total", map[string]string{"direction": "down"}, 1 << 20},
		{"vmon_store_errors_total", map[string]string{"op": "push"}, 1},
		{"vmon_boots_in_progress", nil, 4},
		{"vmon_boot_queue_depth", nil, 7},
		{"vmon_egress_proxy_bytes_total", map[string]string{"direction": "sent"}, 1500},
		{"vmon_egress_proxy_bytes_total", map[string]string{"direction": "received"}, 64000},
		{"vmon_database_queries_total", map[string]string{"engine": "postgres"}, 12},
		{"vmon_warm_pool_size", map[string]string{"template": "base"}, 2},
		{"vmon_warm_pool_ready", map[string]string{"template": "base"}, 1},
		{"vmon_warm_pool_creates_total", map[string]string{"template": "base", "result": "hit"}, 9},
		{"vmon_warm_pool_creates_total", map[string]string{"template": "base", "result": "miss"}, 3},
		{"vmon_database_query_seconds_total", map[string]string{"engine": "postgres"}, 0.004},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
}

// /healthz answers while the process serves; /readyz only when every check passes, naming
// those that do not.
func TestProbes(t *testing.T) {
	var dbErr error
	h := New("driver").Handler(Check{Name: "database", Fn: func(context.Context) error { return dbErr }},
		Check{Name: "templates", Fn: func(context.Context) error { return nil }})
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		b, _ := io.ReadAll(rec.Body)
		return rec.Code, string(b)
	}
	if code, body := get("/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz: %d %q", code, body)
	}
	dbErr = errdefs.Unavailable("database unavailable")
	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "database: database unavailable") || strings.Contains(body, "templates") {
		t.Fatalf("/readyz with the database down: %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
}

// The Grafana dashboard in deploy/ is valid JSON and asks only for metrics vmon exposes.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "vmon.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	fams := scrape(t, filled(t).Handler())
	name := regexp.MustCompile(`vmon_[a-z_]+`)
	asked := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q asks for nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				asked++
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && fams[b] != nil && fams[b].GetType() == dto.MetricType_HISTOGRAM {
						base = b
					}
				}
				if fams[base] == nil {
					t.Errorf("panel %q asks for %s, which vmon does not expose", p.Title, n)
				}
			}
		}
	}
	if asked < 10 {
		t.Fatalf("the dashboard names %d metrics", asked)
	}
}
