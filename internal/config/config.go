// Package config is the one place vmon reads its settings: command-line flags with VMON_*
// environment equivalents. Nothing else in vmon reads the environment for configuration.
package config

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Serve is the configuration of `vmon serve`.
type Serve struct {
	Role              string
	Listen            string
	DataDir           string
	Domain            string
	Runtime           string
	RunscPath         string
	Platform          string
	EnvdPath          string
	BootConcurrency   int
	MaxSandboxes      int
	WarmPool          int
	MaxSandboxTimeout time.Duration
	TLS               string
	TLSCert           string
	TLSKey            string
	LogLevel          string
}

// DefaultDataDir is where vmon keeps its state unless told otherwise.
const DefaultDataDir = "/var/lib/vmon"

// BindServe registers the serve flags on fs.
func BindServe(fs *pflag.FlagSet, c *Serve) {
	fs.StringVar(&c.Role, "role", "all", "process role: all (driver and node), driver or node")
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:3000", "address of the API and ingress listener")
	BindDataDir(fs, &c.DataDir)
	fs.StringVar(&c.Domain, "domain", "localhost", "domain sandboxes are addressed under: <port>-<sandboxID>.<domain>")
	fs.StringVar(&c.Runtime, "runtime", "gvisor", "sandbox runtime backend (gvisor)")
	fs.StringVar(&c.RunscPath, "runsc", "runsc", "path of the runsc binary for the gvisor runtime")
	fs.StringVar(&c.Platform, "gvisor-platform", "systrap", "gVisor platform: systrap or ptrace")
	fs.StringVar(&c.EnvdPath, "envd-path", "", "envd binary to run in sandboxes (default: envd beside the vmon binary)")
	fs.IntVar(&c.BootConcurrency, "boot-concurrency", 4, "sandboxes booted at the same time")
	fs.IntVar(&c.WarmPool, "warm-pool", 1, "pre-started sandboxes kept per template, so creates skip the boot (0 disables)")
	fs.IntVar(&c.MaxSandboxes, "max-sandboxes", 0, "sandboxes this node holds at most (0: derived from memory)")
	fs.DurationVar(&c.MaxSandboxTimeout, "max-sandbox-timeout", 24*time.Hour, "longest sandbox timeout a client may ask for")
	fs.StringVar(&c.TLS, "tls", "", `"self-signed" to serve HTTPS with a CA and wildcard certificate made in the data dir`)
	fs.StringVar(&c.TLSCert, "tls-cert", "", "TLS certificate file (PEM) for the listener")
	fs.StringVar(&c.TLSKey, "tls-key", "", "TLS private key file (PEM) for the listener")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
}

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
	case "driver", "node":
		return fmt.Errorf("--role %s: split roles need gossip, which is not available yet; use --role all", c.Role)
	default:
		return fmt.Errorf("--role must be all, driver or node, not %q", c.Role)
	}
	if c.TLS != "" && c.TLS != "self-signed" {
		return fmt.Errorf(`--tls must be "self-signed" (or use --tls-cert/--tls-key)`)
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
	if c.WarmPool < 0 || c.WarmPool > 32 {
		return fmt.Errorf("--warm-pool must be between 0 and 32")
	}
	if c.MaxSandboxTimeout <= 0 {
		return fmt.Errorf("--max-sandbox-timeout must be positive")
	}
	if c.Runtime != "gvisor" {
		return fmt.Errorf("--runtime %q is not available: only gvisor is built in (firecracker needs /dev/kvm and is not implemented yet)", c.Runtime)
	}
	return nil
}

// TLSEnabled reports whether the listener serves HTTPS.
func (c *Serve) TLSEnabled() bool { return c.TLS != "" || c.TLSCert != "" }
