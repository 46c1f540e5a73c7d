// Package systemd holds vmon's systemd units and their environment files (installed by
// scripts/install.sh --systemd); its tests check them with systemd's own verifier and against
// vmon's flags.
package systemd

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/vibemon/vmon/internal/config"
)

// units maps each unit to its environment file and the role its ExecStart serves.
var units = map[string]struct{ env, role string }{
	"vmon.service":        {"vmon.env", "all"},
	"vmon-driver.service": {"vmon-driver.env", "driver"},
	"vmon-node.service":   {"vmon-node.env", "node"},
}

const installedVmon = "/usr/local/bin/vmon"

// vmonBinary is the vmon the units start: the installed one, or else the repository's (make
// build), so the verifier can check the command exists.
func vmonBinary(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(installedVmon); err == nil {
		return installedVmon
	}
	repo, err := filepath.Abs(filepath.Join("..", "..", "bin", "vmon"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(repo); err != nil {
		t.Fatalf("no vmon to verify the units' ExecStart with: install it (scripts/install.sh) or run make build (%v)", err)
	}
	return repo
}

// systemd-analyze verify finds nothing to say about any unit: no unknown or misspelt setting
// (which systemd only warns about and ignores), no missing command, no bad dependency.
func TestVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("systemd-analyze is needed in CI (apt: systemd): %v", err)
		}
		t.Skip("systemd-analyze is not installed")
	}
	bin := vmonBinary(t)
	dir := t.TempDir()
	for name := range units {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		unit := strings.ReplaceAll(string(b), installedVmon, bin)
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", path).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
	}
}

// Each unit reads its own environment file and serves its role; every VMON_ setting the files
// name (set or commented out) is a flag of vmon serve, so an operator who uncomments one gets
// what it says.
func TestUnitsAndEnvFiles(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	config.BindServe(fs, &config.Serve{})
	setting := regexp.MustCompile(`^#?\s*([A-Z][A-Z0-9_]*)=`)
	for name, u := range units {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		unit := string(b)
		if !strings.Contains(unit, "\nEnvironmentFile=-/etc/vmon/"+u.env+"\n") {
			t.Errorf("%s does not read /etc/vmon/%s", name, u.env)
		}
		if !strings.Contains(unit, "\nExecStart="+installedVmon+" serve --role "+u.role) {
			t.Errorf("%s does not serve --role %s", name, u.role)
		}
		f, err := os.Open(u.env)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		seen := 0
		for sc.Scan() {
			m := setting.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			key := m[1]
			if strings.HasPrefix(key, "AWS_") {
				continue // the S3 client's own settings
			}
			flag, ok := strings.CutPrefix(key, "VMON_")
			if !ok || fs.Lookup(strings.ToLower(strings.ReplaceAll(flag, "_", "-"))) == nil {
				t.Errorf("%s: %s is no flag of vmon serve", u.env, key)
			}
			seen++
		}
		f.Close()
		if seen == 0 {
			t.Errorf("%s names no setting", u.env)
		}
	}
}

// scripts/install-systemd.sh puts the units and the environment files in place (the files
// private: they hold tokens and keys), and a second run keeps the operator's settings.
func TestInstallScript(t *testing.T) {
	root := t.TempDir()
	install := func() {
		t.Helper()
		out, err := exec.Command("bash", filepath.Join("..", "..", "scripts", "install-systemd.sh"), "--root", root).CombinedOutput()
		if err != nil {
			t.Fatalf("install-systemd.sh: %v\n%s", err, out)
		}
	}
	install()
	envPath := filepath.Join(root, "etc", "vmon", "vmon-node.env")
	for name, u := range units {
		want, _ := os.ReadFile(name)
		got, err := os.ReadFile(filepath.Join(root, "etc", "systemd", "system", name))
		if err != nil || string(got) != string(want) {
			t.Fatalf("%s installed: %v", name, err)
		}
		fi, err := os.Stat(filepath.Join(root, "etc", "vmon", u.env))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s installed with mode %v, want 0600", u.env, fi.Mode().Perm())
		}
	}
	if err := os.WriteFile(envPath, []byte("VMON_JOIN=10.0.0.1:3100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	install()
	if b, _ := os.ReadFile(envPath); string(b) != "VMON_JOIN=10.0.0.1:3100\n" {
		t.Fatalf("a second install overwrote the operator's settings: %q", b)
	}
}
