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
	"math/rand/v2"
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
	// MinBackoff and MaxBackoff bound the redial delay; defaults 50 ms and 30 s. In between the
	// delay is half of how long the node has been away (redialDelay), drawn from the upper half
	// of that so guests that lost the node together do not redial in step.
	MinBackoff, MaxBackoff time.Duration
}

// Run keeps a session with the node up until ctx is done, then returns nil. Dial failures and
// session ends are retried (redialDelay); they are not errors.
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
		opts.MaxBackoff = max(30*time.Second, opts.MinBackoff)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "channel", "socket", opts.Socket)
	handler := Tunnel(opts.Handler, log)

	var lost time.Time // since when the node has been away
	failures := 0
	for ctx.Err() == nil {
		began := time.Now()
		connected, err := serveOnce(ctx, opts.Socket, handler, log)
		switch {
		case connected && time.Since(began) > 100*time.Millisecond:
			// A session ended because the node went away for a moment (a restore, a node
			// restart): it is usually listening again already, so redial at once.
			lost, failures = time.Now(), 0
			log.Info("agent session ended; redialling", "err", err)
			continue
		case connected:
			// A node that closes sessions as soon as they open has not really come back.
			if lost.IsZero() {
				lost = began
			}
			failures = 0
			log.Info("agent session ended; redialling", "err", err)
		case failures == 0:
			if lost.IsZero() {
				lost = began
			}
			log.Warn("agent socket dial failed; retrying", "err", err)
			failures++
		default:
			// Keep quiet while the node is away (restore in progress), but leave a trace.
			log.Debug("agent socket dial failed", "err", err)
			failures++
		}
		select {
		case <-ctx.Done():
		case <-time.After(jitter(redialDelay(time.Since(lost), opts.MinBackoff, opts.MaxBackoff))):
		}
	}
	return nil
}

// redialDelay is how long to wait before the next dial once the node has been away for away:
// half of that, within [lo, hi]. A guest is back within half the node's absence after it
// returns, and its dials thin out as the absence grows, since they are not free: under gVisor a
// failed dial of a host socket wakes the sentry and the gofer for 5 ms of CPU or more, so 500
// guests redialling every second kept two cores busy while the node was away (every 5 s still
// did), and starved the node that came back to adopt them. Halving the absence costs a guest
// about twenty dials over a 30 s absence, most of them in its first second, and one every 30 s
// after a minute.
func redialDelay(away, lo, hi time.Duration) time.Duration {
	return min(max(away/2, lo), hi)
}

// jitter returns a delay drawn uniformly from [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d < 2 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// serveOnce dials the socket and serves one yamux session until it closes or ctx is done.
// connected reports whether a session was established.
func serveOnce(ctx context.Context, socket string, handler http.Handler, log *slog.Logger) (connected bool, err error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", socket, err)
	}
	return true, serveConn(ctx, conn, handler, log)
}

// serveConn runs a yamux server session on conn and serves handler on its streams until the
// session ends or ctx is done; conn is closed on return.
func serveConn(ctx context.Context, conn net.Conn, handler http.Handler, log *slog.Logger) error {
	session, err := yamux.Server(conn, agentproto.YamuxConfig())
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("yamux server: %w", err)
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
	return err
}
