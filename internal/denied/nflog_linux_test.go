package denied

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/firewall"
	"github.com/vibemon/vmon/internal/testutil/netnstest"
)

const testGroup = 5381

// Refusals of the CIDR rules reach user space through NFLOG with their addresses and ports: a
// denyOut refusal (the guard's tail) and an always-denied one (the node-wide chain), while
// allowed traffic is not logged.
func TestKernelRefusalsAreLogged(t *testing.T) {
	netnstest.RequireRoot(t)
	node := netnstest.New(t, "node")
	inet := netnstest.NewInternet(t, node)
	inet.Serve(netip.MustParseAddrPort("198.51.100.7:7"))
	fw, err := firewall.New(firewall.Config{Env: egress.NewEnv(nil), NetNS: node.Path, LogGroup: testGroup})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fw.Close)
	host, guest := netip.MustParseAddr("172.20.0.1"), netip.MustParseAddr("172.20.0.2")
	gns := netnstest.GuestLink(t, node, fw.Iface(0), host, guest)
	hooks, err := fw.Install(context.Background(), firewall.Link{Index: 0, Guest: guest, Pool: netip.MustParsePrefix("172.20.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hooks.Remove(context.Background()); _ = fw.RemoveGlobal(context.Background()) })
	pol, _ := egress.Parse(egress.Config{DenyOut: []string{"203.0.113.0/24"}})
	if err := hooks.Attach(context.Background(), pol); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var got []Packet
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := node.Do(func() error {
		return Listen(ctx, testGroup, slog.New(slog.DiscardHandler), func(p Packet) {
			mu.Lock()
			got = append(got, p)
			mu.Unlock()
		})
	}); err != nil {
		t.Fatal(err)
	}

	if r := gns.TCP(netip.MustParseAddrPort("203.0.113.10:443"), time.Second); r.Outcome != netnstest.Refused {
		t.Fatalf("denyOut: %v", r)
	}
	gns.UDP(netip.Addr{}, netip.MustParseAddrPort("10.1.2.3:53"), "q", 300*time.Millisecond)
	if r := gns.TCP(netip.MustParseAddrPort("198.51.100.7:7"), 3*time.Second); r.Outcome != netnstest.Answered {
		t.Fatalf("allowed flow: %v", r)
	}
	want := []Packet{
		{Src: guest, Dst: netip.MustParseAddr("203.0.113.10"), Proto: "tcp", Port: 443},
		{Src: guest, Dst: netip.MustParseAddr("10.1.2.3"), Proto: "udp", Port: 53},
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		snapshot := append([]Packet(nil), got...)
		mu.Unlock()
		if n >= len(want) {
			for i, w := range want {
				if snapshot[i] != w {
					t.Fatalf("packet %d: %+v, want %+v (all: %+v)", i, snapshot[i], w, snapshot)
				}
			}
			for _, p := range snapshot {
				if p.Dst == netip.MustParseAddr("198.51.100.7") {
					t.Fatalf("an allowed flow was logged: %+v", p)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("logged %+v, want %+v", snapshot, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestParsePacket(t *testing.T) {
	// IPv6 UDP to [2001:db8::10]:53.
	b := make([]byte, 48)
	b[0] = 0x60
	b[6] = protoUDP
	copy(b[8:24], netip.MustParseAddr("2001:db8::2").AsSlice())
	copy(b[24:40], netip.MustParseAddr("2001:db8::10").AsSlice())
	b[42], b[43] = 0, 53
	p, err := ParsePacket(b)
	if err != nil || p.Proto != "udp" || p.Port != 53 || p.Dst != netip.MustParseAddr("2001:db8::10") {
		t.Fatalf("%+v %v", p, err)
	}
	if _, err := ParsePacket([]byte{0x50, 1, 2}); err == nil {
		t.Fatal("a non-IP packet parsed")
	}
	if _, err := ParsePacket(nil); err == nil {
		t.Fatal("an empty packet parsed")
	}
}
