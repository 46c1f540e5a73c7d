package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckGuestPrograms(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"envd", "vmon-code-interpreter"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for cmd, wantErr := range map[string]string{
		"sudo /opt/vmon/bin/vmon-code-interpreter --cwd /home/user": "",
		"python3 -m http.server 8080":                               "",
		"cd /x && /opt/vmon/bin/vmon-nope --serve":                  "/opt/vmon/bin/vmon-nope, which this node does not have",
		"sh -c '/opt/vmon/bin/other'":                               "/opt/vmon/bin/other",
		"/opt/vmon/bin/sub/dir --x":                                 "",
	} {
		err := checkGuestPrograms(cmd, dir)
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("%q: %v", cmd, err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Errorf("%q: error %v, want %q", cmd, err, wantErr)
		}
	}
	// The code-execution service says how to get it.
	if err := checkGuestPrograms("/opt/vmon/bin/vmon-code-interpreter", t.TempDir()); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("missing service: %v", err)
	}
}
