package gvisor

import (
	"bytes"
	"encoding/json"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// TestBuildSpecGolden compares the rendered OCI spec with the saved one, so any change to what
// runsc is asked to do shows up in review as a diff of testdata/config.golden.json.
func TestBuildSpecGolden(t *testing.T) {
	spec, err := buildSpec(runtime.Spec{
		ID:        "sbx-1",
		RootDir:   "/var/lib/vmon/sandboxes/sbx-1/root",
		StateDir:  "/var/lib/vmon/sandboxes/sbx-1/state",
		Hostname:  "e2b",
		NetNSPath: "/run/netns/vmon-sbx-1",
		Mounts: []runtime.Mount{
			{HostPath: "/var/lib/vmon/sandboxes/sbx-1/agent", GuestPath: "/run/vmon"},
			{HostPath: "/usr/lib/vmon/envd", GuestPath: "/usr/bin/envd", ReadOnly: true},
		},
		Args:     []string{"/usr/bin/envd"},
		Env:      []string{"HOME=/root"},
		CPUs:     2,
		MemoryMB: 512,
		Limits:   runtime.Limits{GuestTasks: 512, HostTasks: 2048, NProc: 512, NoFile: 32768, ShmBytes: 256 << 20},
	}, cgroupPath("vmon", "sbx-1"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "config.golden.json")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("spec differs from %s (go test -run Golden -update to accept):\n%s", golden, got)
	}
}

func TestBuildSpecInvalid(t *testing.T) {
	ok := runtime.Spec{ID: "a", RootDir: "/r", Args: []string{"/init"}}
	for name, mut := range map[string]func(*runtime.Spec){
		"bad id":         func(s *runtime.Spec) { s.ID = "../x" },
		"empty id":       func(s *runtime.Spec) { s.ID = "" },
		"no args":        func(s *runtime.Spec) { s.Args = nil },
		"relative root":  func(s *runtime.Spec) { s.RootDir = "r" },
		"relative mount": func(s *runtime.Spec) { s.Mounts = []runtime.Mount{{HostPath: "x", GuestPath: "/x"}} },
		"negative mem":   func(s *runtime.Spec) { s.MemoryMB = -1 },
		"relative image": func(s *runtime.Spec) { s.RootImage = "t.erofs" },
		"negative size":  func(s *runtime.Spec) { s.RootImage, s.RootSizeBytes = "/t.erofs", -1 },
		"size, no image": func(s *runtime.Spec) { s.RootSizeBytes = 1 << 30 },
	} {
		s := ok
		mut(&s)
		if _, err := buildSpec(s, ""); !errdefs.Is(err, errdefs.KindInvalidArgument) {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
	if spec, err := buildSpec(ok, ""); err != nil || spec.Linux.Resources != nil || spec.Hostname != "a" {
		t.Fatalf("minimal spec = %+v, %v", spec, err)
	}
}

// TestBuildSpecRootImage: a root image is gVisor's rootfs hint, with the writable layer's file in
// RootDir and its bound, and no /tmp bind mount, which would need a gofer.
func TestBuildSpecRootImage(t *testing.T) {
	s := runtime.Spec{ID: "a", RootDir: "/sbx/a/layer/", RootImage: "/tpl/base.erofs", RootSizeBytes: 1 << 30,
		Args: []string{"/init"}}
	spec, err := buildSpec(s, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"dev.gvisor.spec.rootfs.source":  "/tpl/base.erofs",
		"dev.gvisor.spec.rootfs.type":    "erofs",
		"dev.gvisor.spec.rootfs.overlay": "dir=/sbx/a/layer",
		"dev.gvisor.spec.rootfs.options": "size=1073741824",
	}
	if !maps.Equal(spec.Annotations, want) {
		t.Fatalf("annotations = %v, want %v", spec.Annotations, want)
	}
	for _, m := range spec.Mounts {
		if m.Type == "bind" {
			t.Fatalf("bind mount %+v with a root image", m)
		}
	}
	if got := rootUpperFlag(s); len(got) != 1 || got[0] != "--overlay2=root:dir=/sbx/a/layer" {
		t.Fatalf("rootUpperFlag = %v", got)
	}

	s.RootSizeBytes = 0
	if spec, err = buildSpec(s, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := spec.Annotations["dev.gvisor.spec.rootfs.options"]; ok {
		t.Fatalf("a size option without a bound: %v", spec.Annotations)
	}
	s.RootImage = ""
	if spec, err = buildSpec(s, ""); err != nil || spec.Annotations != nil || rootUpperFlag(s) != nil {
		t.Fatalf("without a root image: annotations %v, flag %v, err %v", spec.Annotations, rootUpperFlag(s), err)
	}
}

func TestCheckTmpDir(t *testing.T) {
	root := t.TempDir()
	if err := checkTmpDir(root); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(root, "tmp"))
	if err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("created /tmp mode = %v, %v; want sticky 0777", fi.Mode(), err)
	}
	// A guest-planted symlink must never become a host bind-mount source.
	evil := t.TempDir()
	if err := os.Symlink("/etc", filepath.Join(evil, "tmp")); err != nil {
		t.Fatal(err)
	}
	if err := checkTmpDir(evil); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("symlinked /tmp: err = %v, want InvalidArgument", err)
	}
}
