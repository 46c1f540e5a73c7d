package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps envd free of vmon's host side: it runs inside the sandbox, so it may
// import only the agent-channel contract, error kinds and its own packages.
func TestDependencies(t *testing.T) {
	// envd ships as a static CGO_ENABLED=0 binary; list the dependencies of exactly that build.
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/vibemon/vmon/"
	// guestnet is shared on purpose: the node builds the address push, envd applies it; httpguard
	// gives both HTTP surfaces (the API and envd) E2B's error shapes; agentctl is both ends of the
	// agent channel's control socket.
	allowed := []string{mod + "cmd/envd", mod + "internal/agentctl", mod + "internal/agentproto", mod + "internal/errdefs", mod + "internal/envd/",
		mod + "internal/guestnet", mod + "internal/httpguard"}
	for _, pkg := range strings.Fields(string(out)) {
		if !strings.HasPrefix(pkg, mod) {
			continue
		}
		ok := false
		for _, a := range allowed {
			ok = ok || pkg == a || (strings.HasSuffix(a, "/") && strings.HasPrefix(pkg, a))
		}
		if !ok {
			t.Errorf("envd depends on host-side package %s", pkg)
		}
	}
}
