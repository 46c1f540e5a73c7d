package netnstest

import (
	"net/netip"
	"os"
	"testing"
	"time"
)

// TestProbes checks the three outcomes on a two-namespace topology, and that cleanup removes
// the namespaces.
func TestProbes(t *testing.T) {
	var paths []string
	t.Run("topology", func(t *testing.T) {
		a, b := New(t, "a"), New(t, "b")
		paths = []string{a.Path, b.Path}
		Veth(t, a, "veth0", b, "veth0")
		a.AddAddr("veth0", netip.MustParsePrefix("198.18.1.1/24"))
		b.AddAddr("veth0", netip.MustParsePrefix("198.18.1.2/24"))
		a.AddAddr("veth0", netip.MustParsePrefix("2001:db8:1::1/64"))
		b.AddAddr("veth0", netip.MustParsePrefix("2001:db8:1::2/64"))
		a.Up("veth0")
		b.Up("veth0")
		a.WaitUp("veth0")
		b.WaitUp("veth0")
		srv := netip.MustParseAddrPort("198.18.1.2:7000")
		srv6 := netip.MustParseAddrPort("[2001:db8:1::2]:7000")
		r := b.Serve(srv)
		b.Serve(srv6)

		want := func(what string, got Result, o Outcome) {
			t.Helper()
			if got.Outcome != o {
				t.Errorf("%s = %s (%v), want %s", what, got.Outcome, got.Err, o)
			}
		}
		want("tcp", a.TCP(srv, 2*time.Second), Answered)
		want("ping6", a.Ping(srv6.Addr(), 2*time.Second), Answered)
		want("tcp6", a.TCP(srv6, 2*time.Second), Answered)
		want("udp", a.UDP(netip.Addr{}, srv, "hello", 2*time.Second), Answered)
		want("ping", a.Ping(srv.Addr(), 2*time.Second), Answered)
		want("ping6", a.Ping(srv6.Addr(), 2*time.Second), Answered)
		if r.Seen("hello") != 1 || r.Accepts() != 1 {
			t.Errorf("responder saw %d datagrams and %d connections", r.Seen("hello"), r.Accepts())
		}
		closed := netip.MustParseAddrPort("198.18.1.2:7001")
		want("tcp to a closed port", a.TCP(closed, 2*time.Second), Refused)
		want("udp to a closed port", a.UDP(netip.Addr{}, closed, "x", 2*time.Second), Refused)
		b.MustRun("*filter\n-A INPUT -p tcp --dport 7000 -j DROP\nCOMMIT\n", "iptables-restore", "--noflush")
		want("dropped tcp", a.TCP(srv, 300*time.Millisecond), Silent)
	})
	for _, p := range paths {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after the test: %v", p, err)
		}
	}
}
