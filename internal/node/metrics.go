package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Metrics is one resource sample of a sandbox as its envd sees it (bytes for memory and disk).
type Metrics struct {
	Timestamp  time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    int64
	MemTotal   int64
	MemCache   int64
	DiskUsed   int64
	DiskTotal  int64
}

// SandboxMetrics samples a running sandbox through its envd's /metrics.
func (n *Node) SandboxMetrics(ctx context.Context, id string) (Metrics, error) {
	sb, ok := n.lookup(id)
	if !ok {
		return Metrics{}, errdefs.NotFound("sandbox %q not found", id)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, envdURL("/metrics"), nil)
	if err != nil {
		return Metrics{}, err
	}
	if sb.token != "" {
		req.Header.Set("X-Access-Token", sb.token)
	}
	resp, err := sb.ch.Transport().RoundTrip(req)
	if err != nil {
		return Metrics{}, errdefs.Wrap(errdefs.KindUnavailable, err, "sandbox metrics unavailable")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Metrics{}, errdefs.Wrap(errdefs.KindUnavailable, fmt.Errorf("envd answered %s", resp.Status), "sandbox metrics unavailable")
	}
	var m struct {
		TS         int64   `json:"ts"`
		CPUCount   int     `json:"cpu_count"`
		CPUUsedPct float64 `json:"cpu_used_pct"`
		MemTotal   int64   `json:"mem_total"`
		MemUsed    int64   `json:"mem_used"`
		MemCache   int64   `json:"mem_cache"`
		DiskUsed   int64   `json:"disk_used"`
		DiskTotal  int64   `json:"disk_total"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&m); err != nil {
		return Metrics{}, fmt.Errorf("decode envd metrics: %w", err)
	}
	return Metrics{
		Timestamp: time.Unix(m.TS, 0), CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache,
		DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
	}, nil
}
