package channel

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/agentproto"
)

// get asks for / over a yamux client session on conn and returns the body.
func get(t *testing.T, conn net.Conn) (string, *yamux.Session) {
	t.Helper()
	sess, err := yamux.Client(conn, agentproto.YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) { return sess.OpenStream() },
	}}
	resp, err := client.Get("http://envd/")
	if err != nil {
		t.Fatalf("request over the session: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), sess
}

// ended waits for envd's report that a session ended.
func ended(t *testing.T, ctl *agentctl.Conn) uint32 {
	t.Helper()
	got := make(chan uint32, 1)
	go func() {
		n, err := ctl.NextEnded()
		if err != nil {
			t.Errorf("NextEnded: %v", err)
		}
		got <- n
	}()
	select {
	case n := <-got:
		return n
	case <-time.After(5 * time.Second):
		t.Fatal("envd did not report the session's end")
		return 0
	}
}

func TestRunControl(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	node, guest, err := agentctl.Pair()
	if err != nil {
		t.Fatal(err)
	}
	control, err := agentctl.FromFile(guest)
	if err != nil {
		t.Fatal(err)
	}
	handoff := filepath.Join(t.TempDir(), "vmon", "handoff.sock")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "envd") })
	done := make(chan error, 1)
	go func() { done <- RunControl(ctx, ControlOptions{Control: control, Handoff: handoff, Handler: handler}) }()

	// A session serves; the node closing it (a park before a checkpoint) is reported.
	conn, err := node.Offer(1)
	if err != nil {
		t.Fatal(err)
	}
	body, sess := get(t, conn)
	if body != "envd" {
		t.Fatalf("body %q", body)
	}
	sess.Close()
	if n := ended(t, node); n != 1 {
		t.Fatalf("ended %d, want 1", n)
	}

	// A new offer while a session runs ends that one first.
	conn2, err := node.Offer(2)
	if err != nil {
		t.Fatal(err)
	}
	body, sess2 := get(t, conn2)
	if body != "envd" {
		t.Fatalf("body %q", body)
	}
	conn3, err := node.Offer(3)
	if err != nil {
		t.Fatal(err)
	}
	if n := ended(t, node); n != 2 {
		t.Fatalf("ended %d, want 2", n)
	}
	select {
	case <-sess2.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("the replaced session is still open on the node's side")
	}
	body, sess3 := get(t, conn3)
	if body != "envd" {
		t.Fatalf("body %q", body)
	}

	// The node's end goes (a node restart): envd drops the control socket and takes a new one
	// over the handoff socket.
	node.Close()
	sess3.Close()
	node2, guest2, err := agentctl.Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer node2.Close()
	if err := agentctl.Handoff(handoff, guest2); err != nil {
		t.Fatal(err)
	}
	guest2.Close()
	conn4, err := node2.Offer(4)
	if err != nil {
		t.Fatal(err)
	}
	if body, _ := get(t, conn4); body != "envd" {
		t.Fatalf("body over the handed-over control socket %q", body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("RunControl did not return after cancel")
	}
	// Its session went with it, and was reported.
	if n := ended(t, node2); n != 4 {
		t.Fatalf("ended %d, want 4", n)
	}
}

// envd without a control socket at start waits for one on the handoff socket.
func TestRunControlHandoffFirst(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	handoff := filepath.Join(t.TempDir(), "handoff.sock")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "envd") })
	go func() { _ = RunControl(ctx, ControlOptions{Handoff: handoff, Handler: handler}) }()
	node, guest, err := agentctl.Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := agentctl.Handoff(handoff, guest)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	guest.Close()
	conn, err := node.Offer(1)
	if err != nil {
		t.Fatal(err)
	}
	if body, _ := get(t, conn); body != "envd" {
		t.Fatalf("body %q", body)
	}
}
