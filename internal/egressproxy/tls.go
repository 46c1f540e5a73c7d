package egressproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/egress"
)

// errPeeked stops crypto/tls right after it parsed the ClientHello.
var errPeeked = errors.New("client hello read")

// peekConn feeds crypto/tls from the guest and records every byte it reads, so the ClientHello
// can be replayed to the origin; crypto/tls's writes (alerts) never reach the guest.
type peekConn struct {
	net.Conn
	rec bytes.Buffer
}

func (c *peekConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.rec.Write(b[:n])
	return n, err
}

func (c *peekConn) Write(b []byte) (int, error) { return len(b), nil }

// readClientHello reads the guest's ClientHello with crypto/tls's own parser and returns its
// server name ("" when absent) and the raw bytes read so far. Only the outer ClientHello of ECH
// is visible, which is what is judged.
func readClientHello(c net.Conn, timeout time.Duration) (string, []byte, error) {
	pc := &peekConn{Conn: c}
	var name string
	var got bool
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	err := tls.Server(pc, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name, got = h.ServerName, true
			return nil, errPeeked
		},
	}).Handshake()
	_ = c.SetReadDeadline(time.Time{})
	if !got {
		return "", nil, err
	}
	return name, pc.rec.Bytes(), nil
}

// accessDenied is a TLS alert record: fatal (2), access_denied (49) (RFC 8446 §6). The record
// version field is ignored by receivers for alerts sent before a version is negotiated.
var accessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49}

// serveTLS judges a port-443 flow by its SNI and splices an allowed one to the origin after
// replaying the ClientHello.
func (p *Proxy) serveTLS(c net.Conn, fl flow) {
	name, hello, err := readClientHello(c, p.cfg.HandshakeTimeout)
	if err != nil {
		// Not TLS, or the guest never finished its ClientHello: no name, so only addresses
		// could allow it — but the bytes are gone into a parser that failed. Refuse.
		p.refuse(fl, "", egress.Decision{Verdict: egress.Deny, Stage: egress.StageDenyOut, Rule: "no TLS ClientHello"})
		reset(c)
		return
	}
	ctx := context.Background()
	d, targets := p.judge(ctx, fl, name)
	if d.Verdict != egress.Allow {
		p.refuse(fl, name, d)
		_, _ = c.Write(accessDenied)
		_ = c.Close()
		return
	}
	up, err := p.dial(ctx, targets, fl.dst.Port())
	if err != nil {
		p.log.Debug("egress proxy: origin unreachable", "guest", fl.guest, "name", name, "err", err)
		reset(c)
		return
	}
	if !p.track(up) {
		up.Close()
		reset(c)
		return
	}
	defer p.untrack(up)
	if _, err := up.Write(hello); err != nil {
		up.Close()
		reset(c)
		return
	}
	splice(c, up)
}

// splice copies both ways until both directions end; a half-close is passed on so protocols
// that shut down their write side keep working.
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(b, a)
		closeWrite(b)
	})
	_, err := io.Copy(a, b)
	closeWrite(a)
	if err != nil {
		// b broke: a gets nothing more, so stop the other direction too.
		_ = a.Close()
		_ = b.Close()
	}
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
