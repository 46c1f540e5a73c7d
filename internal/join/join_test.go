package join

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/store"
	"github.com/vibemon/vmon/internal/tlsutil"
)

type cluster struct {
	auth *Authority
	url  string
	now  time.Time
}

// newCluster runs a driver's join endpoint over TLS with a certificate from its cluster CA.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	st, err := store.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, err := tlsutil.LoadOrCreateCA(t.TempDir(), "vmon cluster CA")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{now: time.Now()}
	c.auth = &Authority{CA: ca, Tokens: st, Now: func() time.Time { return c.now }, GossipKey: []byte("0123456789abcdef0123456789abcdef")}
	mux := http.NewServeMux()
	mux.Handle(Path, c.auth)
	ts := httptest.NewUnstartedServer(mux)
	leaf, err := ca.Leaf("127.0.0.1", net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	c.url = ts.URL
	return c
}

func (c *cluster) token(t *testing.T, ttl time.Duration, uses int) string {
	t.Helper()
	tok, err := c.auth.IssueToken(context.Background(), ttl, uses)
	if err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

func TestJoinGivesTheNodeACertificateForItsOwnKey(t *testing.T) {
	c := newCluster(t)
	tok := c.token(t, time.Hour, 1)
	if _, err := ParseToken(tok); err != nil {
		t.Fatalf("the token does not parse: %v", err)
	}
	creds, err := Node(context.Background(), c.url, tok, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(creds.CertPEM, creds.KeyPEM)
	if err != nil {
		t.Fatalf("the certificate is not for the node's key: %v", err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	roots := x509.NewCertPool()
	roots.AddCert(c.auth.CA.Certificate())
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "node-a", KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("usage %v: %v", usage, err)
		}
	}
	if string(creds.CAPEM) != string(c.auth.CA.CertPEM) {
		t.Error("the node did not get the cluster CA")
	}
	if string(creds.GossipKey) != string(c.auth.GossipKey) {
		t.Error("the node did not get the gossip key")
	}
}

func TestJoinRefusals(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	refused := func(t *testing.T, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "invalid, expired or used up") {
			t.Fatalf("want a 401 refusal, got %v", err)
		}
	}
	t.Run("wrong secret", func(t *testing.T) {
		tok, _ := ParseToken(c.token(t, time.Hour, 1))
		tok.Secret = strings.Repeat("0", 32)
		_, err := Node(ctx, c.url, tok.String(), "node-a")
		refused(t, err)
	})
	t.Run("expired", func(t *testing.T) {
		tok := c.token(t, time.Minute, 1)
		c.now = c.now.Add(2 * time.Minute)
		defer func() { c.now = time.Now() }()
		_, err := Node(ctx, c.url, tok, "node-a")
		refused(t, err)
	})
	t.Run("replayed", func(t *testing.T) {
		tok := c.token(t, time.Hour, 2)
		for _, name := range []string{"node-a", "node-b"} {
			if _, err := Node(ctx, c.url, tok, name); err != nil {
				t.Fatalf("use by %s: %v", name, err)
			}
		}
		_, err := Node(ctx, c.url, tok, "node-c")
		refused(t, err)
	})
	t.Run("a malformed request does not spend the token", func(t *testing.T) {
		tok := c.token(t, time.Hour, 1)
		if _, err := Node(ctx, c.url, tok, "Not_A_Name"); err == nil || !strings.Contains(err.Error(), "400") {
			t.Fatalf("bad name: %v", err)
		}
		if _, err := Node(ctx, c.url, tok, "node-d"); err != nil {
			t.Fatalf("the token was spent by a refused request: %v", err)
		}
	})
	t.Run("a driver whose CA the token does not pin", func(t *testing.T) {
		other := newCluster(t)
		tok, _ := ParseToken(other.token(t, time.Hour, 1))
		mine, _ := ParseToken(c.token(t, time.Hour, 1))
		// The right id and secret, sent to a driver with another CA: the node must not send them.
		tok.ID, tok.Secret = mine.ID, mine.Secret
		_, err := Node(ctx, c.url, tok.String(), "node-e")
		if err == nil || !strings.Contains(err.Error(), "does not chain to the CA the join token pins") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("another node posing as the driver", func(t *testing.T) {
		creds, err := Node(ctx, c.url, c.token(t, time.Hour, 1), "node-f")
		if err != nil {
			t.Fatal(err)
		}
		pair, _ := tls.X509KeyPair(append(creds.CertPEM, creds.CAPEM...), creds.KeyPEM)
		mux := http.NewServeMux()
		mux.Handle(Path, c.auth)
		fake := httptest.NewUnstartedServer(mux)
		fake.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
		fake.StartTLS()
		defer fake.Close()
		_, err = Node(ctx, fake.URL, c.token(t, time.Hour, 1), "node-g")
		if err == nil || !strings.Contains(err.Error(), "a node's certificate") {
			t.Fatalf("got %v", err)
		}
	})
	if _, err := Node(ctx, "http://127.0.0.1:1", c.token(t, time.Hour, 1), "node-h"); err == nil || !strings.Contains(err.Error(), "https") {
		t.Errorf("a plain-http driver address: %v", err)
	}
	for _, bad := range []string{"", "vmonjoin.x.y.z", "vmonjoin.0123456z.0123456789abcdef0123456789abcdef.sha256:x"} {
		if _, err := ParseToken(bad); err == nil {
			t.Errorf("ParseToken(%q) accepted", bad)
		}
	}
	if _, err := c.auth.IssueToken(ctx, MaxTTL+time.Hour, 1); err == nil {
		t.Error("a token past the longest life was issued")
	}
	if _, err := c.auth.IssueToken(ctx, time.Hour, 0); err == nil {
		t.Error("a token without uses was issued")
	}
}

func TestMutualTLSAcceptsOnlyTheClustersNodes(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	join := func(c *cluster, name string) Credentials {
		creds, err := Node(ctx, c.url, c.token(t, time.Hour, 1), name)
		if err != nil {
			t.Fatal(err)
		}
		return creds
	}
	serverCreds, clientCreds := join(c, "node-a"), join(c, "driver")
	srvConf, err := MutualTLS(serverCreds, true)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello "+r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	ts.TLS = srvConf
	ts.StartTLS()
	defer ts.Close()
	get := func(creds Credentials, withCert bool) (string, error) {
		conf, err := MutualTLS(creds, false)
		if err != nil {
			t.Fatal(err)
		}
		conf.ServerName = "node-a"
		if !withCert {
			conf.Certificates = nil
		}
		resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: conf}}).Get(ts.URL)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if got, err := get(clientCreds, true); err != nil || got != "hello driver" {
		t.Fatalf("a member: %q %v", got, err)
	}
	if _, err := get(clientCreds, false); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	strangerCreds := join(newCluster(t), "driver")
	// The stranger trusts this cluster's CA but presents a certificate of its own cluster.
	strangerCreds.CAPEM = clientCreds.CAPEM
	if _, err := get(strangerCreds, true); err == nil {
		t.Fatal("a node of another cluster was served")
	}
}

// The driver's own credentials serve the join endpoint (the pin and host check pass, it is not a
// node's certificate) and call nodes over mutual TLS; the join answer names the gossip seeds.
func TestDriverCredentialsServeJoinsAndCallNodes(t *testing.T) {
	c := newCluster(t)
	c.auth.Gossip = func() []string { return []string{"127.0.0.1:7946"} }
	drv, err := c.auth.Driver("driver-1", []string{"127.0.0.1", "driver.example"})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(drv.CertPEM, drv.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, c.auth)
	joinSrv := httptest.NewUnstartedServer(mux)
	joinSrv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	joinSrv.StartTLS()
	defer joinSrv.Close()
	creds, err := Node(context.Background(), joinSrv.URL, c.token(t, time.Hour, 1), "node-b")
	if err != nil {
		t.Fatalf("join served with the driver's certificate: %v", err)
	}
	if !slices.Equal(creds.Gossip, []string{"127.0.0.1:7946"}) {
		t.Fatalf("gossip seeds %q", creds.Gossip)
	}
	srvConf, err := MutualTLS(creds, true)
	if err != nil {
		t.Fatal(err)
	}
	node := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	node.TLS = srvConf
	node.StartTLS()
	defer node.Close()
	cliConf, err := MutualTLS(drv, false)
	if err != nil {
		t.Fatal(err)
	}
	cliConf.ServerName = "node-b"
	resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: cliConf}}).Get(node.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); string(b) != "driver-1" {
		t.Fatalf("the node saw %q", b)
	}
}
