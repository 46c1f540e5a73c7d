package doctor

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func find(t *testing.T, rs []Result, prefix string) Result {
	t.Helper()
	for _, r := range rs {
		if strings.HasPrefix(r.Name, prefix) {
			return r
		}
	}
	t.Fatalf("no check named %q", prefix)
	return Result{}
}

func TestMissingThingsFailWithAFix(t *testing.T) {
	dir := t.TempDir()
	rs := Run(context.Background(), Options{
		DataDir:   dir,
		RunscPath: filepath.Join(dir, "no-runsc"),
		EnvdPath:  filepath.Join(dir, "no-envd"),
	})
	for _, name := range []string{"runtime", "envd"} {
		r := find(t, rs, name)
		if r.Level != Fail || r.Fix == "" {
			t.Errorf("%s: %+v, want a failure with a fix", name, r)
		}
	}
	if r := find(t, rs, "template base"); r.Level != Warn || !strings.Contains(r.Fix, "vmon template build base") {
		t.Errorf("template: %+v", r)
	}
	var out bytes.Buffer
	if Print(&out, rs) {
		t.Fatal("Print reported success with failed checks")
	}
	if !strings.Contains(out.String(), "fix: ") {
		t.Fatalf("output has no fixes:\n%s", out.String())
	}
}

func TestSocketPathLength(t *testing.T) {
	if r := checkSocketPath("/var/lib/vmon"); r.Level != OK {
		t.Fatalf("short dir: %+v", r)
	}
	if r := checkSocketPath("/" + strings.Repeat("d", 80)); r.Level != Fail {
		t.Fatalf("long dir: %+v", r)
	}
}

func TestEnvdAndRunscFound(t *testing.T) {
	// This test binary is a static-or-not Go ELF file; envd only needs to exist.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if r := checkEnvd(exe); r.Level != OK {
		t.Fatalf("envd: %+v", r)
	}
	// A Go binary without gvisor in its build info is reported as the wrong version.
	if r := checkRunsc(Options{RunscPath: exe, RunscVersion: "160fafc42237"}); r.Level == OK {
		t.Fatalf("a non-runsc binary passed the runsc check: %+v", r)
	}
}

func TestRunscPatched(t *testing.T) {
	dir := t.TempDir()
	script := func(name, help string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\nprintf '%s\\n' '"+help+"'\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stock := script("stock", "restore [flags] <container id>\n  -image-path string")
	if err := checkRunscPatched(stock); err == nil || !strings.Contains(err.Error(), "without vmon's patches") {
		t.Fatalf("stock runsc: %v", err)
	}
	patched := script("patched", "restore [flags] <container id>\n  -pass-fd value")
	if err := checkRunscPatched(patched); err != nil {
		t.Fatalf("patched runsc: %v", err)
	}
	// The runsc scripts/install.sh installs is the patched one.
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatalf("runsc (bash scripts/install-runsc.sh): %v", err)
	}
	if err := checkRunscPatched(runsc); err != nil {
		t.Fatal(err)
	}
}

func TestCheckMemoryMerge(t *testing.T) {
	ksm := func(run string) string {
		dir := t.TempDir()
		for name, v := range map[string]string{"run": run, "pages_to_scan": "100", "sleep_millisecs": "20"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, tc := range []struct {
		name, dir, release string
		level              Level
		detail             string
	}{
		{"no KSM", t.TempDir(), "6.18.1", Warn, "no KSM"},
		{"old kernel", ksm("0"), "6.6.30-amd64", Warn, "Linux 6.6.30-amd64"},
		{"stopped", ksm("0"), "6.7.0", OK, "ksmd stopped"},
		{"running", ksm("1"), "6.18.44-fc", OK, "ksmd running, 100 pages every 20 ms"},
	} {
		r := checkMemoryMerge(tc.dir, tc.release)
		if r.Level != tc.level || !strings.Contains(r.Detail, tc.detail) {
			t.Errorf("%s: got %v %q, want %v with %q", tc.name, r.Level, r.Detail, tc.level, tc.detail)
		}
	}
}
