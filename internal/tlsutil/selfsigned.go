// Package tlsutil makes and loads the listener's certificates: a local CA and a wildcard
// certificate for the sandbox domain, kept in the data dir so clients trust them across restarts.
// It owns only files under its directory.
package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Issuer mints a certificate per requested server name from a local CA kept in the data dir,
// because TLS clients (Node among them) refuse a wildcard directly under a single-label domain
// such as *.localhost: every "<port>-<id>.localhost" needs a certificate naming it exactly.
type Issuer struct {
	CAPath string
	domain string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	// leafKey is shared by all minted certificates; only the CA signature differs per name.
	leafKey *ecdsa.PrivateKey

	mu    sync.Mutex
	cache map[string]*tls.Certificate
}

// NewIssuer loads (or makes once) the CA under dir and returns an issuer for domain and its
// subdomains.
func NewIssuer(dir, domain string) (*Issuer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create tls dir: %w", err)
	}
	caCert, caKey, err := loadOrCreateCA(dir)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &Issuer{
		CAPath: filepath.Join(dir, "ca.pem"), domain: strings.ToLower(domain),
		caCert: caCert, caKey: caKey, leafKey: leafKey, cache: map[string]*tls.Certificate{},
	}, nil
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
	i.mu.Lock()
	defer i.mu.Unlock()
	if c, ok := i.cache[name]; ok && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, i.caCert, &i.leafKey.PublicKey, i.caKey)
	if err != nil {
		return nil, fmt.Errorf("mint certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: i.leafKey, Leaf: leaf}
	// Sandboxes come and go; bound the cache instead of tracking them.
	if len(i.cache) > 4096 {
		clear(i.cache)
	}
	i.cache[name] = c
	return c, nil
}

func loadOrCreateCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPath, keyPath := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	if pair, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return nil, nil, fmt.Errorf("parse CA: %w", err)
		}
		key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return nil, nil, errors.New("CA key is not ECDSA")
		}
		return cert, key, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "vmon local CA", Organization: []string{"vibemon"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA: %w", err)
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return os.Rename(tmp, path)
}
