//go:build linux

package agentctl

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair returns both ends of a control socket as Conns.
func pair(t *testing.T) (node, envd *Conn) {
	t.Helper()
	node, guest, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	envd, err = FromFile(guest)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close(); envd.Close() })
	return node, envd
}

func TestOfferNextEnded(t *testing.T) {
	node, envd := pair(t)
	for n := uint32(1); n <= 3; n++ {
		local, err := node.Offer(n)
		if err != nil {
			t.Fatal(err)
		}
		got, remote, err := envd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if got != n {
			t.Fatalf("session number %d, want %d", got, n)
		}
		// The session socket is a byte stream between the two ends.
		go func() { _, _ = io.WriteString(local, "ping\n") }()
		_ = remote.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(remote).ReadString('\n')
		if err != nil || line != "ping\n" {
			t.Fatalf("session %d: read %q, %v", n, line, err)
		}
		// envd lets go: the node's end reads EOF, then the report comes.
		remote.Close()
		_ = local.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := local.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("session %d: node end after envd closed: %v, want EOF", n, err)
		}
		local.Close()
		if err := envd.Ended(n); err != nil {
			t.Fatal(err)
		}
		if got, err := node.NextEnded(); err != nil || got != n {
			t.Fatalf("NextEnded = %d, %v; want %d", got, err, n)
		}
	}
}

// A message that is not an offer with one descriptor is an error for that message only.
func TestNextRejectsBadMessages(t *testing.T) {
	node, envd := pair(t)
	if _, err := node.c.Write(message(kindOffer, 7)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := envd.Next(); err == nil || !errors.Is(err, ErrProtocol) {
		t.Fatalf("offer without a descriptor: %v", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, _, err := node.c.WriteMsgUnix([]byte("junk!"), unix.UnixRights(int(r.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := envd.Next(); err == nil || !errors.Is(err, ErrProtocol) {
		t.Fatalf("junk message: %v", err)
	}
	// The protocol goes on after both.
	local, err := node.Offer(8)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	n, remote, err := envd.Next()
	if err != nil || n != 8 {
		t.Fatalf("Next after bad messages = %d, %v", n, err)
	}
	remote.Close()
	// NextEnded skips what is not a report.
	if _, err := envd.c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := envd.Ended(8); err != nil {
		t.Fatal(err)
	}
	if got, err := node.NextEnded(); err != nil || got != 8 {
		t.Fatalf("NextEnded = %d, %v; want 8", got, err)
	}
}

// Either end sees the other's close as IsClosed.
func TestPeerClose(t *testing.T) {
	node, envd := pair(t)
	node.Close()
	if _, _, err := envd.Next(); !IsClosed(err) {
		t.Fatalf("Next after the node's end closed: %v", err)
	}
	node2, envd2 := pair(t)
	envd2.Close()
	if _, err := node2.NextEnded(); !IsClosed(err) {
		t.Fatalf("NextEnded after envd's end closed: %v", err)
	}
}

func TestHandoff(t *testing.T) {
	dir := t.TempDir()
	// The template made the directory open to all; Listen closes it to root.
	sockDir := filepath.Join(dir, "run", "vmon")
	if err := os.MkdirAll(sockDir, 0o777); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(sockDir, "handoff.sock")
	if err := os.WriteFile(path, nil, 0o600); err != nil { // stale
		t.Fatal(err)
	}
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if fi, err := os.Stat(sockDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory mode = %v, %v; want 0700", fi.Mode(), err)
	}
	accepted := make(chan *Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()

	// Something that is not a control socket is refused, and the listener goes on.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := Handoff(path, r); err == nil || !strings.Contains(err.Error(), "not a control socket") {
		t.Fatalf("handoff of a pipe: %v", err)
	}

	node, guest, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if err := Handoff(path, guest); err != nil {
		t.Fatal(err)
	}
	guest.Close()
	var envd *Conn
	select {
	case envd = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("no control socket accepted")
	}
	defer envd.Close()
	local, err := node.Offer(1)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	if n, remote, err := envd.Next(); err != nil || n != 1 {
		t.Fatalf("Next over the handed-over socket = %d, %v", n, err)
	} else {
		remote.Close()
	}
}

// The descriptors envd holds are close-on-exec: a command envd starts inherits none of them.
func TestCloseOnExec(t *testing.T) {
	node, envd := pair(t)
	local, err := node.Offer(1)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	_, remote, err := envd.Next()
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	for name, c := range map[string]syscall.Conn{"control": envd.c, "session": remote.(syscall.Conn)} {
		raw, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var flags int
		var ferr error
		if err := raw.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFD, 0) }); err != nil || ferr != nil {
			t.Fatal(err, ferr)
		}
		if flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("%s socket is not close-on-exec", name)
		}
	}
}
