// Package agent owns the host end of the agent channel to one sandbox's envd (see agentproto for
// the wire contract). It either offers envd sessions over the control socket it gave the
// sandbox (Attach) or listens on the per-sandbox unix socket envd dials (Listen, for sandboxes
// checkpointed by older vmon), keeps the newest yamux session, and hands out HTTP transports and
// port tunnels over it. It never touches runtimes, records or the guest network.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/vibemon/vmon/internal/agentctl"
	"github.com/vibemon/vmon/internal/agentproto"
)

// ErrClosed is returned once the channel has been closed by the node.
var ErrClosed = errors.New("agent channel closed")

// DialWait bounds how long a request waits for envd to (re)connect before it fails: envd redials
// at once after a restore, so a longer wait means it is not coming. (After a node restart the
// node holds a sandbox back until its envd is connected again; see node.adopt.)
const DialWait = 5 * time.Second

// Channel is the host end of one sandbox's agent channel.
type Channel struct {
	log *slog.Logger
	ln  net.Listener // a dialled channel's; nil with a control socket

	// With a control socket (Attach): ctl is the node's end, sessionN the number of the session
	// last offered, ended the sessions envd has not reported ended yet, and parked says the node
	// let go of the session on purpose (Park), so its end is not answered with a new offer.
	// +checklocks:mu
	ctl *agentctl.Conn
	// +checklocks:mu
	sessionN uint32
	// +checklocks:mu
	ended map[uint32]chan struct{}
	// +checklocks:mu
	parked bool

	mu sync.Mutex
	// +checklocks:mu
	session *yamux.Session
	// ready is closed and replaced whenever a session arrives; waiters block on the current one.
	// +checklocks:mu
	ready chan struct{}
	// +checklocks:mu
	closed bool
	// stopped is set once the sandbox is known to be gone; every wait fails with it at once.
	// +checklocks:mu
	stopped error

	transport *http.Transport

	// refused counts sessions closed for guest-opened streams; lastWarn rate-limits the log line
	// about them, so a guest cannot flood the node's log.
	refused  atomic.Int64
	lastWarn atomic.Int64
}

// Listen creates the agent socket in dir (replacing a stale one left by a crash) and starts
// accepting envd connections.
func Listen(dir string, log *slog.Logger) (*Channel, error) {
	path := filepath.Join(dir, agentproto.SocketName)
	// sun_path holds 108 bytes including the terminating NUL.
	if len(path) >= 108 {
		return nil, fmt.Errorf("agent socket path is %d bytes, over the 107 a unix socket allows: use a shorter --data-dir", len(path))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale agent socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on agent socket: %w", err)
	}
	c := newChannel(log)
	c.ln = ln
	go c.acceptLoop()
	return c, nil
}

func newChannel(log *slog.Logger) *Channel {
	c := &Channel{log: log, ready: make(chan struct{})}
	c.transport = &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return c.open(ctx) },
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// envd output is already small chunks; compression would only add latency.
		DisableCompression: true,
	}
	return c
}

// Attach returns the channel to the envd at the other end of control socket ctl, and offers it
// its first session. The channel owns ctl from then on.
func Attach(ctl *agentctl.Conn, log *slog.Logger) (*Channel, error) {
	c := newChannel(log)
	c.ended = make(map[uint32]chan struct{})
	if err := c.Rebind(ctl); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Rebind makes ctl the channel's control socket, in place of one whose envd end is gone (the
// sandbox was restored from a checkpoint, or handed a new one after a node restart), and offers
// envd a session on it. It ends a Park.
func (c *Channel) Rebind(ctl *agentctl.Conn) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		ctl.Close()
		return ErrClosed
	}
	old := c.ctl
	c.ctl = ctl
	c.parked = false
	err := c.offerLocked()
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
	go c.readEnded(ctl)
	return err
}

// offerLocked offers envd a new session on the control socket and makes it the current one.
//
// +checklocks:c.mu
func (c *Channel) offerLocked() error {
	c.sessionN++
	n := c.sessionN
	conn, err := c.ctl.Offer(n)
	if err != nil {
		return err
	}
	sess, err := yamux.Client(conn, sessionConfig())
	if err != nil {
		conn.Close()
		return fmt.Errorf("agent session: %w", err)
	}
	c.ended[n] = make(chan struct{})
	c.installLocked(sess)
	return nil
}

// readEnded follows envd's reports on ctl until it closes. A session envd ended without the node
// asking (a guest that broke the protocol, see refuseInbound) is followed by a new offer, at most
// one per reofferGap, so a guest cannot make the node spin.
func (c *Channel) readEnded(ctl *agentctl.Conn) {
	var last time.Time
	for {
		n, err := ctl.NextEnded()
		if err != nil {
			if !agentctl.IsClosed(err) {
				c.log.Warn("agent control socket failed", "err", err)
			}
			return
		}
		c.mu.Lock()
		if ch, ok := c.ended[n]; ok {
			close(ch)
			delete(c.ended, n)
		}
		again := c.unaskedEndLocked(ctl, n)
		c.mu.Unlock()
		if !again {
			continue
		}
		time.Sleep(time.Until(last.Add(reofferGap)))
		last = time.Now()
		c.mu.Lock()
		// Still so after the wait: nothing parked, replaced or stopped the channel meanwhile.
		if c.unaskedEndLocked(ctl, n) {
			if err := c.offerLocked(); err != nil && !agentctl.IsClosed(err) {
				c.log.Warn("agent session offer failed", "err", err)
			}
		}
		c.mu.Unlock()
	}
}

// unaskedEndLocked reports whether the end of session n on ctl is one the node did not ask for:
// n is the current session on the current control socket, and the channel is not parked, closed
// or stopped.
//
// +checklocks:c.mu
func (c *Channel) unaskedEndLocked(ctl *agentctl.Conn, n uint32) bool {
	return c.ctl == ctl && n == c.sessionN && !c.parked && !c.closed && c.stopped == nil
}

// reofferGap is the least time between two sessions offered because envd ended one.
const reofferGap = 100 * time.Millisecond

// Park lets go of the current session and waits until envd reports it holds nothing of it, so
// that a checkpoint of the sandbox can be restored: a checkpoint keeps the control socket, not a
// session's. Requests meanwhile wait for the next session (Rebind after a restore, or Unpark).
func (c *Channel) Park(ctx context.Context) error {
	c.mu.Lock()
	if c.ctl == nil {
		c.mu.Unlock()
		return errors.New("agent channel has no control socket to park")
	}
	c.parked = true
	s, done := c.session, c.ended[c.sessionN]
	c.session = nil
	c.mu.Unlock()
	if s != nil {
		s.Close()
	}
	c.transport.CloseIdleConnections()
	if done == nil {
		return nil // already reported
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("envd did not let go of its agent session: %w", ctx.Err())
	}
}

// Unpark offers envd a new session after a Park whose checkpoint did not happen.
func (c *Channel) Unpark() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctl == nil || c.closed {
		return ErrClosed
	}
	c.parked = false
	return c.offerLocked()
}

func (c *Channel) acceptLoop() {
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			if !c.isClosed() {
				c.log.Warn("agent accept failed", "err", err)
			}
			return
		}
		sess, err := yamux.Client(conn, sessionConfig())
		if err != nil {
			c.log.Warn("agent session failed", "err", err)
			conn.Close()
			continue
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			sess.Close()
			return
		}
		c.installLocked(sess)
		c.mu.Unlock()
	}
}

// installLocked makes sess the current session.
//
// +checklocks:c.mu
func (c *Channel) installLocked(sess *yamux.Session) {
	old := c.session
	c.session = sess
	close(c.ready)
	c.ready = make(chan struct{})
	if old != nil {
		go old.Close()
	}
	go c.refuseInbound(sess)
	// Pooled HTTP connections ride streams of the old session; drop them.
	go c.transport.CloseIdleConnections()
	c.log.Debug("agent connected")
}

// refuseInbound closes a session as soon as the guest opens a stream on it. Only the node opens
// streams (envd serves, the node asks); a stream from the guest is a protocol violation, and
// accepting streams nobody reads would let the guest grow the node's memory without bound.
// Closing the session affects this sandbox alone; a well-behaved envd redials.
func (c *Channel) refuseInbound(sess *yamux.Session) {
	if _, err := sess.AcceptStream(); err != nil {
		return // the session ended
	}
	sess.Close()
	n := c.refused.Add(1)
	now := time.Now().UnixNano()
	if last := c.lastWarn.Load(); now-last >= int64(time.Minute) && c.lastWarn.CompareAndSwap(last, now) {
		c.log.Warn("guest opened a stream on the agent channel; closed the session", "sessions_closed", n)
	}
}

// sessionConfig is the node's side of the shared yamux configuration, with tighter bounds on
// what the guest can make the node hold: a stream the node closed whose guest end never closes
// is reset (freeing its receive buffer) after StreamCloseTimeout instead of five minutes, and the
// accept backlog, which only a misbehaving guest ever fills, holds one stream.
func sessionConfig() *yamux.Config {
	c := agentproto.YamuxConfig()
	c.StreamCloseTimeout = 15 * time.Second
	c.AcceptBacklog = 1
	return c
}

func (c *Channel) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// current returns a live session, waiting for envd to (re)connect until ctx is done.
func (c *Channel) current(ctx context.Context) (*yamux.Session, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if c.stopped != nil {
			err := c.stopped
			c.mu.Unlock()
			return nil, err
		}
		s, ready := c.session, c.ready
		c.mu.Unlock()
		if s != nil && !s.IsClosed() {
			return s, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for envd to connect: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
			// A closed session gives no signal on ready; poll so a redial is noticed.
		}
	}
}

// open opens a stream to envd, waiting at most DialWait for a session.
func (c *Channel) open(ctx context.Context) (net.Conn, error) {
	wctx, cancel := context.WithTimeout(ctx, DialWait)
	s, err := c.current(wctx)
	cancel()
	if err != nil {
		return nil, err
	}
	st, err := s.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("open agent stream: %w", err)
	}
	return st, nil
}

// Stop marks the sandbox behind the channel as gone: waits and dials fail at once with err from
// now on, and the live session is closed so requests in flight end instead of hanging.
func (c *Channel) Stop(err error) {
	c.mu.Lock()
	if c.stopped == nil {
		c.stopped = err
	}
	s := c.session
	ready := c.ready
	c.ready = make(chan struct{})
	c.mu.Unlock()
	close(ready)
	if s != nil {
		s.Close()
	}
	c.transport.CloseIdleConnections()
}

// WaitConnected blocks until envd has connected.
func (c *Channel) WaitConnected(ctx context.Context) error {
	_, err := c.current(ctx)
	return err
}

// Transport returns an HTTP transport whose connections are streams to envd. URLs may use any
// host; requests always reach this sandbox's envd.
func (c *Channel) Transport() http.RoundTripper { return c.transport }

// DialPort opens a raw TCP tunnel to port on the guest's loopback through envd.
func (c *Channel) DialPort(ctx context.Context, port int) (net.Conn, error) {
	conn, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	tunnel, err := agentproto.ConnectTunnel(conn, agentproto.TunnelAuthority(port))
	var te *agentproto.TunnelError
	if errors.As(err, &te) {
		return nil, fmt.Errorf("%w: guest port %d answered %s", ErrPortClosed, port, te.Text)
	}
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return tunnel, nil
}

// DialEnvd opens a raw stream to envd, which serves HTTP/1.1 on it (what Transport uses); a node
// hands it to a driver's tunnel for envd traffic to a sandbox it holds.
func (c *Channel) DialEnvd(ctx context.Context) (net.Conn, error) { return c.open(ctx) }

// ErrPortClosed means envd could not reach the requested guest port.
var ErrPortClosed = errors.New("guest port not reachable")

// Close stops accepting, closes the live session and removes the socket, or closes the control
// socket.
func (c *Channel) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s, ctl := c.session, c.ctl
	c.mu.Unlock()
	var err error
	if c.ln != nil {
		err = c.ln.Close()
	}
	if ctl != nil {
		err = ctl.Close()
	}
	if s != nil {
		s.Close()
	}
	c.transport.CloseIdleConnections()
	return err
}
