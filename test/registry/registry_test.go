//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/oci"
)

// startFixtures runs the fixture registry in-process. Missing binaries fail the test: the
// end-to-end tests cannot run without them, so neither may this one pass.
func startFixtures(t *testing.T, user, pass string) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Addr: "127.0.0.1:0", User: user, Password: pass, Busybox: "/bin/busybox", Bash: "/bin/bash-static"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func puller(t *testing.T) *oci.Puller {
	t.Helper()
	// An empty docker config keeps the machine's own credentials out of the test.
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return oci.New(oci.Options{DockerConfig: cfg, Log: slog.New(slog.DiscardHandler)})
}

func TestAnnouncement(t *testing.T) {
	s := startFixtures(t, "", "")
	line, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Addr   string            `json:"addr"`
		Images map[string]string `json:"images"`
	}
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got.Addr, "127.0.0.1:") || bytes.ContainsRune(line, '\n') {
		t.Fatalf("announcement %s", line)
	}
	want := map[string]string{
		"busybox":      got.Addr + "/vmon-test/busybox:latest",
		"busybox-root": got.Addr + "/vmon-test/busybox-root:latest",
	}
	if len(got.Images) != len(want) {
		t.Fatalf("images %v", got.Images)
	}
	for k, v := range want {
		if got.Images[k] != v {
			t.Errorf("images[%s] = %q, want %q", k, got.Images[k], v)
		}
	}
}

func TestRefusesNonLoopback(t *testing.T) {
	_, err := Start(context.Background(), Config{Addr: "0.0.0.0:0", Busybox: "/bin/busybox", Bash: "/bin/bash-static"})
	if err == nil || !strings.Contains(err.Error(), "non-loopback") {
		t.Fatalf("Start on 0.0.0.0: %v", err)
	}
}

func TestMissingBinaryFailsLoudly(t *testing.T) {
	_, err := Start(context.Background(), Config{Busybox: "/bin/busybox", Bash: filepath.Join(t.TempDir(), "bash-static")})
	if err == nil || !strings.Contains(err.Error(), "bash-static") {
		t.Fatalf("Start without bash: %v", err)
	}
}

func TestBusyboxFixture(t *testing.T) {
	s := startFixtures(t, "fixture", "pw")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := puller(t)
	creds := &oci.Credentials{Username: "fixture", Password: "pw"}

	if _, err := p.Resolve(ctx, s.Images["busybox"], nil); errdefs.KindOf(err) != errdefs.KindUnauthorized {
		t.Fatalf("anonymous pull: %v, want Unauthorized", err)
	}

	img, err := p.Resolve(ctx, s.Images["busybox"], creds)
	if err != nil {
		t.Fatal(err)
	}
	c := img.Config
	if !slices.Equal(c.Env, []string{pathEnv, "FIXTURE_ENV=from-image"}) || c.WorkingDir != "/opt/app" ||
		c.User != "app" || !slices.Equal(c.Cmd, []string{"/bin/sh"}) || len(c.Entrypoint) != 0 {
		t.Fatalf("config %+v", c)
	}
	dir := t.TempDir()
	var progress []string
	if err := p.Unpack(ctx, img, dir, func(s string) { progress = append(progress, s) }); err != nil {
		t.Fatal(err)
	}
	if len(progress) != 3 {
		t.Errorf("progress %q, want 3 layers", progress)
	}

	type want struct {
		mode     os.FileMode
		uid, gid uint32
	}
	for rel, w := range map[string]want{
		"bin/busybox":      {0o755, 0, 0},
		"bin/bash":         {0o755, 0, 0},
		"tmp":              {os.ModeDir | os.ModeSticky | 0o777, 0, 0},
		"root":             {os.ModeDir | 0o700, 0, 0},
		"home/app":         {os.ModeDir | 0o755, 1234, 1234},
		"usr/bin":          {os.ModeDir | 0o755, 0, 0},
		"var":              {os.ModeDir | 0o755, 0, 0},
		"opt/app/data.txt": {0o640, 1234, 1234},
	} {
		fi, err := os.Lstat(filepath.Join(dir, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != w.mode || st.Uid != w.uid || st.Gid != w.gid {
			t.Errorf("%s: %v %d:%d, want %v %d:%d", rel, fi.Mode(), st.Uid, st.Gid, w.mode, w.uid, w.gid)
		}
	}
	for _, a := range []string{"sh", "ls", "cat", "id", "whoami", "[", "grep", "sed", "awk", "wget", "nc", "httpd", "su", "sha256sum"} {
		if target, err := os.Readlink(filepath.Join(dir, "bin", a)); err != nil || target != "busybox" {
			t.Errorf("bin/%s -> %q, %v", a, target, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "opt/app/data.txt")); string(b) != "fixture-data\n" {
		t.Errorf("data.txt = %q", b)
	}
	for _, gone := range []string{"etc/removed-later", "etc/.wh.removed-later", "opt/app/dir-replaced/old.txt", "opt/app/dir-replaced/.wh..wh..opq", "arch.txt"} {
		if _, err := os.Lstat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s should not exist", gone)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "opt/app/dir-replaced/new.txt")); err != nil {
		t.Error(err)
	}

	// The userland works in an otherwise empty root: the binaries are static and the users
	// resolve. This runs the host's own busybox and bash, copied; it is a check of the
	// fixture, not something the puller ever does.
	out := chroot(t, dir, "/bin/sh", "-c", "id -u app; id -g app; cat /opt/app/data.txt")
	if out != "1234\n1234\nfixture-data\n" {
		t.Errorf("sh in the fixture printed %q", out)
	}
	if out := chroot(t, dir, "/bin/bash", "-c", `echo "bash ${BASH_VERSINFO[0]}"`); !strings.HasPrefix(out, "bash ") || out == "bash \n" {
		t.Errorf("bash in the fixture printed %q", out)
	}
}

func TestBusyboxRootFixture(t *testing.T) {
	s := startFixtures(t, "", "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := puller(t)
	img, err := p.Resolve(ctx, s.Images["busybox-root"], nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := img.Config; !slices.Equal(c.Env, []string{pathEnv}) || c.User != "" || c.WorkingDir != "" {
		t.Fatalf("config %+v", c)
	}
	busybox, err := p.Resolve(ctx, s.Images["busybox"], nil)
	if err != nil {
		t.Fatal(err)
	}
	if busybox.Digest == img.Digest {
		t.Fatal("busybox and busybox-root share a digest")
	}
	dir := t.TempDir()
	if err := p.Unpack(ctx, img, dir, nil); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"bin/busybox", "bin/bash", "bin/sh", "etc/passwd", "etc/group", "home/app"} {
		if _, err := os.Lstat(filepath.Join(dir, rel)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "opt")); err == nil {
		t.Error("busybox-root has layer 2's /opt")
	}
	if out := chroot(t, dir, "/bin/sh", "-c", "whoami"); out != "root\n" {
		t.Errorf("whoami printed %q", out)
	}
}

func chroot(t *testing.T, root string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = []string{pathEnv}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v in %s: %v\n%s", argv, root, err, out)
	}
	return string(out)
}
