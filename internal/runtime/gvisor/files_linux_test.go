package gvisor

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/runtime"
)

// socketPair returns the two ends of a unix stream socket pair, closed by t.Cleanup.
func socketPair(t *testing.T) (host net.Conn, guest *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "host")
	host, err = net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	guest = os.NewFile(uintptr(fds[1]), "guest")
	t.Cleanup(func() { host.Close(); guest.Close() })
	return host, guest
}

// echo writes line to the host end and reads what the guest sends back.
func echo(t *testing.T, host net.Conn, line string) string {
	t.Helper()
	if err := host.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(host, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(host).ReadString('\n')
	if err != nil {
		t.Fatalf("read the guest's echo of %q: %v", line, err)
	}
	return strings.TrimSuffix(got, "\n")
}

// TestPassedFiles gives init a socket (Spec.Files) that a guest process holds across a checkpoint:
// the restore gives it a new host socket behind the same descriptor, and the process, blocked
// reading it when it was saved, reads and answers on the new one. ExecFiles hands a socket to a
// command in the running sandbox.
func TestPassedFiles(t *testing.T) {
	rt, fx := setup(t)
	ctx := context.Background()
	host, guest := socketPair(t)
	// The guest echoes every line it reads on descriptor 3 back on it.
	s := newSandbox(t, fx, rt, func(s *runtime.Spec) {
		s.Args = []string{"/bin/busybox", "sh", "-c", "exec /bin/busybox cat <&3 >&3"}
		s.Files = []*os.File{guest}
	})
	id := s.spec.ID
	if err := rt.Start(ctx, s.spec); err != nil {
		t.Fatal(err)
	}
	if got := echo(t, host, "before"); got != "before" {
		t.Fatalf("echo before the checkpoint = %q", got)
	}

	img := filepath.Join(s.dir, "ckpt")
	if err := rt.Checkpoint(ctx, id, img, false); err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	// The old socket's guest end went with the sandbox.
	_ = host.SetDeadline(time.Now().Add(10 * time.Second))
	if n, err := host.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("read of the old host end after destroy = %d, %v; want EOF", n, err)
	}

	host2, guest2 := socketPair(t)
	spec := s.spec
	spec.Files = []*os.File{guest2}
	if err := rt.Restore(ctx, spec, img); err != nil {
		t.Fatalf("restore: %v\n%s", err, tail(ConsoleLog(spec.StateDir), 4096))
	}
	if got := echo(t, host2, "after"); got != "after" {
		t.Fatalf("echo after the restore = %q", got)
	}

	// A restore without a file for the descriptor the checkpoint holds fails, and leaves nothing.
	img2 := filepath.Join(s.dir, "ckpt2")
	if err := rt.Checkpoint(ctx, id, img2, false); err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	spec.Files = nil
	if err := rt.Restore(ctx, spec, img2); err == nil {
		t.Fatal("restore without the passed file succeeded")
	}
	wantStatus(t, rt, id, runtime.StatusNotFound)

	// ExecFiles: a command in the running sandbox gets the file as descriptor 3.
	host3, guest3 := socketPair(t)
	spec.Files = []*os.File{guest3}
	if err := rt.Restore(ctx, spec, img2); err != nil {
		t.Fatalf("restore: %v\n%s", err, tail(ConsoleLog(spec.StateDir), 4096))
	}
	host4, guest4 := socketPair(t)
	if out, err := rt.ExecFiles(ctx, id, []*os.File{guest4}, "/bin/busybox", "sh", "-c", "echo from-exec >&3"); err != nil {
		t.Fatalf("exec with a file: %v: %s", err, out)
	}
	_ = host4.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := bufio.NewReader(host4).ReadString('\n'); err != nil || got != "from-exec\n" {
		t.Fatalf("read from the exec's descriptor = %q, %v", got, err)
	}
	if got := echo(t, host3, "still"); got != "still" {
		t.Fatalf("init's echo after the exec = %q", got)
	}
}
