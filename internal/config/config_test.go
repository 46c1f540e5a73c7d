package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func parse(t *testing.T, args []string, env map[string]string) (*Serve, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var c Serve
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	BindServe(fs, &c)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := ApplyEnv(fs); err != nil {
		return nil, err
	}
	return &c, c.Validate()
}

func TestDefaults(t *testing.T) {
	c, err := parse(t, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:3000" || c.DataDir != "/var/lib/vmon" || c.Domain != "localhost" ||
		c.MaxSandboxTimeout != 24*time.Hour || c.Role != "all" || c.Runtime != "gvisor" || c.WarmPool != 1 {
		t.Fatalf("defaults: %+v", c)
	}
	// The filtering resolver is on unless turned off: with it off, any name sent to 8.8.8.8 (which
	// allowOut domains open) leaves the node.
	if c.VolumeSizeMB != 10240 || c.MaxVolumeSizeMB != 102400 {
		t.Fatalf("volume sizes default to %d and at most %d MiB", c.VolumeSizeMB, c.MaxVolumeSizeMB)
	}
	if c.EgressDNS != "filter" {
		t.Fatalf("--egress-dns defaults to %q", c.EgressDNS)
	}
	if c, err := parse(t, []string{"--egress-dns", "off"}, nil); err != nil || c.EgressDNS != "off" {
		t.Fatalf("--egress-dns off: %v", err)
	}
	if _, err := parse(t, []string{"--egress-dns", "all"}, nil); err == nil {
		t.Fatal("--egress-dns all accepted")
	}
}

func TestEnvAndFlagPrecedence(t *testing.T) {
	c, err := parse(t, []string{"--listen", "127.0.0.1:4000"}, map[string]string{
		"VMON_LISTEN":              "127.0.0.1:5000",
		"VMON_DATA_DIR":            "/srv/vmon",
		"VMON_MAX_SANDBOX_TIMEOUT": "2h",
		"VMON_BOOT_CONCURRENCY":    "8",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:4000" {
		t.Fatalf("flag must win over env: %s", c.Listen)
	}
	if c.DataDir != "/srv/vmon" || c.MaxSandboxTimeout != 2*time.Hour || c.BootConcurrency != 8 {
		t.Fatalf("env not applied: %+v", c)
	}
}

func TestNetPoolEdges(t *testing.T) {
	for _, ok := range []string{"10.0.0.0/8", "172.20.0.0/16", "192.168.7.4/30"} {
		if _, err := parse(t, []string{"--net-pool", ok}, nil); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// The ready link pool follows --boot-concurrency unless --net-ready-links (0 to 32) says otherwise.
func TestReadyLinks(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{want: 4},
		{args: []string{"--boot-concurrency", "32"}, want: 32},
		{args: []string{"--net-ready-links", "0"}, want: 0},
		{args: []string{"--net-ready-links", "32", "--boot-concurrency", "2"}, want: 32},
		{env: map[string]string{"VMON_NET_READY_LINKS": "7"}, want: 7},
	} {
		c, err := parse(t, tc.args, tc.env)
		if err != nil {
			t.Fatalf("%v %v: %v", tc.args, tc.env, err)
		}
		if got := c.ReadyLinks(); got != tc.want {
			t.Errorf("%v %v: %d ready links, want %d", tc.args, tc.env, got, tc.want)
		}
	}
}

func TestInvalid(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--role", "node"}, want: "gossip"},
		{args: []string{"--role", "x"}, want: "--role"},
		{args: []string{"--tls", "acme"}, want: "--tls"},
		{args: []string{"--tls-cert", "a.pem"}, want: "go together"},
		{args: []string{"--boot-concurrency", "0"}, want: "--boot-concurrency"},
		{args: []string{"--boot-concurrency", "33"}, want: "--boot-concurrency"},
		{args: []string{"--warm-pool", "-1"}, want: "--warm-pool"},
		{args: []string{"--net-ready-links", "33"}, want: "--net-ready-links"},
		{args: []string{"--net-ready-links", "-2"}, want: "--net-ready-links"},
		{args: []string{"--runtime", "firecracker"}, want: "not available"},
		{args: []string{"--max-sandbox-timeout", "0s"}, want: "positive"},
		{env: map[string]string{"VMON_BOOT_CONCURRENCY": "many"}, want: "VMON_BOOT_CONCURRENCY"},
		{args: []string{"--net", "user"}, want: "not available on Linux"},
		{args: []string{"--net", "slirp"}, want: "--net must be"},
		{args: []string{"--net-pool", "172.20.0.1/16"}, want: "host bits"},
		{args: []string{"--net-pool", "10.0.0.0/7"}, want: "between /8 and /30"},
		{args: []string{"--net-pool", "10.0.0.0/31"}, want: "between /8 and /30"},
		{args: []string{"--net-pool", "fd00::/64"}, want: "not an IPv4"},
		{env: map[string]string{"VMON_NET_POOL": "nonsense"}, want: "--net-pool"},
		{args: []string{"--volume-size-mb", "10"}, want: "--volume-size-mb"},
		{args: []string{"--volume-size-mb", "4096", "--max-volume-size-mb", "1024"}, want: "--volume-size-mb"},
		{args: []string{"--max-volume-size-mb", "0"}, want: "--max-volume-size-mb"},
		{args: []string{"--egress-upstream-dns", "10.0.0.53"}, want: "--egress-upstream-dns"},
		{args: []string{"--egress-upstream-dns", "10.0.0.53:53,[::1]"}, want: "--egress-upstream-dns"},
	} {
		// A subtest per case scopes t.Setenv to it.
		t.Run(tc.want, func(t *testing.T) {
			_, err := parse(t, tc.args, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v %v: error %v, want it to mention %q", tc.args, tc.env, err, tc.want)
			}
		})
	}
}

// The split roles: a name that is a DNS label, addresses the cluster can reach (a wildcard
// listener needs --advertise), and a node needs its drivers.
func TestClusterRoles(t *testing.T) {
	node := []string{"--role", "node", "--name", "node-a", "--listen", "10.0.0.2:3001", "--gossip-listen", "10.0.0.2:7946", "--join", "10.0.0.1:3100"}
	c, err := parse(t, node, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Advertise != "10.0.0.2:3001" || c.GossipAdvertise != "10.0.0.2:7946" || len(c.Join) != 1 {
		t.Fatalf("node: %+v", c)
	}
	c, err = parse(t, []string{"--role", "driver", "--name", "d1", "--cluster-listen", "0.0.0.0:3100", "--advertise", "10.0.0.1:3100",
		"--gossip-listen", "0.0.0.0:7946", "--gossip-advertise", "10.0.0.1:7946"}, nil)
	if err != nil || c.Advertise != "10.0.0.1:3100" {
		t.Fatalf("driver: %+v %v", c, err)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--role", "node", "--name", "Node_A"}, "DNS label"},
		{[]string{"--role", "node", "--name", "a", "--listen", "0.0.0.0:3001", "--gossip-listen", "10.0.0.2:7946", "--join", "x:1"}, "--advertise is required"},
		{[]string{"--role", "node", "--name", "a", "--listen", "10.0.0.2:3001", "--gossip-listen", "0.0.0.0:7946", "--join", "x:1"}, "--gossip-advertise is required"},
		{[]string{"--role", "node", "--name", "a", "--listen", "10.0.0.2:3001", "--gossip-listen", "10.0.0.2:7946"}, "needs --join"},
		{[]string{"--role", "node", "--name", "a", "--listen", "10.0.0.2:0", "--gossip-listen", "10.0.0.2:7946", "--join", "x:1"}, "fixed port"},
		{[]string{"--role", "driver", "--name", "d", "--advertise", "0.0.0.0:3100", "--gossip-advertise", "10.0.0.1:7946"}, "not a wildcard"},
		{[]string{"--role", "both"}, "must be all, driver or node"},
	} {
		if _, err := parse(t, bad.args, nil); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want an error saying %q", bad.args, err, bad.want)
		}
	}
}

// The bootstrap flags: a driver's token and admin key files, a node's token from a file, each
// also from the environment; the driver's are refused elsewhere.
func TestBootstrapFiles(t *testing.T) {
	t.Run("driver", func(t *testing.T) {
		driver := []string{"--role", "driver", "--name", "d1", "--advertise", "10.0.0.1:3100", "--gossip-advertise", "10.0.0.1:7946"}
		c, err := parse(t, driver, map[string]string{
			"VMON_BOOTSTRAP_TOKEN_FILE": "/etc/vmon/bootstrap/token",
			"VMON_ADMIN_KEY_FILE":       "/etc/vmon/admin/key",
			"VMON_GOSSIP_JOIN":          "vmon-gossip.sandboxes.svc:7946",
		})
		if err != nil || c.BootstrapTokenFile != "/etc/vmon/bootstrap/token" || c.AdminKeyFile != "/etc/vmon/admin/key" ||
			len(c.GossipJoin) != 1 || c.GossipJoin[0] != "vmon-gossip.sandboxes.svc:7946" {
			t.Fatalf("driver: %+v %v", c, err)
		}
		if _, err := parse(t, append(driver, "--gossip-join", "vmon-gossip"), nil); err == nil || !strings.Contains(err.Error(), "host:port") {
			t.Fatalf("--gossip-join without a port: %v", err)
		}
	})
	for _, role := range []string{"node", "all"} {
		args := []string{"--role", role, "--name", "a", "--listen", "10.0.0.2:3001", "--gossip-listen", "10.0.0.2:7946", "--join", "x:1"}
		for _, f := range []string{"--bootstrap-token-file", "--admin-key-file", "--gossip-join"} {
			if _, err := parse(t, append(args, f, "/x"), nil); err == nil || !strings.Contains(err.Error(), "--role driver's") {
				t.Errorf("%s with --role %s: %v", f, role, err)
			}
		}
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("vmonjoin.0a1b2c3d.00112233445566778899aabbccddeeff\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	node := []string{"--role", "node", "--name", "a", "--listen", "10.0.0.2:3001", "--gossip-listen", "10.0.0.2:7946", "--join", "x:1"}
	c, err := parse(t, node, map[string]string{"VMON_JOIN_TOKEN_FILE": file})
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := c.ReadJoinToken(); err != nil || tok != "vmonjoin.0a1b2c3d.00112233445566778899aabbccddeeff" {
		t.Fatalf("--join-token-file: %q %v", tok, err)
	}
	t.Setenv("VMON_JOIN_TOKEN_FILE", "")
	c, err = parse(t, append(node, "--join-token", "vmonjoin.x"), nil)
	if tok, _ := c.ReadJoinToken(); err != nil || tok != "vmonjoin.x" {
		t.Fatalf("--join-token: %q %v", tok, err)
	}
	if _, err := parse(t, append(node, "--join-token", "t", "--join-token-file", file), nil); err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Fatalf("both --join-token and --join-token-file: %v", err)
	}
	for name, content := range map[string]string{"empty": " \n", "two lines": "a\nb\n"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadSecretFile("--x", p); err == nil {
			t.Errorf("a secret file %s was read", name)
		}
	}
	if _, err := ReadSecretFile("--x", filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "--x") {
		t.Errorf("a missing secret file: %v", err)
	}
}
