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

// serveTLS judges a port-443 flow by its SNI. An allowed flow whose name a header rule covers is
// intercepted (intercept); any other is spliced to the origin after replaying the ClientHello.
func (p *Proxy) serveTLS(c net.Conn, fl flow) {
	handedOff := false
	defer func() {
		if !handedOff {
			p.untrack(c)
		}
	}()
	name, hello, err := readClientHello(c, p.cfg.HandshakeTimeout)
	if err != nil {
		// Not TLS, or the guest never finished its ClientHello: no name, so only addresses
		// could allow it — but the bytes are gone into a parser that failed. Refuse.
		p.refuse(fl, "", egress.Decision{Verdict: egress.Deny, Stage: egress.StageDenyOut, Rule: "no TLS ClientHello"})
		reset(c)
		return
	}
	ctx := context.Background()
	d, rt := p.judge(fl, name)
	if d.Verdict == egress.Allow {
		// Resolved before anything is spliced, so a name leading only into always-denied
		// ranges is refused with the alert rather than a reset.
		var re *refusedError
		var err error
		if rt, err = p.resolve(ctx, rt); errors.As(err, &re) {
			d = re.d
		}
	}
	if d.Verdict != egress.Allow {
		p.refuse(fl, name, d)
		_, _ = c.Write(accessDenied)
		_ = c.Close()
		return
	}
	if host, ok := egress.HostName(name); ok {
		if e, ok := p.lookup(fl.guest); ok {
			if _, ok := e.policy.MatchRule(host); ok {
				handedOff = p.intercept(c, fl, host, hello)
				return
			}
		}
	}
	p.splice(ctx, c, fl, name, rt, hello)
}

// replayConn reads the bytes already taken from the guest before the rest of its stream.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// intercept terminates the guest's TLS with a leaf the node's CA mints for host and hands the
// decrypted HTTP/1.1 stream to the HTTP server, which applies the rule's headers per request and
// re-encrypts to the origin with verified TLS. It reports whether the HTTP server took the flow.
func (p *Proxy) intercept(c net.Conn, fl flow, host string, hello []byte) bool {
	if p.cfg.CA == nil {
		p.refuse(fl, host, egress.Decision{Verdict: egress.Deny, Stage: egress.StageDomain, Rule: "header rules are not supported on this node"})
		_, _ = c.Write(accessDenied)
		_ = c.Close()
		return false
	}
	tc := tls.Server(&replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello), c)}, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.cfg.CA.Leaf(host) },
		// HTTP/1.1 only: headers are applied per request on one stream.
		NextProtos: []string{"http/1.1"},
	})
	_ = c.SetDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	if err := tc.Handshake(); err != nil {
		p.log.Debug("egress proxy: intercepted handshake failed", "guest", fl.guest, "name", host, "err", err)
		_ = c.Close()
		return false
	}
	_ = c.SetDeadline(time.Time{})
	p.httpLn.push(&flowConn{Conn: tc, flow: fl, sni: host, done: func() { p.untrack(c) }})
	return true
}

// splice copies both ways until both directions end; a half-close is passed on so protocols
// that shut down their write side keep working. It returns the bytes copied a to b and b to a.
func splice(a, b net.Conn) (ab, ba int64) {
	var wg sync.WaitGroup
	wg.Go(func() {
		ab, _ = io.Copy(b, a)
		closeWrite(b)
	})
	ba, err := io.Copy(a, b)
	closeWrite(a)
	if err != nil {
		// b broke: a gets nothing more, so stop the other direction too.
		_ = a.Close()
		_ = b.Close()
	}
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
	return ab, ba
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
