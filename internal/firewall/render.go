package firewall

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vibemon/vmon/internal/egress"
)

// script builds one iptables-restore --noflush input: a transaction (COMMIT) per table.
type script struct {
	b     strings.Builder
	table string
}

func (s *script) begin(table string) {
	s.end()
	s.table = table
	fmt.Fprintf(&s.b, "*%s\n", table)
}

func (s *script) end() {
	if s.table != "" {
		s.b.WriteString("COMMIT\n")
		s.table = ""
	}
}

func (s *script) line(format string, args ...any) {
	fmt.Fprintf(&s.b, format, args...)
	s.b.WriteByte('\n')
}

// insertTop inserts rules at the top of a built-in chain so they read in the given order and run
// before whatever else (Docker, ufw, a DROP policy) the host has there. Inserting at position 1
// in reverse needs no rule-position lookups, which keeps the transaction flat as chains grow.
func (s *script) insertTop(chain string, rules ...string) {
	for i := len(rules) - 1; i >= 0; i-- {
		s.line("-I %s 1 %s", chain, rules[i])
	}
}

func (s *script) String() string {
	s.end()
	return s.b.String()
}

func tagged(rule string) string {
	// The comment goes right before the target so iptables-save prints the rule as written.
	i := strings.LastIndex(rule, " -j ")
	return rule[:i] + " -m comment --comment " + Comment + rule[i:]
}

func hostPrefix(a netip.Addr, f family) string {
	return netip.PrefixFrom(a, f.hostBits()).String()
}

// guest and pool for one family; the guest is invalid when the link has no address in it.
func (l Link) guest(f family) netip.Addr {
	if f == v6 {
		return l.Guest6
	}
	return l.Guest
}

func (l Link) pool(f family) netip.Prefix {
	if f == v6 {
		return l.Pool6
	}
	return l.Pool
}

// renderInstall is everything a link carries from creation, in one transaction per table: the
// guard with its refusal tail, the closed policy chain, the hooks in FORWARD and INPUT, the
// connection mark, masquerading and the transparent-proxy slot.
//
// The layout keeps per-link rule count (and jumps) low: nf_tables re-validates every rule
// reachable from a base chain on each commit, so that count, times the number of links, is
// what makes an attach slower as the node fills up.
func renderInstall(n names, l Link, f family, logGroup uint16) string {
	iface := n.iface(l.Index)
	guard, egr := n.chainName(chainGuard, l.Index), n.chainName(chainEgress, l.Index)
	masq, proxy := n.chainName(chainMasquerade, l.Index), n.chainName(chainProxy, l.Index)
	guest, pool := l.guest(f), l.pool(f)
	refuse := []string{
		"-p tcp -j REJECT --reject-with tcp-reset",
		"-j REJECT --reject-with " + f.rejectOther(),
	}
	var s script

	s.begin("filter")
	s.line(":%s - [0:0]", guard)
	if !l.Unrestricted {
		s.line(":%s - [0:0]", egr)
		// Closed until Attach: a silent DROP, so a sandbox that resumes before its policy is
		// in place gets nothing out and learns nothing. The chain exists in both families
		// even when the guard cannot reach it yet (no IPv6 guest), so policies are applied
		// the same way and take effect the day the guest gets an address.
		s.line("-A %s -j DROP", egr)
	}
	switch {
	case !f.has(guest):
		// No source of this family is the guest's: nothing of it leaves the link, and the
		// rest of the guard would be dead rules the kernel still validates on every commit.
		s.line("-A %s -j DROP", guard)
	case l.Unrestricted:
		s.line("-A %s ! -s %s -j DROP", guard, hostPrefix(guest, f))
		if pool.IsValid() {
			for _, r := range refuse {
				s.line("-A %s -d %s %s", guard, pool, r)
			}
		}
		s.line("-A %s -j ACCEPT", guard)
	default:
		s.line("-A %s ! -s %s -j DROP", guard, hostPrefix(guest, f))
		// Established TCP is accepted before the policy so a live update only affects new
		// connections; UDP and ICMP go through the policy on every packet.
		s.line("-A %s -p tcp -m conntrack --ctstate ESTABLISHED -j ACCEPT", guard)
		s.line("-A %s -j %s", guard, egr)
		// What the policy RETURNs is refused here, fast: a reset for TCP, admin-prohibited
		// for the rest (a closed policy chain DROPs and never returns). The refusal is logged
		// first, for the node's stream of what was blocked.
		if logGroup != 0 {
			s.line("-A %s -j %s", guard, n.logChain())
		}
		for _, r := range refuse {
			s.line("-A %s %s", guard, r)
		}
	}
	// The only per-link rule in a built-in filter chain; what is the same for every link
	// lives in the node-wide rules (renderGlobal).
	s.insertTop("FORWARD", tagged(fmt.Sprintf("-i %s -j %s", iface, guard)))

	s.begin("mangle")
	s.insertTop("PREROUTING", tagged(fmt.Sprintf("-i %s -j CONNMARK --set-mark %d", iface, l.Mark())))

	s.begin("nat")
	if f.has(guest) {
		s.line(":%s - [0:0]", masq)
	}
	if !l.Unrestricted {
		s.line(":%s - [0:0]", proxy)
	}
	if f.has(guest) {
		s.line("-A %s -j MASQUERADE", masq)
		notPool := ""
		if pool.IsValid() {
			notPool = " ! -d " + pool.String()
		}
		s.insertTop("POSTROUTING", tagged(fmt.Sprintf("-s %s%s -j %s", hostPrefix(guest, f), notPool, masq)))
	}
	if !l.Unrestricted {
		// The slot the transparent proxy (domain allowOut, header rules, SOCKS5) fills with a
		// REDIRECT (proxyRules). Empty: the chain returns and nothing changes. nat sees only
		// the first packet of a flow, so the jump costs nothing per packet.
		s.insertTop("PREROUTING", proxyJump(n, l.Index))
	}
	return s.String()
}

// globalRules are the node-wide rules every link relies on, keyed on the link prefix wildcard
// (vmon+) so their cost does not grow with the number of links. Their order relative to the
// per-link jumps does not matter: none of them can match what a guard would judge.
func globalRules(n names, f family, sl slot) map[string][]string {
	all := n.prefix + "+"
	forward := []string{
		// Return traffic of the guests' flows.
		tagged(fmt.Sprintf("-o %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", all)),
		// Nothing new reaches a guest from outside. Traffic from another of our links is
		// left to that link's own guard, which checks its source and refuses it fast.
		tagged(fmt.Sprintf("-o %s ! -i %s -j DROP", all, all)),
	}
	var input []string
	if f == v6 {
		// Neighbour discovery is how an IPv6 guest finds its router; without it no IPv6
		// packet could leave even when the policy allows it.
		input = append(input,
			tagged(fmt.Sprintf("-i %s -p ipv6-icmp -m icmp6 --icmpv6-type neighbour-solicitation -j ACCEPT", all)),
			tagged(fmt.Sprintf("-i %s -p ipv6-icmp -m icmp6 --icmpv6-type neighbour-advertisement -j ACCEPT", all)))
	}
	if sl.proxyPort != 0 && f == v4 {
		// Flows a link's proxy slot redirected (ctstate DNAT) reach the proxy; a guest that
		// connects to the port itself is refused below like any other.
		input = append(input, tagged(fmt.Sprintf(
			"-i %s -p tcp -m tcp --dport %d -m conntrack --ctstate DNAT -j ACCEPT", all, sl.proxyPort)))
	}
	if sl.dnsPort != 0 && f == v4 {
		for _, proto := range []string{"udp", "tcp"} {
			input = append(input, tagged(fmt.Sprintf(
				"-i %s -p %s -m %s --dport %d -m conntrack --ctstate DNAT -j ACCEPT", all, proto, proto, sl.dnsPort)))
		}
	}
	// The node serves nothing else on the guest network: every address of the host is refused.
	input = append(input,
		tagged(fmt.Sprintf("-i %s -p tcp -j REJECT --reject-with tcp-reset", all)),
		tagged(fmt.Sprintf("-i %s -j REJECT --reject-with %s", all, f.rejectOther())))
	return map[string][]string{"FORWARD": forward, "INPUT": input}
}

// deniedRules are the rules of the node-wide chain <PREFIX>-DENIED: the always-denied ranges
// minus --egress-internal-allow, each refused fast (a reset for TCP, admin-prohibited for the
// rest), as the guard's tail would. Every attached policy block jumps here first. One shared
// chain rather than a copy per link is what keeps an attach from slowing down as links grow:
// nf_tables re-validates every rule reachable from a base chain on each commit, but a chain
// that many links jump to is walked once per commit (measured: the same attach cost with 1 or
// 100 ranges in it at 1000 links, against twice the cost with eight ranges copied per link).
func deniedRules(n names, f family, env egress.Env, logGroup uint16) []string {
	var rules []string
	for _, pfx := range deniedPrefixes(f, env) {
		if logGroup != 0 {
			rules = append(rules, fmt.Sprintf("-d %s -j %s", pfx, n.logChain()))
		}
		rules = append(rules,
			fmt.Sprintf("-d %s -p tcp -j REJECT --reject-with tcp-reset", pfx),
			fmt.Sprintf("-d %s -j REJECT --reject-with %s", pfx, f.rejectOther()))
	}
	return rules
}

// deniedPrefixes are the always-denied ranges of family f minus the node's exemptions.
func deniedPrefixes(f family, env egress.Env) []netip.Prefix {
	denied := env.AlwaysDenied
	if denied == nil {
		denied = egress.AlwaysDenied() // as in egress.Decide: a zero Env fails closed
	}
	return subtract(forFamily(denied, f), forFamily(env.InternalAllow, f))
}

// renderGlobal installs the node-wide rules, first deleting whatever part of them exists
// (stale lines from saved output), and (re)writes the DENIED chain for env, in one
// transaction: links already attached see the old ranges until the commit and the new ones
// after it, never an empty chain.
func renderGlobal(n names, f family, stale []string, deniedExists, logExists bool, sl slot, logGroup uint16) string {
	env := sl.env
	var s script
	s.begin("filter")
	if logGroup != 0 {
		// Before DENIED, which jumps to it.
		if logExists {
			s.line("-F %s", n.logChain())
		} else {
			s.line(":%s - [0:0]", n.logChain())
		}
		s.line("-A %s %s", n.logChain(), logRule(n, logGroup))
	}
	denied := n.deniedChain()
	if deniedExists {
		s.line("-F %s", denied)
	} else {
		s.line(":%s - [0:0]", denied)
	}
	for _, r := range deniedRules(n, f, env, logGroup) {
		s.line("-A %s %s", denied, r)
	}
	for _, l := range stale {
		s.line("%s", l)
	}
	g := globalRules(n, f, sl)
	s.insertTop("FORWARD", g["FORWARD"]...)
	s.insertTop("INPUT", g["INPUT"]...)
	return s.String()
}

// policyRules renders a policy as the rules of one family's egress chain, first match wins,
// exactly in the seed's precedence (RETURN hands the packet back to the guard, which refuses it):
//
//  1. another lease                                   → RETURN (lease isolation, not policy)
//  2. always-denied minus --egress-internal-allow      → the node-wide DENIED chain refuses it
//  3. allowOut                                        → ACCEPT
//  4. denyOut                                         → RETURN
//  5. otherwise                                       → ACCEPT
//
// The final ACCEPT makes every block terminal, which is what lets a live update stack a new
// block on top of the old one atomically.
func policyRules(n names, l Link, f family, p egress.Policy, env egress.Env) []string {
	const refuse = "RETURN"
	var rules []string
	dst := func(pfx netip.Prefix, target string) {
		if pfx.Bits() == 0 {
			rules = append(rules, "-j "+target)
			return
		}
		rules = append(rules, fmt.Sprintf("-d %s -j %s", pfx, target))
	}
	if pool := l.pool(f); pool.IsValid() {
		dst(pool, refuse)
	}
	if len(deniedPrefixes(f, env)) > 0 {
		rules = append(rules, "-j "+n.deniedChain())
	}
	for _, pfx := range forFamily(p.AllowOut, f) {
		dst(pfx, "ACCEPT")
	}
	for _, pfx := range forFamily(p.DenyOut, f) {
		dst(pfx, refuse)
	}
	return append(rules, "-j ACCEPT")
}

// logRule is the one rule of the node-wide log chain: it hands a copy of a refused packet's
// headers to user space (the node's stream of what was blocked, internal/denied; 128 bytes hold
// an IPv6 header and a TCP header), at most 50 a second per source address, so a guest flooding
// refused packets cannot turn the node's logging into work for it (the stream collapses repeats
// anyway). One shared chain rather than a rule per link: nf_tables validates it once per commit.
func logRule(n names, group uint16) string {
	return fmt.Sprintf("-m hashlimit --hashlimit-upto 50/sec --hashlimit-burst 100 --hashlimit-mode srcip "+
		"--hashlimit-name %s-log -j NFLOG --nflog-group %d --nflog-size 128", n.prefix, group)
}

// proxyJump is the per-link jump into the proxy slot: every new flow of the link (nat sees only
// a flow's first packet).
func proxyJump(n names, i int) string {
	return tagged(fmt.Sprintf("-i %s -j %s", n.iface(i), n.chainName(chainProxy, i)))
}

// slot is what the proxy slot of every link redirects to: the node's transparent egress proxy and
// its filtering resolver (0: not running).
type slot struct {
	proxyPort, dnsPort uint16
	env                egress.Env
}

// proxyRules renders the shared part of a link's proxy slot for policy p (slots.go: the link's
// own chain checks the source and jumps here): nil (the slot stays empty) unless the node runs
// the proxy or the resolver and p needs them. Only IPv4 guests exist today; IPv6 flows
// are judged by the CIDR rules of their family alone. First match wins:
//
//  1. a source other than the guest, or a destination in the pool → RETURN (the guard drops a
//     spoofed source, which the proxy would take for another sandbox; leases stay isolated);
//  2. with the filtering resolver and a policy it serves (filtersDNS: allowOut domains under
//     deny-all), DNS (UDP and TCP 53) → REDIRECT to it, to any address but the allowOut CIDRs
//     the policy names itself (dnsExempt), which RETURN: the filter chain lets everything reach
//     those anyway, so refusing names there would only break a resolver the user chose;
//  3. with domains, TCP to 80/443 → REDIRECT: only the proxy can judge a name;
//  4. domains alone: any other port → RETURN; allowOut CIDRs → RETURN (allowed unproxied by the
//     filter chain); the rest → REDIRECT;
//  5. with header rules (port 443) or an egressProxy (every port): the seed's address precedence
//     (always-denied → allowOut → denyOut → allow), where a denial RETURNs, so the filter chain
//     refuses it with a reset at the SYN, and an allowed flow is REDIRECTed, for the proxy to
//     intercept (rules) or tunnel (SOCKS5) it.
//
// Every block ends in RETURN for whatever it did not redirect, so an update can stack a new
// block on top atomically without packets falling through into the one below.
func proxyRules(l Link, f family, p egress.Policy, sl slot) []string {
	if f != v4 || !f.has(l.guest(f)) {
		return nil
	}
	dns := sl.dnsPort != 0 && filtersDNS(p)
	tcp := tcpProxyRules(l, f, p, sl)
	if !dns && tcp == nil {
		return nil
	}
	// The spoofing check is the link's own (linkSlotRules); what follows depends on the policy
	// and the node only, so links with the same policy share it.
	var out []string
	if pool := l.pool(f); pool.IsValid() {
		out = append(out, fmt.Sprintf("-d %s -j RETURN", pool))
	}
	if dns {
		for _, pfx := range dnsExempt(p, f) {
			out = append(out, fmt.Sprintf("-d %s -p udp -m udp --dport 53 -j RETURN", pfx))
			if p.Proxy == nil {
				// With an egressProxy every allowed TCP flow belongs to the proxy's rules
				// below, which a RETURN here would skip; DNS over TCP to such an address is
				// then the resolver's.
				out = append(out, fmt.Sprintf("-d %s -p tcp -m tcp --dport 53 -j RETURN", pfx))
			}
		}
		for _, proto := range []string{"udp", "tcp"} {
			out = append(out, fmt.Sprintf("-p %s -m %s --dport 53 -j REDIRECT --to-ports %d", proto, proto, sl.dnsPort))
		}
	}
	return append(append(out, tcp...), "-j RETURN")
}

// implicitDNS is the address egress.Parse adds to allowOut with domains (seed 000: "8.8.8.8 is
// implicitly allowed so DNS works under deny-all").
var implicitDNS = netip.MustParsePrefix("8.8.8.8/32")

// filtersDNS reports whether the node's filtering resolver answers the DNS of a sandbox under p:
// when p has allowOut domains (which require deny-all) and no allowOut CIDR reaches every
// address. Those are the policies that open a resolver (8.8.8.8) the guest did not name, and
// without the resolver any name sent there would leave the node. A policy without domains opens
// no resolver: under deny-all DNS is refused like any other flow, and a resolver the user allowed
// by CIDR is the user's choice, which the resolver would only break.
func filtersDNS(p egress.Policy) bool {
	return len(p.AllowDomains) > 0 && !p.ReachesAnyAddress()
}

// dnsExempt are the destinations whose DNS is left to the filter chain for a policy the resolver
// serves: the allowOut CIDRs of family f, except 8.8.8.8/32, which domains add implicitly (a user
// who also names it in allowOut cannot be told apart, so it is filtered too).
func dnsExempt(p egress.Policy, f family) []netip.Prefix {
	var out []netip.Prefix
	for _, pfx := range forFamily(p.AllowOut, f) {
		if pfx != implicitDNS {
			out = append(out, pfx)
		}
	}
	return out
}

// tcpProxyRules are steps 3–5 of proxyRules: nil when the proxy has nothing to do for p.
func tcpProxyRules(l Link, f family, p egress.Policy, sl slot) []string {
	if sl.proxyPort == 0 {
		return nil
	}
	domains, rules, socks := len(p.AllowDomains) > 0, len(p.Rules) > 0, p.Proxy != nil
	if !domains && !rules && !socks {
		return nil
	}
	redirect := fmt.Sprintf("REDIRECT --to-ports %d", sl.proxyPort)
	dst := func(pfx netip.Prefix, target string) string {
		if pfx.Bits() == 0 {
			return "-p tcp -j " + target
		}
		return fmt.Sprintf("-d %s -p tcp -j %s", pfx, target)
	}
	var out []string
	if !rules && !socks {
		out = append(out, "-p tcp -m multiport ! --dports 80,443 -j RETURN")
		for _, pfx := range forFamily(p.AllowOut, f) {
			if pfx.Bits() == 0 {
				return nil // every address is allowed by CIDR: a name adds nothing
			}
			out = append(out, dst(pfx, "RETURN"))
		}
		return append(out, "-p tcp -j "+redirect)
	}
	if domains {
		out = append(out, "-p tcp -m multiport --dports 80,443 -j "+redirect)
	}
	if !socks {
		out = append(out, "-p tcp ! --dport 443 -j RETURN")
	}
	for _, pfx := range deniedPrefixes(f, sl.env) {
		out = append(out, dst(pfx, "RETURN"))
	}
	for _, pfx := range forFamily(p.AllowOut, f) {
		out = append(out, dst(pfx, redirect))
	}
	for _, pfx := range forFamily(p.DenyOut, f) {
		out = append(out, dst(pfx, "RETURN"))
	}
	return append(out, "-p tcp -j "+redirect)
}

// renderAttach inserts a policy block above whatever the egress chain holds: the closed DROP on
// attach, the previous block on a live update, and a proxy block (when not nil) above what the
// proxy slot holds. Add-only, one transaction per table.
func renderAttach(n names, l Link, rules, proxy []string) string {
	var s script
	s.begin("filter")
	s.insertTop(n.chainName(chainEgress, l.Index), rules...)
	if proxy != nil {
		s.begin("nat")
		s.insertTop(n.chainName(chainProxy, l.Index), proxy...)
	}
	return s.String()
}

// renderReplace rewrites the egress chain as rules followed by the closed DROP, and with
// flushProxy the proxy slot as proxy, in one transaction per table: compaction after an update
// (the live blocks) and detach (no rules).
func renderReplace(n names, l Link, rules []string, flushProxy bool, proxy []string) string {
	egr := n.chainName(chainEgress, l.Index)
	var s script
	s.begin("filter")
	s.line("-F %s", egr)
	for _, r := range rules {
		s.line("-A %s %s", egr, r)
	}
	s.line("-A %s -j DROP", egr)
	if flushProxy {
		t := n.chainName(chainProxy, l.Index)
		s.begin("nat")
		s.line("-F %s", t)
		for _, r := range proxy {
			if r != "-j RETURN" {
				s.line("-A %s %s", t, r)
			}
		}
	}
	return s.String()
}
