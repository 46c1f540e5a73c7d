package egress

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
)

// API limits on egressProxy (seed "SOCKS5 egress proxy"). 255 bytes is what a SOCKS5
// username/password negotiation (RFC 1929) can carry.
const (
	MaxProxyCredentialBytes = 255
	MaxCACertBytes          = 8 << 10
)

// parseProxy validates an egressProxy. Whether the proxy host resolves into an always-denied range
// is not checked here (that needs DNS, and --egress-internal-allow may exempt an internal proxy):
// the node checks the address it actually dials.
func parseProxy(c *ProxyConfig) (*ProxyConfig, *Proxy, error) {
	if c == nil {
		return nil, nil, nil
	}
	const field = "network.egressProxy"
	addr, err := normHostPort(c.Address)
	if err != nil {
		return nil, nil, errdefs.InvalidArgument("%s.address: %s: %s", field, quote(c.Address), err)
	}
	if n := len(c.Username); n > MaxProxyCredentialBytes {
		return nil, nil, errdefs.InvalidArgument("%s.username: must be at most %d bytes, got %d", field, MaxProxyCredentialBytes, n)
	}
	if n := len(c.Password); n > MaxProxyCredentialBytes {
		return nil, nil, errdefs.InvalidArgument("%s.password: must be at most %d bytes, got %d", field, MaxProxyCredentialBytes, n)
	}
	if c.Password != "" && c.Username == "" {
		return nil, nil, errdefs.InvalidArgument("%s.password: a password requires a username", field)
	}
	norm := &ProxyConfig{Address: addr, Username: c.Username, Password: c.Password}
	p := &Proxy{Address: addr, Username: c.Username, Password: c.Password}
	if t := c.TLS; t != nil {
		if !t.Enabled && t.ServerName != "" {
			return nil, nil, errdefs.InvalidArgument("%s.tls.serverName: requires tls.enabled: true", field)
		}
		if !t.Enabled && t.CACert != "" {
			return nil, nil, errdefs.InvalidArgument("%s.tls.caCert: requires tls.enabled: true", field)
		}
		nt := &ProxyTLS{Enabled: t.Enabled}
		if t.ServerName != "" {
			if nt.ServerName, err = normServerName(t.ServerName); err != nil {
				return nil, nil, errdefs.InvalidArgument("%s.tls.serverName: %s: %s", field, quote(t.ServerName), err)
			}
		}
		if t.CACert != "" {
			if err := checkCACert(t.CACert); err != nil {
				return nil, nil, errdefs.InvalidArgument("%s.tls.caCert: %s", field, err)
			}
			nt.CACert = t.CACert
		}
		norm.TLS = nt
		p.TLS, p.ServerName, p.CACert = nt.Enabled, nt.ServerName, nt.CACert
	}
	return norm, p, nil
}

// normHostPort checks host:port with a hostname or IP literal host and a port 1–65535, and
// returns it with a lower-case host and a canonical port.
func normHostPort(s string) (string, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(s))
	if err != nil || host == "" {
		return "", errString("not host:port (an IPv6 host goes in brackets: [2001:db8::1]:1080)")
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", errString("the port must be a number from 1 to 65535")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return "", errString("an IPv6 zone is not allowed")
		}
		host = a.Unmap().String()
	} else if host, err = normDomain(host, false); err != nil {
		return "", errString("the host is neither an IP address nor a valid hostname: " + err.Error())
	}
	return net.JoinHostPort(host, strconv.FormatUint(n, 10)), nil
}

// normServerName accepts a hostname or an IP literal, the names a TLS certificate can carry.
func normServerName(s string) (string, error) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap().String(), nil
	}
	return normDomain(s, false)
}

// checkCACert requires a PEM bundle of at most MaxCACertBytes holding one or more certificates and
// nothing but certificates (a private key pasted by mistake must not be stored). Text around the
// blocks is ignored, as crypto/x509's CertPool does.
func checkCACert(s string) error {
	if len(s) > MaxCACertBytes {
		return errString("must be at most " + strconv.Itoa(MaxCACertBytes) + " bytes, got " + strconv.Itoa(len(s)))
	}
	rest := []byte(s)
	count := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		count++
		if b.Type != "CERTIFICATE" {
			return errString("PEM block " + strconv.Itoa(count) + " is a " + strconv.Quote(b.Type) + "; only CERTIFICATE blocks are accepted")
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return errString("certificate " + strconv.Itoa(count) + " does not parse: " + err.Error())
		}
	}
	if count == 0 {
		return errString("no PEM certificate found")
	}
	return nil
}
