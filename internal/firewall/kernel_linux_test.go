package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/testutil/netnstest"
)

// Real-kernel tests. Every rule is applied inside a throwaway "node" namespace (iptables-restore
// is forked from a thread in it); the host's own firewall and links are never touched, and the
// node namespace's only routes lead into a fake internet namespace.

const (
	// answerWait bounds a probe that should be answered; refusals must come back well within
	// refuseFast, and a silent drop is judged after silentWait.
	answerWait = 3 * time.Second
	refuseFast = time.Second
	silentWait = 400 * time.Millisecond
)

// guestSide is one sandbox link of a topology: the guest namespace and the link's addresses.
type guestSide struct {
	ns    *netnstest.NS
	link  Link
	host  netip.Addr // the node's address on vmon<N>
	host6 netip.Addr
}

type topo struct {
	node *netnstest.NS
	inet *netnstest.Internet
	fw   *Firewall
}

var testPool = netip.MustParsePrefix("172.20.0.0/16")

func newTopo(t *testing.T, env egress.Env) *topo {
	t.Helper()
	node := netnstest.New(t, "node")
	inet := netnstest.NewInternet(t, node)
	// The kernel rate-limits ICMP errors per destination (a burst of 6, then 1/s), which would
	// turn back-to-back refusals to the same guest silent. Production keeps the default: a
	// burst of refused UDP/ICMP then times out, TCP resets are not limited.
	node.Sysctl("net/ipv4/icmp_ratelimit", "0")
	node.Sysctl("net/ipv6/icmp/ratelimit", "0")
	// Strict reverse-path filtering would drop spoofed packets before the firewall does; turn
	// it off so the anti-spoofing test proves the rule.
	node.Sysctl("net/ipv4/conf/all/rp_filter", "0")
	node.Sysctl("net/ipv4/conf/default/rp_filter", "0")
	fw, err := New(Config{Env: env, NetNS: node.Path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fw.Close)
	return &topo{node: node, inet: inet, fw: fw}
}

// addGuest creates lease index's guest namespace and the veth vmon<index> to it, addressed like
// netpool's leases (a /30 from the pool, host .1, guest .2), with an IPv6 /64 as well.
func (tp *topo) addGuest(t *testing.T, index int, unrestricted bool) *guestSide {
	t.Helper()
	base := testPool.Addr().As4()
	base[2], base[3] = byte(index*4/256), byte(index*4%256)
	network := netip.AddrFrom4(base)
	host, guest := network.Next(), network.Next().Next()
	host6 := netip.MustParseAddr(fmt.Sprintf("2001:db8:fe00:%x::1", index))
	guest6 := netip.MustParseAddr(fmt.Sprintf("2001:db8:fe00:%x::2", index))

	ns := netnstest.New(t, fmt.Sprintf("guest%d", index))
	iface := tp.fw.Iface(index)
	netnstest.Veth(t, tp.node, iface, ns, "eth0")
	tp.node.AddAddr(iface, netip.PrefixFrom(host, 30))
	tp.node.AddAddr(iface, netip.PrefixFrom(host6, 64))
	ns.AddAddr("eth0", netip.PrefixFrom(guest, 30))
	ns.AddAddr("eth0", netip.PrefixFrom(guest6, 64))
	tp.node.Up(iface)
	ns.Up("eth0")
	ns.AddRoute("eth0", netip.MustParsePrefix("0.0.0.0/0"), host)
	ns.AddRoute("eth0", netip.MustParsePrefix("::/0"), host6)
	tp.node.WaitUp(iface)
	ns.WaitUp("eth0")
	return &guestSide{ns: ns, host: host, host6: host6, link: Link{
		Index: index, Guest: guest, Pool: testPool,
		Guest6: guest6, Pool6: netip.MustParsePrefix("2001:db8:fe00::/48"),
		Unrestricted: unrestricted,
	}}
}

func (tp *topo) install(t *testing.T, g *guestSide) *Hooks {
	t.Helper()
	h, err := tp.fw.Install(context.Background(), g.link)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// ruleState is what a leak check compares: every rule and chain of both families that names one
// of our links or chains. (Whole-ruleset snapshots would also differ by the empty tables the
// first iptables-nft call creates in a fresh namespace.)
func (tp *topo) ruleState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, bin := range []string{"iptables-save", "ip6tables-save"} {
		out := tp.node.MustRun("", bin)
		for line := range strings.Lines(out) {
			if strings.Contains(strings.ToLower(line), "vmon") {
				b.WriteString(bin + ": " + line)
			}
		}
	}
	return b.String()
}

func expect(t *testing.T, what string, got netnstest.Result, want netnstest.Outcome) {
	t.Helper()
	if got.Outcome != want {
		t.Errorf("%s: %s after %v (%v), want %s", what, got.Outcome, got.Took.Round(time.Millisecond), got.Err, want)
		return
	}
	if want == netnstest.Refused && got.Took > refuseFast {
		t.Errorf("%s: refused only after %v, want a fast refusal", what, got.Took)
	}
}

var (
	web  = netip.MustParseAddrPort("203.0.113.10:8080")
	web6 = netip.MustParseAddrPort("[2001:db8::10]:8080")
)

func TestKernelLifecycleLeavesNothing(t *testing.T) {
	ctx := context.Background()
	tp := newTopo(t, egress.NewEnv(pfx("10.20.0.0/16")))
	before := tp.ruleState(t)
	var hooks []*Hooks
	for i, st := range renderStates {
		l := st.link
		l.Index = 100 + i // distinct links in one namespace
		h, err := tp.fw.Install(ctx, l)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		hooks = append(hooks, h)
		if st.policy == nil || l.Unrestricted {
			continue
		}
		if err := h.Attach(ctx, *st.policy); err != nil {
			t.Fatalf("%s: attach: %v", st.name, err)
		}
		if err := h.Update(ctx, egress.Policy{DenyOut: pfx("0.0.0.0/0", "::/0")}); err != nil {
			t.Fatalf("%s: update: %v", st.name, err)
		}
	}
	tp.fw.wg.Wait() // compactions
	save := tp.node.MustRun("", "iptables-save", "-t", "filter")
	// The live block is a jump to the deny-all policy's shared chain, then RETURN, then DROP.
	live := regexp.MustCompile(`-A VMON-E101 -j (VMON-POL-[0-9a-f]+)\n-A VMON-E101 -j RETURN\n-A VMON-E101 -j DROP\n`).FindStringSubmatch(save)
	if live == nil {
		t.Errorf("compacted chain is not the live block + DROP:\n%s", save)
	} else if !strings.Contains(save, "-A "+live[1]+" -j RETURN\n-A "+live[1]+" -j ACCEPT\n") {
		t.Errorf("the shared chain of deny-all does not end in RETURN, ACCEPT:\n%s", save)
	}
	for _, h := range hooks {
		if !h.link.Unrestricted {
			if err := h.Detach(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := h.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		// Removing twice is fine: the rules are already gone.
		if err := h.Remove(ctx); err != nil {
			t.Fatalf("second remove: %v", err)
		}
	}
	if err := tp.fw.RemoveGlobal(ctx); err != nil {
		t.Fatal(err)
	}
	if after := tp.ruleState(t); after != before {
		t.Errorf("rules left behind:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestDecisionTableTraffic replays egress.DecisionTable as real TCP, UDP and ICMP traffic from a
// guest namespace through the rules to responders in the fake internet, and checks every
// outcome against egress.Decide: allowed flows are answered, denied ones refused fast.
func TestDecisionTableTraffic(t *testing.T) {
	tp := newTopo(t, egress.NewEnv(nil))
	g := tp.addGuest(t, 7, false)
	tp.install(t, g)

	cases := egress.DecisionTable()
	// A responder behind every destination, so a refusal can only come from the rules (a
	// missing listener would answer with a reset too): refused flows must not reach it.
	served := map[netip.AddrPort]*netnstest.Responder{}
	for _, c := range cases {
		dst := c.Dst.Unmap()
		if dst.IsLoopback() || dst.IsLinkLocalUnicast() && dst.Is6() {
			continue // answered by the guest's own loopback / never forwarded: no traffic to test
		}
		ap := netip.AddrPortFrom(dst, c.Port)
		switch {
		case c.Proto == egress.ICMP:
			tp.inet.Host(dst)
		case served[ap] == nil:
			served[ap] = tp.inet.Serve(ap)
		}
	}

	// One firewall per node environment, sharing the rules namespace: the env is node config.
	// Its always-denied chain is node-wide, so switching env is a node restarting with another
	// --egress-internal-allow: EnsureGlobal rewrites the chain under the attached link.
	fws := map[string]*Firewall{}
	ctx := context.Background()
	var cur, curEnv string
	var ran int
	for _, c := range cases {
		dst := c.Dst.Unmap()
		if dst.IsLoopback() || dst.IsLinkLocalUnicast() && dst.Is6() {
			t.Logf("%s: skipped, %s never leaves the guest", c.Name, c.Dst)
			continue
		}
		envKey := fmt.Sprint(c.Env.InternalAllow)
		fw := fws[envKey]
		if fw == nil {
			var err error
			if fw, err = New(Config{Env: c.Env, NetNS: tp.node.Path}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(fw.Close)
			fws[envKey] = fw
		}
		if envKey != curEnv {
			fw.globalMu.Lock()
			fw.globalDone = false
			fw.globalMu.Unlock()
			if err := fw.EnsureGlobal(ctx); err != nil {
				t.Fatal(err)
			}
			curEnv = envKey
		}
		key := envKey + fmt.Sprint(c.Policy.AllowOut, c.Policy.DenyOut)
		if key != cur {
			h, err := fw.Adopt(g.link)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Update(ctx, c.Policy); err != nil {
				t.Fatalf("%s: %v", c.Name, err)
			}
			// Each env has its own Hooks for the link (production has exactly one): let
			// the compaction finish before another Hooks writes the chain.
			fw.wg.Wait()
			cur = key
		}
		want := netnstest.Refused
		if egress.Decide(c.Policy, c.Env, c.Proto, c.Dst, c.Port) == egress.Allow {
			want = netnstest.Answered
		}
		what := fmt.Sprintf("%s (%s %s)", c.Name, c.Proto, c.Dst)
		r := served[netip.AddrPortFrom(dst, c.Port)]
		var got netnstest.Result
		switch c.Proto {
		case egress.TCP:
			before := r.Accepts()
			got = g.ns.TCP(netip.AddrPortFrom(c.Dst, c.Port), answerWait)
			if want == netnstest.Refused && r.Accepts() != before {
				t.Errorf("%s: refused flow reached the responder", what)
			}
		case egress.UDP:
			payload := "case " + c.Name
			got = g.ns.UDP(netip.Addr{}, netip.AddrPortFrom(c.Dst, c.Port), payload, answerWait)
			if want == netnstest.Refused && r.Seen(payload) != 0 {
				t.Errorf("%s: refused datagram reached the responder", what)
			}
		case egress.ICMP:
			got = g.ns.Ping(dst, answerWait)
			if adminProhibited := map[bool]int{false: 13, true: 1}[dst.Is6()]; want == netnstest.Refused &&
				got.Outcome == netnstest.Refused && got.ICMPCode != adminProhibited {
				t.Errorf("%s: refused with ICMP code %d, want admin-prohibited %d", what, got.ICMPCode, adminProhibited)
			}
		}
		expect(t, what, got, want)
		ran++
	}
	if ran < len(cases)*3/4 {
		t.Fatalf("only %d of %d cases ran as traffic", ran, len(cases))
	}
}

func TestPreAttachIsSilent(t *testing.T) {
	tp := newTopo(t, egress.NewEnv(nil))
	g := tp.addGuest(t, 3, false)
	tp.install(t, g)
	r := tp.inet.Serve(web)
	r6 := tp.inet.Serve(web6)

	expect(t, "tcp before attach", g.ns.TCP(web, silentWait), netnstest.Silent)
	expect(t, "udp before attach", g.ns.UDP(netip.Addr{}, web, "early", silentWait), netnstest.Silent)
	expect(t, "ping before attach", g.ns.Ping(web.Addr(), silentWait), netnstest.Silent)
	expect(t, "tcp6 before attach", g.ns.TCP(web6, silentWait), netnstest.Silent)
	if r.Accepts()+r.Seen("early")+r6.Accepts() != 0 {
		t.Error("a packet left the guest before attach")
	}

	h, _ := tp.fw.Adopt(g.link)
	if err := h.Attach(context.Background(), egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "tcp after attach", g.ns.TCP(web, answerWait), netnstest.Answered)
	expect(t, "tcp6 after attach", g.ns.TCP(web6, answerWait), netnstest.Answered)
	if err := h.Detach(context.Background()); err != nil {
		t.Fatal(err)
	}
	expect(t, "tcp after detach", g.ns.TCP(web, silentWait), netnstest.Silent)
}

func TestAntiSpoofing(t *testing.T) {
	tp := newTopo(t, egress.NewEnv(nil))
	g := tp.addGuest(t, 5, false)
	h := tp.install(t, g)
	if err := h.Attach(context.Background(), egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	r := tp.inet.Serve(web)
	r6 := tp.inet.Serve(web6)
	expect(t, "genuine source", g.ns.UDP(netip.Addr{}, web, "genuine", answerWait), netnstest.Answered)

	// Foreign sources: another lease's guest, an address outside the pool, and IPv6 likewise.
	spoofed := []netip.Prefix{
		netip.MustParsePrefix("172.20.0.6/32"),
		netip.MustParsePrefix("198.51.100.99/32"),
		netip.MustParsePrefix("2001:db8:fe00:99::2/128"),
	}
	for _, src := range spoofed {
		g.ns.AddAddr("eth0", src)
		dst := web
		if src.Addr().Is6() {
			dst = web6
		}
		payload := "spoofed from " + src.Addr().String()
		expect(t, payload, g.ns.UDP(src.Addr(), dst, payload, silentWait), netnstest.Silent)
		if n := r.Seen(payload) + r6.Seen(payload); n != 0 {
			t.Errorf("%s: %d datagrams left the link", payload, n)
		}
	}
}

func TestIsolation(t *testing.T) {
	ctx := context.Background()
	tp := newTopo(t, egress.NewEnv(pfx("172.16.0.0/12"))) // even with the pool's range exempted
	a, b := tp.addGuest(t, 1, false), tp.addGuest(t, 2, false)
	for _, g := range []*guestSide{a, b} {
		h := tp.install(t, g)
		if err := h.Attach(ctx, egress.Policy{AllowOut: pfx("172.20.0.0/16")}); err != nil {
			t.Fatal(err)
		}
	}
	peer := b.ns.Serve(netip.AddrPortFrom(b.link.Guest, 9000))
	// Listeners of the node itself, on every address: the node serves nothing to guests.
	tp.node.Serve(netip.MustParseAddrPort("0.0.0.0:9001"))
	tp.node.Serve(netip.MustParseAddrPort("[::]:9002"))

	expect(t, "guest to another lease", a.ns.TCP(netip.AddrPortFrom(b.link.Guest, 9000), answerWait), netnstest.Refused)
	expect(t, "guest to another lease udp", a.ns.UDP(netip.Addr{}, netip.AddrPortFrom(b.link.Guest, 9000), "peer", answerWait), netnstest.Refused)
	expect(t, "ping another lease", a.ns.Ping(b.link.Guest, answerWait), netnstest.Refused)
	if peer.Accepts()+peer.Seen("peer") != 0 {
		t.Error("another lease received traffic")
	}
	for _, host := range []netip.Addr{a.host, b.host, netnstest.UplinkNode.Addr()} {
		expect(t, "node address "+host.String(), a.ns.TCP(netip.AddrPortFrom(host, 9001), answerWait), netnstest.Refused)
		expect(t, "node address udp "+host.String(), a.ns.UDP(netip.Addr{}, netip.AddrPortFrom(host, 9001), "node", answerWait), netnstest.Refused)
		expect(t, "ping node "+host.String(), a.ns.Ping(host, answerWait), netnstest.Refused)
	}
	for _, host := range []netip.Addr{a.host6, netnstest.UplinkNode6.Addr()} {
		expect(t, "node address "+host.String(), a.ns.TCP(netip.AddrPortFrom(host, 9002), answerWait), netnstest.Refused)
	}
	// And the path out still works, so the refusals above are the rules, not a broken topology.
	tp.inet.Serve(web)
	expect(t, "internet", a.ns.TCP(web, answerWait), netnstest.Answered)
}

func TestLiveUpdateKeepsEstablishedTCP(t *testing.T) {
	ctx := context.Background()
	tp := newTopo(t, egress.NewEnv(nil))
	g := tp.addGuest(t, 9, false)
	h := tp.install(t, g)
	if err := h.Attach(ctx, egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	tp.inet.Serve(web)
	conn, err := g.ns.DialTCP(web, answerWait)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := func(msg string) error {
		_ = conn.SetDeadline(time.Now().Add(answerWait))
		if _, err := conn.Write([]byte(msg)); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		_, err := conn.Read(buf)
		return err
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := h.Update(ctx, egress.Policy{DenyOut: pfx("0.0.0.0/0", "::/0")}); err != nil {
		t.Fatal(err)
	}
	t.Logf("live update took %v", time.Since(start))
	if err := echo("after"); err != nil {
		t.Errorf("established connection broken by the update: %v", err)
	}
	expect(t, "new tcp after update", g.ns.TCP(web, answerWait), netnstest.Refused)
	expect(t, "udp after update", g.ns.UDP(netip.Addr{}, web, "u", answerWait), netnstest.Refused)
	tp.fw.wg.Wait()
	if err := echo("after compaction"); err != nil {
		t.Errorf("established connection broken by the compaction: %v", err)
	}
	if err := h.Update(ctx, egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	expect(t, "tcp after reopening", g.ns.TCP(web, answerWait), netnstest.Answered)
}

func TestUnrestrictedLink(t *testing.T) {
	tp := newTopo(t, egress.NewEnv(nil))
	g := tp.addGuest(t, 11, true)
	tp.install(t, g)
	private := netip.MustParseAddrPort("10.1.2.3:8080")
	tp.inet.Serve(private)
	tp.inet.Serve(web)
	expect(t, "template build to always-denied", g.ns.TCP(private, answerWait), netnstest.Answered)
	expect(t, "template build to internet", g.ns.TCP(web, answerWait), netnstest.Answered)
	tp.node.Serve(netip.MustParseAddrPort("0.0.0.0:9001"))
	expect(t, "template build to node", g.ns.TCP(netip.AddrPortFrom(g.host, 9001), answerWait), netnstest.Refused)
}

func TestSweepRemovesOrphans(t *testing.T) {
	ctx := context.Background()
	tp := newTopo(t, egress.NewEnv(nil))
	before := tp.ruleState(t)
	for _, i := range []int{1, 2, 3} {
		l := link7
		l.Index = i
		if _, err := tp.fw.Install(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := tp.fw.Sweep(ctx, func(i int) bool { return i == 2 })
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(removed) != "[1 3]" {
		t.Errorf("swept %v, want [1 3]", removed)
	}
	save := tp.node.MustRun("", "iptables-save")
	if strings.Contains(save, "VMON-E1") || strings.Contains(save, "vmon3 ") || !strings.Contains(save, "VMON-E2") {
		t.Errorf("after sweep:\n%s", save)
	}
	if _, err := tp.fw.Sweep(ctx, func(int) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if err := tp.fw.RemoveGlobal(ctx); err != nil {
		t.Fatal(err)
	}
	if after := tp.ruleState(t); after != before {
		t.Errorf("rules left after sweeping everything:\n%s", after)
	}
}

// Links with the same policy share one slot chain, so an attach does not grow with them; a
// chain no link jumps to any more is removed in the background, and RemoveGlobal takes the rest.
func TestSharedSlotChains(t *testing.T) {
	netnstest.RequireRoot(t)
	defer func(g time.Duration) { slotGrace = g }(slotGrace)
	slotGrace = 0
	node := netnstest.New(t, "node")
	fw, err := New(Config{Env: egress.NewEnv(nil), NetNS: node.Path, ProxyPort: 15380})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fw.Close)
	ctx := context.Background()
	domains := egress.Policy{AllowOut: pfx("8.8.8.8/32"), DenyOut: pfx("0.0.0.0/0", "::/0"), AllowDomains: []string{"a.test"}}
	other := egress.Policy{AllowOut: pfx("8.8.8.8/32"), DenyOut: pfx("0.0.0.0/0", "::/0"), AllowDomains: []string{"b.test", "c.test"}, Rules: []egress.HeaderRule{{Domain: "b.test"}}}
	var hooks []*Hooks
	for i := range 3 {
		h, err := fw.Install(ctx, Link{Index: i, Guest: leaseGuest(i), Pool: testPool})
		if err != nil {
			t.Fatal(err)
		}
		hooks = append(hooks, h)
		if err := h.Attach(ctx, domains); err != nil {
			t.Fatal(err)
		}
	}
	slots := func() []string {
		var out []string
		for line := range strings.Lines(node.MustRun("", "iptables-save", "-t", "nat")) {
			if strings.HasPrefix(line, ":VMON-SLOT-") {
				out = append(out, strings.Fields(line[1:])[0])
			}
		}
		return out
	}
	waitSlots := func(n int) []string {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			s := slots()
			if len(s) == n {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("slot chains %v, want %d", s, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitSlots(1)
	if err := hooks[1].Update(ctx, other); err != nil {
		t.Fatal(err)
	}
	waitSlots(2)
	if err := hooks[1].Update(ctx, domains); err != nil {
		t.Fatal(err)
	}
	waitSlots(1) // after compaction, nothing jumps to the second one
	for _, h := range hooks {
		if err := h.Detach(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitSlots(0)
	// Within its grace an unused chain stays (the next sandbox of the policy finds it ready), and
	// the node-wide removal takes it with the rest.
	slotGrace = time.Hour
	if err := hooks[0].Attach(ctx, domains); err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks {
		if err := h.Remove(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if s := slots(); len(s) != 1 {
		t.Fatalf("slot chains within the grace after the last link went: %v, want the one", s)
	}
	if err := fw.RemoveGlobal(ctx); err != nil {
		t.Fatal(err)
	}
	if s := slots(); len(s) != 0 {
		t.Fatalf("slot chains after RemoveGlobal: %v", s)
	}
}
