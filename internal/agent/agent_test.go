package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/vibemon/vmon/internal/agentproto"
)

// fakeEnvd dials the agent socket like envd does and serves handler on the streams the node opens,
// tunnelling CONNECT requests to guest loopback ports.
func fakeEnvd(t *testing.T, sock string, handler http.Handler) (stop func()) {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("dial agent socket: %v", err)
	}
	sess, err := yamux.Server(conn, agentproto.YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			handler.ServeHTTP(w, r)
			return
		}
		up, err := net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		// Hijack before answering, as envd does: once the 200 is on the wire the node may send
		// at once, and bytes the server already buffered are only in buf.
		c, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			up.Close()
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n"); err != nil {
			c.Close()
			up.Close()
			return
		}
		go func() { _, _ = io.Copy(up, buf); up.Close() }()
		_, _ = io.Copy(c, up)
		c.Close()
	})}
	go func() { _ = srv.Serve(sess) }()
	return func() { sess.Close() }
}

func TestChannelHTTPAndTunnel(t *testing.T) {
	dir := t.TempDir()
	ch, err := Listen(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stop := fakeEnvd(t, filepath.Join(dir, agentproto.SocketName), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "envd:"+r.URL.Path)
	}))
	if err := ch.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	get := func() (string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:49983/health", nil)
		resp, err := ch.Transport().RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if got, err := get(); err != nil || got != "envd:/health" {
		t.Fatalf("got %q, %v", got, err)
	}

	// A guest service on loopback, reached by a CONNECT tunnel.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	tc, err := ch.DialPort(ctx, port)
	if err != nil {
		t.Fatalf("DialPort: %v", err)
	}
	if _, err := tc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(tc, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through tunnel: %q %v", buf, err)
	}
	tc.Close()

	// A closed guest port is an error, not a hang.
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	closedPort := ln2.Addr().(*net.TCPAddr).Port
	ln2.Close()
	if _, err := ch.DialPort(ctx, closedPort); err == nil {
		t.Fatal("DialPort to a closed port succeeded")
	}

	// envd redials after its session breaks (as after checkpoint/restore); requests keep working.
	stop()
	stop = fakeEnvd(t, filepath.Join(dir, agentproto.SocketName), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "envd2:"+r.URL.Path)
	}))
	defer stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Requests in flight while the session breaks may fail; new ones must succeed.
		if got, err := get(); err == nil && got == "envd2:/health" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("requests did not move to the new session")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWaitConnectedHonoursContext(t *testing.T) {
	ch, err := Listen(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := ch.WaitConnected(ctx); err == nil {
		t.Fatal("WaitConnected without envd succeeded")
	}
	ch.Close()
	if err := ch.WaitConnected(context.Background()); err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
}

// A guest that opens streams toward the node loses its session; the node keeps serving the next
// envd that connects.
func TestGuestStreamsCloseTheSession(t *testing.T) {
	dir := t.TempDir()
	ch, err := Listen(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	sock := filepath.Join(dir, agentproto.SocketName)
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hostile, err := yamux.Server(conn, agentproto.YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.WaitConnected(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		st, err := hostile.OpenStream()
		if err != nil {
			break // already refused
		}
		_, _ = st.Write(make([]byte, 64<<10))
	}
	select {
	case <-hostile.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("the node kept a session on which the guest opened streams")
	}
	stop := fakeEnvd(t, sock, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer stop()
	resp, err := (&http.Client{Transport: ch.Transport()}).Get("http://envd/health")
	if err != nil {
		t.Fatalf("envd after the hostile session: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestStopFailsWaitersAtOnce(t *testing.T) {
	ch, err := Listen(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	gone := errors.New("sandbox stopped")
	waiting := make(chan error, 1)
	go func() { waiting <- ch.WaitConnected(context.Background()) }()
	ch.Stop(gone)
	select {
	case err := <-waiting:
		if !errors.Is(err, gone) {
			t.Fatalf("waiter got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter kept waiting after Stop")
	}
	if _, err := ch.DialPort(context.Background(), 80); !errors.Is(err, gone) {
		t.Fatalf("dial after Stop: %v", err)
	}
}

// Without envd, a dial gives up after DialWait instead of waiting for the caller's deadline.
func TestDialWaitIsBounded(t *testing.T) {
	ch, err := Listen(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	_, err = ch.DialPort(context.Background(), 80)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial without envd: %v", err)
	}
}
