package netnstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/netns"
)

// seq makes namespace names unique within a test binary; the pid makes them unique between the
// test binaries `go test ./...` runs in parallel.
var seq atomic.Int64

// NS is a throwaway named network namespace (under /run/netns, so `ip netns exec` works while
// debugging a hung test).
type NS struct {
	Name string
	Path string
	tb   testing.TB

	hOnce sync.Once
	h     *netlink.Handle
}

// RequireRoot fails the test unless it runs as root: real-kernel tests must not silently skip
// (CI runs them as root).
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Fatal("this test builds network namespaces and must run as root (CI runs it as root)")
	}
}

// New creates a namespace with loopback up and deletes it when the test ends. role is a short
// word that shows up in the name.
func New(tb testing.TB, role string) *NS {
	tb.Helper()
	RequireRoot(tb)
	name := fmt.Sprintf("vnt%d-%d-%s", os.Getpid(), seq.Add(1), role)
	path, err := netns.Create(context.Background(), name)
	if err != nil {
		tb.Fatalf("create namespace %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := netns.Delete(context.Background(), name); err != nil {
			tb.Errorf("delete namespace %s: %v", name, err)
		}
	})
	return &NS{Name: name, Path: path, tb: tb}
}

// Open wraps a namespace the test did not create (one the code under test made) so it can be
// probed. It is not deleted when the test ends: its owner does that.
func Open(tb testing.TB, path string) *NS {
	tb.Helper()
	RequireRoot(tb)
	return &NS{Name: filepath.Base(path), Path: path, tb: tb}
}

// Do runs fn on an OS thread inside the namespace. Sockets fn creates stay in the namespace
// after it returns. The thread is never unlocked, so it exits with its goroutine and nothing else
// ever runs in the wrong namespace.
func (n *NS) Do(fn func() error) error {
	return Do(n.Path, fn)
}

// Do runs fn on an OS thread inside the namespace at path (see NS.Do).
func Do(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		target, err := vnetns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("open namespace %s: %w", path, err)
			return
		}
		defer target.Close()
		if err := vnetns.Set(target); err != nil {
			errc <- fmt.Errorf("enter namespace %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Run executes a command inside the namespace (forked from a thread that is in it) and returns
// its stdout; stderr is part of the error.
func (n *NS) Run(ctx context.Context, stdin, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	err := n.Do(func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Run()
	})
	if err != nil {
		return stdout.String(), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.Name, err,
			strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// MustRun is Run that fails the test on error.
func (n *NS) MustRun(stdin, name string, args ...string) string {
	n.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := n.Run(ctx, stdin, name, args...)
	if err != nil {
		n.tb.Fatal(err)
	}
	return out
}

// Handle returns a netlink handle operating inside the namespace, closed when the test ends.
func (n *NS) Handle() *netlink.Handle {
	n.tb.Helper()
	var err error
	n.hOnce.Do(func() {
		var ns vnetns.NsHandle
		ns, err = vnetns.GetFromPath(n.Path)
		if err != nil {
			return
		}
		defer ns.Close()
		n.h, err = netlink.NewHandleAt(ns)
		if err == nil {
			n.tb.Cleanup(n.h.Close)
		}
	})
	if err != nil {
		n.tb.Fatalf("netlink in %s: %v", n.Name, err)
	}
	if n.h == nil {
		n.tb.Fatalf("netlink in %s failed earlier", n.Name)
	}
	return n.h
}

// Veth connects namespace a (link aName) and namespace b (link bName) with a veth pair, both
// ends down. Deleting either namespace removes the pair.
func Veth(tb testing.TB, a *NS, aName string, b *NS, bName string) {
	tb.Helper()
	bns, err := vnetns.GetFromPath(b.Path)
	if err != nil {
		tb.Fatal(err)
	}
	defer bns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: aName},
		PeerName:      bName,
		PeerNamespace: netlink.NsFd(int(bns)),
	}
	if err := a.Handle().LinkAdd(veth); err != nil {
		tb.Fatalf("veth %s/%s - %s/%s: %v", a.Name, aName, b.Name, bName, err)
	}
}

// Up sets a link up.
func (n *NS) Up(ifname string) {
	n.tb.Helper()
	h := n.Handle()
	l, err := h.LinkByName(ifname)
	if err != nil {
		n.tb.Fatalf("%s in %s: %v", ifname, n.Name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		n.tb.Fatalf("set %s up in %s: %v", ifname, n.Name, err)
	}
}

// WaitUp waits until the link's operational state is up. IPv6 only uses a link once the kernel's
// link watcher has seen its carrier, which can lag the veth peer coming up by about a second;
// until then neighbour discovery goes unanswered and IPv6 probes look silent.
func (n *NS) WaitUp(ifname string) {
	n.tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := n.Handle().LinkByName(ifname)
		if err != nil {
			n.tb.Fatalf("%s in %s: %v", ifname, n.Name, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return
		}
		if time.Now().After(deadline) {
			n.tb.Fatalf("%s in %s is still %s", ifname, n.Name, l.Attrs().OperState)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// AddAddr assigns p (address and prefix length) to a link. IPv6 addresses skip duplicate address
// detection so they are usable at once.
func (n *NS) AddAddr(ifname string, p netip.Prefix) {
	n.tb.Helper()
	h := n.Handle()
	l, err := h.LinkByName(ifname)
	if err != nil {
		n.tb.Fatalf("%s in %s: %v", ifname, n.Name, err)
	}
	addr := &netlink.Addr{IPNet: prefixNet(p)}
	if p.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(l, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		n.tb.Fatalf("add %s to %s in %s: %v", p, ifname, n.Name, err)
	}
}

// AddRoute routes dst via gw (on-link through ifname).
func (n *NS) AddRoute(ifname string, dst netip.Prefix, gw netip.Addr) {
	n.tb.Helper()
	h := n.Handle()
	l, err := h.LinkByName(ifname)
	if err != nil {
		n.tb.Fatalf("%s in %s: %v", ifname, n.Name, err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(dst.Masked()), Gw: gw.AsSlice()}
	if err := h.RouteReplace(r); err != nil {
		n.tb.Fatalf("route %s via %s in %s: %v", dst, gw, n.Name, err)
	}
}

// Sysctl writes value to /proc/sys/<key> as seen from inside the namespace (key like
// "net/ipv4/ip_forward").
func (n *NS) Sysctl(key, value string) {
	n.tb.Helper()
	err := n.Do(func() error {
		return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
	})
	if err != nil {
		n.tb.Fatalf("sysctl %s=%s in %s: %v", key, value, n.Name, err)
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}

// Internet is a fake internet: a namespace reachable only through the node namespace's uplink
// veth, holding responder addresses on its loopback. The node's default routes point into it, so
// nothing the node forwards can reach a real network.
type Internet struct {
	*NS
	node *NS
	// NodeIface is the uplink link in the node namespace.
	NodeIface string
}

// NewInternet creates the fake internet behind node: a veth (node side "vup0"), transit
// addresses, IPv4 and IPv6 default routes in node pointing at it, and forwarding on in node.
func NewInternet(tb testing.TB, node *NS) *Internet {
	tb.Helper()
	inet := New(tb, "inet")
	const nodeIf, inetIf = "vup0", "eth0"
	Veth(tb, node, nodeIf, inet, inetIf)
	node.AddAddr(nodeIf, UplinkNode)
	node.AddAddr(nodeIf, UplinkNode6)
	inet.AddAddr(inetIf, UplinkInternet)
	inet.AddAddr(inetIf, UplinkInet6)
	node.Up(nodeIf)
	inet.Up(inetIf)
	node.AddRoute(nodeIf, netip.MustParsePrefix("0.0.0.0/0"), UplinkInternet.Addr())
	node.AddRoute(nodeIf, netip.MustParsePrefix("::/0"), UplinkInet6.Addr())
	node.Sysctl("net/ipv4/ip_forward", "1")
	node.Sysctl("net/ipv6/conf/all/forwarding", "1")
	node.WaitUp(nodeIf)
	inet.WaitUp(inetIf)
	return &Internet{NS: inet, node: node, NodeIface: nodeIf}
}

// Host makes addr an address of the fake internet (on its loopback), so it answers pings and
// responders can bind it. Adding the same address twice is fine.
func (i *Internet) Host(addr netip.Addr) {
	i.tb.Helper()
	bits := 32
	if addr.Is6() {
		bits = 128
	}
	i.AddAddr("lo", netip.PrefixFrom(addr, bits))
}

// Serve adds the responder address to the fake internet and starts TCP and UDP echo servers on
// ap.
func (i *Internet) Serve(ap netip.AddrPort) *Responder {
	i.tb.Helper()
	i.Host(ap.Addr())
	return i.NS.Serve(ap)
}

// GuestLink makes a sandbox-like guest behind node: a "guest" namespace joined to node by a veth
// (iface on node's side, eth0 in the guest), host/30 on node's end, guest/30 in the guest, the
// guest's default route via host, both ends up.
func GuestLink(tb testing.TB, node *NS, iface string, host, guest netip.Addr) *NS {
	tb.Helper()
	g := New(tb, "guest")
	Veth(tb, node, iface, g, "eth0")
	node.AddAddr(iface, netip.PrefixFrom(host, 30))
	g.AddAddr("eth0", netip.PrefixFrom(guest, 30))
	node.Up(iface)
	g.Up("eth0")
	g.AddRoute("eth0", netip.MustParsePrefix("0.0.0.0/0"), host)
	node.WaitUp(iface)
	g.WaitUp("eth0")
	return g
}

// Listen opens a TCP listener on addr inside the namespace; it is closed when the test ends.
func (n *NS) Listen(addr string) net.Listener {
	n.tb.Helper()
	var ln net.Listener
	if err := n.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		n.tb.Fatalf("listen on %s in %s: %v", addr, n.Name, err)
	}
	n.tb.Cleanup(func() { ln.Close() })
	return ln
}
