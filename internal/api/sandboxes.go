package api

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

// newSandboxBody is NewSandbox (v1) / NewSandboxV2. Pointers tell "absent" from zero values.
type newSandboxBody struct {
	TemplateID          *string           `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *driver.Network   `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	VolumeMounts        []volumeMountJSON `json:"volumeMounts"`
	// mcp is accepted and ignored: the SDK runs it itself after create.
	AutoResume *struct {
		Enabled *bool `json:"enabled"`
	} `json:"autoResume"`
	MCP json.RawMessage `json:"mcp"`
}

type volumeMountJSON struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// sandboxJSON is E2B's `Sandbox` (create/connect response).
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// sandboxDetailJSON is E2B's `SandboxDetail` (GET one).
type sandboxDetailJSON struct {
	SandboxID           string            `json:"sandboxID"`
	TemplateID          string            `json:"templateID"`
	Alias               string            `json:"alias,omitempty"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool             `json:"allowInternetAccess"`
	Domain              *string           `json:"domain"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	DiskSizeMB          int               `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	Network             driver.Network    `json:"network"`
	Lifecycle           lifecycleJSON     `json:"lifecycle"`
	VolumeMounts        []volumeMountJSON `json:"volumeMounts"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// metricJSON is E2B's `SandboxMetric`; the SDK reads the deprecated `timestamp`.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

func (s *Server) sandboxJSON(sb driver.Sandbox) sandboxJSON {
	out := sandboxJSON{SandboxID: sb.ID, TemplateID: sb.TemplateID, Alias: sb.Alias, ClientID: ClientID,
		EnvdVersion: sb.EnvdVersion, EnvdAccessToken: sb.EnvdAccessToken, Domain: s.domain}
	if sb.TrafficAccessToken != "" {
		t := sb.TrafficAccessToken
		out.TrafficAccessToken = &t
	}
	return out
}

func (s *Server) createV1(w http.ResponseWriter, r *http.Request) error { return s.create(w, r, true) }
func (s *Server) createV2(w http.ResponseWriter, r *http.Request) error { return s.create(w, r, false) }

func (s *Server) create(w http.ResponseWriter, r *http.Request, v1 bool) error {
	var body newSandboxBody
	if err := decodeBody(r, &body, true); err != nil {
		return err
	}
	if body.TemplateID == nil || *body.TemplateID == "" {
		return errdefs.InvalidArgument("templateID is required")
	}
	req := driver.CreateRequest{
		Template:            *body.TemplateID,
		Metadata:            body.Metadata,
		EnvVars:             body.EnvVars,
		AllowInternetAccess: body.AllowInternetAccess,
		Network:             body.Network,
		AutoPause:           body.AutoPause != nil && *body.AutoPause,
		AutoPauseMemory:     body.AutoPauseMemory,
		AutoResume:          body.AutoResume != nil && body.AutoResume.Enabled != nil && *body.AutoResume.Enabled,
		VolumeMounts:        volumeMountRequests(body.VolumeMounts),
		// v2 sandboxes are always secured; v1 clients may opt out explicitly.
		Secure: !v1 || body.Secure == nil || *body.Secure,
	}
	if body.Timeout != nil {
		d, err := seconds("timeout", *body.Timeout)
		if err != nil {
			return err
		}
		req.Timeout = &d
	}
	sb, err := s.driver.Create(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.sandboxJSON(sb))
	return nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.driver.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	// The normal form, never the proxy password or CA bundle.
	network, err := driver.NetworkOf(sb)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sandboxDetailJSON{
		SandboxID: sb.ID, TemplateID: sb.TemplateID, Alias: sb.Alias, ClientID: ClientID,
		StartedAt: sb.StartedAt, EndAt: sb.EndAt, EnvdVersion: sb.EnvdVersion,
		EnvdAccessToken: sb.EnvdAccessToken, AllowInternetAccess: sb.AllowInternetAccess,
		Domain: s.domain, CPUCount: sb.CPU, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB,
		Metadata: nonNil(sb.Metadata), State: string(sb.State), Network: network,
		Lifecycle:    lifecycleOf(sb),
		VolumeMounts: volumeMountsJSON(sb),
	})
	return nil
}

func lifecycleOf(sb driver.Sandbox) lifecycleJSON {
	l := lifecycleJSON{OnTimeout: "kill", AutoResume: sb.AutoResume}
	if sb.AutoPause {
		l.OnTimeout = "pause"
	}
	return l
}

// pause is POST /sandboxes/{id}/pause {memory?}: 204, 409 when already paused.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &body, false); err != nil {
		return err
	}
	if err := s.driver.Pause(r.Context(), r.PathValue("id"), body.Memory == nil || *body.Memory); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resume is the deprecated POST /sandboxes/{id}/resume {timeout?, autoPause?}: 201 with the
// sandbox, 409 when it is running.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &body, false); err != nil {
		return err
	}
	timeout, err := optionalSeconds("timeout", body.Timeout)
	if err != nil {
		return err
	}
	sb, err := s.driver.Resume(r.Context(), r.PathValue("id"), timeout)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.sandboxJSON(sb))
	return nil
}

func optionalSeconds(field string, v *int64) (*time.Duration, error) {
	if v == nil {
		return nil, nil
	}
	d, err := seconds(field, *v)
	if err != nil {
		return nil, err
	}
	return &d, nil
}

// updateNetwork is PUT /sandboxes/{id}/network: SandboxNetworkUpdateConfig (allowOut, denyOut,
// rules, egressProxy, allow_internet_access in snake case) replaces the sandbox's whole egress
// configuration; ingress settings are kept.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request) error {
	var body driver.NetworkUpdate
	if err := decodeBody(r, &body, true); err != nil {
		return err
	}
	if err := s.driver.UpdateNetwork(r.Context(), r.PathValue("id"), body); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) error {
	if err := s.driver.Kill(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *int64 `json:"timeout"`
		// memory false (SDK onResume 'reboot') boots a paused sandbox afresh over its files.
		Memory *bool `json:"memory"`
	}
	if err := decodeBody(r, &body, false); err != nil {
		return err
	}
	timeout, err := optionalSeconds("timeout", body.Timeout)
	if err != nil {
		return err
	}
	sb, resumed, err := s.driver.Connect(r.Context(), r.PathValue("id"), timeout, body.Memory == nil || *body.Memory)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sandboxJSON(sb))
	return nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decodeBody(r, &body, true); err != nil {
		return err
	}
	if body.Timeout == nil {
		return errdefs.InvalidArgument("timeout is required")
	}
	d, err := seconds("timeout", *body.Timeout)
	if err != nil {
		return err
	}
	if err := s.driver.SetTimeout(r.Context(), r.PathValue("id"), d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// E2B's refresh API caps a keep-alive at one hour, and defaults to 15 s (its v1 timeout).
const (
	maxRefresh     = 3600
	defaultRefresh = 15
)

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if err := decodeBody(r, &body, false); err != nil {
		return err
	}
	secs := int64(defaultRefresh)
	if body.Duration != nil {
		secs = *body.Duration
	}
	if secs > maxRefresh {
		return errdefs.InvalidArgument("duration must be at most %d seconds", maxRefresh)
	}
	d, err := seconds("duration", secs)
	if err != nil {
		return err
	}
	if err := s.driver.Refresh(r.Context(), r.PathValue("id"), d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	start, err := unixParam(q.Get("start"), "start")
	if err != nil {
		return err
	}
	end, err := unixParam(q.Get("end"), "end")
	if err != nil {
		return err
	}
	if start >= 0 && end >= 0 && start > end {
		return errdefs.InvalidArgument("start must not be after end")
	}
	ms, err := s.driver.Metrics(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	out := []metricJSON{}
	for _, m := range ms {
		ts := m.Timestamp.Unix()
		if (start >= 0 && ts < start) || (end >= 0 && ts > end) {
			continue
		}
		out = append(out, metricJSON{Timestamp: m.Timestamp.UTC(), TimestampUnix: ts, CPUCount: m.CPUCount,
			CPUUsedPct: m.CPUUsedPct, MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache,
			DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// unixParam parses an optional unix-seconds query parameter; absent is -1.
func unixParam(v, name string) (int64, error) {
	if v == "" {
		return -1, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errdefs.InvalidArgument("%s must be a non-negative integer (unix seconds), got %q", name, v)
	}
	return n, nil
}

// seconds converts a client's seconds into a Duration. Values too large to represent saturate, so
// the driver reports them against the configured maximum instead of overflowing.
func seconds(field string, v int64) (time.Duration, error) {
	if v < 0 {
		return 0, errdefs.InvalidArgument("%s must not be negative", field)
	}
	if v > math.MaxInt64/int64(time.Second) {
		return time.Duration(math.MaxInt64), nil
	}
	return time.Duration(v) * time.Second, nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// listedSandboxJSON is E2B's `ListedSandbox`.
type listedSandboxJSON struct {
	SandboxID    string             `json:"sandboxID"`
	TemplateID   string             `json:"templateID"`
	Alias        string             `json:"alias,omitempty"`
	ClientID     string             `json:"clientID"`
	StartedAt    time.Time          `json:"startedAt"`
	EndAt        time.Time          `json:"endAt"`
	State        store.SandboxState `json:"state"`
	CPUCount     int                `json:"cpuCount"`
	MemoryMB     int                `json:"memoryMB"`
	DiskSizeMB   int                `json:"diskSizeMB"`
	EnvdVersion  string             `json:"envdVersion"`
	Metadata     map[string]string  `json:"metadata"`
	VolumeMounts []volumeMountJSON  `json:"volumeMounts"`
}

func listed(sbs []driver.Sandbox) []listedSandboxJSON {
	out := make([]listedSandboxJSON, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, listedSandboxJSON{SandboxID: sb.ID, TemplateID: sb.TemplateID, Alias: sb.Alias,
			ClientID: ClientID, StartedAt: sb.StartedAt, EndAt: sb.EndAt, State: sb.State, CPUCount: sb.CPU,
			MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB, EnvdVersion: sb.EnvdVersion,
			Metadata: nonNil(sb.Metadata), VolumeMounts: volumeMountsJSON(sb)})
	}
	return out
}

func volumeMountRequests(in []volumeMountJSON) []driver.VolumeMountRequest {
	out := make([]driver.VolumeMountRequest, 0, len(in))
	for _, m := range in {
		out = append(out, driver.VolumeMountRequest{Name: m.Name, Path: m.Path})
	}
	return out
}

func volumeMountsJSON(sb driver.Sandbox) []volumeMountJSON {
	out := make([]volumeMountJSON, 0, len(sb.VolumeMounts))
	for _, m := range sb.VolumeMounts {
		out = append(out, volumeMountJSON{Name: m.Name, Path: m.Path})
	}
	return out
}
