//go:build linux

package firewall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/testutil/netnstest"
)

// throughputBytes is what one iteration sends over one TCP connection.
const throughputBytes = 64 << 20

// BenchmarkThroughput measures TCP throughput from a guest to a sink in the fake internet through
// the egress policy path (vmon<N> installed and attached to a deny-all + allowOut policy) against
// a second guest on a plain veth into the same node namespace with none of our rules on it, in
// the same run (target: policy ≥ 0.9 × plain). Both paths are masqueraded to the node's uplink,
// so the difference is the per-link filter rules. Each iteration sends 64 MiB over one
// connection and waits until the sink has read it all; every iteration sends on both paths, in
// alternating order. Reported: plain-MB/s, policy-MB/s and their ratio (ratio-vs-plain).
//
//	go test ./internal/firewall -run '^$' -bench Throughput -benchtime 5x
func BenchmarkThroughput(b *testing.B) {
	ctx := context.Background()
	node := netnstest.New(b, "tput")
	inet := netnstest.NewInternet(b, node)
	fw, err := New(Config{Env: egress.NewEnv(nil), NetNS: node.Path})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fw.Close)

	sink := netip.MustParseAddrPort("203.0.113.10:5201")
	inet.Host(sink.Addr())
	startSink(b, inet.NS, sink)

	// The policy guest: lease 7 of the pool, vmon7, installed and attached.
	const index = 7
	base := testPool.Addr().As4()
	base[3] = byte(index * 4)
	network := netip.AddrFrom4(base)
	host, guest := network.Next(), network.Next().Next()
	pg := netnstest.New(b, "tpol")
	iface := fw.Iface(index)
	wireGuest(b, node, iface, pg, netip.PrefixFrom(host, 30), netip.PrefixFrom(guest, 30))
	h, err := fw.Install(ctx, Link{Index: index, Guest: guest, Pool: testPool})
	if err != nil {
		b.Fatal(err)
	}
	policy := egress.Policy{
		AllowOut: pfx("198.51.100.0/24", "192.0.2.64/26", "2001:db8:a::/48", "100.64.12.0/22",
			sink.Addr().String()+"/32"),
		DenyOut: pfx("0.0.0.0/0", "::/0"),
	}
	if err := h.Attach(ctx, policy); err != nil {
		b.Fatal(err)
	}
	fw.wg.Wait()

	// The plain guest: a veth outside vmon+, outside the pool, with only a masquerade (what
	// any routed namespace needs to reach the uplink) and no filter rules.
	plainHost := netip.MustParsePrefix("198.19.7.1/30")
	plainGuest := netip.MustParsePrefix("198.19.7.2/30")
	gg := netnstest.New(b, "tpln")
	wireGuest(b, node, "plain0", gg, plainHost, plainGuest)
	node.MustRun(fmt.Sprintf("*nat\n-A POSTROUTING -s %s -o %s -j MASQUERADE\nCOMMIT\n",
		plainGuest.Masked(), inet.NodeIface), "iptables-restore", "--noflush")

	// Both paths must work before anything is measured.
	for name, ns := range map[string]*netnstest.NS{"policy": pg, "plain": gg} {
		c, err := ns.DialTCP(sink, 3*time.Second)
		if err != nil {
			b.Fatalf("%s guest cannot reach the sink: %v", name, err)
		}
		c.Close()
	}

	// Paired and alternating: each iteration sends once on each path, the first path swapping
	// every iteration, so warm-up and load drift on this shared machine hit both alike.
	paths := map[string]*netnstest.NS{"plain": gg, "policy": pg}
	total := map[string]time.Duration{}
	b.SetBytes(2 * throughputBytes)
	n := 0
	for b.Loop() {
		order := []string{"plain", "policy"}
		if n%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, name := range order {
			d, err := sendOnce(paths[name], sink)
			if err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			total[name] += d
		}
		n++
	}
	mbps := func(name string) float64 { return float64(n) * throughputBytes / 1e6 / total[name].Seconds() }
	plain, pol := mbps("plain"), mbps("policy")
	b.ReportMetric(plain, "plain-MB/s")
	b.ReportMetric(pol, "policy-MB/s")
	b.ReportMetric(pol/plain, "ratio-vs-plain")
	b.Logf("policy %.1f MB/s, plain %.1f MB/s, ratio %.3f (target ≥ 0.9)", pol, plain, pol/plain)
}

// wireGuest connects guest (eth0) to node (nodeIf) with a veth, addresses both ends and routes
// the guest's default through the node.
func wireGuest(tb testing.TB, node *netnstest.NS, nodeIf string, guest *netnstest.NS, hostP, guestP netip.Prefix) {
	tb.Helper()
	netnstest.Veth(tb, node, nodeIf, guest, "eth0")
	node.AddAddr(nodeIf, hostP)
	guest.AddAddr("eth0", guestP)
	node.Up(nodeIf)
	guest.Up("eth0")
	guest.AddRoute("eth0", netip.MustParsePrefix("0.0.0.0/0"), hostP.Addr())
	node.WaitUp(nodeIf)
	guest.WaitUp("eth0")
}

// startSink listens on ap inside ns and discards everything each connection sends, closing it
// once the sender has finished (so the sender knows every byte arrived).
func startSink(tb testing.TB, ns *netnstest.NS, ap netip.AddrPort) {
	tb.Helper()
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", ap.String())
		return err
	}); err != nil {
		tb.Fatalf("sink on %s: %v", ap, err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
}

// sendOnce connects from inside ns (the socket stays there), sends throughputBytes and waits for
// the sink to close after reading them all; it returns how long that took.
func sendOnce(ns *netnstest.NS, dst netip.AddrPort) (time.Duration, error) {
	var d time.Duration
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
		buf := make([]byte, 256<<10)
		start := time.Now()
		for sent := 0; sent < throughputBytes; {
			k, err := c.Write(buf[:min(len(buf), throughputBytes-sent)])
			sent += k
			if err != nil {
				return fmt.Errorf("after %d bytes: %w", sent, err)
			}
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		var one [1]byte
		if _, err := c.Read(one[:]); !errors.Is(err, io.EOF) {
			return fmt.Errorf("sink did not close cleanly: %v", err)
		}
		d = time.Since(start)
		return nil
	})
	return d, err
}
