package egressproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"golang.org/x/net/proxy"

	"github.com/vibemon/vmon/internal/egress"
)

// socksDial opens target (host:port; a name is resolved by the SOCKS server, RFC 1928 remote DNS)
// through the sandbox's SOCKS5 egress proxy. The hop to the proxy is dialed by the node, never
// to an always-denied address unless exempted, and wrapped in TLS when the policy asks. Any
// failure is an error: the caller refuses the guest's flow, it never falls back to a direct
// connection.
func (p *Proxy) socksDial(ctx context.Context, px *egress.Proxy, target string) (net.Conn, error) {
	var auth *proxy.Auth
	if px.Username != "" {
		auth = &proxy.Auth{User: px.Username, Password: px.Password}
	}
	d, err := proxy.SOCKS5("tcp", px.Address, auth, &hopDialer{p: p, px: px})
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s: %w", px.Address, err)
	}
	cd, ok := d.(proxy.ContextDialer)
	if !ok {
		return nil, errors.New("SOCKS5 dialer without context support")
	}
	c, err := cd.DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, fmt.Errorf("via egress proxy %s: %w", px.Address, err)
	}
	return c, nil
}

// hopDialer opens the connection to the SOCKS5 server itself.
type hopDialer struct {
	p  *Proxy
	px *egress.Proxy
}

func (h *hopDialer) Dial(network, addr string) (net.Conn, error) {
	return h.DialContext(context.Background(), network, addr)
}

func (h *hopDialer) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else if addrs, err = h.p.cfg.Resolver.LookupNetIP(ctx, "ip", host); err != nil {
		return nil, fmt.Errorf("resolve egress proxy %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve egress proxy %s: no addresses", host)
	}
	targets := h.p.cfg.Env.DialTargets(addrs)
	if len(targets) == 0 {
		return nil, fmt.Errorf("egress proxy %s is in an always-denied range (%s)", host, addrs[0])
	}
	c, err := h.p.dialDirect(ctx, targets, uint16(port))
	if err != nil || !h.px.TLS {
		return c, err
	}
	cfg := &tls.Config{ServerName: h.px.ServerName}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	if h.px.CACert != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(h.px.CACert)) {
			c.Close()
			return nil, errors.New("egress proxy tls.caCert holds no usable certificate")
		}
		cfg.RootCAs = pool
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS to egress proxy %s: %w", addr, err)
	}
	return tc, nil
}
