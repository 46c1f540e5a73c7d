// Package egressproxy owns the node's transparent egress proxy: guest TCP flows to ports 80 and
// 443 that a link's nat chain redirects to it are judged by the HTTP Host header or the TLS
// ClientHello's server name against the sandbox's egress policy (egress.Judge), and an allowed
// flow is re-dialed from the node, by name for a domain (never to an always-denied address) or to
// the address the guest chose for an address rule. Refusals are fast and say why: a 403 naming
// the rule for HTTP, an access_denied alert for TLS, a reset otherwise.
//
// The proxy knows sandboxes only as guest addresses with their policies (Set, Remove); it must
// never touch iptables, links or addresses (firewall and netpool own those). It terminates TLS
// only for flows a header rule applies to (intercept, with the node's egress CA); every other
// TLS flow's ClientHello is read, then replayed to the origin byte for byte.
package egressproxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/tlsutil"
)

// Resolver looks up the addresses of a name (*net.Resolver).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer opens the node's connection to an origin (*net.Dialer).
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Secrets opens the values header rules name with ${e2b.secrets.NAME} (*driver.Driver).
type Secrets interface {
	SecretValue(ctx context.Context, name string) (string, bool)
}

// Refusal is one refused flow, for the operator (seed 002, "Seeing what was blocked").
type Refusal struct {
	Time time.Time
	// Guest is the sandbox's address; the node maps it to a sandbox.
	Guest netip.Addr
	Proto egress.Proto
	Dst   netip.Addr
	Port  uint16
	// Name is the Host or SNI the guest sent ("" for none).
	Name  string
	Stage egress.Stage
	Rule  string
}

// Config configures a Proxy.
type Config struct {
	Env egress.Env
	// Resolver resolves names of domain-allowed flows; nil is net.DefaultResolver.
	Resolver Resolver
	// Dialer reaches origins; nil is a net.Dialer with DialTimeout.
	Dialer Dialer
	// OriginalDst returns where a redirected connection was going; nil reads SO_ORIGINAL_DST.
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// OnRefuse, when set, is called for every refused flow (synchronously: keep it cheap).
	OnRefuse func(Refusal)
	// HandshakeTimeout bounds waiting for a ClientHello or a request header (default 10 s).
	HandshakeTimeout time.Duration
	// DialTimeout bounds resolving and connecting to an origin (default 10 s).
	DialTimeout time.Duration
	// CA mints the certificates of intercepted HTTPS flows (header rules); nil refuses flows a
	// rule would intercept.
	CA *tlsutil.CA
	// OriginRoots verify the origins of intercepted flows; nil is the host's roots. Only tests
	// set it (an origin CA of their own), never production defaults.
	OriginRoots *x509.CertPool
	Log         *slog.Logger
}

// Proxy is the node's transparent egress proxy.
type Proxy struct {
	cfg Config
	log *slog.Logger

	mu sync.RWMutex
	// +checklocks:mu
	guests map[netip.Addr]entry
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	conns map[net.Conn]struct{}

	http   *http.Server
	httpLn *connListener
	wg     sync.WaitGroup
	// secrets is set once the driver exists (SetSecrets); nil fills no placeholder.
	secrets atomic.Pointer[Secrets]
	// sent and received count the bytes relayed to and from origins (Relayed).
	sent, received atomic.Int64
}

// Relayed returns the bytes the proxy relayed so far: sent to origins, and received from them.
// A spliced flow is counted when it ends; an intercepted one (header rules) as it goes.
func (p *Proxy) Relayed() (sent, received int64) { return p.sent.Load(), p.received.Load() }

// SetSecrets gives the proxy the store of secret values; until then a header whose value names a
// secret is not sent.
func (p *Proxy) SetSecrets(s Secrets) { p.secrets.Store(&s) }

// entry is what the proxy knows about one guest.
type entry struct {
	// host is the node's end of the guest's link: the address a REDIRECT delivers its flows to.
	// A connection arriving elsewhere from the guest's address is spoofed.
	host   netip.Addr
	policy egress.Policy
}

// New returns a proxy; Serve starts it.
func New(cfg Config) *Proxy {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{Timeout: cfg.DialTimeout}
	}
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, log: cfg.Log, guests: map[netip.Addr]entry{}, conns: map[net.Conn]struct{}{}}
	p.httpLn = newConnListener()
	p.http = p.newHTTPServer()
	return p
}

// CABundle is the PEM of the CA guests must trust for intercepted flows (nil without a CA).
func (p *Proxy) CABundle() []byte {
	if p.cfg.CA == nil {
		return nil
	}
	return p.cfg.CA.CertPEM
}

// Set puts policy in force for new flows (and, on port 80, new requests) from guest, whose link's
// node end is host. It replaces what was there: the proxy's half of a live update.
func (p *Proxy) Set(guest, host netip.Addr, policy egress.Policy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.guests[guest.Unmap()] = entry{host: host.Unmap(), policy: policy}
}

// Remove forgets guest: its further flows are refused.
func (p *Proxy) Remove(guest netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.guests, guest.Unmap())
}

func (p *Proxy) lookup(guest netip.Addr) (entry, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	e, ok := p.guests[guest.Unmap()]
	return e, ok
}

// Serve accepts redirected flows on ln until Close. It returns nil after Close.
func (p *Proxy) Serve(ln net.Listener) error {
	p.wg.Go(func() { _ = p.http.Serve(p.httpLn) })
	for {
		c, err := ln.Accept()
		if err != nil {
			p.mu.RLock()
			closed := p.closed
			p.mu.RUnlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("egress proxy accept: %w", err)
		}
		if !p.start() {
			c.Close()
			return nil
		}
		p.track(c)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

// Close stops the proxy: every flow it carries is closed.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	_ = p.http.Close()
	p.wg.Wait()
	return nil
}

// start counts a flow handler in, unless the proxy is closing (Close waits for those counted).
func (p *Proxy) start() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	return true
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// flow is one redirected guest connection.
type flow struct {
	guest netip.Addr
	dst   netip.AddrPort
}

// handle identifies the guest and the original destination and hands the flow to the HTTP or
// TLS path. Anything that does not add up is reset.
func (p *Proxy) handle(c net.Conn) {
	remote, local := addrPortOf(c.RemoteAddr()), addrPortOf(c.LocalAddr())
	e, ok := p.lookup(remote.Addr())
	if !ok || e.host != local.Addr().Unmap() {
		// Not a guest of this node, or a guest's address arriving on another link (spoofed).
		p.log.Debug("egress proxy: connection from an unknown guest", "remote", remote, "local", local)
		p.untrack(c)
		reset(c)
		return
	}
	dst, err := p.cfg.OriginalDst(c)
	if err != nil {
		p.log.Warn("egress proxy: original destination", "guest", remote.Addr(), "err", err)
		p.untrack(c)
		reset(c)
		return
	}
	fl := flow{guest: remote.Addr().Unmap(), dst: netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())}
	switch dst.Port() {
	case egress.PortHTTP:
		// The HTTP server owns the connection from here (and untracks it when it ends).
		p.httpLn.push(&flowConn{Conn: c, flow: fl, done: func() { p.untrack(c) }})
	case egress.PortHTTPS:
		// serveTLS untracks c itself, unless it hands an intercepted flow to the HTTP server.
		p.serveTLS(c, fl)
	default:
		// Other ports reach the proxy only when the policy has a SOCKS5 egress proxy: judged
		// by address alone, then tunnelled.
		defer p.untrack(c)
		p.serveTCP(c, fl)
	}
}

// route is where an allowed flow goes.
type route struct {
	// name is the normalised domain of a domain-allowed flow ("" otherwise).
	name string
	// addrs are the addresses the node may dial directly, in order (none when a SOCKS5 proxy
	// resolves name itself).
	addrs []netip.Addr
	port  uint16
	// via, when set, is the sandbox's SOCKS5 egress proxy every allowed TCP flow goes through.
	via *egress.Proxy
}

// key identifies the route's destination, for connection pooling.
func (r route) key() string {
	if r.name != "" {
		return net.JoinHostPort(r.name, strconv.Itoa(int(r.port)))
	}
	if len(r.addrs) == 0 {
		return "invalid"
	}
	return netip.AddrPortFrom(r.addrs[0], r.port).String()
}

// judge decides a flow with the guest's current policy and, for an allowed one, where it goes: a
// domain-allowed flow to the name (resolved when it is dialed, by the node or by the SOCKS5
// proxy), an address-allowed one to the original destination. It does no I/O, so a kept-alive
// HTTP connection judges each request without resolving the name again.
func (p *Proxy) judge(fl flow, name string) (egress.Decision, route) {
	e, ok := p.lookup(fl.guest)
	if !ok {
		return egress.Decision{Verdict: egress.Deny, Stage: egress.StageDenyOut, Rule: "sandbox gone"}, route{}
	}
	d := egress.Judge(e.policy, p.cfg.Env, egress.TCP, fl.dst.Addr(), fl.dst.Port(), name)
	if d.Verdict != egress.Allow {
		return d, route{}
	}
	rt := route{port: fl.dst.Port(), via: e.policy.Proxy}
	if d.Stage != egress.StageDomain {
		rt.addrs = []netip.Addr{fl.dst.Addr()}
		return d, rt
	}
	rt.name, _ = egress.HostName(name)
	return d, rt
}

// refusedError is a dial the policy refuses after all: the name leads only into always-denied
// ranges, or does not resolve.
type refusedError struct{ d egress.Decision }

func (e *refusedError) Error() string { return e.d.Rule }

// resolve fills in the addresses of a domain route the node dials itself, never an always-denied
// one; a SOCKS5 proxy resolves the name instead (remote DNS).
func (p *Proxy) resolve(ctx context.Context, rt route) (route, error) {
	if rt.name == "" || rt.via != nil || rt.addrs != nil {
		return rt, nil
	}
	rctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	addrs, err := p.cfg.Resolver.LookupNetIP(rctx, "ip", rt.name)
	if err != nil || len(addrs) == 0 {
		return rt, &refusedError{egress.Decision{Verdict: egress.Deny, Stage: egress.StageDomain, Rule: "cannot resolve " + rt.name}}
	}
	if rt.addrs = p.cfg.Env.DialTargets(addrs); len(rt.addrs) == 0 {
		return rt, &refusedError{egress.Decision{Verdict: egress.Deny, Stage: egress.StageAlwaysDenied,
			Rule: fmt.Sprintf("%s resolves only to always-denied addresses (%s)", rt.name, addrs[0])}}
	}
	return rt, nil
}

// dial opens an allowed flow's connection to its origin, through the SOCKS5 proxy when the
// policy has one. A name that turns out to lead nowhere allowed is a *refusedError.
func (p *Proxy) dial(ctx context.Context, rt route) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
	defer cancel()
	if rt.via != nil {
		return p.socksDial(ctx, rt.via, rt.key())
	}
	rt, err := p.resolve(ctx, rt)
	if err != nil {
		return nil, err
	}
	return p.dialDirect(ctx, rt.addrs, rt.port)
}

// dialDirect connects to the first target that answers, on port.
func (p *Proxy) dialDirect(ctx context.Context, targets []netip.Addr, port uint16) (net.Conn, error) {
	var errs []error
	for _, a := range targets {
		c, err := p.cfg.Dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a, port).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("no address to dial")
	}
	return nil, errors.Join(errs...)
}

func (p *Proxy) refuse(fl flow, name string, d egress.Decision) {
	p.log.Debug("egress refused", "guest", fl.guest, "dst", fl.dst, "name", name, "stage", d.Stage, "rule", d.Rule)
	if p.cfg.OnRefuse != nil {
		p.cfg.OnRefuse(Refusal{Time: time.Now(), Guest: fl.guest, Proto: egress.TCP, Dst: fl.dst.Addr(),
			Port: fl.dst.Port(), Name: name, Stage: d.Stage, Rule: d.Rule})
	}
}

// reason is the one-line explanation a refusal carries to the guest.
func reason(d egress.Decision, name string, dst netip.AddrPort) string {
	target := dst.String()
	if name != "" {
		target = fmt.Sprintf("%s (%s)", name, dst)
	}
	switch d.Stage {
	case egress.StageDenyOut:
		if d.Rule == "" {
			return fmt.Sprintf("egress to %s refused by the sandbox's network policy", target)
		}
		return fmt.Sprintf("egress to %s refused: no allowOut domain or address matches, denyOut %s", target, d.Rule)
	case egress.StageAlwaysDenied:
		return fmt.Sprintf("egress to %s refused: always-denied range (%s)", target, d.Rule)
	default:
		return fmt.Sprintf("egress to %s refused: %s", target, d.Rule)
	}
}

// reset closes c with a TCP RST, so the guest fails at once instead of waiting.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// serveTCP judges a flow that carries no name by its address and tunnels an allowed one.
func (p *Proxy) serveTCP(c net.Conn, fl flow) {
	ctx := context.Background()
	d, rt := p.judge(fl, "")
	if d.Verdict != egress.Allow {
		p.refuse(fl, "", d)
		reset(c)
		return
	}
	p.splice(ctx, c, fl, "", rt, nil)
}

// splice dials the route, writes first (bytes already read from the guest) and copies both ways.
// A failed dial is a reset: the guest sees a refusal, never a half-open flow.
func (p *Proxy) splice(ctx context.Context, c net.Conn, fl flow, name string, rt route, first []byte) {
	up, err := p.dial(ctx, rt)
	if err != nil {
		if re := (*refusedError)(nil); errors.As(err, &re) {
			p.refuse(fl, name, re.d)
		} else {
			p.log.Debug("egress proxy: origin unreachable", "guest", fl.guest, "dst", fl.dst, "name", name, "err", err)
		}
		reset(c)
		return
	}
	if !p.track(up) {
		up.Close()
		reset(c)
		return
	}
	defer p.untrack(up)
	if len(first) > 0 {
		if _, err := up.Write(first); err != nil {
			up.Close()
			reset(c)
			return
		}
		p.sent.Add(int64(len(first)))
	}
	// Counted from io.Copy's totals rather than by wrapping the connections: that would cost
	// the kernel's splice between the two sockets.
	sent, received := splice(c, up)
	p.sent.Add(sent)
	p.received.Add(received)
}
