package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/vibemon/vmon/internal/envd/gen/filesystem"
	"github.com/vibemon/vmon/internal/envd/gen/filesystem/filesystemconnect"
	pb "github.com/vibemon/vmon/internal/envd/gen/process"
	"github.com/vibemon/vmon/internal/envd/gen/process/processconnect"
	"github.com/vibemon/vmon/internal/envd/server"
	"github.com/vibemon/vmon/internal/envd/users"
)

// testUser is a throwaway account created by TestMain (nil when not running as root).
var testUser *users.User

func TestMain(m *testing.M) {
	// New files are 0666&~umask; pin the umask so mode assertions do not depend on the caller.
	syscall.Umask(0o022)
	cleanup, err := createTestUser()
	if err != nil {
		fmt.Fprintln(os.Stderr, "create test user:", err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func createTestUser() (func(), error) {
	if os.Geteuid() != 0 {
		return func() {}, nil
	}
	suffix := fmt.Sprint(os.Getpid())
	name, group := "vmonenvd"+suffix, "vmonenvdg"+suffix
	base, err := os.MkdirTemp("", "envd-user-")
	if err != nil {
		return nil, err
	}
	cleanup := func() {
		_ = exec.Command("userdel", name).Run()
		_ = exec.Command("groupdel", group).Run()
		_ = os.RemoveAll(base)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		return nil, err
	}
	if out, err := exec.Command("groupadd", group).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("groupadd: %v: %s", err, out)
	}
	home := filepath.Join(base, "home")
	if out, err := exec.Command("useradd", "-m", "-d", home, "-s", "/bin/bash", "-G", group, name).CombinedOutput(); err != nil {
		cleanup()
		return nil, fmt.Errorf("useradd: %v: %s", err, out)
	}
	testUser, err = users.DB{}.Lookup(name)
	if err != nil {
		cleanup()
		return nil, err
	}
	return cleanup, nil
}

func needTestUser(t *testing.T) *users.User {
	t.Helper()
	if testUser == nil {
		t.Skip("needs root: creates a user account and runs processes as it (CI runs as root)")
	}
	return testUser
}

// env is one envd server on 127.0.0.1:0 with clients in both Connect codecs.
type env struct {
	url      string
	procJSON processconnect.ProcessClient
	procBin  processconnect.ProcessClient
	fsJSON   filesystemconnect.FilesystemClient
	fsBin    filesystemconnect.FilesystemClient
}

func startEnv(t *testing.T) *env {
	t.Helper()
	srv, err := server.New(server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		_ = srv.Close()
	})
	c := ts.Client()
	return &env{
		url:      ts.URL,
		procJSON: processconnect.NewProcessClient(c, ts.URL, connect.WithProtoJSON()),
		procBin:  processconnect.NewProcessClient(c, ts.URL),
		fsJSON:   filesystemconnect.NewFilesystemClient(c, ts.URL, connect.WithProtoJSON()),
		fsBin:    filesystemconnect.NewFilesystemClient(c, ts.URL),
	}
}

func (e *env) codecs() map[string]processconnect.ProcessClient {
	return map[string]processconnect.ProcessClient{"json": e.procJSON, "binary": e.procBin}
}

// initEnvd posts /init like the control plane does.
func (e *env) initEnvd(t *testing.T, body map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(e.url+"/init", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("/init: %d", resp.StatusCode)
	}
}

func asUser[T any](req *connect.Request[T], name string) *connect.Request[T] {
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(name+":")))
	return req
}

func shell(cmd string) *pb.StartRequest {
	no := false
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}}, Stdin: &no}
}

// result is everything one Start stream delivered.
type result struct {
	pid            uint32
	stdout, stderr string
	pty            string
	keepalives     int
	end            *pb.ProcessEvent_EndEvent
	err            error
}

// collect drains a Start stream, checking that it opens with start (unless the caller already
// received it) and carries at most one end.
func collect(t *testing.T, stream *connect.ServerStreamForClient[pb.StartResponse]) result {
	t.Helper()
	return collectFrom(t, stream, true)
}

func collectRest(t *testing.T, stream *connect.ServerStreamForClient[pb.StartResponse]) result {
	t.Helper()
	return collectFrom(t, stream, false)
}

func collectFrom(t *testing.T, stream *connect.ServerStreamForClient[pb.StartResponse], first bool) result {
	t.Helper()
	var r result
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if first {
			if ev.GetStart() == nil {
				t.Fatalf("first event is %v, want start", ev)
			}
			r.pid = ev.GetStart().GetPid()
			first = false
			continue
		}
		switch {
		case ev.GetData() != nil:
			d := ev.GetData()
			r.stdout += string(d.GetStdout())
			r.stderr += string(d.GetStderr())
			r.pty += string(d.GetPty())
		case ev.GetEnd() != nil:
			if r.end != nil {
				t.Fatal("second end event")
			}
			r.end = ev.GetEnd()
		case ev.GetKeepalive() != nil:
			r.keepalives++
		default:
			t.Fatalf("unexpected event %v", ev)
		}
	}
	r.err = stream.Err()
	_ = stream.Close()
	return r
}

func runCmd(t *testing.T, c processconnect.ProcessClient, req *connect.Request[pb.StartRequest]) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, stream)
	if r.err != nil {
		t.Fatalf("stream error: %v", r.err)
	}
	if r.end == nil {
		t.Fatal("no end event")
	}
	return r
}

// receiveUntil reads a stream until the accumulated output contains want, and returns the output.
func receiveUntil(t *testing.T, stream interface {
	Receive() bool
	Err() error
}, msg func() *pb.ProcessEvent, want string) string {
	t.Helper()
	var out strings.Builder
	for stream.Receive() {
		ev := msg()
		d := ev.GetData()
		out.Write(d.GetStdout())
		out.Write(d.GetPty())
		out.Write(d.GetStderr())
		if strings.Contains(out.String(), want) {
			return out.String()
		}
	}
	t.Fatalf("stream ended (%v) before %q; got %q", stream.Err(), want, out.String())
	return ""
}

func connectCode(err error) connect.Code {
	return connect.CodeOf(err)
}

func waitGone(t *testing.T, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(int(pid), 0); err != nil {
			return
		}
		// A zombie has exited; reaping an orphan is up to the host's init, not envd.
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if _, rest, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(rest, "Z") {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("process %d still exists", pid)
}

func entryNames(entries []*fspb.EntryInfo, root string) []string {
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimPrefix(e.GetPath(), root+"/"))
	}
	return out
}
