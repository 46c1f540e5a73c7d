package channel

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/agentproto"
)

// ControlOptions configures RunControl.
type ControlOptions struct {
	Logger *slog.Logger
	// Control is the control socket the node gave envd at start; nil when there is none yet
	// (one may come by Handoff).
	Control *agentctl.Conn
	// Handoff is the in-guest socket on which a new control socket arrives (`envd handoff`);
	// default agentproto.HandoffSocket.
	Handoff string
	// Handler serves the HTTP requests of every stream, as in Options.
	Handler http.Handler
}

// controlRetryMin and controlRetryMax bound the delay between reads of a control socket whose
// node end is gone: after a restore the first read finds the node's offer.
const (
	controlRetryMin = 50 * time.Millisecond
	controlRetryMax = time.Second
)

// offer is what a control socket's reader passes on: a session to serve, or why it stopped.
type offer struct {
	ctl  *agentctl.Conn
	n    uint32
	conn net.Conn
	err  error
}

// session is the session being served.
type session struct {
	n      uint32
	cancel context.CancelFunc
	done   chan struct{}
}

// RunControl serves the sessions the node offers over its control socket until ctx is done, then
// returns nil. One session runs at a time: a new offer ends the one before. When a session ends,
// for whatever reason, its socket is closed and the node is told (agentctl.Conn.Ended), which is
// what the node waits for before a checkpoint. A control socket whose node end is gone is kept
// until another comes over the handoff socket: a restore may bring it back (see read).
func RunControl(ctx context.Context, opts ControlOptions) error {
	if opts.Handler == nil {
		return errors.New("channel: ControlOptions.Handler is required")
	}
	if opts.Handoff == "" {
		opts.Handoff = agentproto.HandoffSocket
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "channel")
	handler := Tunnel(opts.Handler, log)

	ln, err := agentctl.Listen(opts.Handoff)
	if err != nil {
		// Without it the sandbox cannot be reached again after a node restart; the control
		// socket it has still works.
		log.Error("no handoff socket: the node cannot reach envd again after it restarts", "err", err)
	}
	controls := make(chan *agentctl.Conn)
	if ln != nil {
		stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
		defer stop()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				select {
				case controls <- c:
				case <-ctx.Done():
					c.Close()
					return
				}
			}
		}()
	}

	offers := make(chan offer)
	read := func(ctl *agentctl.Conn) {
		var delay time.Duration
		for {
			n, conn, err := ctl.Next()
			if errors.Is(err, net.ErrClosed) {
				return // closed here: replaced by a handoff, or envd is stopping
			}
			gone := err != nil && !errors.Is(err, agentctl.ErrProtocol)
			if !gone || delay == 0 {
				select {
				case offers <- offer{ctl: ctl, n: n, conn: conn, err: err}:
				case <-ctx.Done():
					if conn != nil {
						conn.Close()
					}
					return
				}
			}
			if !gone {
				delay = 0
				continue
			}
			// The node's end is gone. Either the node restarted, and a new control socket comes
			// by handoff, or the node died while it checkpointed this sandbox, and a restore of
			// that checkpoint gives this very descriptor a new socket: keep it, and keep
			// reading it, more slowly the longer it stays dead.
			delay = min(max(2*delay, controlRetryMin), controlRetryMax)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
		}
	}
	ctl := opts.Control
	if ctl != nil {
		go read(ctl)
	} else {
		log.Info("no control socket yet; waiting for one on the handoff socket", "socket", opts.Handoff)
	}
	var cur *session
	end := func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
			cur = nil
		}
	}
	defer func() {
		end()
		if ctl != nil {
			ctl.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-controls:
			log.Info("control socket handed over")
			end()
			if ctl != nil {
				ctl.Close()
			}
			ctl = c
			go read(ctl)
		case o := <-offers:
			switch {
			case o.ctl != ctl:
				// From a control socket that was replaced meanwhile.
				if o.conn != nil {
					o.conn.Close()
				}
			case errors.Is(o.err, agentctl.ErrProtocol):
				log.Warn("bad control message", "err", o.err)
			case o.err != nil:
				log.Info("the node's end of the control socket is gone; waiting for a restore or a new one on the handoff socket", "err", o.err)
			default:
				end()
				cur = serveOffer(ctx, o, handler, log)
			}
		}
	}
}

// serveOffer serves one offered session until it ends or is cancelled, then closes its socket
// and tells the node.
func serveOffer(ctx context.Context, o offer, handler http.Handler, log *slog.Logger) *session {
	sctx, cancel := context.WithCancel(ctx)
	s := &session{n: o.n, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		err := serveConn(sctx, o.conn, handler, log)
		_ = o.conn.Close()
		log.Info("agent session ended", "session", o.n, "err", err)
		if err := o.ctl.Ended(o.n); err != nil && !agentctl.IsClosed(err) {
			log.Warn("could not tell the node a session ended", "session", o.n, "err", err)
		}
	}()
	return s
}
