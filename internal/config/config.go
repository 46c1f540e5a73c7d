// Package config is the one place vmon reads its settings: command-line flags with VMON_*
// environment equivalents. Nothing else in vmon reads the environment for configuration.
package config

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vibemon/vmon/internal/limits"
)

// Serve is the configuration of `vmon serve`.
type Serve struct {
	Role string
	// Name is this member's name in the cluster (a node's certificate carries it).
	Name string
	// Advertise is the host:port other members reach this one's RPC at: a node's contract and
	// tunnels, a driver's cluster endpoint (join, seeds).
	Advertise string
	// ClusterListen is a driver's cluster endpoint (TLS): nodes join there.
	ClusterListen string
	// GossipListen and GossipAdvertise are this member's gossip address (TCP and UDP).
	GossipListen, GossipAdvertise string
	// Join lists a node's drivers (host:port of their cluster endpoint, or a DNS name that
	// resolves to several); JoinToken is the token a node joins with the first time.
	Join      []string
	JoinToken string
	// JoinTokenFile holds the join token instead (a mounted Secret); see ReadJoinToken.
	JoinTokenFile string
	// BootstrapTokenFile (driver) holds a join token without a pin that the driver keeps good for
	// any number of joins (a Kubernetes DaemonSet's nodes all join with it).
	BootstrapTokenFile string
	// AdminKeyFile (driver) holds an API key the driver keeps valid (a Helm-made Secret).
	AdminKeyFile string
	// GossipJoin (driver) are gossip addresses where the cluster's drivers find each other.
	GossipJoin []string
	// NodeLostGrace is how long a driver waits for a node out of reach before it ends the node's
	// running sandboxes.
	NodeLostGrace time.Duration
	// DrainOnExit makes a node, told to stop, have its sandboxes paused before it exits (within
	// DrainTimeout).
	DrainOnExit  bool
	DrainTimeout time.Duration
	// Database is a PostgreSQL DSN that several drivers share; "" keeps the embedded SQLite
	// database in the data dir.
	Database string
	// Store is the artifact store the cluster shares (a directory, or s3://bucket/prefix);
	// StoreCacheMB bounds a node's local copies of its chunks.
	Store             string
	StoreCacheMB      int64
	Listen            string
	DataDir           string
	Domain            string
	Runtime           string
	RunscPath         string
	Platform          string
	EnvdPath          string
	BootConcurrency   int
	NetReadyLinks     int
	MaxSandboxes      int
	WarmPool          int
	MaxSandboxTimeout time.Duration
	Net               string
	NetPool           string
	NetScope          string
	NFLogGroup        int
	EgressDNSPort     int
	EgressInternal    string
	EgressProxyPort   int
	EgressDNS         string
	// MetricsListen serves /metrics, /healthz and /readyz over plain HTTP; "" serves none.
	MetricsListen string
	// EgressUpstreamDNS are the servers (host:port) the node's egress resolver and proxy ask;
	// empty: those of /etc/resolv.conf.
	EgressUpstreamDNS []string
	VMMUser           string
	TLS               string
	TLSCert           string
	TLSKey            string
	LogLevel          string
	// RegistryMirrors maps registry hosts to mirrors ("docker.io=127.0.0.1:5000").
	RegistryMirrors []string
	// InsecureRegistries are reached over plain HTTP.
	InsecureRegistries []string
	DockerConfig       string
	BuildConcurrency   int
	ReadyTimeout       time.Duration
	// StartSnapshots saves templates with a start command started, at the end of their build.
	StartSnapshots bool
	// SandboxDiskMB is the writable disk of sandboxes whose template sets none (0: uncapped).
	SandboxDiskMB int
	// VolumeSizeMB is the size of a volume created without one; MaxVolumeSizeMB bounds a
	// requested one.
	VolumeSizeMB, MaxVolumeSizeMB int
	// MaxSnapshotDiskMB bounds the disk paused sandboxes and snapshots take together (0: no bound).
	MaxSnapshotDiskMB int
	// SandboxMaxTasks and SandboxMaxFiles replace the task and open-file limits derived from
	// each sandbox's memory (0: derived).
	SandboxMaxTasks int
	SandboxMaxFiles int
	// SandboxLogMaxBytes caps each sandbox's log (oldest entries dropped first);
	// SandboxLogRetention is how long the log of an ended sandbox stays readable.
	SandboxLogMaxBytes  int64
	SandboxLogRetention time.Duration
	// SandboxLogs turns sandbox logs on (the default); off, nothing is logged and the logs API
	// answers 501 (for measuring what logging costs).
	SandboxLogs bool
	// MemoryMerge lets the kernel merge identical pages of the sandboxes' runsc processes (KSM).
	MemoryMerge bool
	// RootImages boots sandboxes from read-only EROFS images of their templates, without a gofer.
	RootImages bool
}

// Mirrors parses --registry-mirror into a host -> mirror map.
func (c *Serve) Mirrors() (map[string]string, error) {
	out := map[string]string{}
	for _, m := range c.RegistryMirrors {
		host, mirror, ok := strings.Cut(m, "=")
		if !ok || host == "" || mirror == "" || strings.Contains(mirror, "/") {
			return nil, fmt.Errorf("--registry-mirror %q: want <registry>=<mirror host[:port]>, e.g. docker.io=127.0.0.1:5000", m)
		}
		out[host] = mirror
	}
	return out, nil
}

// ReadyLinks is the ready link pool's target: --net-ready-links, or one per boot slot (seed 000,
// "Ready TAP pool").
func (c *Serve) ReadyLinks() int {
	if c.NetReadyLinks >= 0 {
		return c.NetReadyLinks
	}
	return min(c.BootConcurrency, 32)
}

// DefaultDataDir is where vmon keeps its state unless told otherwise.
const DefaultDataDir = "/var/lib/vmon"

// BindServe registers the serve flags on fs.
func BindServe(fs *pflag.FlagSet, c *Serve) {
	fs.StringVar(&c.Role, "role", "all", "process role: all (driver and node), driver or node")
	fs.StringVar(&c.MetricsListen, "metrics-listen", "", "address of a plain-HTTP listener for Prometheus (/metrics) and probes (/healthz, /readyz), e.g. 127.0.0.1:9464 (default: none; the API listener serves /healthz and /readyz too)")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:3000", "address of the API and ingress listener (--role node: of the node's RPC and tunnel listener, mutual TLS)")
	fs.StringVar(&c.Name, "name", "", "this member's name in the cluster, a DNS label (default: the host name)")
	fs.StringVar(&c.Advertise, "advertise", "", "host:port the cluster reaches this member's RPC at (--role node: default --listen when it names a host; --role driver: default --cluster-listen when it names a host)")
	fs.StringVar(&c.ClusterListen, "cluster-listen", "0.0.0.0:3100", "--role driver: address of the cluster endpoint nodes join at (TLS under the cluster CA)")
	fs.StringVar(&c.GossipListen, "gossip-listen", "0.0.0.0:7946", "--role driver/node: gossip address, TCP and UDP")
	fs.StringVar(&c.GossipAdvertise, "gossip-advertise", "", "host:port other members reach this one's gossip at (default --gossip-listen when it names a host)")
	fs.StringSliceVar(&c.Join, "join", nil, "--role node: the drivers' cluster endpoints, host:port (repeatable, or a DNS name that resolves to several)")
	fs.DurationVar(&c.NodeLostGrace, "node-lost-grace", 10*time.Minute, "--role driver: how long a node may stay out of reach before its running sandboxes are ended (back sooner, they run on)")
	fs.BoolVar(&c.DrainOnExit, "drain-on-exit", false, "--role node: on SIGTERM, have the drivers pause this node's sandboxes before exiting, so they resume elsewhere")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 5*time.Minute, "--role node: how long --drain-on-exit waits for the sandboxes to be paused")
	fs.StringVar(&c.Database, "database", "", "--role driver: the PostgreSQL database several drivers share (postgres://user:pass@host/db or libpq key=value; usually from VMON_DATABASE, as it may hold a password); empty: an embedded SQLite database in the data dir")
	fs.StringVar(&c.Store, "store", "", "--role driver/node: the artifact store the cluster shares for templates: a directory (a shared filesystem such as NFS) or s3://bucket/prefix (endpoint and keys the usual AWS way: AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, …); empty: each node keeps its own")
	fs.Int64Var(&c.StoreCacheMB, "store-cache-mb", 10240, "--role node: size of the local cache of the store's chunks, in MiB (0: no cache)")
	fs.StringVar(&c.JoinToken, "join-token", "", "--role node: the token `vmon node join-token` printed on the driver's host, or the driver's --bootstrap-token-file token; needed only for the first start")
	fs.StringVar(&c.JoinTokenFile, "join-token-file", "", "--role node: a file holding the --join-token (e.g. a mounted Secret)")
	fs.StringVar(&c.BootstrapTokenFile, "bootstrap-token-file", "", "--role driver: a file holding a join token without a pin (vmonjoin.<8 hex>.<32 hex>) the driver keeps good for any number of joins, replacing an earlier one; nodes join with it and find the cluster CA by it")
	fs.StringSliceVar(&c.GossipJoin, "gossip-join", nil, "--role driver: gossip addresses (host:port, repeatable, or a name that resolves to several, such as a headless Service of the drivers) the driver joins at start and whenever it sees no other driver, so the cluster's drivers find each other")
	fs.StringVar(&c.AdminKeyFile, "admin-key-file", "", "--role driver: a file holding an API key (e2b_ and 40 lower-case hex) the driver makes a valid admin key at start, instead of making one of its own")
	BindDataDir(fs, &c.DataDir)
	fs.StringVar(&c.Domain, "domain", "localhost", "domain sandboxes are addressed under: <port>-<sandboxID>.<domain>")
	fs.StringVar(&c.Runtime, "runtime", "gvisor", "sandbox runtime backend (gvisor)")
	fs.StringVar(&c.RunscPath, "runsc", "runsc", "path of the runsc binary for the gvisor runtime")
	fs.StringVar(&c.Platform, "gvisor-platform", "systrap", "gVisor platform: systrap or ptrace")
	fs.StringVar(&c.EnvdPath, "envd-path", "", "envd binary to run in sandboxes (default: envd beside the vmon binary)")
	fs.IntVar(&c.BootConcurrency, "boot-concurrency", 4, "sandboxes booted at the same time")
	fs.IntVar(&c.WarmPool, "warm-pool", 1, "pre-started sandboxes kept per template, so creates skip the boot (0 disables)")
	fs.IntVar(&c.MaxSandboxes, "max-sandboxes", 0, "sandboxes this node holds at most (0: derived from its memory and cores, see docs/operations.md)")
	fs.DurationVar(&c.MaxSandboxTimeout, "max-sandbox-timeout", 24*time.Hour, "longest sandbox timeout a client may ask for")
	fs.StringVar(&c.Net, "net", "auto", "sandbox networking: auto (tap if CAP_NET_ADMIN, else none), tap, or user")
	fs.IntVar(&c.NetReadyLinks, "net-ready-links", -1, "sandbox links kept pre-created (-1: one per --boot-concurrency slot, at most 32; 0: none, creates build their link)")
	fs.StringVar(&c.NetPool, "net-pool", "172.20.0.0/16", "IPv4 prefix (/8-/30) the per-sandbox /30 leases are carved from")
	fs.StringVar(&c.NetScope, "net-scope", "vmon", "prefix (1-8 lower-case letters) of this node's sandbox links, iptables chains and pooled network namespaces: nodes sharing one network namespace need different scopes, --net-pool, --nflog-group, --egress-proxy-port and --egress-dns-port")
	fs.IntVar(&c.NFLogGroup, "nflog-group", 5380, "NFLOG group the node's firewall copies refused packets to, for the sandbox logs (1-65535)")
	fs.IntVar(&c.EgressDNSPort, "egress-dns-port", 15353, "port of the node's filtering resolver for sandboxes with allowOut domains (bound on every address)")
	fs.StringVar(&c.EgressInternal, "egress-internal-allow", "", "comma-separated CIDRs exempted from the always-denied ranges on this node")
	fs.StringVar(&c.EgressDNS, "egress-dns", "filter", "DNS of sandboxes whose policy has allowOut domains: filter (the node answers their DNS to any server but the allowOut CIDRs they name, resolves only names their domains cover, and asks upstream in a canonical form: lower-case name, no guest flags or EDNS options) or off (their DNS goes wherever the guest sends it: 8.8.8.8, which domains allow implicitly, resolves any name, a channel out of deny-all)")
	fs.StringSliceVar(&c.EgressUpstreamDNS, "egress-upstream-dns", nil, "DNS servers (host:port, repeatable) the node asks for the names of allowOut domains, for its filtering resolver and its egress proxy (default: those of /etc/resolv.conf)")
	fs.IntVar(&c.EgressProxyPort, "egress-proxy-port", 15380, "port of the node's transparent egress proxy, which enforces allowOut domains (bound on every address; only redirected guest flows are let in; 0 disables it and the egress-domains feature)")
	fs.StringVar(&c.VMMUser, "vmm-user", "", "uid that owns sandbox links when VMMs drop privileges")
	fs.StringVar(&c.TLS, "tls", "", `"self-signed" to serve HTTPS with a CA and wildcard certificate made in the data dir`)
	fs.StringVar(&c.TLSCert, "tls-cert", "", "TLS certificate file (PEM) for the listener")
	fs.StringVar(&c.TLSKey, "tls-key", "", "TLS private key file (PEM) for the listener")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringSliceVar(&c.RegistryMirrors, "registry-mirror", nil, "pull images of a registry from a mirror: <registry>=<host[:port]> (repeatable), e.g. docker.io=127.0.0.1:5000")
	fs.StringSliceVar(&c.InsecureRegistries, "insecure-registry", nil, "registries (host[:port]) reached over plain HTTP, e.g. a local mirror (repeatable)")
	fs.StringVar(&c.DockerConfig, "docker-config", "", "Docker config.json with registry credentials (default: $DOCKER_CONFIG or ~/.docker/config.json)")
	fs.IntVar(&c.BuildConcurrency, "build-concurrency", 2, "template builds run at the same time; more wait")
	fs.BoolVar(&c.StartSnapshots, "template-start-snapshots", true, "save a template with a start command as a snapshot with it running, at the end of its build, and restore every sandbox from it (false: each sandbox runs the start command)")
	fs.DurationVar(&c.ReadyTimeout, "template-ready-timeout", 60*time.Second, "how long a template's ready command may take to succeed, at build and at sandbox create")
	fs.IntVar(&c.MaxSnapshotDiskMB, "max-snapshot-disk", 0, "disk paused sandboxes and snapshots may take together, in MiB; past it pause answers 507 and the sandbox keeps running (0: bounded only by the host's disk)")
	fs.IntVar(&c.SandboxDiskMB, "sandbox-disk-mb", DefaultSandboxDiskMB, "disk each sandbox may write, in MiB, enforced by a filesystem of that size per sandbox (0: uncapped, writes go to the host's disk)")
	fs.IntVar(&c.VolumeSizeMB, "volume-size-mb", DefaultVolumeSizeMB, "size of a volume created without sizeMB, in MiB, enforced by a filesystem of that size per volume (sparse: the host's disk grows only by what is written)")
	fs.IntVar(&c.MaxVolumeSizeMB, "max-volume-size-mb", DefaultMaxVolumeSizeMB, "largest sizeMB a volume create may ask for, in MiB")
	fs.IntVar(&c.SandboxMaxTasks, "sandbox-max-tasks", 0, "processes and threads per sandbox (0: one per MiB of the sandbox's memory, at least 128)")
	fs.IntVar(&c.SandboxMaxFiles, "sandbox-max-files", 0, "open files per sandbox process, RLIMIT_NOFILE (0: 64 per MiB of the sandbox's memory, 1024 to 1048576)")
	fs.BoolVar(&c.MemoryMerge, "memory-merge", false, "let the kernel merge identical memory pages of the sandboxes' sentries and gofers (KSM; never a guest's own memory): about 2.5 MiB less per idle sandbox for some of ksmd's CPU; needs Linux 6.7 or later, and starts ksmd if it is stopped (see docs/operations.md)")
	fs.BoolVar(&c.RootImages, "root-images", true, "boot sandboxes without volumes from a read-only image of their template with envd inside (EROFS, built in the background on first use) instead of an overlay mount: no gofer process and no host mounts per sandbox, about 5 MiB less memory each; a pause of such a sandbox always keeps its memory, since its writes live in its runtime; needs mkfs.erofs (false: every sandbox boots from an overlay with a gofer; see docs/operations.md)")
	fs.BoolVar(&c.SandboxLogs, "sandbox-logs", true, "keep a log per sandbox (lifecycle, processes, limits, egress refusals) for the logs API; false turns them off")
	fs.Int64Var(&c.SandboxLogMaxBytes, "sandbox-log-max-bytes", 1<<20, "size cap of each sandbox's log, in bytes; past it the oldest entries are dropped")
	fs.DurationVar(&c.SandboxLogRetention, "sandbox-log-retention", 24*time.Hour, "how long the log of an ended sandbox stays readable through the logs API")
}

// DefaultSandboxDiskMB is E2B's free disk per sandbox on its Hobby tier.
const DefaultSandboxDiskMB = 10240

// DefaultVolumeSizeMB and DefaultMaxVolumeSizeMB bound volumes (internal/volumes).
const (
	DefaultVolumeSizeMB    = 10240
	DefaultMaxVolumeSizeMB = 102400
)

// BindDataDir registers --data-dir.
func BindDataDir(fs *pflag.FlagSet, dir *string) {
	fs.StringVar(dir, "data-dir", DefaultDataDir, "directory holding vmon's state")
}

// ApplyEnv sets every flag not given on the command line from VMON_<FLAG> (dashes as
// underscores), so a flag always wins over the environment.
func ApplyEnv(fs *pflag.FlagSet) error {
	var errs []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		name := "VMON_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", name, err))
			}
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("invalid environment: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Validate checks a serve configuration.
func (c *Serve) Validate() error {
	switch c.Role {
	case "all":
		if c.Database != "" {
			return fmt.Errorf("--database is for --role driver (drivers sharing one database); --role all keeps its records in its data dir")
		}
	case "driver", "node":
		if err := c.validateCluster(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("--role must be all, driver or node, not %q", c.Role)
	}
	if c.Role != "driver" && (c.BootstrapTokenFile != "" || c.AdminKeyFile != "" || len(c.GossipJoin) > 0) {
		return fmt.Errorf("--bootstrap-token-file, --admin-key-file and --gossip-join are --role driver's")
	}
	for _, a := range c.GossipJoin {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			return fmt.Errorf("--gossip-join %q: want host:port", a)
		}
	}
	if c.TLS != "" && c.TLS != "self-signed" {
		return fmt.Errorf(`--tls must be "self-signed" (or use --tls-cert/--tls-key)`)
	}
	for _, u := range c.EgressUpstreamDNS {
		if _, port, err := net.SplitHostPort(u); err != nil || port == "" {
			return fmt.Errorf("--egress-upstream-dns %q: want host:port", u)
		}
	}
	if c.EgressDNS != "filter" && c.EgressDNS != "off" {
		return fmt.Errorf("--egress-dns must be filter or off, not %q", c.EgressDNS)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("--tls-cert and --tls-key go together")
	}
	if c.TLS != "" && c.TLSCert != "" {
		return fmt.Errorf("--tls self-signed and --tls-cert are exclusive")
	}
	if c.BootConcurrency < 1 || c.BootConcurrency > 32 {
		return fmt.Errorf("--boot-concurrency must be between 1 and 32")
	}
	if c.NetReadyLinks < -1 || c.NetReadyLinks > 32 {
		return fmt.Errorf("--net-ready-links must be between 0 and 32, or -1 for one per --boot-concurrency slot")
	}
	if c.BuildConcurrency < 1 || c.BuildConcurrency > 16 {
		return fmt.Errorf("--build-concurrency must be between 1 and 16")
	}
	if c.ReadyTimeout < time.Second || c.ReadyTimeout > time.Hour {
		return fmt.Errorf("--template-ready-timeout must be between 1s and 1h")
	}
	if _, err := c.Mirrors(); err != nil {
		return err
	}
	switch c.Net {
	case "auto", "tap":
	case "user":
		return fmt.Errorf("--net user is not available on Linux yet: use --net tap or auto")
	default:
		return fmt.Errorf("--net must be auto, tap or user, not %q", c.Net)
	}
	if err := validateNetPool(c.NetPool); err != nil {
		return err
	}
	if !netScopeRe.MatchString(c.NetScope) {
		return fmt.Errorf("--net-scope %q: want 1-8 lower-case letters", c.NetScope)
	}
	if c.NFLogGroup < 1 || c.NFLogGroup > 65535 {
		return fmt.Errorf("--nflog-group %d: must be 1-65535", c.NFLogGroup)
	}
	if c.EgressDNSPort < 1 || c.EgressDNSPort > 65535 {
		return fmt.Errorf("--egress-dns-port %d: must be 1-65535", c.EgressDNSPort)
	}
	if c.WarmPool < 0 || c.WarmPool > 32 {
		return fmt.Errorf("--warm-pool must be between 0 and 32")
	}
	if c.MaxSandboxTimeout <= 0 {
		return fmt.Errorf("--max-sandbox-timeout must be positive")
	}
	if c.MaxSnapshotDiskMB < 0 {
		return fmt.Errorf("--max-snapshot-disk must not be negative")
	}
	if c.SandboxDiskMB != 0 && (c.SandboxDiskMB < 64 || c.SandboxDiskMB > 16<<20) {
		return fmt.Errorf("--sandbox-disk-mb must be between 64 and %d, or 0 for no limit", 16<<20)
	}
	if c.MaxVolumeSizeMB < 64 || c.MaxVolumeSizeMB > 16<<20 {
		return fmt.Errorf("--max-volume-size-mb must be between 64 and %d", 16<<20)
	}
	if c.VolumeSizeMB < 64 || c.VolumeSizeMB > c.MaxVolumeSizeMB {
		return fmt.Errorf("--volume-size-mb must be between 64 and --max-volume-size-mb (%d)", c.MaxVolumeSizeMB)
	}
	if err := (limits.Overrides{Tasks: c.SandboxMaxTasks, Files: c.SandboxMaxFiles}).Validate(); err != nil {
		return fmt.Errorf("--sandbox-max-tasks/--sandbox-max-files: %w", err)
	}
	if c.SandboxLogMaxBytes < 16<<10 || c.SandboxLogMaxBytes > 64<<20 {
		return fmt.Errorf("--sandbox-log-max-bytes must be between 16384 and %d", 64<<20)
	}
	if c.SandboxLogRetention < time.Minute {
		return fmt.Errorf("--sandbox-log-retention must be at least 1m")
	}
	if c.Runtime != "gvisor" {
		return fmt.Errorf("--runtime %q is not available: only gvisor is built in (firecracker needs /dev/kvm and is not implemented yet)", c.Runtime)
	}
	return nil
}

var nameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// validateCluster checks the flags of the split roles.
func (c *Serve) validateCluster() error {
	if c.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--name is required (no host name: %v)", err)
		}
		c.Name = strings.ToLower(strings.SplitN(h, ".", 2)[0])
	}
	if !nameRe.MatchString(c.Name) {
		return fmt.Errorf("--name %q must be a DNS label: lower-case letters, digits and -, at most 63", c.Name)
	}
	own := c.Listen
	if c.Role == "driver" {
		own = c.ClusterListen
	}
	for flag, addr := range map[string]string{"--listen": c.Listen, "--cluster-listen": c.ClusterListen, "--gossip-listen": c.GossipListen} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%s %q: want host:port", flag, addr)
		}
	}
	var err error
	if c.Advertise, err = advertised("--advertise", c.Advertise, own); err != nil {
		return err
	}
	if c.GossipAdvertise, err = advertised("--gossip-advertise", c.GossipAdvertise, c.GossipListen); err != nil {
		return err
	}
	if c.NodeLostGrace < time.Second || c.DrainTimeout < time.Second {
		return fmt.Errorf("--node-lost-grace and --drain-timeout must be at least 1s")
	}
	if c.Role == "node" && len(c.Join) == 0 {
		return fmt.Errorf("--role node needs --join: the drivers' cluster endpoints (host:port)")
	}
	if c.Role == "node" && c.Database != "" {
		return fmt.Errorf("--database is the drivers' (a node keeps no records)")
	}
	if c.JoinToken != "" && c.JoinTokenFile != "" {
		return fmt.Errorf("--join-token and --join-token-file are exclusive")
	}
	return nil
}

// ReadJoinToken is --join-token, or the content of --join-token-file ("" when neither is given).
func (c *Serve) ReadJoinToken() (string, error) {
	if c.JoinTokenFile == "" {
		return c.JoinToken, nil
	}
	return ReadSecretFile("--join-token-file", c.JoinTokenFile)
}

// ReadSecretFile reads a one-line secret (a token, a key) from path, without its surrounding
// white space; flag names the setting in errors.
func ReadSecretFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" || strings.ContainsAny(v, "\n\r") {
		return "", fmt.Errorf("%s %s: want one line, the secret alone", flag, path)
	}
	return v, nil
}

// advertised is the address given for flag, or listen when that names a host others can reach.
func advertised(flag, given, listen string) (string, error) {
	addr := given
	if addr == "" {
		addr = listen
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" || port == "" {
		return "", fmt.Errorf("%s %q: want host:port with a fixed port", flag, addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if given == "" {
			return "", fmt.Errorf("%s is required: %s listens on every address, so which one the cluster reaches is not known", flag, listen)
		}
		return "", fmt.Errorf("%s %q: an address others can reach, not a wildcard", flag, addr)
	}
	return addr, nil
}

// TLSEnabled reports whether the listener serves HTTPS.
func (c *Serve) TLSEnabled() bool { return c.TLS != "" || c.TLSCert != "" }

// netScopeRe is what a link name prefix may be: link names are at most 15 bytes, and the index
// follows the prefix.
var netScopeRe = regexp.MustCompile(`^[a-z]{1,8}$`)

// validateNetPool checks --net-pool: an IPv4 prefix between /8 and /30 with no host bits.
func validateNetPool(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return fmt.Errorf("--net-pool %q: not an IPv4 prefix", s)
	}
	if p.Bits() < 8 || p.Bits() > 30 {
		return fmt.Errorf("--net-pool %q: prefix must be between /8 and /30", s)
	}
	if p.Masked() != p {
		return fmt.Errorf("--net-pool %q: host bits are set (did you mean %s?)", s, p.Masked())
	}
	return nil
}
