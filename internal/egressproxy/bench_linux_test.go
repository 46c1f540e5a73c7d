package egressproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	socks5 "github.com/armon/go-socks5"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/firewall"
	"github.com/vibemon/vmon/internal/testutil/netnstest"
	"github.com/vibemon/vmon/internal/tlsutil"
)

// benchTopo is one guest link behind a node running the firewall and the proxy, in front of a
// fake internet with an HTTPS origin (203.0.113.10, "a.test") and a SOCKS5 server
// (198.51.100.7:1080). Everything is real: namespaces, iptables, REDIRECT, the proxy's sockets.
type benchTopo struct {
	guest  *netnstest.NS
	hooks  *firewall.Hooks
	proxy  *Proxy
	roots  *x509.CertPool // the origin's CA and the node's, as a guest that got /init's caBundle
	guestA netip.Addr
	hostA  netip.Addr
}

const benchBody = 32 << 20

func newBenchTopo(b *testing.B) *benchTopo {
	b.Helper()
	netnstest.RequireRoot(b)
	node := netnstest.New(b, "node")
	inet := netnstest.NewInternet(b, node)
	originCA, err := tlsutil.LoadOrCreateCA(b.TempDir(), "test CA")
	if err != nil {
		b.Fatal(err)
	}
	body := strings.Repeat("x", benchBody)
	origin := netip.MustParseAddr("203.0.113.10")
	inet.Host(origin)
	oln := inet.Listen(netip.AddrPortFrom(origin, 443).String())
	osrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = io.WriteString(w, body)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}), TLSConfig: &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return originCA.Leaf("a.test") }}}
	go func() { _ = osrv.ServeTLS(oln, "", "") }()
	b.Cleanup(func() { osrv.Close() })

	socksAddr := netip.MustParseAddrPort("198.51.100.7:1080")
	inet.Host(socksAddr.Addr())
	sln := inet.Listen(socksAddr.String())
	ssrv, _ := socks5.New(&socks5.Config{Resolver: &socksServer{}, Logger: log.New(io.Discard, "", 0),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return nsDialer{inet.NS}.DialContext(ctx, network, addr)
		}})
	go func() { _ = ssrv.Serve(sln) }()
	b.Cleanup(func() { sln.Close() })

	fw, err := firewall.New(firewall.Config{Env: egress.NewEnv(nil), NetNS: node.Path, ProxyPort: kernelProxyPort, LogGroup: 5380})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fw.Close)
	host, guest := netip.MustParseAddr("172.20.0.1"), netip.MustParseAddr("172.20.0.2")
	gns := netnstest.GuestLink(b, node, fw.Iface(0), host, guest)
	hooks, err := fw.Install(context.Background(), firewall.Link{Index: 0, Guest: guest, Pool: netip.MustParsePrefix("172.20.0.0/16")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = hooks.Remove(context.Background()); _ = fw.RemoveGlobal(context.Background()) })

	ca, err := tlsutil.LoadOrCreateCA(b.TempDir(), "test CA")
	if err != nil {
		b.Fatal(err)
	}
	originRoots := x509.NewCertPool()
	originRoots.AppendCertsFromPEM(originCA.CertPEM)
	p := New(Config{Env: egress.NewEnv(nil), Resolver: zoneResolver(egress.TestZone()), Dialer: nsDialer{node}, CA: ca, OriginRoots: originRoots})
	pln := node.Listen(fmt.Sprintf("0.0.0.0:%d", kernelProxyPort))
	go func() { _ = p.Serve(pln) }()
	b.Cleanup(func() { p.Close(); pln.Close() })

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(originCA.CertPEM)
	roots.AppendCertsFromPEM(ca.CertPEM)
	return &benchTopo{guest: gns, hooks: hooks, proxy: p, roots: roots, guestA: guest, hostA: host}
}

// policy puts p in force the way netpool does: the proxy's view first, then the chains.
func (t *benchTopo) policy(b *testing.B, c egress.Config) {
	b.Helper()
	p, err := egress.Parse(c)
	if err != nil {
		b.Fatal(err)
	}
	t.proxy.Set(t.guestA, t.hostA, p)
	if err := t.hooks.Update(context.Background(), p); err != nil {
		b.Fatal(err)
	}
}

// client is an HTTPS client in the guest namespace; keepAlive false makes every request a new
// connection (TCP + TLS handshake).
func (t *benchTopo) client(keepAlive bool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := t.guest.Do(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, "203.0.113.10:443")
				return err
			})
			return c, err
		},
		TLSClientConfig:   &tls.Config{RootCAs: t.roots, ServerName: "a.test"},
		DisableKeepAlives: !keepAlive,
		ForceAttemptHTTP2: false,
	}, Timeout: time.Minute}
}

// benchPaths are the egress paths compared: the kernel alone (no policy, and an allowOut CIDR),
// the proxy peeking at the SNI and splicing, the proxy terminating TLS for a header rule, and the
// proxy tunnelling through a SOCKS5 server.
var benchPaths = []struct {
	name string
	cfg  egress.Config
}{
	{"unfiltered", egress.Config{}},
	{"cidr", egress.Config{AllowOut: []string{"203.0.113.0/24"}, DenyOut: []string{egress.AllTraffic}}},
	{"sni", egress.Config{AllowOut: []string{"a.test"}, DenyOut: []string{egress.AllTraffic}}},
	{"mitm", egress.Config{AllowOut: []string{"a.test"}, DenyOut: []string{egress.AllTraffic},
		Rules: map[string][]egress.Rule{"a.test": {{Transform: &egress.Transform{Headers: map[string]string{"Authorization": "Bearer x"}}}}}}},
	{"socks5", egress.Config{AllowOut: []string{"a.test"}, DenyOut: []string{egress.AllTraffic},
		EgressProxy: &egress.ProxyConfig{Address: "198.51.100.7:1080"}}},
}

// BenchmarkEgressPaths measures, per path, download throughput of a 32 MiB HTTPS body on a kept
// connection (MB/s) and the time to a first response on a new connection (connect + TLS + one
// request; p50 ms). The paths run in one process on one topology, so they are paired.
//
//	go test ./internal/egressproxy -run '^$' -bench EgressPaths -benchtime 5x
func BenchmarkEgressPaths(b *testing.B) {
	t := newBenchTopo(b)
	for _, path := range benchPaths {
		b.Run(path.name+"/throughput", func(b *testing.B) {
			t.policy(b, path.cfg)
			c := t.client(true)
			defer c.CloseIdleConnections()
			b.SetBytes(benchBody)
			for b.Loop() {
				resp, err := c.Get("https://a.test/big")
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || n != benchBody {
					b.Fatalf("read %d: %v", n, err)
				}
			}
		})
		b.Run(path.name+"/connect", func(b *testing.B) {
			t.policy(b, path.cfg)
			c := t.client(false)
			var d []time.Duration
			for b.Loop() {
				t0 := time.Now()
				resp, err := c.Get("https://a.test/")
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				d = append(d, time.Since(t0))
			}
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			b.ReportMetric(float64(d[len(d)/2])/float64(time.Millisecond), "p50-ms")
		})
	}
}

// BenchmarkProxyMemory holds 1,000 idle TLS flows open through the SNI path and reports the
// proxy's heap and goroutines per flow.
//
//	go test ./internal/egressproxy -run '^$' -bench ProxyMemory -benchtime 1x
func BenchmarkProxyMemory(b *testing.B) {
	t := newBenchTopo(b)
	t.policy(b, benchPaths[2].cfg)
	const flows = 1000
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()
		var conns []*tls.Conn
		for range flows {
			var c net.Conn
			err := t.guest.Do(func() error {
				var err error
				c, err = net.DialTimeout("tcp", "203.0.113.10:443", 10*time.Second)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			tc := tls.Client(c, &tls.Config{RootCAs: t.roots, ServerName: "a.test"})
			if err := tc.Handshake(); err != nil {
				b.Fatal(err)
			}
			conns = append(conns, tc)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		g1 := runtime.NumGoroutine()
		// The client ends live in this process too: subtract what 1,000 client TLS conns hold by
		// measuring them alone would need a second topology; report the total, an upper bound.
		b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/flows/1024, "KiB/flow(upper)")
		b.ReportMetric(float64(g1-g0)/flows, "goroutines/flow")
		for _, c := range conns {
			c.Close()
		}
	}
}
