package netpool

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ti-mo/conntrack"
	"github.com/vishvananda/netlink"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/guestnet"
	"github.com/vibemon/vmon/internal/netns"
	"github.com/vibemon/vmon/internal/testutil/netnstest"
)

// Real-kernel tests: the pool's host links and rules live in a throwaway "node" namespace
// (Config.HostNetNS) whose only routes lead into a fake internet namespace; the sandbox
// namespaces it creates carry a prefix unique to the test and are removed at cleanup.

const (
	answerWait = 3 * time.Second
	silentWait = 400 * time.Millisecond
)

var (
	web     = netip.MustParseAddrPort("203.0.113.10:8080")
	private = netip.MustParseAddrPort("10.1.2.3:8080")
	prefixN atomic.Int64
)

// testPrefix is a link prefix no other test (or test binary) uses.
func testPrefix() string {
	n := int64(os.Getpid())*100 + prefixN.Add(1)
	var b []byte
	for range 6 {
		b = append(b, byte('a'+n%26))
		n /= 26
	}
	return "t" + string(b)
}

type env struct {
	node   *netnstest.NS
	inet   *netnstest.Internet
	prefix string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	node := netnstest.New(t, "node")
	inet := netnstest.NewInternet(t, node)
	e := &env{node: node, inet: inet, prefix: testPrefix()}
	t.Cleanup(func() {
		// Sandbox namespaces are bind mounts under /run/netns: they outlive the node
		// namespace unless removed.
		ents, _ := os.ReadDir(netns.Dir)
		for _, ent := range ents {
			if strings.HasPrefix(ent.Name(), e.prefix+"-net-") {
				t.Errorf("namespace %s left behind", ent.Name())
				_ = netns.Delete(context.Background(), ent.Name())
			}
		}
	})
	return e
}

func (e *env) config(target int) Config {
	return Config{Target: target, HostNetNS: e.node.Path, LinkPrefix: e.prefix, Env: egress.NewEnv(nil),
		Prefix: netip.MustParsePrefix(DefaultPrefix)}
}

func (e *env) pool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// state counts what the pool owns, for leak checks.
type state struct{ links, rules, namespaces, conntrack int }

func (e *env) state(t *testing.T) state {
	t.Helper()
	var s state
	links, err := e.node.Handle().LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, e.prefix) {
			s.links++
		}
	}
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		for line := range strings.Lines(e.node.MustRun("", bin)) {
			if strings.Contains(strings.ToLower(line), e.prefix) {
				s.rules++
			}
		}
	}
	ents, _ := os.ReadDir(netns.Dir)
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), e.prefix+"-net-") {
			s.namespaces++
		}
	}
	s.conntrack = len(e.flows(t, 0))
	return s
}

// flows dumps the node's conntrack entries with mark (0: every marked entry).
func (e *env) flows(t *testing.T, mark uint32) []conntrack.Flow {
	t.Helper()
	c, err := dialConntrack(e.node.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	all, err := c.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []conntrack.Flow
	for _, f := range all {
		if (mark == 0 && f.Mark != 0) || (mark != 0 && f.Mark == mark) {
			out = append(out, f)
		}
	}
	return out
}

func waitReadyReal(t testing.TB, p *Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for p.Stats().Ready < n {
		if time.Now().After(deadline) {
			t.Fatalf("ready pool stuck at %d, want %d", p.Stats().Ready, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func expect(t *testing.T, what string, got netnstest.Result, want netnstest.Outcome) {
	t.Helper()
	if got.Outcome != want {
		t.Errorf("%s: %s after %v (%v), want %s", what, got.Outcome, got.Took.Round(time.Millisecond), got.Err, want)
	}
}

// boot stands in for the runtime and envd on a link just taken: the namespace holds eth0 with only
// the link-local placeholder and no route, and the address push (guestnet.Apply, as envd runs it
// on the node's /init) configures the lease. The namespace's kernel stack plays the guest's.
func boot(t *testing.T, l *Link) *netnstest.NS {
	t.Helper()
	guest := netnstest.Open(t, l.NetNSPath())
	if out := guest.MustRun("", "ip", "-4", "-o", "addr", "show", GuestInterface); strings.Count(out, "inet ") != 1 ||
		!strings.Contains(out, "inet "+guestPlaceholder.String()+" ") {
		t.Errorf("%s before the push: %s, want only the placeholder %s", l.Name(), out, guestPlaceholder)
	}
	if out := guest.MustRun("", "ip", "-4", "route"); strings.TrimSpace(out) != "" {
		t.Errorf("%s has routes before the push: %s", l.Name(), out)
	}
	if err := guest.Do(func() error { return guestnet.Apply(l.GuestNet()) }); err != nil {
		t.Fatalf("push %+v: %v", l.GuestNet(), err)
	}
	if out := guest.MustRun("", "ip", "-4", "-o", "addr", "show", GuestInterface); strings.Count(out, "inet ") != 1 ||
		!strings.Contains(out, l.Lease().GuestPrefix().String()) {
		t.Errorf("%s after the push: %s", l.Name(), out)
	}
	if out := guest.MustRun("", "ip", "route"); !strings.Contains(out, "default via "+l.Lease().Host.String()) {
		t.Errorf("%s routes after the push: %s", l.Name(), out)
	}
	return guest
}

func TestPoolLinks(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.inet.Serve(web)
	before := e.state(t)
	p := e.pool(t, e.config(2))
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitReadyReal(t, p, 2)

	start := time.Now()
	l, err := p.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("take from the ready pool: %v", time.Since(start))
	if l.Name() != fmt.Sprintf("%s%d", e.prefix, l.ID()) || l.NetNSPath() == "" {
		t.Fatalf("link %q in %q", l.Name(), l.NetNSPath())
	}
	host, err := e.node.Handle().LinkByName(l.Name())
	if err != nil || host.Type() != "veth" || host.Attrs().OperState == netlink.OperDown {
		t.Fatalf("host link %v (%v)", host, err)
	}
	guest := boot(t, l)

	// Closed until attached, then open, and the flow is marked.
	expect(t, "before attach", guest.TCP(web, silentWait), netnstest.Silent)
	if err := p.Attach(ctx, l, egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "after attach", guest.TCP(web, answerWait), netnstest.Answered)
	expect(t, "udp after attach", guest.UDP(netip.Addr{}, web, "flow", answerWait), netnstest.Answered)
	expect(t, "always-denied", guest.TCP(private, answerWait), netnstest.Refused)
	if n := len(e.flows(t, l.Lease().Mark())); n == 0 {
		t.Fatal("no conntrack entry carries the lease's mark")
	}

	// Release: conntrack flushed, chains closed, back in the pool, still configured.
	if err := p.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if f := e.flows(t, l.Lease().Mark()); len(f) != 0 {
		t.Errorf("%d conntrack entries of mark %d survived the release: %v", len(f), l.Lease().Mark(), f)
	}
	if s := p.Stats(); s.Ready != 3 || s.InUse != 0 {
		t.Errorf("stats after release: %+v", s)
	}
	// The next sandbox on the link finds it as new: placeholder only, and closed once configured.
	guest = boot(t, l)
	expect(t, "released link", guest.TCP(web, silentWait), netnstest.Silent)

	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if after := e.state(t); after != before {
		t.Errorf("leaked: before %+v, after %+v", before, after)
	}
}

func TestPoolOverflowTearsDown(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	before := e.state(t)
	p := e.pool(t, e.config(1))
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var links []*Link
	for range 4 {
		l, err := p.Take(ctx)
		if err != nil {
			t.Fatal(err)
		}
		links = append(links, l)
	}
	waitReadyReal(t, p, 1)
	for _, l := range links {
		if err := p.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.Ready != 2 {
		t.Errorf("ready after releasing 4 with target 1: %+v", s)
	}
	gone := links[len(links)-1]
	if _, err := e.node.Handle().LinkByName(gone.Name()); err == nil {
		t.Errorf("%s was not torn down", gone.Name())
	}
	if _, err := os.Stat(gone.NetNSPath()); err == nil {
		t.Errorf("namespace of %s was not removed", gone.Name())
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if after := e.state(t); after != before {
		t.Errorf("leaked: before %+v, after %+v", before, after)
	}
}

// TestPoolRecoverAfterCrash abandons a pool the way kill -9 would, plants rules without a link,
// and checks that the next node's Recover hands back the held link (still enforcing and
// updatable) and removes every other link, namespace, rule and conntrack entry.
func TestPoolRecoverAfterCrash(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.inet.Serve(web)
	before := e.state(t)
	cfg := e.config(2)

	p1 := e.pool(t, cfg)
	if _, err := p1.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	waitReadyReal(t, p1, 2)
	held, err := p1.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := p1.Take(ctx) // in use, but its sandbox will not come back
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Link{held, idle} {
		if err := p1.Attach(ctx, l, egress.Policy{}); err != nil {
			t.Fatal(err)
		}
		expect(t, "flow before the crash", boot(t, l).UDP(netip.Addr{}, web, "x", answerWait),
			netnstest.Answered)
	}
	waitReadyReal(t, p1, 2)
	// Rules of a link whose device is gone (a crash in the middle of a teardown).
	if _, err := p1.sys.(*linuxSystem).fw.Install(ctx, (&linuxSystem{pool: cfg.Prefix}).fwLink(mustLease(t, cfg, 40), false)); err != nil {
		t.Fatal(err)
	}
	// kill -9: the refill stops, nothing is cleaned up.
	p1.cancel()
	p1.wg.Wait()
	p1.sys.(*linuxSystem).fw.Close()

	p2 := e.pool(t, cfg)
	got, err := p2.Recover(ctx, []LinkID{held.ID()})
	if err != nil {
		t.Fatal(err)
	}
	l := got[held.ID()]
	if l == nil || l.NetNSPath() != held.NetNSPath() {
		t.Fatalf("recovered %v", got)
	}
	waitReadyReal(t, p2, 2)
	s := e.state(t)
	if s.links != 3 || s.namespaces != 3 {
		t.Errorf("after recovery: %+v, want the held link and 2 ready ones", s)
	}
	if n := len(e.flows(t, idle.Lease().Mark())); n != 0 && idle.ID() != held.ID() {
		t.Errorf("%d conntrack entries of the abandoned link survived", n)
	}
	if n := len(e.flows(t, held.Lease().Mark())); n == 0 {
		t.Error("recovery flushed the held sandbox's flows")
	}
	if strings.Contains(e.node.MustRun("", "iptables-save"), strings.ToUpper(e.prefix)+"-E40") {
		t.Error("rules of a link without a device survived recovery")
	}

	// The held link still enforces its policy and takes updates.
	guest := netnstest.Open(t, l.NetNSPath())
	expect(t, "held link after recovery", guest.TCP(web, answerWait), netnstest.Answered)
	if err := p2.Update(ctx, l, egress.Policy{DenyOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"),
		netip.MustParsePrefix("::/0")}}); err != nil {
		t.Fatal(err)
	}
	expect(t, "held link after update", guest.TCP(web, answerWait), netnstest.Refused)

	if err := p2.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := p2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if after := e.state(t); after != before {
		t.Errorf("leaked: before %+v, after %+v", before, after)
	}
}

func mustLease(t *testing.T, cfg Config, i int) Lease {
	t.Helper()
	l, err := LeaseAt(cfg.Prefix, i)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestPoolUnrestricted(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.inet.Serve(private)
	before := e.state(t)
	p := e.pool(t, e.config(1))
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	l, err := p.TakeUnrestricted(ctx)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "template build to an always-denied address", boot(t, l).TCP(private, answerWait),
		netnstest.Answered)
	if err := p.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if _, err := e.node.Handle().LinkByName(l.Name()); err == nil {
		t.Error("template link was pooled")
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if after := e.state(t); after != before {
		t.Errorf("leaked: before %+v, after %+v", before, after)
	}
}

func TestPoolTAP(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	before := e.state(t)
	cfg := e.config(1)
	cfg.Kind, cfg.VMMUser, cfg.VMMGroup = TAP, 4242, 4343
	p := e.pool(t, cfg)
	if _, err := p.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	l, err := p.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.NetNSPath() != "" {
		t.Errorf("TAP link has a namespace %q", l.NetNSPath())
	}
	link, err := e.node.Handle().LinkByName(l.Name())
	if err != nil {
		t.Fatal(err)
	}
	tap, ok := link.(*netlink.Tuntap)
	if !ok || tap.Mode != netlink.TUNTAP_MODE_TAP || tap.Owner != 4242 || tap.Group != 4343 {
		t.Errorf("link = %#v, want a TAP owned by 4242:4343", link)
	}
	save := e.node.MustRun("", "iptables-save")
	if !strings.Contains(save, "-i "+l.Name()+" ") || !strings.Contains(save, strings.ToUpper(e.prefix)+fmt.Sprintf("-E%d", l.ID())) {
		t.Errorf("TAP link has no rules:\n%s", save)
	}
	if err := p.Attach(ctx, l, egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if after := e.state(t); after != before {
		t.Errorf("leaked: before %+v, after %+v", before, after)
	}
}
