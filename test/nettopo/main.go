//go:build linux

// Command nettopo builds the network topology of the networking end-to-end tests
// (test/e2e/tests-net): a "node" namespace in which `vmon serve` and the test runner run, and a
// "fake internet" namespace that is the node's only way out, holding responders on documentation
// addresses and on addresses inside the always-denied ranges. Nothing it creates can reach the
// machine's real network: the node's only non-local routes point into the fake internet, and the
// fake internet only knows the transit /24 between the two.
//
//	go run ./test/nettopo up   --name vmone2e   # builds it, prints READY, tears down on SIGTERM/SIGINT
//	go run ./test/nettopo down --name vmone2e   # removes the leftovers of a crashed run
//
// Topology (N = --name):
//
//	N-node: lo; uplink0 192.0.2.2/24, 2001:db8:ffff::2/64; default via 192.0.2.1 and
//	        2001:db8:ffff::1; ip_forward on.
//	N-inet: lo plus the hosts below; inet0 192.0.2.1/24, 2001:db8:ffff::1/64; no default route.
//
// Hosts (on the inet namespace's loopback): 203.0.113.10, 203.0.113.11, 198.51.100.7,
// 198.51.100.8, 2001:db8::10, and the always-denied 10.1.2.3, 192.168.7.7, 100.64.1.1,
// 172.16.5.5, 169.254.169.254. On each: HTTP :80 answering "hello from <dst ip>\n" (headers
// X-Client: the source address it saw, X-Host: the Host it got), HTTPS :443 answering the same
// (plus X-SNI) with a certificate from the topology's own CA, TCP echo :7, UDP echo :7, UDP :9
// (echo, and remembers its last client for the late sender). DNS for egress.TestZone on
// 203.0.113.53 and 8.8.8.8, SOCKS5 servers on 198.51.100.7:1080-1082 (names.go). The control API is HTTP on 192.0.2.1:8080, reachable from
// the node namespace:
//
//	GET  /stats                    counters per host: {"203.0.113.10":{"http":1,"tcp7":0,...}}
//	POST /reset                    zero the counters
//	GET  /last?host=H              the last client of H:9 ("" when none)
//	GET  /ca                       the CA of the HTTPS origins (PEM)
//	GET  /dns                      the names the DNS servers were asked, in order; POST /dns/reset
//	GET  /socks                    what the SOCKS5 servers were asked: {names, dials}
//	POST /late?host=H&count=C&payload=P
//	                               send C datagrams "P-<i>" from H:9 to its last client
//
// Responders are goroutines of this process whose sockets were opened on an OS thread locked
// into the inet namespace; no other thread of the process ever enters a namespace.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vibemon/vmon/internal/netns"
)

// Addresses of the topology. The tests (test/e2e/lib/net.js) use the same literals.
var (
	nodeUplink4 = netip.MustParsePrefix("192.0.2.2/24")
	inetUplink4 = netip.MustParsePrefix("192.0.2.1/24")
	nodeUplink6 = netip.MustParsePrefix("2001:db8:ffff::2/64")
	inetUplink6 = netip.MustParsePrefix("2001:db8:ffff::1/64")

	hosts = []netip.Addr{
		netip.MustParseAddr("203.0.113.10"),
		netip.MustParseAddr("203.0.113.11"),
		netip.MustParseAddr("198.51.100.7"),
		netip.MustParseAddr("198.51.100.8"),
		netip.MustParseAddr("2001:db8::10"),
		// Inside the always-denied ranges; they exist only in the inet namespace.
		netip.MustParseAddr("10.1.2.3"),
		netip.MustParseAddr("192.168.7.7"),
		netip.MustParseAddr("100.64.1.1"),
		netip.MustParseAddr("172.16.5.5"),
		netip.MustParseAddr("169.254.169.254"), // where clouds serve instance metadata
	}
	controlAddr = netip.AddrPortFrom(inetUplink4.Addr(), 8080)
)

const (
	nodeIf = "uplink0"
	inetIf = "inet0"
)

var nameRe = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

func usage() {
	fmt.Fprintf(os.Stderr, `usage: nettopo up|down [--name NAME]

  up    create NAME-node and NAME-inet with responders, print READY, and remove
        everything on SIGTERM/SIGINT
  down  remove NAME-node and NAME-inet left behind by a crashed run

NAME is 1-12 lower-case letters and digits, starting with a letter (default vmone2e).
`)
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	cmd := os.Args[1]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	name := fs.String("name", "vmone2e", "topology name: namespaces are <name>-node and <name>-inet")
	_ = fs.Parse(os.Args[2:])
	if !nameRe.MatchString(*name) {
		fmt.Fprintf(os.Stderr, "nettopo: invalid --name %q\n", *name)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "nettopo: must run as root (it creates network namespaces)")
		os.Exit(1)
	}
	t := &topo{name: *name}
	var err error
	switch cmd {
	case "up":
		err = t.up()
	case "down":
		err = t.down()
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nettopo %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

type topo struct {
	name string

	closers []io.Closer
	wg      sync.WaitGroup
	stats   *stats
	dns     dnsLog
	socks   socksLog
	ca      *testCA
}

func (t *topo) nodeNS() string { return t.name + "-node" }
func (t *topo) inetNS() string { return t.name + "-inet" }

func (t *topo) up() error {
	for _, n := range []string{t.nodeNS(), t.inetNS()} {
		if _, err := os.Stat(netns.Path(n)); err == nil {
			return fmt.Errorf("%s already exists: another run is active, or a crashed one left it (run `nettopo down --name %s`)",
				netns.Path(n), t.name)
		}
	}
	// Signals are caught from the start, so that an interrupt during set-up still tears down.
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)

	err := t.build()
	if err == nil {
		fmt.Printf("node namespace: %s\ninet namespace: %s\ncontrol: http://%s\nREADY\n",
			netns.Path(t.nodeNS()), netns.Path(t.inetNS()), controlAddr)
		s := <-sigc
		fmt.Fprintf(os.Stderr, "nettopo: %v, tearing down\n", s)
	} else {
		fmt.Fprintf(os.Stderr, "nettopo: set-up failed, tearing down: %v\n", err)
	}
	for _, c := range t.closers {
		_ = c.Close()
	}
	waitTimeout(&t.wg, 5*time.Second)
	if derr := t.down(); derr != nil {
		return errors.Join(err, derr)
	}
	if err == nil {
		fmt.Println("DOWN")
	}
	return err
}

func (t *topo) build() error {
	ctx := context.Background()
	nodePath, err := netns.Create(ctx, t.nodeNS())
	if err != nil {
		return err
	}
	inetPath, err := netns.Create(ctx, t.inetNS())
	if err != nil {
		return err
	}
	nodeH, err := handleAt(nodePath)
	if err != nil {
		return err
	}
	defer nodeH.Close()
	inetH, err := handleAt(inetPath)
	if err != nil {
		return err
	}
	defer inetH.Close()

	inetNS, err := vnetns.GetFromPath(inetPath)
	if err != nil {
		return err
	}
	defer inetNS.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: nodeIf},
		PeerName:      inetIf,
		PeerNamespace: netlink.NsFd(int(inetNS)),
	}
	if err := nodeH.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s/%s: %w", nodeIf, inetIf, err)
	}

	for _, a := range []netip.Prefix{nodeUplink4, nodeUplink6} {
		if err := addAddr(nodeH, nodeIf, a); err != nil {
			return err
		}
	}
	for _, a := range []netip.Prefix{inetUplink4, inetUplink6} {
		if err := addAddr(inetH, inetIf, a); err != nil {
			return err
		}
	}
	for _, h := range append(slices.Clone(hosts), dnsHosts...) {
		if err := addAddr(inetH, "lo", netip.PrefixFrom(h, h.BitLen())); err != nil {
			return err
		}
	}
	for _, x := range []struct {
		h     *netlink.Handle
		iface string
	}{{nodeH, nodeIf}, {inetH, inetIf}} {
		l, err := x.h.LinkByName(x.iface)
		if err != nil {
			return err
		}
		if err := x.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", x.iface, err)
		}
	}
	up, err := nodeH.LinkByName(nodeIf)
	if err != nil {
		return err
	}
	for _, r := range []struct{ dst, gw string }{
		{"0.0.0.0/0", inetUplink4.Addr().String()},
		{"::/0", inetUplink6.Addr().String()},
	} {
		_, dst, _ := net.ParseCIDR(r.dst)
		route := &netlink.Route{LinkIndex: up.Attrs().Index, Dst: dst, Gw: net.ParseIP(r.gw)}
		if err := nodeH.RouteReplace(route); err != nil {
			return fmt.Errorf("node route %s via %s: %w", r.dst, r.gw, err)
		}
	}
	if err := inNS(nodePath, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("ip_forward in the node namespace: %w", err)
	}
	if err := waitOperUp(nodeH, nodeIf); err != nil {
		return err
	}
	if err := waitOperUp(inetH, inetIf); err != nil {
		return err
	}
	return t.serve(inetPath)
}

// serve opens every responder socket inside the inet namespace and serves them from ordinary
// goroutines (a socket stays in the namespace it was created in).
func (t *topo) serve(inetPath string) error {
	t.stats = newStats()
	type udpSock struct {
		host netip.Addr
		port int
		pc   *net.UDPConn
	}
	var (
		httpLns  = map[netip.Addr]net.Listener{}
		echoLns  = map[netip.Addr]net.Listener{}
		udps     []udpSock
		control  net.Listener
		openErr  error
		register = func(c io.Closer) { t.closers = append(t.closers, c) }
		dnsUDP   []net.PacketConn
		dnsTCP   []net.Listener
		tlsLns   []net.Listener
		socksLns []net.Listener
	)
	var err error
	if t.ca, err = newTestCA(); err != nil {
		return fmt.Errorf("test CA: %w", err)
	}
	openErr = inNS(inetPath, func() error {
		var err error
		if dnsUDP, dnsTCP, tlsLns, err = t.openNames(register); err != nil {
			return err
		}
		if socksLns, err = t.openSocks(register); err != nil {
			return err
		}
		for _, h := range hosts {
			for _, port := range []int{80, 7} {
				ln, err := net.Listen("tcp", netip.AddrPortFrom(h, uint16(port)).String())
				if err != nil {
					return err
				}
				register(ln)
				if port == 80 {
					httpLns[h] = ln
				} else {
					echoLns[h] = ln
				}
			}
			for _, port := range []int{7, 9} {
				pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(h, uint16(port))))
				if err != nil {
					return err
				}
				register(pc)
				udps = append(udps, udpSock{h, port, pc})
			}
		}
		control, err = net.Listen("tcp", controlAddr.String())
		if err == nil {
			register(control)
		}
		return err
	})
	if openErr != nil {
		return fmt.Errorf("responders: %w", openErr)
	}

	for h, ln := range httpLns {
		srv := &http.Server{Handler: t.helloHandler(), ReadHeaderTimeout: 10 * time.Second}
		register(srv)
		t.spawn(func() { _ = srv.Serve(countingListener{ln, func() { t.stats.inc(h, "http") }}) })
	}
	for h, ln := range echoLns {
		t.spawn(func() { t.tcpEcho(h, ln) })
	}
	late := map[netip.Addr]*net.UDPConn{}
	for _, u := range udps {
		if u.port == 9 {
			late[u.host] = u.pc
		}
		t.spawn(func() { t.udpEcho(u.host, u.port, u.pc) })
	}
	t.serveNames(dnsUDP, dnsTCP, tlsLns, register)
	if err := t.serveSocks(inetPath, socksLns); err != nil {
		return err
	}
	ctl := &http.Server{Handler: t.controlHandler(late), ReadHeaderTimeout: 10 * time.Second}
	register(ctl)
	t.spawn(func() { _ = ctl.Serve(control) })
	return nil
}

// spawn runs fn in a goroutine that teardown waits for.
func (t *topo) spawn(fn func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		fn()
	}()
}

func (t *topo) helloHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		ip := "unknown"
		if ap, err := netip.ParseAddrPort(fmt.Sprint(local)); err == nil {
			ip = ap.Addr().Unmap().String()
		}
		w.Header().Set("X-Client", r.RemoteAddr)
		w.Header().Set("X-Host", r.Host)
		w.Header().Set("X-Auth", r.Header.Get("Authorization"))
		if r.TLS != nil {
			w.Header().Set("X-SNI", r.TLS.ServerName)
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "hello from %s\n", ip)
	})
}

func (t *topo) tcpEcho(h netip.Addr, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		t.stats.inc(h, "tcp7")
		t.spawn(func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		})
	}
}

func (t *topo) udpEcho(h netip.Addr, port int, pc *net.UDPConn) {
	key := "udp" + strconv.Itoa(port)
	buf := make([]byte, 65536)
	for {
		n, from, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		t.stats.inc(h, key)
		if port == 9 {
			t.stats.setLast(h, from)
		}
		_, _ = pc.WriteToUDPAddrPort(buf[:n], from)
	}
}

func (t *topo) controlHandler(late map[netip.Addr]*net.UDPConn) http.Handler {
	mux := http.NewServeMux()
	hostOf := func(w http.ResponseWriter, r *http.Request) (netip.Addr, bool) {
		h, err := netip.ParseAddr(r.URL.Query().Get("host"))
		if err != nil || late[h] == nil {
			http.Error(w, "unknown host "+strconv.Quote(r.URL.Query().Get("host")), http.StatusBadRequest)
			return netip.Addr{}, false
		}
		return h, true
	}
	t.namesControl(mux)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, t.stats.snapshot())
	})
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, r *http.Request) {
		t.stats.reset()
		t.dns.reset()
		t.socks.reset()
		writeJSON(w, map[string]bool{"ok": true})
	})
	mux.HandleFunc("GET /last", func(w http.ResponseWriter, r *http.Request) {
		h, ok := hostOf(w, r)
		if !ok {
			return
		}
		last := t.stats.last(h)
		s := ""
		if last.IsValid() {
			s = last.String()
		}
		writeJSON(w, map[string]string{"client": s})
	})
	mux.HandleFunc("POST /late", func(w http.ResponseWriter, r *http.Request) {
		h, ok := hostOf(w, r)
		if !ok {
			return
		}
		q := r.URL.Query()
		count, err := strconv.Atoi(q.Get("count"))
		if err != nil || count < 1 || count > 100 {
			count = 1
		}
		payload := q.Get("payload")
		if payload == "" {
			payload = "late"
		}
		to := t.stats.last(h)
		if !to.IsValid() {
			http.Error(w, "no client has sent to "+h.String()+":9 yet", http.StatusConflict)
			return
		}
		sent := 0
		var errs []string
		for i := range count {
			if _, err := late[h].WriteToUDPAddrPort([]byte(payload+"-"+strconv.Itoa(i)), to); err != nil {
				errs = append(errs, err.Error())
			} else {
				sent++
			}
			time.Sleep(20 * time.Millisecond)
		}
		writeJSON(w, map[string]any{"client": to.String(), "sent": sent, "errors": errs})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// stats counts what each host saw, so a test can prove a denied packet never arrived.
type stats struct {
	mu     sync.Mutex
	counts map[string]map[string]int
	last9  map[netip.Addr]netip.AddrPort
}

func newStats() *stats {
	s := &stats{last9: map[netip.Addr]netip.AddrPort{}}
	s.reset()
	return s
}

func (s *stats) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts = map[string]map[string]int{}
	for _, h := range hosts {
		s.counts[h.String()] = map[string]int{"http": 0, "tcp7": 0, "udp7": 0, "udp9": 0}
	}
}

func (s *stats) inc(h netip.Addr, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[h.String()][key]++
}

func (s *stats) setLast(h netip.Addr, from netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last9[h] = from
}

func (s *stats) last(h netip.Addr) netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last9[h]
}

func (s *stats) snapshot() map[string]map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]int{}
	for h, m := range s.counts {
		c := map[string]int{}
		for k, v := range m {
			c[k] = v
		}
		out[h] = c
	}
	return out
}

type countingListener struct {
	net.Listener
	onAccept func()
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.onAccept()
	}
	return c, err
}

// down removes both namespaces. Processes still inside them can only be this run's (a `vmon
// serve` or test runner whose parent crashed); they are stopped first so the namespaces can go.
func (t *topo) down() error {
	var errs []error
	for _, n := range []string{t.nodeNS(), t.inetNS()} {
		path := netns.Path(n)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := stopProcessesIn(path); err != nil {
			errs = append(errs, err)
		}
		if err := netns.Delete(context.Background(), n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stopProcessesIn sends SIGTERM, then SIGKILL, to every process whose network namespace is the
// one pinned at path.
func stopProcessesIn(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Ino == 0 {
		return nil
	}
	find := func() []int {
		var pids []int
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			var ps unix.Stat_t
			if unix.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &ps) != nil {
				continue
			}
			if ps.Ino == st.Ino && ps.Dev == st.Dev {
				pids = append(pids, pid)
			}
		}
		sort.Ints(pids)
		return pids
	}
	pids := find()
	if len(pids) == 0 {
		return nil
	}
	var desc []string
	for _, p := range pids {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		desc = append(desc, fmt.Sprintf("%d (%s)", p, strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))))
	}
	fmt.Fprintf(os.Stderr, "nettopo: stopping processes left in %s: %s\n", path, strings.Join(desc, ", "))
	for _, p := range pids {
		_ = unix.Kill(p, unix.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if len(find()) == 0 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range find() {
		_ = unix.Kill(p, unix.SIGKILL)
	}
	return nil
}

func handleAt(path string) (*netlink.Handle, error) {
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, nil
}

func addAddr(h *netlink.Handle, ifname string, p netip.Prefix) error {
	l, err := h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("find %s: %w", ifname, err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD // usable at once
	}
	if err := h.AddrAdd(l, a); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s to %s: %w", p, ifname, err)
	}
	return nil
}

func waitOperUp(h *netlink.Handle, ifname string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := h.LinkByName(ifname)
		if err != nil {
			return err
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is still %s", ifname, l.Attrs().OperState)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// inNS runs fn on an OS thread inside the namespace at path. The thread is never unlocked, so it
// exits with its goroutine and nothing else ever runs in the wrong namespace.
func inNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := vnetns.GetFromPath(path)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		if err := vnetns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}
