package firewall

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/egress"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current rendering")

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func testNames(t testing.TB) names {
	t.Helper()
	n, err := newNames("")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// link7 is lease 7 of the default pool: 172.20.0.28/30, host .29, guest .30.
var link7 = Link{
	Index: 7,
	Guest: netip.MustParseAddr("172.20.0.30"),
	Pool:  netip.MustParsePrefix("172.20.0.0/16"),
}

var defaultEnv = egress.NewEnv(nil)

// testProxyPort is the proxy port of the render states that have one; those states also log
// refusals to testLogGroup.
const (
	testProxyPort = 15380
	testLogGroup  = 5380
	testDNSPort   = 15353
)

// renderStates are the policies whose rendered rules are kept in testdata/<name>.golden, the way
// Tailscale's TestRouterStates keeps the OS state per router config: a diff in review shows
// exactly which rules a change adds or drops.
var renderStates = []struct {
	name   string
	link   Link
	env    egress.Env
	policy *egress.Policy // nil: install only (closed chains)
	// proxyPort, when set, is the node's egress proxy port.
	proxyPort uint16
}{
	{name: "closed", link: link7, env: defaultEnv},
	{name: "default", link: link7, env: defaultEnv, policy: &egress.Policy{}},
	{name: "deny-all", link: link7, env: defaultEnv,
		policy: &egress.Policy{DenyOut: pfx("0.0.0.0/0", "::/0")}},
	{name: "allow-cidrs-deny-all", link: link7, env: defaultEnv, policy: &egress.Policy{
		AllowOut: pfx("203.0.113.0/24", "198.51.100.7/32", "2001:db8:1::/48"),
		DenyOut:  pfx("0.0.0.0/0", "::/0"),
	}},
	{name: "deny-some", link: link7, env: defaultEnv, policy: &egress.Policy{
		DenyOut: pfx("198.51.100.7/32", "203.0.113.0/24", "2001:db8:2::/64"),
	}},
	{name: "internal-allow", link: link7,
		env: egress.NewEnv(pfx("10.20.0.0/16", "192.168.5.10/32", "fd00:1::/64")),
		policy: &egress.Policy{
			AllowOut: pfx("10.20.1.0/24"),
			DenyOut:  pfx("10.20.0.0/16"),
		}},
	{name: "domains", link: link7, env: defaultEnv, policy: &egress.Policy{
		AllowOut:     pfx("8.8.8.8/32"),
		DenyOut:      pfx("0.0.0.0/0", "::/0"),
		AllowDomains: []string{"pypi.org", "*.pythonhosted.org"},
	}},
	{name: "domains-proxy", link: link7, env: defaultEnv, proxyPort: testProxyPort, policy: &egress.Policy{
		AllowOut:     pfx("8.8.8.8/32", "198.51.100.0/24"),
		DenyOut:      pfx("0.0.0.0/0", "::/0"),
		AllowDomains: []string{"pypi.org", "*.pythonhosted.org"},
	}},
	{name: "socks-proxy", link: link7, env: defaultEnv, proxyPort: testProxyPort, policy: &egress.Policy{
		DenyOut: pfx("198.51.100.7/32"),
		Proxy:   &egress.Proxy{Address: "proxy.example:1080"},
	}},
	{name: "rules-proxy", link: link7, env: defaultEnv, proxyPort: testProxyPort, policy: &egress.Policy{
		AllowOut:     pfx("8.8.8.8/32", "198.51.100.0/24"),
		DenyOut:      pfx("0.0.0.0/0", "::/0"),
		AllowDomains: []string{"api.example"},
		Rules:        []egress.HeaderRule{{Domain: "api.example", Headers: map[string]string{"Authorization": "x"}}},
	}},
	// Deny-all without domains on a node running the resolver: no slot at all (filtersDNS).
	{name: "deny-all-dns-filter", link: link7, env: defaultEnv, proxyPort: testProxyPort, policy: &egress.Policy{
		DenyOut: pfx("0.0.0.0/0", "::/0"),
	}},
	// Domains with an egressProxy: UDP DNS to the allowOut CIDR is left to the filter chain, TCP
	// DNS is the resolver's (a RETURN would skip the SOCKS5 redirect).
	{name: "domains-socks-dns-filter", link: link7, env: defaultEnv, proxyPort: testProxyPort, policy: &egress.Policy{
		AllowOut:     pfx("8.8.8.8/32", "198.51.100.0/24"),
		DenyOut:      pfx("0.0.0.0/0", "::/0"),
		AllowDomains: []string{"pypi.org"},
		Proxy:        &egress.Proxy{Address: "proxy.example:1080"},
	}},
	{name: "guest6", env: defaultEnv, policy: &egress.Policy{DenyOut: pfx("2001:db8:2::/64")},
		link: Link{
			Index: 3, Guest: netip.MustParseAddr("172.20.0.14"), Pool: netip.MustParsePrefix("172.20.0.0/16"),
			Guest6: netip.MustParseAddr("fd00:20::e"), Pool6: netip.MustParsePrefix("fd00:20::/64"),
		}},
	{name: "unrestricted", env: defaultEnv, link: Link{
		Index: 12, Guest: netip.MustParseAddr("172.20.0.50"), Pool: netip.MustParsePrefix("172.20.0.0/16"),
		Unrestricted: true,
	}},
}

func describe(p *egress.Policy, env egress.Env) string {
	if p == nil {
		return "none (closed)"
	}
	return fmt.Sprintf("allowOut=%v denyOut=%v domains=%v internalAllow=%v", p.AllowOut, p.DenyOut,
		p.AllowDomains, env.InternalAllow)
}

func renderNodeWide(n names) string {
	var b strings.Builder
	b.WriteString("# node-wide rules every link relies on, installed once (EnsureGlobal)\n")
	for _, f := range families {
		tool := map[family]string{v4: "iptables-restore", v6: "ip6tables-restore"}[f]
		fmt.Fprintf(&b, "\n## %s --noflush\n", tool)
		b.WriteString(renderGlobal(n, f, nil, false, false, slot{env: defaultEnv}, 0))
	}
	for _, f := range families {
		tool := map[family]string{v4: "iptables-restore", v6: "ip6tables-restore"}[f]
		fmt.Fprintf(&b, "\n## %s --noflush, on a node running the egress proxy on port %d and logging refusals to NFLOG group %d\n", tool, testProxyPort, testLogGroup)
		b.WriteString(renderGlobal(n, f, nil, false, false, slot{env: defaultEnv, proxyPort: testProxyPort, dnsPort: testDNSPort}, testLogGroup))
	}
	return b.String()
}

func renderState(n names, l Link, env egress.Env, p *egress.Policy, port uint16) string {
	// The states with a proxy port stand for a fully featured node: they log refusals and
	// filter DNS too.
	var logGroup, dnsPort uint16
	if port != 0 {
		logGroup, dnsPort = testLogGroup, testDNSPort
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# %s, policy %s\n", l, describe(p, env))
	for _, f := range families {
		tool := map[family]string{v4: "iptables-restore", v6: "ip6tables-restore"}[f]
		if len(env.InternalAllow) > 0 {
			fmt.Fprintf(&b, "\n## %s --noflush: node-wide rules for this node's exemptions (EnsureGlobal)\n", tool)
			b.WriteString(renderGlobal(n, f, nil, true, true, slot{env: env, proxyPort: port}, logGroup))
		}
		fmt.Fprintf(&b, "\n## %s --noflush: install (from creation, in the pool)\n", tool)
		b.WriteString(renderInstall(n, l, f, logGroup))
		if p == nil {
			fmt.Fprintf(&b, "\n## %s --noflush: detach (reset to closed)\n", tool)
			b.WriteString(renderReplace(n, l, nil, false, nil))
			continue
		}
		rules, proxy := policyRules(n, l, f, *p, env), proxyRules(l, f, *p, slot{env: env, proxyPort: port, dnsPort: dnsPort})
		shared := func(table, name string, block []string) {
			fmt.Fprintf(&b, "\n## %s --noflush: the policy's shared %s chain, once per node\n", tool, table)
			var sc script
			sc.begin(table)
			sc.line(":%s - [0:0]", name)
			for _, r := range block {
				sc.line("-A %s %s", name, r)
			}
			b.WriteString(sc.String())
		}
		polName := n.policyChain(rules)
		shared("filter", polName, rules)
		rules = linkPolicyRules(polName)
		if proxy != nil {
			name := n.slotChain(proxy)
			shared("nat", name, proxy)
			proxy = linkSlotRules(l, f, name)
		}
		fmt.Fprintf(&b, "\n## %s --noflush: attach or live update (add-only)\n", tool)
		b.WriteString(renderAttach(n, l, rules, proxy))
		fmt.Fprintf(&b, "\n## %s --noflush: background compaction after a live update\n", tool)
		b.WriteString(renderReplace(n, l, rules, proxy != nil, proxy))
	}
	return b.String()
}

func TestRenderStates(t *testing.T) {
	n := testNames(t)
	states := []struct{ name, got string }{{"node-wide", renderNodeWide(n)}}
	for _, st := range renderStates {
		states = append(states, struct{ name, got string }{st.name, renderState(n, st.link, st.env, st.policy, st.proxyPort)})
	}
	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			got := st.got
			path := filepath.Join("testdata", st.name+".golden")
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestRenderStates -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("rendered rules differ from %s (re-run with -update if intended):\n%s", path,
					lineDiff(string(want), got))
			}
		})
	}
}

// lineDiff lists lines only in want (-) or only in got (+); enough to read a rule change.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	if b.Len() == 0 {
		return "(same lines, different order)"
	}
	return b.String()
}

func TestAttachIsAddOnly(t *testing.T) {
	n := testNames(t)
	for _, st := range renderStates {
		if st.policy == nil || st.link.Unrestricted {
			continue
		}
		for _, f := range families {
			s := renderAttach(n, st.link, policyRules(n, st.link, f, *st.policy, st.env),
				proxyRules(st.link, f, *st.policy, slot{env: st.env, proxyPort: st.proxyPort}))
			for line := range strings.Lines(s) {
				if !strings.HasPrefix(line, "-I ") && !strings.HasPrefix(line, "*") && line != "COMMIT\n" {
					t.Errorf("%s/%s: attach is not add-only: %q", st.name, f, line)
				}
				// Positions other than 1 need rule handles, i.e. a rule-cache fetch that grows
				// with the chain.
				if strings.HasPrefix(line, "-I ") && !strings.HasPrefix(strings.Fields(line)[2], "1") {
					t.Errorf("%s/%s: insert at a position other than 1: %q", st.name, f, line)
				}
			}
		}
	}
}

// evalBlock walks a rendered policy block the way the kernel does, first match wins, for the
// only matches a block uses (-d PREFIX, or none), following its jump to the node-wide DENIED
// chain (rendered for env).
func evalBlock(t *testing.T, n names, f family, env egress.Env, rules []string, dst netip.Addr) egress.Verdict {
	t.Helper()
	matches := func(args []string) bool {
		return args[0] != "-d" || netip.MustParsePrefix(args[1]).Contains(dst)
	}
	for _, r := range rules {
		args := strings.Fields(r)
		target := args[len(args)-1]
		if !matches(args) {
			continue
		}
		switch target {
		case "ACCEPT":
			return egress.Allow
		case "RETURN": // refused by the guard's tail
			return egress.Deny
		case n.deniedChain():
			for _, d := range deniedRules(n, f, env, 0) {
				if !strings.Contains(d, "-j REJECT") {
					t.Fatalf("DENIED rule without a refusal: %q", d)
				}
				if matches(strings.Fields(d)) {
					return egress.Deny
				}
			}
		default:
			t.Fatalf("unexpected target in %q", r)
		}
	}
	t.Fatalf("block %v has no verdict for %s", rules, dst)
	return egress.Deny
}

// TestRenderMatchesDecide checks the rendered policy of every case of the shared decision table
// against the reference engine, without a kernel. The same table is replayed as real traffic in
// TestDecisionTableTraffic.
func TestRenderMatchesDecide(t *testing.T) {
	n := testNames(t)
	// A pool no case's destination is in: lease isolation is outside the policy model.
	l := Link{Index: 1, Guest: netip.MustParseAddr("198.18.0.2"), Pool: netip.MustParsePrefix("198.18.0.0/24")}
	cases := egress.DecisionTable()
	if len(cases) == 0 {
		t.Fatal("egress.DecisionTable is empty")
	}
	for _, c := range cases {
		if l.Pool.Contains(c.Dst.Unmap()) {
			t.Fatalf("case %q: destination inside the test pool", c.Name)
		}
		dst := c.Dst.Unmap()
		f := v4
		if dst.Is6() {
			f = v6
		}
		got := evalBlock(t, n, f, c.Env, policyRules(n, l, f, c.Policy, c.Env), dst)
		if want := egress.Decide(c.Policy, c.Env, c.Proto, c.Dst, c.Port); got != want || got != c.Want {
			t.Errorf("%s: rendered rules say %v, Decide says %v, table says %v", c.Name, got, want, c.Want)
		}
	}
}

func TestLeaseIsolationBeforePolicy(t *testing.T) {
	n := testNames(t)
	// Even a policy that allows the pool and an exemption that lifts its always-denied block
	// must not let a guest reach another lease.
	env := egress.NewEnv(pfx("172.16.0.0/12"))
	p := egress.Policy{AllowOut: pfx("172.20.0.0/16")}
	rules := policyRules(n, link7, v4, p, env)
	if got := evalBlock(t, n, v4, env, rules, netip.MustParseAddr("172.20.0.6")); got != egress.Deny {
		t.Fatalf("guest reaches another lease: %v", rules)
	}
}

func TestSubtract(t *testing.T) {
	tests := []struct {
		from, minus, want []string
	}{
		{[]string{"10.0.0.0/8"}, nil, []string{"10.0.0.0/8"}},
		{[]string{"10.0.0.0/8"}, []string{"10.0.0.0/8"}, nil},
		{[]string{"10.0.0.0/8"}, []string{"0.0.0.0/1"}, nil},
		{[]string{"10.0.0.0/8"}, []string{"192.168.0.0/16", "fc00::/7"}, []string{"10.0.0.0/8"}},
		{[]string{"10.0.0.0/8"}, []string{"10.128.0.0/9"}, []string{"10.0.0.0/9"}},
		{[]string{"10.0.0.0/8"}, []string{"10.20.0.0/16"}, []string{
			"10.0.0.0/12", "10.16.0.0/14", "10.21.0.0/16", "10.22.0.0/15", "10.24.0.0/13",
			"10.32.0.0/11", "10.64.0.0/10", "10.128.0.0/9"}},
		{[]string{"192.168.0.0/16"}, []string{"192.168.5.10/32", "192.168.5.11/32"}, []string{
			"192.168.0.0/22", "192.168.4.0/24", "192.168.5.0/29", "192.168.5.8/31", "192.168.5.12/30",
			"192.168.5.16/28", "192.168.5.32/27", "192.168.5.64/26", "192.168.5.128/25",
			"192.168.6.0/23", "192.168.8.0/21", "192.168.16.0/20", "192.168.32.0/19",
			"192.168.64.0/18", "192.168.128.0/17"}},
		{[]string{"fc00::/7"}, []string{"fd00::/8"}, []string{"fc00::/8"}},
	}
	for _, tc := range tests {
		got := subtract(pfx(tc.from...), pfx(tc.minus...))
		if !slices.Equal(got, pfx(tc.want...)) {
			t.Errorf("%v - %v = %v, want %v", tc.from, tc.minus, got, tc.want)
		}
		// Exhaustive check on a sample: an address is in the result iff in from and not minus.
		for _, a := range []string{"10.0.0.1", "10.20.3.4", "10.21.0.0", "10.255.255.255", "192.168.5.10",
			"192.168.5.11", "192.168.5.12", "192.168.5.9", "fc00::1", "fd00::1", "8.8.8.8"} {
			addr := netip.MustParseAddr(a)
			in := func(ps []netip.Prefix) bool {
				return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(addr) })
			}
			if want := in(pfx(tc.from...)) && !in(pfx(tc.minus...)); in(got) != want {
				t.Errorf("%v - %v: %s in result = %v, want %v", tc.from, tc.minus, a, in(got), want)
			}
		}
	}
}

func TestForFamily(t *testing.T) {
	ps := pfx("0.0.0.0/0", "::/0", "10.1.2.3/8", "::ffff:192.0.2.0/120", "2001:db8::/32", "10.0.0.0/8")
	if got, want := forFamily(ps, v4), pfx("0.0.0.0/0", "10.0.0.0/8", "192.0.2.0/24"); !slices.Equal(got, want) {
		t.Errorf("v4 = %v, want %v", got, want)
	}
	if got, want := forFamily(ps, v6), pfx("::/0", "2001:db8::/32"); !slices.Equal(got, want) {
		t.Errorf("v6 = %v, want %v", got, want)
	}
}

func TestNames(t *testing.T) {
	n := testNames(t)
	if got := n.iface(7); got != "vmon7" {
		t.Errorf("iface = %s", got)
	}
	if got := n.chainName(chainEgress, 16383); got != "VMON-E16383" {
		t.Errorf("chain = %s", got)
	}
	for name, want := range map[string]int{"vmon0": 0, "vmon42": 42} {
		if i, ok := n.ownIface(name); !ok || i != want {
			t.Errorf("ownIface(%s) = %d, %v", name, i, ok)
		}
	}
	for _, name := range []string{"vmon", "vmon01", "vmonx", "vmon-1", "vmonb3", "eth0", "vmon1a"} {
		if _, ok := n.ownIface(name); ok {
			t.Errorf("ownIface(%s) claimed a foreign link", name)
		}
	}
	for _, name := range []string{"VMON-E", "VMON-e1", "VMONX-E1", "DOCKER", "VMON-EE1"} {
		if _, ok := n.ownChain(name); ok {
			t.Errorf("ownChain(%s) claimed a foreign chain", name)
		}
	}
	for _, bad := range []string{"VMON", "vm0n", "toolongprefix", "a-b"} {
		if _, err := newNames(bad); err == nil {
			t.Errorf("prefix %q accepted", bad)
		}
	}
}

// Links installed by an older vmon jumped into the proxy slot for 80/443 only; start-up rewrites
// the jumps of the links it keeps, and leaves other links' and other software's rules alone.
func TestRenderMigrate(t *testing.T) {
	n := testNames(t)
	saved := parseSave(`*nat
:PREROUTING ACCEPT [0:0]
:VMON-T3 - [0:0]
:VMON-T4 - [0:0]
-A PREROUTING -i vmon3 -p tcp -m multiport --dports 80,443 -m comment --comment vmon-egress -j VMON-T3
-A PREROUTING -i vmon4 -p tcp -m multiport --dports 80,443 -m comment --comment vmon-egress -j VMON-T4
-A PREROUTING -i vmon5 -m comment --comment vmon-egress -j VMON-T5
-A PREROUTING -i vmon6 -p tcp -m comment --comment vmon-egress -j VMON-T6
-A PREROUTING -i eth0 -p tcp -m multiport --dports 80,443 -j REDIRECT --to-ports 3128
COMMIT
`)
	got := renderMigrate(n, saved, func(i int) bool { return i != 4 })
	want := `*nat
-D PREROUTING -i vmon3 -p tcp -m multiport --dports 80,443 -m comment --comment vmon-egress -j VMON-T3
-I PREROUTING 1 -i vmon3 -m comment --comment vmon-egress -j VMON-T3
-D PREROUTING -i vmon6 -p tcp -m comment --comment vmon-egress -j VMON-T6
-I PREROUTING 1 -i vmon6 -m comment --comment vmon-egress -j VMON-T6
COMMIT
`
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if s := renderMigrate(n, parseSave(`*nat
-A PREROUTING -i vmon5 -m comment --comment vmon-egress -j VMON-T5
COMMIT
`), func(int) bool { return true }); s != "" {
		t.Fatalf("nothing to migrate, got %q", s)
	}
}

// slotVerdict walks a rendered proxy slot block for one new flow, first match wins, for the
// matches a block uses: "resolver" (REDIRECTed to the DNS port), "proxy" (to the proxy port) or
// "filter" (RETURN, or the end: the filter chain judges the flow as it is).
func slotVerdict(t *testing.T, rules []string, proto string, dst netip.Addr, port int) string {
	t.Helper()
	for _, r := range rules {
		args := strings.Fields(r)
		match, neg := true, false
		for i := 0; i < len(args) && match; i++ {
			switch args[i] {
			case "!":
				neg = true
				continue
			case "-d":
				match = netip.MustParsePrefix(args[i+1]).Contains(dst)
			case "-p":
				match = args[i+1] == proto
			case "--dport":
				match = (args[i+1] == strconv.Itoa(port)) != neg
			case "--dports":
				match = slices.Contains(strings.Split(args[i+1], ","), strconv.Itoa(port)) != neg
			case "-j":
				if args[i+1] == "RETURN" {
					return "filter"
				}
				switch args[len(args)-1] {
				case strconv.Itoa(testDNSPort):
					return "resolver"
				case strconv.Itoa(testProxyPort):
					return "proxy"
				}
				t.Fatalf("unexpected target in %q", r)
			}
			neg = false
		}
	}
	return "filter"
}

// TestDNSRedirectScope pins which guest DNS the filtering resolver answers (filtersDNS,
// dnsExempt): every DNS flow of a policy with allowOut domains, to any server (8.8.8.8, which
// domains open, included), except to allowOut CIDRs the user named; nothing of a policy without
// domains (deny-all refuses DNS like any flow; a resolver allowed by CIDR is reached directly);
// nothing of a policy that reaches every address.
func TestDNSRedirectScope(t *testing.T) {
	parse := func(c egress.Config) egress.Policy {
		t.Helper()
		p, err := egress.Parse(c)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	all := []string{egress.AllTraffic}
	google, other, named := netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("203.0.113.53"), netip.MustParseAddr("198.51.100.7")
	rule := map[string][]egress.Rule{"a.test": {{Transform: &egress.Transform{Headers: map[string]string{"A": "b"}}}}}
	for _, c := range []struct {
		name string
		cfg  egress.Config
		// want per destination, for UDP and TCP 53 in that order.
		want map[netip.Addr][2]string
	}{
		{"deny-all", egress.Config{DenyOut: all},
			map[netip.Addr][2]string{google: {"filter", "filter"}, other: {"filter", "filter"}}},
		{"resolver by CIDR, no domains", egress.Config{AllowOut: []string{"8.8.8.8"}, DenyOut: all},
			map[netip.Addr][2]string{google: {"filter", "filter"}}},
		{"header rules, no domains", egress.Config{AllowOut: []string{"198.51.100.0/24"}, DenyOut: all, Rules: rule},
			map[netip.Addr][2]string{google: {"filter", "filter"}, named: {"filter", "filter"}}},
		{"domains", egress.Config{AllowOut: []string{"a.test"}, DenyOut: all},
			map[netip.Addr][2]string{google: {"resolver", "resolver"}, other: {"resolver", "resolver"}}},
		{"domains and 8.8.8.8 named", egress.Config{AllowOut: []string{"a.test", "8.8.8.8"}, DenyOut: all},
			map[netip.Addr][2]string{google: {"resolver", "resolver"}}},
		{"domains and a CIDR", egress.Config{AllowOut: []string{"a.test", "198.51.100.0/24"}, DenyOut: all},
			map[netip.Addr][2]string{google: {"resolver", "resolver"}, named: {"filter", "filter"}, other: {"resolver", "resolver"}}},
		{"domains, header rules and a CIDR", egress.Config{AllowOut: []string{"a.test", "198.51.100.0/24"}, DenyOut: all, Rules: rule},
			map[netip.Addr][2]string{google: {"resolver", "resolver"}, named: {"filter", "filter"}}},
		{"domains, egressProxy and a CIDR", egress.Config{AllowOut: []string{"a.test", "198.51.100.0/24"}, DenyOut: all,
			EgressProxy: &egress.ProxyConfig{Address: "198.51.100.7:1080"}},
			map[netip.Addr][2]string{google: {"resolver", "resolver"}, named: {"filter", "resolver"}}},
		{"domains and every address", egress.Config{AllowOut: []string{"a.test", "0.0.0.0/0"}, DenyOut: all},
			map[netip.Addr][2]string{google: {"filter", "filter"}, other: {"filter", "filter"}}},
		{"deny some", egress.Config{DenyOut: []string{"203.0.113.0/24"}},
			map[netip.Addr][2]string{google: {"filter", "filter"}, other: {"filter", "filter"}}},
	} {
		p := parse(c.cfg)
		rules := proxyRules(link7, v4, p, slot{env: defaultEnv, proxyPort: testProxyPort, dnsPort: testDNSPort})
		for dst, want := range c.want {
			for i, proto := range []string{"udp", "tcp"} {
				if got := slotVerdict(t, rules, proto, dst, 53); got != want[i] {
					t.Errorf("%s: %s %s:53 goes to the %s, want the %s\n%s", c.name, proto, dst, got, want[i], strings.Join(rules, "\n"))
				}
			}
		}
		// Without the resolver (--egress-dns off) nothing is redirected to it.
		for _, r := range proxyRules(link7, v4, p, slot{env: defaultEnv, proxyPort: testProxyPort}) {
			if strings.Contains(r, "--dport 53") {
				t.Errorf("%s: DNS rule without the resolver: %q", c.name, r)
			}
		}
	}
}
