package api

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps the control plane's layering one-way: api → driver, templates → store →
// apikey, errdefs. templates reaches the host side only through the build engine. The driver reaches nodes only through its Node interface and node's plain types, so the
// node package is the only door to the host side; egress is the pure policy model both share, and
// secrets the pure sealing of secret values, sandboxlog the per-sandbox logs. apikey, store, egress,
// secrets and sandboxlog are checked
// transitively (they must stay leaves); driver and api by
// their direct imports, since node legitimately pulls in the host side behind it.
func TestDependencies(t *testing.T) {
	const mod = "github.com/vibemon/vmon/internal/"
	for _, tc := range []struct {
		pkg     string
		deep    bool
		allowed []string
	}{
		{"apikey", true, nil},
		{"store", true, []string{"apikey", "errdefs"}},
		{"egress", true, []string{"errdefs"}},
		{"secrets", true, []string{"errdefs"}},
		// sandboxlog is the per-sandbox log's files and queries, with its types for both edges.
		{"sandboxlog", true, nil},
		// keylock: per-key mutexes, a leaf of the standard library only.
		{"keylock", true, nil},
		{"driver", false, []string{"store", "errdefs", "node", "egress", "secrets", "sandboxlog", "keylock"}},
		{"templates", false, []string{"store", "errdefs", "build", "template", "agentproto"}},
		// volumes for its entry types only: the files come in through the VolumeFiles interface.
		{"api", false, []string{"driver", "store", "errdefs", "templates", "volumes", "httpguard", "sandboxlog"}},
	} {
		args := []string{"list", "-f", `{{join .Imports "\n"}}`, mod + tc.pkg}
		if tc.deep {
			args = []string{"list", "-deps", "-f", "{{.ImportPath}}", mod + tc.pkg}
		}
		out, err := exec.Command("go", args...).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", tc.pkg, err)
		}
		for _, dep := range strings.Fields(string(out)) {
			rest, ok := strings.CutPrefix(dep, mod)
			if !ok || rest == tc.pkg {
				continue
			}
			permitted := false
			for _, a := range tc.allowed {
				permitted = permitted || rest == a
			}
			if !permitted {
				t.Errorf("%s depends on %s", tc.pkg, rest)
			}
		}
	}
}
