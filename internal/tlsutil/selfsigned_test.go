package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
)

func TestIssuerMintsPerNameCertificates(t *testing.T) {
	dir := t.TempDir()
	iss, err := NewIssuer(dir, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	pemBytes, err := os.ReadFile(iss.CAPath)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemBytes) {
		t.Fatal("CA file holds no certificate")
	}
	for _, name := range []string{"api.localhost", "49983-abc123.localhost", "localhost"} {
		c, err := iss.GetCertificate(&tls.ClientHelloInfo{ServerName: name})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
			t.Fatalf("%s does not verify against the CA: %v", name, err)
		}
	}
	if _, err := iss.GetCertificate(&tls.ClientHelloInfo{ServerName: "example.com"}); err == nil {
		t.Fatal("minted a certificate outside the domain")
	}
	st, err := os.Stat(dir + "/ca-key.pem")
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode: %v %v", st.Mode(), err)
	}
	// A second issuer keeps the same CA, so clients that trust it keep working after a restart.
	iss2, err := NewIssuer(dir, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if !iss2.ca.cert.Equal(iss.ca.cert) {
		t.Fatal("CA changed across restarts")
	}
}
