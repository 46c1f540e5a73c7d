package egressproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/secrets"
)

// flowConn is a redirected port-80 connection handed to the HTTP server, with what the proxy
// knows about it.
type flowConn struct {
	net.Conn
	flow flow
	// sni is the name of an intercepted HTTPS flow (header rules); "" for plain HTTP.
	sni  string
	done func()

	once sync.Once
	mu   sync.Mutex
	// pinned is the Host of the connection's first allowed request: every later request on it
	// must name the same host, so a kept-alive connection cannot be reused for another name.
	// +checklocks:mu
	pinned string
	// +checklocks:mu
	rp *httputil.ReverseProxy
	// +checklocks:mu
	transport *http.Transport
}

// Close also ends the flow. A connection the server hijacked (an Upgrade, e.g. a WebSocket) is
// closed by the reverse proxy when the upgraded stream ends; until then it stays tracked, so
// Proxy.Close still reaches it.
func (c *flowConn) Close() error {
	err := c.Conn.Close()
	c.finish()
	return err
}

func (c *flowConn) finish() {
	c.once.Do(func() {
		c.mu.Lock()
		t := c.transport
		c.mu.Unlock()
		if t != nil {
			t.CloseIdleConnections()
		}
		c.done()
	})
}

type flowKey struct{}

type targetKey struct{}

func (p *Proxy) newHTTPServer() *http.Server {
	return &http.Server{
		Handler:           http.HandlerFunc(p.serveHTTP),
		ReadHeaderTimeout: p.cfg.HandshakeTimeout,
		IdleTimeout:       5 * time.Minute,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, flowKey{}, c)
		},
		ConnState: func(c net.Conn, s http.ConnState) {
			if fc, ok := c.(*flowConn); ok && s == http.StateClosed {
				fc.finish()
			}
		},
		// Guests that send garbage or hang up make net/http log; that is routine, so debug.
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
}

// serveHTTP judges one request by its Host (the URL's host for an absolute-form request, as Go's
// server sets r.Host) and forwards an allowed one to the origin over the connection's own
// transport.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	fc, ok := r.Context().Value(flowKey{}).(*flowConn)
	if !ok {
		http.Error(w, "vmon: egress proxy: no flow", http.StatusInternalServerError)
		return
	}
	name := r.Host
	if fc.sni != "" {
		// Inside an intercepted TLS flow the SNI was judged; a Host naming anything else
		// would be domain fronting.
		if !sameHost(r.Host, fc.sni) {
			d := egress.Decision{Verdict: egress.Deny, Stage: egress.StageDomain,
				Rule: fmt.Sprintf("Host %q differs from the TLS server name %q", r.Host, fc.sni)}
			p.refuse(fc.flow, r.Host, d)
			p.deny(w, reason(d, r.Host, fc.flow.dst))
			return
		}
		name = fc.sni
	}
	d, rt := p.judge(fc.flow, name)
	if d.Verdict != egress.Allow {
		p.refuse(fc.flow, name, d)
		p.deny(w, reason(d, name, fc.flow.dst))
		return
	}
	if fc.sni != "" {
		p.applyRule(r, fc)
	}
	key := strings.ToLower(name)
	if h, ok := egress.HostName(name); ok {
		key = h
	}
	fc.mu.Lock()
	if fc.pinned == "" {
		fc.pinned = key
	}
	pinned := fc.pinned
	rp := fc.reverseProxy(p)
	fc.mu.Unlock()
	if key != pinned {
		d := egress.Decision{Verdict: egress.Deny, Stage: egress.StageDomain,
			Rule: fmt.Sprintf("Host %q differs from this connection's first request (%q)", key, pinned)}
		p.refuse(fc.flow, name, d)
		p.deny(w, reason(d, name, fc.flow.dst))
		return
	}
	ctx := context.WithValue(r.Context(), targetKey{}, rt)
	rp.ServeHTTP(w, r.WithContext(ctx))
}

// sameHost reports whether an intercepted request's Host names the flow's TLS server name sni
// (lower-case, no trailing dot): the same name in any letter case, with or without a trailing
// dot, and with no port or the default one (the flow is on 443, and another port would name
// another origin). Anything else, an address or an empty Host included, is domain fronting.
func sameHost(host, sni string) bool {
	if h, port, err := net.SplitHostPort(host); err == nil {
		if port != "" && port != "443" {
			return false
		}
		host = h
	}
	h, ok := egress.HostName(host)
	return ok && h == sni
}

// applyRule sets the headers of the guest's current rule for the flow's name, replacing what the
// guest sent. A rule removed by a live update stops applying from the next request.
func (p *Proxy) applyRule(r *http.Request, fc *flowConn) {
	e, ok := p.lookup(fc.flow.guest)
	if !ok {
		return
	}
	rule, ok := e.policy.MatchRule(fc.sni)
	if !ok {
		return
	}
	for k, v := range rule.Headers {
		if strings.Contains(v, "${") {
			filled, ok := secrets.Fill(v, func(name string) (string, bool) {
				s := p.secrets.Load()
				if s == nil {
					return "", false
				}
				return (*s).SecretValue(r.Context(), name)
			})
			if !ok {
				// A secret deleted since the rule was accepted: the header is not sent at all,
				// neither the placeholder nor what the guest put there.
				p.log.Warn("egress rule names a secret that no longer exists; header dropped", "guest", fc.flow.guest, "host", fc.sni, "header", k)
				r.Header.Del(k)
				continue
			}
			v = filled
		}
		r.Header.Set(k, v)
	}
}

// deny answers a refused request with a 403 naming the rule, and closes the connection.
func (p *Proxy) deny(w http.ResponseWriter, msg string) {
	w.Header().Set("Connection", "close")
	w.Header().Set("X-Vmon-Egress", "denied")
	http.Error(w, "vmon: "+msg, http.StatusForbidden)
}

// reverseProxy returns the connection's forwarder, made on first use: one transport per guest
// connection keeps upstream keep-alive 1:1 with the guest's and never shares an origin connection
// between sandboxes.
//
// +checklocks:c.mu
func (c *flowConn) reverseProxy(p *Proxy) *httputil.ReverseProxy {
	if c.rp != nil {
		return c.rp
	}
	c.transport = &http.Transport{
		DialContext:        p.dialTarget,
		DisableCompression: true, // pass Accept-Encoding through as the guest sent it
		MaxIdleConns:       4,
		IdleConnTimeout:    time.Minute,
	}
	scheme := "http"
	if c.sni != "" {
		scheme = "https"
		c.transport.TLSClientConfig = &tls.Config{ServerName: c.sni, RootCAs: p.cfg.OriginRoots, NextProtos: []string{"http/1.1"}}
	}
	c.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t, _ := pr.In.Context().Value(targetKey{}).(route)
			pr.Out.URL.Scheme = scheme
			// The pool key is what is dialed, so a connection to one address never serves a
			// request meant for another.
			pr.Out.URL.Host = t.key()
			pr.Out.Host = pr.In.Host
		},
		Transport:     c.transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if re := (*refusedError)(nil); errors.As(err, &re) {
				// The name was resolved only now, at the first dial for it.
				p.refuse(c.flow, r.Host, re.d)
				p.deny(w, reason(re.d, r.Host, c.flow.dst))
				return
			}
			p.log.Debug("egress proxy: origin request failed", "guest", c.flow.guest, "host", r.Host, "err", err)
			if errors.Is(err, context.Canceled) {
				return
			}
			w.Header().Set("Connection", "close")
			http.Error(w, "vmon: egress proxy: origin unreachable: "+r.Host, http.StatusBadGateway)
		},
	}
	return c.rp
}

// dialTarget dials the route judge chose for the request in flight.
func (p *Proxy) dialTarget(ctx context.Context, _, _ string) (net.Conn, error) {
	rt, ok := ctx.Value(targetKey{}).(route)
	if !ok {
		return nil, errors.New("no route for the request")
	}
	c, err := p.dial(ctx, rt)
	if err != nil {
		return nil, err
	}
	return countedConn{Conn: c, p: p}, nil
}

// countedConn counts an intercepted flow's bytes to and from its origin as they go.
type countedConn struct {
	net.Conn
	p *Proxy
}

func (c countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.p.received.Add(int64(n))
	return n, err
}

func (c countedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.p.sent.Add(int64(n))
	return n, err
}

// connListener hands accepted port-80 flows to the HTTP server.
type connListener struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnListener() *connListener {
	return &connListener{ch: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *connListener) push(c *flowConn) {
	select {
	case l.ch <- c:
	case <-l.closed:
		c.finish()
		reset(c.Conn)
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return &net.TCPAddr{} }
