// Package channel owns the guest end of the agent channel (see internal/agentproto): envd dials
// the node's unix socket, runs a yamux server session on it and serves its HTTP handler on the
// streams the node opens, redialling whenever the session ends (checkpoint/restore, node restart).
// It also turns CONNECT 127.0.0.1:<port> requests into TCP tunnels to guest loopback ports. It
// never listens on a network itself.
package channel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/vibemon/vmon/internal/agentproto"
)

// Options configures Run.
type Options struct {
	Logger *slog.Logger
	// Socket is the node's agent socket; default agentproto.GuestSocket.
	Socket string
	// Handler serves the HTTP requests of every stream (envd's server). CONNECT requests never
	// reach it: they are tunnels.
	Handler http.Handler
	// MinBackoff and MaxBackoff bound the redial delay; defaults 50 ms and 1 s.
	MinBackoff, MaxBackoff time.Duration
}

// Run keeps a session with the node up until ctx is done, then returns nil. Dial failures and
// session ends are retried with exponential backoff; they are not errors.
func Run(ctx context.Context, opts Options) error {
	if opts.Handler == nil {
		return errors.New("channel: Options.Handler is required")
	}
	if opts.Socket == "" {
		opts.Socket = agentproto.GuestSocket
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 50 * time.Millisecond
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(time.Second, opts.MinBackoff)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "channel", "socket", opts.Socket)
	handler := Tunnel(opts.Handler, log)

	backoff := opts.MinBackoff
	failures := 0
	for ctx.Err() == nil {
		began := time.Now()
		connected, err := serveOnce(ctx, opts.Socket, handler, log)
		switch {
		case connected && time.Since(began) > 100*time.Millisecond:
			// A session ended because the node went away for a moment (a restore, a node
			// restart): it is usually listening again already, so redial at once. A node that
			// closes sessions as soon as they open meets the backoff below instead.
			backoff, failures = opts.MinBackoff, 0
			log.Info("agent session ended; redialling", "err", err)
			continue
		case connected:
			backoff, failures = opts.MinBackoff, 0
			log.Info("agent session ended; redialling", "err", err)
		case failures == 0:
			log.Warn("agent socket dial failed; retrying", "err", err)
			failures++
		default:
			// Keep quiet while the node is away (restore in progress), but leave a trace.
			log.Debug("agent socket dial failed", "err", err)
			failures++
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, opts.MaxBackoff)
	}
	return nil
}

// serveOnce dials the socket and serves one yamux session until it closes or ctx is done.
// connected reports whether a session was established.
func serveOnce(ctx context.Context, socket string, handler http.Handler, log *slog.Logger) (connected bool, err error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", socket, err)
	}
	session, err := yamux.Server(conn, agentproto.YamuxConfig())
	if err != nil {
		_ = conn.Close()
		return false, fmt.Errorf("yamux server: %w", err)
	}
	log.Info("agent session established")
	// No ReadHeaderTimeout: the only peer is the node, and with read deadlines on yamux streams
	// under gVisor about one stream in 300 had its request context canceled mid-response (the
	// SDK saw "canceled"). Streams die with the session, so nothing can hold one open forever.
	srv := &http.Server{
		Handler:  handler,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	stop := context.AfterFunc(ctx, func() { _ = session.Close() })
	defer stop()
	// A yamux session is a net.Listener: each stream the node opens is one HTTP/1.1 connection.
	err = srv.Serve(session)
	// Serve returns when Accept fails, i.e. the session is gone; drop what is left of it.
	_ = srv.Close()
	_ = session.Close()
	return true, err
}
