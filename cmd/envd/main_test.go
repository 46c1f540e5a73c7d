package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/agentproto"
	pb "github.com/vibemon/vmon/internal/envd/gen/process"
	"github.com/vibemon/vmon/internal/envd/gen/process/processconnect"
)

// The test binary doubles as envd: with ENVD_TEST_MAIN=1 it runs main's logic (also in the child
// that --init re-executes from /proc/self/exe).
func TestMain(m *testing.M) {
	if os.Getenv("ENVD_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func envdCommand(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "ENVD_TEST_MAIN=1")
	return cmd
}

func TestVersionFlag(t *testing.T) {
	out, err := envdCommand("--version").Output()
	if err != nil || strings.TrimSpace(string(out)) != agentproto.EnvdVersion {
		t.Fatalf("--version: %q %v", out, err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func procStatus(pid int, field string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestInitReapsOrphans runs envd --init: an orphaned background process must be reparented to
// envd (a subreaper when not PID 1) and reaped when it exits, while the exit codes of the
// processes envd waits for stay intact; SIGTERM stops everything.
func TestInitReapsOrphans(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	cmd := envdCommand("--init", "--agent-socket", "", "--listen", addr, "--set-clock=false")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	base := "http://" + addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("envd --init did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	client := processconnect.NewProcessClient(http.DefaultClient, base, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	no := false
	stream, err := client.Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "sleep 1 >/dev/null 2>&1 & echo $!"}}, Stdin: &no,
	}))
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for stream.Receive() {
		out += string(stream.Msg().GetEvent().GetData().GetStdout())
	}
	if stream.Err() != nil {
		t.Fatal(stream.Err())
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("orphan pid from %q: %v", out, err)
	}
	// Its shell is gone, so the sleep now belongs to envd's init process.
	if ppid := procStatus(orphan, "PPid"); ppid != strconv.Itoa(cmd.Process.Pid) {
		t.Fatalf("orphan %d has parent %q, want envd init %d", orphan, ppid, cmd.Process.Pid)
	}
	// After it exits, init reaps it: no zombie is left.
	deadline = time.Now().Add(5 * time.Second)
	for procStatus(orphan, "State") != "" {
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped, state %q", orphan, procStatus(orphan, "State"))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The reaper must never take the exit status of a process envd waits for itself: start many
	// short commands, each leaving an orphan behind, and check every exit code arrives intact.
	var wg sync.WaitGroup
	codes := make(chan int32, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := client.Start(ctx, connect.NewRequest(&pb.StartRequest{
				Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "sleep 0.05 >/dev/null 2>&1 & exit 7"}}, Stdin: &no,
			}))
			if err != nil {
				t.Error(err)
				return
			}
			for st.Receive() {
				if end := st.Msg().GetEvent().GetEnd(); end != nil {
					codes <- end.GetExitCode()
				}
			}
		}()
	}
	wg.Wait()
	close(codes)
	n := 0
	for c := range codes {
		n++
		if c != 7 {
			t.Errorf("exit code %d, want 7", c)
		}
	}
	if n != 20 {
		t.Fatalf("%d of 20 commands reported an end", n)
	}

	// SIGTERM stops envd, init included.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("envd --init exit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("envd --init did not exit after SIGTERM")
	}
}
