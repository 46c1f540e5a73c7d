// Package tlsutil makes and loads local certificate authorities and the certificates they mint:
// the listener's (a CA and a certificate per sandbox host name) and the egress proxy's (a CA whose
// certificates guests trust for intercepted flows), kept in the data dir so clients trust them
// across restarts. It owns only files under the directories it is given.
package tlsutil

import (
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"strings"
)

// Issuer mints a certificate per requested server name from a local CA kept in the data dir,
// because TLS clients (Node among them) refuse a wildcard directly under a single-label domain
// such as *.localhost: every "<port>-<id>.localhost" needs a certificate naming it exactly.
type Issuer struct {
	CAPath string
	domain string
	ca     *CA
}

// NewIssuer loads (or makes once) the CA under dir and returns an issuer for domain and its
// subdomains.
func NewIssuer(dir, domain string) (*Issuer, error) {
	ca, err := LoadOrCreateCA(dir, "vmon local CA")
	if err != nil {
		return nil, err
	}
	return &Issuer{CAPath: filepath.Join(dir, CACertFile), domain: strings.ToLower(domain), ca: ca}, nil
}

// GetCertificate is a tls.Config.GetCertificate that serves the domain, its subdomains and
// loopback addresses.
func (i *Issuer) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))
	if name == "" {
		name = i.domain // clients connecting by IP send no SNI
	}
	if name != i.domain && !strings.HasSuffix(name, "."+i.domain) {
		return nil, fmt.Errorf("no certificate for %q: not under %q", name, i.domain)
	}
	return i.ca.Leaf(name, net.IPv4(127, 0, 0, 1), net.IPv6loopback)
}
