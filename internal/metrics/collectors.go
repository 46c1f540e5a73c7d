package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vibemon/vmon/internal/store"
)

// tallyTimeout bounds the records' count at a scrape.
const tallyTimeout = 5 * time.Second

var sandboxesDesc = prometheus.NewDesc("vmon_sandboxes", "Sandbox records, by state and template (killed ones until their retention passed).",
	[]string{"state", "template"}, nil)

// sandboxStates counts the driver's records at each scrape.
type sandboxStates struct {
	tally func(ctx context.Context) ([]store.SandboxTally, error)
}

// SandboxStates reports the records tally counts, by state and template, at each scrape.
func SandboxStates(tally func(ctx context.Context) ([]store.SandboxTally, error)) prometheus.Collector {
	return sandboxStates{tally: tally}
}

func (c sandboxStates) Describe(ch chan<- *prometheus.Desc) { ch <- sandboxesDesc }

func (c sandboxStates) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), tallyTimeout)
	defer cancel()
	ts, err := c.tally(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(sandboxesDesc, err)
		return
	}
	for _, t := range ts {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(t.Count), string(t.State), t.TemplateID)
	}
}

// Room is what a node has and uses, as it reports it for placement.
type Room struct {
	Running, FreeSlots       int
	FreeMemoryMB, FreeDiskMB int64
}

var (
	runningDesc    = prometheus.NewDesc("vmon_node_sandboxes_running", "Sandboxes running on this node.", nil, nil)
	freeSlotsDesc  = prometheus.NewDesc("vmon_node_free_slots", "Sandboxes this node can still take (its limit less those running).", nil, nil)
	freeMemoryDesc = prometheus.NewDesc("vmon_node_free_memory_bytes", "Host memory available without swapping.", nil, nil)
	freeDiskDesc   = prometheus.NewDesc("vmon_node_free_disk_bytes", "Space left on the data dir's filesystem.", nil, nil)
)

// nodeRoom asks for a node's room once per scrape (it reads /proc and the filesystem).
type nodeRoom struct{ room func() Room }

// NodeRoom reports a node's room at each scrape.
func NodeRoom(room func() Room) prometheus.Collector { return nodeRoom{room: room} }

func (c nodeRoom) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{runningDesc, freeSlotsDesc, freeMemoryDesc, freeDiskDesc} {
		ch <- d
	}
}

func (c nodeRoom) Collect(ch chan<- prometheus.Metric) {
	r := c.room()
	ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, float64(r.Running))
	ch <- prometheus.MustNewConstMetric(freeSlotsDesc, prometheus.GaugeValue, float64(r.FreeSlots))
	ch <- prometheus.MustNewConstMetric(freeMemoryDesc, prometheus.GaugeValue, float64(r.FreeMemoryMB)*(1<<20))
	ch <- prometheus.MustNewConstMetric(freeDiskDesc, prometheus.GaugeValue, float64(r.FreeDiskMB)*(1<<20))
}

// BootQueue reports the driver's boots under way and those waiting for a slot at each scrape.
func BootQueue(queue func() (booting, waiting int)) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vmon_boots_in_progress", Help: "Sandbox boots under way (at most --boot-concurrency)."},
			func() float64 { b, _ := queue(); return float64(b) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "vmon_boot_queue_depth", Help: "Sandbox boots waiting for a boot slot."},
			func() float64 { _, w := queue(); return float64(w) }),
	}
}

// Database is what the records' database was asked so far (store.Stats).
type Database struct {
	Engine  string
	Queries int64
	Busy    time.Duration
}

var (
	dbQueriesDesc = prometheus.NewDesc("vmon_database_queries_total", "Statements the driver ran on its database.", []string{"engine"}, nil)
	dbSecondsDesc = prometheus.NewDesc("vmon_database_query_seconds_total", "Time the driver waited on its database's statements.", []string{"engine"}, nil)
)

type database struct{ stats func() Database }

// DatabaseUse reports the driver's statements and the time they took, by engine (sqlite or
// postgres): what a create costs the database is their change over the create.
func DatabaseUse(stats func() Database) prometheus.Collector { return database{stats: stats} }

func (c database) Describe(ch chan<- *prometheus.Desc) {
	ch <- dbQueriesDesc
	ch <- dbSecondsDesc
}

func (c database) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(dbQueriesDesc, prometheus.CounterValue, float64(s.Queries), s.Engine)
	ch <- prometheus.MustNewConstMetric(dbSecondsDesc, prometheus.CounterValue, s.Busy.Seconds(), s.Engine)
}

var proxyBytesDesc = prometheus.NewDesc("vmon_egress_proxy_bytes_total",
	"Bytes the node's egress proxy relayed for allowOut domains, header rules and the SOCKS5 egress proxy, by direction (sent to origins, received from them); a spliced flow counts when it ends.",
	[]string{"direction"}, nil)

type proxyBytes struct{ relayed func() (sent, received int64) }

// EgressProxyBytes reports what a node's egress proxy relayed, at each scrape.
func EgressProxyBytes(relayed func() (sent, received int64)) prometheus.Collector {
	return proxyBytes{relayed: relayed}
}

func (c proxyBytes) Describe(ch chan<- *prometheus.Desc) { ch <- proxyBytesDesc }

func (c proxyBytes) Collect(ch chan<- prometheus.Metric) {
	s, r := c.relayed()
	ch <- prometheus.MustNewConstMetric(proxyBytesDesc, prometheus.CounterValue, float64(s), "sent")
	ch <- prometheus.MustNewConstMetric(proxyBytesDesc, prometheus.CounterValue, float64(r), "received")
}

// WarmPoolSpec is one warm pool spec of a node, as it reports it: the pre-started sandboxes it
// keeps and has ready, and the creates of its shape that got one (hits) or booted (misses).
type WarmPoolSpec struct {
	TemplateID   string
	Size, Ready  int
	Hits, Misses int64
}

var (
	warmSizeDesc    = prometheus.NewDesc("vmon_warm_pool_size", "Pre-started sandboxes the node keeps for a template (--warm-pool).", []string{"template"}, nil)
	warmReadyDesc   = prometheus.NewDesc("vmon_warm_pool_ready", "Pre-started sandboxes ready to be handed to a create.", []string{"template"}, nil)
	warmCreatesDesc = prometheus.NewDesc("vmon_warm_pool_creates_total",
		"Creates of a pooled template's shape, by result: hit (handed a pre-started sandbox) or miss (the pool was empty; the create booted one).",
		[]string{"template", "result"}, nil)
)

type warmPool struct{ specs func() []WarmPoolSpec }

// WarmPool reports a node's warm pool at each scrape. Misses rising means creates come faster
// than the pool refills, and those creates wait for a boot.
func WarmPool(specs func() []WarmPoolSpec) prometheus.Collector { return warmPool{specs: specs} }

func (c warmPool) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{warmSizeDesc, warmReadyDesc, warmCreatesDesc} {
		ch <- d
	}
}

func (c warmPool) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.specs() {
		ch <- prometheus.MustNewConstMetric(warmSizeDesc, prometheus.GaugeValue, float64(s.Size), s.TemplateID)
		ch <- prometheus.MustNewConstMetric(warmReadyDesc, prometheus.GaugeValue, float64(s.Ready), s.TemplateID)
		ch <- prometheus.MustNewConstMetric(warmCreatesDesc, prometheus.CounterValue, float64(s.Hits), s.TemplateID, "hit")
		ch <- prometheus.MustNewConstMetric(warmCreatesDesc, prometheus.CounterValue, float64(s.Misses), s.TemplateID, "miss")
	}
}
