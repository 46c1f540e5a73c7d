package nodeapi

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/tlsutil"
)

// memberTLS makes a certificate for name from ca and a mutual TLS configuration with it.
func memberTLS(t *testing.T, ca *tlsutil.CA, name string, server bool) *tls.Config {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := ca.Sign(&x509.Certificate{Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}, &key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	c := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	if server {
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	} else {
		c.RootCAs, c.ServerName = pool, "node-a"
	}
	return c
}

// guest stands for one sandbox: port 8080 echoes, envd answers HTTP, other ports are closed.
type guest struct{ echo, envd string }

func (g guest) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port != 8080 {
		return nil, errors.New("connection refused")
	}
	return (&net.Dialer{}).DialContext(ctx, "tcp", g.echo)
}

func (g guest) DialEnvd(ctx context.Context) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "tcp", g.envd)
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestTunnelsCarrySandboxTraffic(t *testing.T) {
	ca, err := tlsutil.LoadOrCreateCA(t.TempDir(), "test cluster CA")
	if err != nil {
		t.Fatal(err)
	}
	echo := listen(t)
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	envd := listen(t)
	go func() {
		_ = http.Serve(envd, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "envd says "+r.URL.Path)
		}))
	}()
	nodeLn := listen(t)
	srv := &http.Server{Handler: TunnelHandler{Lookup: func(id string) (Tunnels, bool) {
		return guest{echo: echo.Addr().String(), envd: envd.Addr().String()}, id == "sb1"
	}}, TLSConfig: memberTLS(t, ca, "node-a", true)}
	go func() { _ = srv.ServeTLS(nodeLn, "", "") }()
	t.Cleanup(func() { srv.Close() })
	d := TunnelDialer{Addr: nodeLn.Addr().String(), TLS: memberTLS(t, ca, "driver", false)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// envd's HTTP, as ingress sends the SDK's requests.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.Dial(ctx, "sb1", agentproto.EnvdPort)
	}}}
	resp, err := hc.Get("http://sandbox/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "envd says /health" {
		t.Fatalf("envd through the tunnel: %q", body)
	}

	// A guest port, 8 MiB each way, streamed while it is written.
	conn, err := d.Dial(ctx, "sb1", 8080)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 8<<20)
	_, _ = rand.Read(want)
	go func() {
		_, _ = conn.Write(want)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if !bytes.Equal(got, want) {
		t.Fatal("the echo came back different")
	}

	if _, err := d.Dial(ctx, "nosuch", 8080); errdefs.KindOf(err) != errdefs.KindNotFound {
		t.Errorf("unknown sandbox: %v", err)
	}
	if _, err := d.Dial(ctx, "sb1", 9999); errdefs.KindOf(err) != errdefs.KindUnavailable {
		t.Errorf("closed port: %v", err)
	}
	// Only the cluster's members: a client without a certificate gets no tunnel.
	anon := memberTLS(t, ca, "driver", false)
	anon.Certificates = nil
	if _, err := (TunnelDialer{Addr: d.Addr, TLS: anon}).Dial(ctx, "sb1", 8080); err == nil {
		t.Error("a client without a certificate got a tunnel")
	}
}
