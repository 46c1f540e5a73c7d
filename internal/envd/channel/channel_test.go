package channel_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/yamux"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/envd/channel"
	pb "github.com/vibemon/vmon/internal/envd/gen/process"
	"github.com/vibemon/vmon/internal/envd/gen/process/processconnect"
	"github.com/vibemon/vmon/internal/envd/server"
)

// node is the host side of the channel, as the node runs it: it listens on the socket and runs a
// yamux client session on each connection envd makes.
type node struct {
	t  *testing.T
	ln net.Listener
}

func newNode(t *testing.T) (*node, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), agentproto.SocketName)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return &node{t: t, ln: ln}, sock
}

// accept waits for envd to dial and returns the session plus an HTTP client that opens one
// stream per connection.
func (n *node) accept() (*yamux.Session, *http.Client) {
	n.t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := n.ln.Accept()
		ch <- res{c, err}
	}()
	var r res
	select {
	case r = <-ch:
	case <-time.After(10 * time.Second):
		n.t.Fatal("envd did not dial the agent socket")
	}
	if r.err != nil {
		n.t.Fatal(r.err)
	}
	session, err := yamux.Client(r.c, agentproto.YamuxConfig())
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = session.Close() })
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return session.Open()
		},
	}
	n.t.Cleanup(tr.CloseIdleConnections)
	return session, &http.Client{Transport: tr}
}

func startChannel(t *testing.T, sock string) {
	t.Helper()
	srv, err := server.New(server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- channel.Run(ctx, channel.Options{Socket: sock, Handler: srv, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
		_ = srv.Close()
	})
}

func health(t *testing.T, c *http.Client) {
	t.Helper()
	resp, err := c.Get("http://envd/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("X-Envd-Version") != agentproto.EnvdVersion {
		t.Fatalf("health: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestChannelServesAndReconnects(t *testing.T) {
	n, sock := newNode(t)
	startChannel(t, sock)
	session, c := n.accept()
	health(t, c)

	// A streaming RPC over the channel.
	client := processconnect.NewProcessClient(c, "http://envd", connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	no := false
	stream, err := client.Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo over-the-channel"}}, Stdin: &no,
	}))
	if err != nil {
		t.Fatal(err)
	}
	var out string
	var end *pb.ProcessEvent_EndEvent
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out += string(ev.GetData().GetStdout())
		if ev.GetEnd() != nil {
			end = ev.GetEnd()
		}
	}
	if stream.Err() != nil || out != "over-the-channel\n" || end.GetExitCode() != 0 {
		t.Fatalf("start over channel: %q %v %v", out, end, stream.Err())
	}

	// The node drops the session (e.g. after a restore); envd redials and serves again.
	_ = session.Close()
	_, c2 := n.accept()
	health(t, c2)
}

func TestChannelRedialsUntilSocketAppears(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "late.sock")
	startChannel(t, sock)
	time.Sleep(150 * time.Millisecond) // a few failed dials
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	_, c := (&node{t: t, ln: ln}).accept()
	health(t, c)
}

// echoServer accepts one connection, echoes until EOF, then half-closes its side.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// connectTunnel sends CONNECT on a fresh stream and returns the stream and the status code.
func connectTunnel(t *testing.T, session *yamux.Session, authority string) (net.Conn, *bufio.Reader, int) {
	t.Helper()
	st, err := session.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := io.WriteString(st, "CONNECT "+authority+" HTTP/1.1\r\nHost: "+authority+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(st)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return st, br, resp.StatusCode
}

func TestChannelConnectTunnel(t *testing.T) {
	n, sock := newNode(t)
	startChannel(t, sock)
	session, _ := n.accept()
	port := echoServer(t)

	st, br, status := connectTunnel(t, session, agentproto.TunnelAuthority(port))
	if status != http.StatusOK {
		t.Fatalf("CONNECT: %d", status)
	}
	msg := strings.Repeat("ping-", 20000) // larger than one window update
	go func() {
		_, _ = io.WriteString(st, msg)
		_ = st.Close() // yamux Close is a half-close: we can still read the echo
	}()
	got, err := io.ReadAll(br)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if string(got) != msg {
		t.Fatalf("echo: got %d bytes, want %d", len(got), len(msg))
	}

	// Only the guest's loopback may be reached. (Refused before any dial: nothing leaves the host.)
	if _, _, status := connectTunnel(t, session, "10.0.0.1:80"); status != http.StatusForbidden {
		t.Fatalf("CONNECT to another host: %d", status)
	}
	if _, _, status := connectTunnel(t, session, "localhost:"+strconv.Itoa(port)); status != http.StatusForbidden {
		t.Fatalf("CONNECT by name: %d", status)
	}
	// A closed port is a 502.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	if _, _, status := connectTunnel(t, session, agentproto.TunnelAuthority(closed)); status != http.StatusBadGateway {
		t.Fatalf("CONNECT to a closed port: %d", status)
	}
}
