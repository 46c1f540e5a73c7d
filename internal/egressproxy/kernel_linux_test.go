package egressproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	socks5 "github.com/armon/go-socks5"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/firewall"
	"github.com/vibemon/vmon/internal/testutil/netnstest"
)

const kernelProxyPort = 15380

// nsDialer dials from inside a namespace (the node's), as the proxy does in production from the
// node's own.
type nsDialer struct{ ns *netnstest.NS }

func (d nsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := d.ns.Do(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// The real path: a link's proxy slot (iptables REDIRECT) hands guest TCP to 80/443 to the proxy
// with the original destination readable through SO_ORIGINAL_DST; allowOut CIDRs bypass it; a
// spoofed source never reaches it; a guest connecting to the proxy port itself is refused; and a
// live update that drops the domains empties the slot for new flows.
func TestKernelRedirect(t *testing.T) {
	netnstest.RequireRoot(t)
	node := netnstest.New(t, "node")
	inet := netnstest.NewInternet(t, node)
	node.Sysctl("net/ipv4/conf/all/rp_filter", "0")
	node.Sysctl("net/ipv4/conf/default/rp_filter", "0")
	// Origins: a.test's address answers HTTP with the Host it saw; 198.51.100.8 (allowOut CIDR)
	// answers HTTP too.
	for _, a := range []string{"203.0.113.10", "198.51.100.8", "203.0.113.11"} {
		addr := netip.MustParseAddr(a)
		inet.Host(addr)
		ln := inet.Listen(netip.AddrPortFrom(addr, 80).String())
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "origin=%s host=%s client=%s", a, r.Host, r.RemoteAddr)
		})}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close() })
	}

	fw, err := firewall.New(firewall.Config{Env: egress.NewEnv(nil), NetNS: node.Path, ProxyPort: kernelProxyPort})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fw.Close)

	// Lease 0 of 172.20.0.0/16: host .1, guest .2.
	host, guest := netip.MustParseAddr("172.20.0.1"), netip.MustParseAddr("172.20.0.2")
	gns := netnstest.GuestLink(t, node, fw.Iface(0), host, guest)
	gns.AddAddr("eth0", netip.MustParsePrefix("172.20.0.6/32")) // another lease's guest, for spoofing
	hooks, err := fw.Install(context.Background(), firewall.Link{Index: 0, Guest: guest, Pool: netip.MustParsePrefix("172.20.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hooks.Remove(context.Background()); _ = fw.RemoveGlobal(context.Background()) })

	p := New(Config{Env: egress.NewEnv(nil), Resolver: zoneResolver(egress.TestZone()), Dialer: nsDialer{node}})
	ln := node.Listen(fmt.Sprintf("0.0.0.0:%d", kernelProxyPort))
	go func() { _ = p.Serve(ln) }()
	t.Cleanup(func() { p.Close(); ln.Close() })

	pol, err := egress.Parse(egress.Config{AllowOut: []string{"a.test", "198.51.100.0/24"}, DenyOut: []string{egress.AllTraffic}})
	if err != nil {
		t.Fatal(err)
	}
	p.Set(guest, host, pol)
	if err := hooks.Attach(context.Background(), pol); err != nil {
		t.Fatal(err)
	}

	get := func(src netip.Addr, dst netip.AddrPort, hostHdr string) (string, error) {
		var c net.Conn
		err := gns.Do(func() error {
			var err error
			c, err = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: src.AsSlice()}, Timeout: 3 * time.Second}).Dial("tcp", dst.String())
			return err
		})
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hostHdr)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, b), nil
	}

	// Redirected, judged by Host, re-dialed by name: a.test is 203.0.113.10 whatever the guest
	// dialed; the origin sees the node's uplink address, not the guest's.
	got, err := get(guest, netip.MustParseAddrPort("203.0.113.11:80"), "a.test")
	if err != nil || !strings.HasPrefix(got, "200 origin=203.0.113.10 host=a.test client="+netnstest.UplinkNode.Addr().String()) {
		t.Fatalf("domain flow: %q %v", got, err)
	}
	// Redirected and refused with a 403 naming the rule.
	if got, err := get(guest, netip.MustParseAddrPort("203.0.113.11:80"), "other.test"); err != nil || !strings.HasPrefix(got, "403 ") || !strings.Contains(got, "denyOut 0.0.0.0/0") {
		t.Fatalf("denied domain: %q %v", got, err)
	}
	// An allowOut CIDR is not proxied: the origin sees the guest's Host unjudged, masqueraded.
	if got, err := get(guest, netip.MustParseAddrPort("198.51.100.8:80"), "other.test"); err != nil || !strings.HasPrefix(got, "200 origin=198.51.100.8 host=other.test") {
		t.Fatalf("allowOut CIDR flow: %q %v", got, err)
	}
	// A spoofed source is dropped by the guard, never handed to the proxy as if it were a guest.
	if got, err := get(netip.MustParseAddr("172.20.0.6"), netip.MustParseAddrPort("203.0.113.11:80"), "a.test"); err == nil {
		t.Fatalf("spoofed source got an answer: %q", got)
	}
	// The proxy port itself is not reachable from the guest.
	if got, err := get(guest, netip.AddrPortFrom(host, kernelProxyPort), "a.test"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("direct connection to the proxy port: %q %v", got, err)
	}

	// A SOCKS5 egress proxy: every TCP port goes through the proxy, which tunnels allowed flows
	// by address through the SOCKS server in the fake internet (exempted from the always-denied
	// check by nothing: it is a public address).
	socksAddr := netip.MustParseAddrPort("203.0.113.11:1080")
	s := &socksServer{}
	sln := inet.Listen(socksAddr.String())
	ssrv, err := socks5.New(&socks5.Config{Resolver: s, Logger: log.New(io.Discard, "", 0),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			s.mu.Lock()
			s.dials = append(s.dials, addr)
			s.mu.Unlock()
			return nsDialer{inet.NS}.DialContext(ctx, network, addr)
		}})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ssrv.Serve(sln) }()
	t.Cleanup(func() { sln.Close() })
	eln := inet.Listen("198.51.100.8:8080")
	esrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "origin=8080 client=%s", r.RemoteAddr)
	})}
	go func() { _ = esrv.Serve(eln) }()
	t.Cleanup(func() { esrv.Close() })
	socksPol, err := egress.Parse(egress.Config{DenyOut: []string{"203.0.113.10/32"}, EgressProxy: &egress.ProxyConfig{Address: socksAddr.String()}})
	if err != nil {
		t.Fatal(err)
	}
	p.Set(guest, host, socksPol)
	if err := hooks.Update(context.Background(), socksPol); err != nil {
		t.Fatal(err)
	}
	if got, err := get(guest, netip.MustParseAddrPort("198.51.100.8:8080"), "x"); err != nil || !strings.HasPrefix(got, "200 origin=8080 ") {
		t.Fatalf("port 8080 through SOCKS5: %q %v", got, err)
	}
	if _, dials := s.asked(); len(dials) != 1 || dials[0] != "198.51.100.8:8080" {
		t.Fatalf("SOCKS server dials %v", dials)
	}
	// A flow the address rules deny is refused by the kernel at the SYN, never accepted by the
	// proxy and then reset.
	if got, err := get(guest, netip.MustParseAddrPort("203.0.113.10:80"), "a.test"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("denied address with an egress proxy: %q %v", got, err)
	}
	if _, dials := s.asked(); len(dials) != 1 {
		t.Fatalf("a denied flow reached the SOCKS server: %v", dials)
	}

	// A live update without domains: the slot no longer redirects, CIDR rules decide alone.
	none, _ := egress.Parse(egress.Config{DenyOut: []string{egress.AllTraffic}})
	p.Set(guest, host, none)
	if err := hooks.Update(context.Background(), none); err != nil {
		t.Fatal(err)
	}
	if got, err := get(guest, netip.MustParseAddrPort("203.0.113.11:80"), "a.test"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("after dropping domains: %q %v", got, err)
	}
	// Detach empties the slot.
	if err := hooks.Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The link's slot no longer leads anywhere (its shared chain goes in the background).
	if out := node.MustRun("", "iptables-save", "-t", "nat"); strings.Contains(out, "-A VMON-T0 ") {
		t.Fatalf("the link's slot still jumps after detach:\n%s", out)
	}
}
