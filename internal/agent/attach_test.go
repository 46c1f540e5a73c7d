package agent

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/envd/channel"
)

// attached starts envd's side of a control-socket channel (channel.RunControl) and attaches to it.
func attached(t *testing.T) (*Channel, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	node, guest, err := agentctl.Pair()
	if err != nil {
		t.Fatal(err)
	}
	control, err := agentctl.FromFile(guest)
	if err != nil {
		t.Fatal(err)
	}
	handoff := filepath.Join(t.TempDir(), "handoff.sock")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "envd:"+r.URL.Path) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = channel.RunControl(ctx, channel.ControlOptions{Control: control, Handoff: handoff, Handler: handler})
	}()
	ch, err := Attach(node, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close(); cancel(); <-done })
	return ch, handoff
}

func getPath(ctx context.Context, ch *Channel, path string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:49983"+path, nil)
	resp, err := (&http.Client{Transport: ch.Transport()}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestAttachParkRebind(t *testing.T) {
	ch, handoff := attached(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := getPath(ctx, ch, "/health"); err != nil || got != "envd:/health" {
		t.Fatalf("GET = %q, %v", got, err)
	}

	// Parked, nothing reaches envd until the channel is unparked.
	if err := ch.Park(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	if _, err := getPath(short, ch, "/parked"); err == nil {
		t.Fatal("a request reached envd while the channel was parked")
	}
	cancelShort()
	if err := ch.Unpark(); err != nil {
		t.Fatal(err)
	}
	if got, err := getPath(ctx, ch, "/unparked"); err != nil || got != "envd:/unparked" {
		t.Fatalf("GET after Unpark = %q, %v", got, err)
	}

	// A new control socket, handed to envd as after a node restart, takes over.
	if err := ch.Park(ctx); err != nil {
		t.Fatal(err)
	}
	node, guest, err := agentctl.Pair()
	if err != nil {
		t.Fatal(err)
	}
	if err := agentctl.Handoff(handoff, guest); err != nil {
		t.Fatal(err)
	}
	guest.Close()
	if err := ch.Rebind(node); err != nil {
		t.Fatal(err)
	}
	if got, err := getPath(ctx, ch, "/rebound"); err != nil || got != "envd:/rebound" {
		t.Fatalf("GET after Rebind = %q, %v", got, err)
	}
	// Park of a session envd already let go of returns at once.
	if err := ch.Park(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ch.Park(ctx); err != nil {
		t.Fatal(err)
	}
}

// A guest that opens a stream has its session closed; once it reports the end, the node offers
// a new session.
func TestAttachReoffersAfterRefusal(t *testing.T) {
	node, guest, err := agentctl.Pair()
	if err != nil {
		t.Fatal(err)
	}
	envd, err := agentctl.FromFile(guest)
	if err != nil {
		t.Fatal(err)
	}
	defer envd.Close()
	ch, err := Attach(node, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	n, conn, err := envd.Next()
	if err != nil || n != 1 {
		t.Fatalf("first offer = %d, %v", n, err)
	}
	sess, err := yamux.Server(conn, agentproto.YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sess.OpenStream(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sess.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("the node kept a session whose guest opened a stream")
	}
	if err := envd.Ended(1); err != nil {
		t.Fatal(err)
	}
	got := make(chan uint32, 1)
	go func() {
		n, c, err := envd.Next()
		if err == nil {
			c.Close()
		}
		got <- n
	}()
	select {
	case n := <-got:
		if n != 2 {
			t.Fatalf("second offer numbered %d, want 2", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no new session offered after the guest's ended")
	}
}
