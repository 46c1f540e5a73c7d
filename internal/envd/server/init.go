package server

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/guestnet"
)

// initRequest is POST /init's body; every field is optional. volumeMounts, hyperloopIP and
// lifecycleID are E2B infrastructure hooks vmon does not use; they are ignored. caBundle (PEM) is
// appended to the guest's trust stores: the node's egress CA, for header rules.
// vmonNetwork is vmon's own: the node pushes the guest's address with it after every boot, since
// guests run no DHCP client. vmonSandboxID is vmon's own too: the sandbox envd serves from now
// on, which stamps the journal's events (a sandbox restored from another's snapshot must not
// read that one's events as its own).
type initRequest struct {
	EnvVars        map[string]string `json:"envVars"`
	AccessToken    *string           `json:"accessToken"`
	Timestamp      *time.Time        `json:"timestamp"`
	DefaultUser    *string           `json:"defaultUser"`
	DefaultWorkdir *string           `json:"defaultWorkdir"`
	VmonNetwork    *guestnet.Config  `json:"vmonNetwork"`
	CABundle       *string           `json:"caBundle"`
	VmonSandboxID  *string           `json:"vmonSandboxID"`
}

// init applies the control plane's session state. Once a token is set, a later /init must prove
// it knows it (X-Access-Token header, or the same token in the body): processes inside the
// sandbox must not be able to take over envd by re-initialising it.
func (s *Server) init(w http.ResponseWriter, r *http.Request) {
	var req initRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		s.writeError(w, r, errdefs.InvalidArgument("invalid /init body: %v", err))
		return
	}
	s.mu.RLock()
	// What the last /init set was checked then; after a resume the node sends it all again.
	newUser := req.DefaultUser != nil && *req.DefaultUser != "" && *req.DefaultUser != s.defaultUser
	newCA := req.CABundle != nil && *req.CABundle != "" && *req.CABundle != s.caBundle
	s.mu.RUnlock()
	if newUser {
		if _, err := s.users.Lookup(*req.DefaultUser); err != nil {
			s.writeError(w, r, errdefs.InvalidArgument("default user '%s' does not exist", *req.DefaultUser))
			return
		}
	}
	if req.VmonNetwork != nil {
		if err := req.VmonNetwork.Validate(); err != nil {
			s.writeError(w, r, errdefs.InvalidArgument("%v", err))
			return
		}
	}
	if newCA {
		if err := checkCABundle([]byte(*req.CABundle)); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	s.mu.Lock()
	if s.token != "" {
		sameToken := req.AccessToken != nil && tokenEqual(*req.AccessToken, s.token)
		if !sameToken && !tokenEqual(r.Header.Get("X-Access-Token"), s.token) {
			s.mu.Unlock()
			s.writeError(w, r, errdefs.Unauthorized("an access token is set; /init needs it in X-Access-Token"))
			return
		}
	}
	// The network goes first and under the lock: a failed push leaves envd's own state (token,
	// env, defaults) untouched, and the node's retry of the same /init finds the same token.
	if req.VmonNetwork != nil {
		if err := s.configureNetwork(*req.VmonNetwork); err != nil {
			s.mu.Unlock()
			s.writeError(w, r, err)
			return
		}
	}
	if newCA {
		// Before the token: a failed write is retried by the node with the same /init.
		if err := installCABundle(s.trustBundles, []byte(*req.CABundle)); err != nil {
			s.mu.Unlock()
			s.writeError(w, r, err)
			return
		}
		s.caBundle = *req.CABundle
	}
	if req.AccessToken != nil && *req.AccessToken != "" {
		s.token = *req.AccessToken
	}
	for k, v := range req.EnvVars {
		s.envVars[k] = v
	}
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		s.defaultUser = *req.DefaultUser
	}
	if req.DefaultWorkdir != nil {
		s.defaultWorkdir = *req.DefaultWorkdir
	}
	if req.VmonSandboxID != nil {
		s.journal.SetSandbox(*req.VmonSandboxID)
	}
	s.mu.Unlock()

	if req.Timestamp != nil && s.setClock {
		if err := setClock(*req.Timestamp); err != nil {
			s.log.Warn("init: set clock", "err", err)
		}
	}
	s.log.Info("initialised", "envVars", len(req.EnvVars), "token", req.AccessToken != nil,
		"defaultUser", req.DefaultUser != nil, "defaultWorkdir", req.DefaultWorkdir != nil,
		"network", req.VmonNetwork != nil, "caBundle", req.CABundle != nil)
	w.Header().Set("X-Envd-Version", agentproto.EnvdVersion)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// configureNetwork applies the guest network /init pushed. What sending the same push again
// cannot fix is a 4xx, so the node stops retrying at once; anything else is a 500 it retries.
//
// +checklocks:s.mu
func (s *Server) configureNetwork(c guestnet.Config) error {
	if s.netConf == nil {
		return errdefs.InvalidArgument("this envd does not configure the guest network (started with --configure-network=false)")
	}
	if err := s.netConf(c); err != nil {
		if errors.Is(err, guestnet.ErrNoInterface) {
			return errdefs.Wrap(errdefs.KindInvalidArgument, err, "configure the guest network: %v", err)
		}
		return fmt.Errorf("configure the guest network: %w", err)
	}
	s.log.Info("guest network configured", "interface", c.Interface, "address", c.Address, "gateway", c.Gateway)
	return nil
}

// metrics is GET /metrics's body (E2B's field names).
type metrics struct {
	Timestamp  int64   `json:"ts"`
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   uint64  `json:"mem_total"`
	MemUsed    uint64  `json:"mem_used"`
	MemCache   uint64  `json:"mem_cache"`
	MemTotalMi uint64  `json:"mem_total_mib"`
	MemUsedMi  uint64  `json:"mem_used_mib"`
	DiskUsed   uint64  `json:"disk_used"`
	DiskTotal  uint64  `json:"disk_total"`
}

func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request) {
	m := metrics{Timestamp: time.Now().Unix(), CPUCount: runtime.NumCPU(), CPUUsedPct: s.metrics.usedPct()}
	if mi, err := readMeminfo("/proc/meminfo"); err == nil {
		m.MemTotal = mi["MemTotal"]
		if avail, ok := mi["MemAvailable"]; ok && avail <= m.MemTotal {
			m.MemUsed = m.MemTotal - avail
		}
		m.MemCache = mi["Cached"]
		m.MemTotalMi, m.MemUsedMi = m.MemTotal>>20, m.MemUsed>>20
	}
	m.DiskUsed, m.DiskTotal = diskUsage("/")
	writeJSON(w, http.StatusOK, m)
}

// readMeminfo returns /proc/meminfo's fields in bytes.
func readMeminfo(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n <<= 10
		}
		out[key] = n
	}
	return out, sc.Err()
}

// cpuSampler turns /proc/stat's cumulative counters into a usage percentage since the last call.
type cpuSampler struct {
	mu sync.Mutex
	// +checklocks:mu
	lastBusy, lastTotal uint64
}

func (c *cpuSampler) usedPct() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	busy, total, err := readCPUStat("/proc/stat")
	if err != nil {
		return 0
	}
	// The first call measures since boot: sampling an interval instead would hold every first
	// /metrics request (the node's snapshot-budget check before a pause among them) for it.
	if busy < c.lastBusy || total <= c.lastTotal {
		c.lastBusy, c.lastTotal = busy, total
		return 0
	}
	db, dt := busy-c.lastBusy, total-c.lastTotal
	c.lastBusy, c.lastTotal = busy, total
	return float64(db) * 100 / float64(dt)
}

func readCPUStat(path string) (busy, total uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, errors.New("unexpected /proc/stat format")
	}
	for i, f := range fields[1:] {
		// guest and guest_nice (fields 9, 10) are already counted in user and nice.
		if i >= 8 {
			break
		}
		n, _ := strconv.ParseUint(f, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, nil
}
