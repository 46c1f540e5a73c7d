//go:build linux

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	socks5 "github.com/armon/go-socks5"
	"github.com/miekg/dns"

	"github.com/vibemon/vmon/internal/egress"
)

// Names in the fake internet: a DNS server for egress.TestZone (the names the proxy's tests and
// the networking e2e tests share) and TLS origins with their own CA.
//
//	DNS   UDP and TCP :53 on 203.0.113.53 (what the node resolves through) and on 8.8.8.8 (what
//	      guests use; seed 000 allows it implicitly under deny-all). A and AAAA from the zone,
//	      NXDOMAIN for other names; every question is logged as asked (GET /dns).
//	TLS   :443 on every host, with a certificate for every zone name, *.test and the host
//	      addresses, issued by a CA made at start-up (GET /ca). Answers like :80, plus X-SNI.
var dnsHosts = []netip.Addr{netip.MustParseAddr("203.0.113.53"), netip.MustParseAddr("8.8.8.8")}

// dnsLog remembers the questions the DNS servers were asked, in order.
type dnsLog struct {
	mu    sync.Mutex
	names []string
}

func (l *dnsLog) add(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.names) < 10000 {
		l.names = append(l.names, name)
	}
}

func (l *dnsLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.names)
}

func (l *dnsLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names = nil
}

// dnsHandler answers from the zone.
func (t *topo) dnsHandler() dns.Handler {
	zone := egress.TestZone()
	return dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		if len(r.Question) != 1 {
			m.Rcode = dns.RcodeFormatError
			_ = w.WriteMsg(m)
			return
		}
		q := r.Question[0]
		// Logged as asked, letter case included: the node's resolver must send names lower-case.
		t.dns.add(strings.TrimSuffix(q.Name, "."))
		addrs, ok := zone[strings.TrimSuffix(strings.ToLower(q.Name), ".")]
		if !ok {
			m.Rcode = dns.RcodeNameError
			_ = w.WriteMsg(m)
			return
		}
		for _, a := range addrs {
			hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: 5}
			switch {
			case q.Qtype == dns.TypeA && a.Is4():
				hdr.Rrtype = dns.TypeA
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			case q.Qtype == dns.TypeAAAA && a.Is6():
				hdr.Rrtype = dns.TypeAAAA
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
		_ = w.WriteMsg(m)
	})
}

// testCA is the fake internet's certificate authority and the one leaf every TLS origin serves.
type testCA struct {
	pem  []byte
	leaf tls.Certificate
}

func newTestCA() (*testCA, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "vmon fake internet CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	dnsNames := []string{"*.test", "socks.test"}
	for name := range egress.TestZone() {
		dnsNames = append(dnsNames, name)
	}
	slices.Sort(dnsNames)
	var ips []net.IP
	for _, h := range hosts {
		ips = append(ips, h.AsSlice())
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "fake internet origin"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	return &testCA{
		pem:  pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		leaf: tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey},
	}, nil
}

// openNames opens the DNS and TLS sockets; it runs inside the inet namespace.
func (t *topo) openNames(register func(io.Closer)) (udp []net.PacketConn, tcp, tlsLns []net.Listener, err error) {
	for _, h := range dnsHosts {
		ap := netip.AddrPortFrom(h, 53).String()
		pc, err := net.ListenPacket("udp", ap)
		if err != nil {
			return nil, nil, nil, err
		}
		register(pc)
		udp = append(udp, pc)
		ln, err := net.Listen("tcp", ap)
		if err != nil {
			return nil, nil, nil, err
		}
		register(ln)
		tcp = append(tcp, ln)
	}
	for _, h := range hosts {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(h, 443).String())
		if err != nil {
			return nil, nil, nil, err
		}
		register(ln)
		tlsLns = append(tlsLns, ln)
	}
	return udp, tcp, tlsLns, nil
}

// serveNames serves what openNames opened.
func (t *topo) serveNames(udp []net.PacketConn, tcp, tlsLns []net.Listener, register func(io.Closer)) {
	h := t.dnsHandler()
	for _, pc := range udp {
		srv := &dns.Server{PacketConn: pc, Handler: h}
		register(closerFunc(srv.Shutdown))
		t.spawn(func() { _ = srv.ActivateAndServe() })
	}
	for _, ln := range tcp {
		srv := &dns.Server{Listener: ln, Handler: h}
		register(closerFunc(srv.Shutdown))
		t.spawn(func() { _ = srv.ActivateAndServe() })
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{t.ca.leaf}, NextProtos: []string{"http/1.1"}}
	for _, ln := range tlsLns {
		ap, _ := netip.ParseAddrPort(ln.Addr().String())
		srv := &http.Server{Handler: t.helloHandler(), ReadHeaderTimeout: 10 * time.Second, TLSConfig: cfg}
		register(srv)
		t.spawn(func() {
			_ = srv.Serve(tls.NewListener(countingListener{ln, func() { t.stats.inc(ap.Addr(), "https") }}, cfg))
		})
	}
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// namesControl adds the control endpoints of names.
func (t *topo) namesControl(mux *http.ServeMux) {
	mux.HandleFunc("GET /ca", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-pem-file")
		_, _ = w.Write(t.ca.pem)
	})
	mux.HandleFunc("GET /dns", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string][]string{"names": t.dns.snapshot()})
	})
	mux.HandleFunc("POST /dns/reset", func(w http.ResponseWriter, r *http.Request) {
		t.dns.reset()
		writeJSON(w, map[string]bool{"ok": true})
	})
	mux.HandleFunc("GET /socks", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, t.socks.snapshot())
	})
}

// SOCKS5 servers in the fake internet, for egressProxy: on 198.51.100.7, port 1080 without
// authentication, 1081 with user "vmon" and password "s3cret", 1082 in TLS (the topology CA's
// leaf, valid for socks.test and the host addresses). Names are resolved from the zone (remote
// DNS); every request is logged (GET /socks).
var socksHost = netip.MustParseAddr("198.51.100.7")

type socksLog struct {
	mu    sync.Mutex
	names []string
	dials []string
}

func (l *socksLog) Resolve(ctx context.Context, name string) (context.Context, net.IP, error) {
	l.mu.Lock()
	l.names = append(l.names, name)
	l.mu.Unlock()
	a, ok := egress.TestZone()[strings.ToLower(name)]
	if !ok {
		return ctx, nil, fmt.Errorf("no such host %s", name)
	}
	return ctx, a[0].AsSlice(), nil
}

func (l *socksLog) snapshot() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return map[string][]string{"names": slices.Clone(l.names), "dials": slices.Clone(l.dials)}
}

func (l *socksLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names, l.dials = nil, nil
}

// openSocks opens the SOCKS5 listeners; it runs inside the inet namespace.
func (t *topo) openSocks(register func(io.Closer)) ([]net.Listener, error) {
	var lns []net.Listener
	for _, port := range []uint16{1080, 1081, 1082} {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(socksHost, port).String())
		if err != nil {
			return nil, err
		}
		register(ln)
		lns = append(lns, ln)
	}
	return lns, nil
}

// serveSocks serves what openSocks opened; the servers' own connections are made in inetPath.
func (t *topo) serveSocks(inetPath string, lns []net.Listener) error {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		t.socks.mu.Lock()
		t.socks.dials = append(t.socks.dials, addr)
		t.socks.mu.Unlock()
		var c net.Conn
		err := inNS(inetPath, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	for i, ln := range lns {
		cfg := &socks5.Config{Resolver: &t.socks, Dial: dial, Logger: log.New(io.Discard, "", 0)}
		if i == 1 {
			cfg.Credentials = socks5.StaticCredentials{"vmon": "s3cret"}
		}
		if i == 2 {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{t.ca.leaf}})
		}
		srv, err := socks5.New(cfg)
		if err != nil {
			return err
		}
		t.spawn(func() { _ = srv.Serve(ln) })
	}
	return nil
}
