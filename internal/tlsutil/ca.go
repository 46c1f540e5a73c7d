package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Files of a CA in its directory.
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca-key.pem"
)

// leafValidity is how long a minted certificate lives; it is minted again when less than a day
// is left.
const leafValidity = 30 * 24 * time.Hour

// CA is a local certificate authority kept in a directory (ca.pem, ca-key.pem 0600), which
// mints certificates for names on demand: the listener's (Issuer) and the egress proxy's for
// intercepted flows.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// leafKey is shared by all minted certificates and never written anywhere; only the CA
	// signature differs per name.
	leafKey *ecdsa.PrivateKey
	// CertPEM is the CA certificate, what clients must trust.
	CertPEM []byte

	mu sync.Mutex
	// +checklocks:mu
	cache map[string]*tls.Certificate
}

// LoadOrCreateCA loads the CA in dir, or makes it once with commonName.
func LoadOrCreateCA(dir, commonName string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create CA dir: %w", err)
	}
	cert, key, err := loadOrCreateCA(dir, commonName)
	if err != nil {
		return nil, err
	}
	return newCA(cert, key)
}

// Leaf returns a certificate for name (and ips), chained to the CA, minted on first use and
// cached until it nears expiry. A CA mints for one purpose, so the cache is keyed by name.
func (ca *CA) Leaf(name string, ips ...net.IP) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.cache[name]; ok && time.Until(c.Leaf.NotAfter) > 24*time.Hour {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		IPAddresses:  ips,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("mint a certificate for %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	// Names come from clients (sandbox ids, guests' server names): bound the cache instead of
	// tracking them.
	if len(ca.cache) > 4096 {
		clear(ca.cache)
	}
	ca.cache[name] = c
	return c, nil
}

// CAFromPEM loads a CA kept elsewhere than in files (drivers sharing a database keep theirs
// there): pemData holds its certificate and its key, as NewCAPEM makes them.
func CAFromPEM(pemData []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(pemData, pemData)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	cert, key, err := caOf(pair)
	if err != nil {
		return nil, err
	}
	return newCA(cert, key)
}

// NewCAPEM makes a new CA and returns its certificate and key as PEM, for CAFromPEM.
func NewCAPEM(commonName string) ([]byte, error) {
	cert, key, err := createCA(commonName)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})...), nil
}

func newCA(cert *x509.Certificate, key *ecdsa.PrivateKey) (*CA, error) {
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, leafKey: leafKey, cache: map[string]*tls.Certificate{},
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}, nil
}

func caOf(pair tls.Certificate) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA: %w", err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || !cert.IsCA {
		return nil, nil, errors.New("CA key is not an ECDSA certificate authority")
	}
	return cert, key, nil
}

func loadOrCreateCA(dir, commonName string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	if pair, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil {
		return caOf(pair)
	}
	cert, key, err := createCA(commonName)
	if err != nil {
		return nil, nil, err
	}
	// The key goes first: a certificate without its key would be unusable after a crash.
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", cert.Raw, 0o644); err != nil {
		return nil, nil, err
	}
	return cert, key, nil
}

func createCA(commonName string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"vibemon"}},
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

// Sign issues a certificate from tmpl for pub, signed by the CA (a serial number is filled in
// when tmpl has none). It is for certificates of keys the CA never holds: a node's, from the
// request it made when it joined.
func (ca *CA) Sign(tmpl *x509.Certificate, pub any) ([]byte, error) {
	if tmpl.SerialNumber == nil {
		tmpl.SerialNumber = randomSerial()
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign a certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

// Pin names the CA by its public key: "sha256:" and the unpadded base64url SHA-256 of its
// SubjectPublicKeyInfo, which a joining party compares with the pin it was given before it
// trusts anything the CA signed.
func (ca *CA) Pin() string { return PinOf(ca.cert) }

// PinOf is Pin of any certificate.
func PinOf(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// Certificate returns the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }
