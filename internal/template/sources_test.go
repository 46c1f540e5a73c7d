package template

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestHostSources(t *testing.T) {
	etc := t.TempDir()
	d := filepath.Join(etc, "sources.list.d")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"sources.list": `# comment
deb http://mirror.example/debian bookworm main contrib # trailing
deb-src http://mirror.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm-backports main
`,
		"sources.list.d/debian.sources": `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://off.example/debian
Suites: bookworm
Components: main
Enabled: no
`,
		"sources.list.d/nodesource.sources":                  "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n",
		"sources.list.d/google-cloud-sdk.list.disabled-by-x": "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n",
		"sources.list.d/inline.sources":                      "Types: deb\nURIs: http://inline.example/debian\nSuites: bookworm\nComponents: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := hostSources(etc, "bookworm")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"deb http://mirror.example/debian bookworm main contrib",
		"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main",
		"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main",
		"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main",
		"deb http://inline.example/debian bookworm main",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sources:\ngot  %q\nwant %q", got, want)
	}

	// No matching entry: Debian's public mirrors.
	got, err = hostSources(t.TempDir(), "trixie")
	if err != nil || len(got) != 3 || got[0] != "deb http://deb.debian.org/debian trixie main" {
		t.Fatalf("fallback sources = %q, %v", got, err)
	}
}
