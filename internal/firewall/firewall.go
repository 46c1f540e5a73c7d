// Package firewall renders and applies the iptables rules of sandbox links: NAT, anti-spoofing,
// connection marks, host isolation and the per-link egress policy chains that enforce an
// egress.Policy (seed 000, "Linux: TAP and NAT", "Egress hooks", "Egress policy").
//
// Every rule is keyed on the host end of a link, vmon<N>, in the namespace the firewall is
// configured for (the node's root namespace in production): gVisor's netstack and VMMs bypass
// iptables inside the sandbox, so nothing is ever installed there. All state lives in per-link
// chains, so attaching or updating one sandbox costs the same whether 1 or 500 are running:
//
//	filter FORWARD  -i vmon<N> -j VMON-F<N>                 guard: anti-spoofing, established TCP,
//	                                                        policy, then refusal of what it returns
//	VMON-E<N>       the egress policy; a single DROP (closed) until Attach, then a block that
//	                jumps to VMON-DENIED first and ends in a verdict
//	mangle PREROUTING -i vmon<N> -j CONNMARK --set-mark N+1  tags every guest flow for conntrack flushes
//	nat POSTROUTING -s guest ! -d pool -j VMON-M<N>         MASQUERADE, never towards another lease
//	nat PREROUTING  -i vmon<N> -j VMON-T<N>                 the transparent proxy: empty (RETURN)
//	                until a policy with domains is attached, then a REDIRECT to the node's proxy
//	                port for flows no allowOut CIDR already allows
//
// plus node-wide rules on the wildcard vmon+, the same for every link (EnsureGlobal):
//
//	filter FORWARD  -o vmon+ ESTABLISHED,RELATED -j ACCEPT   return traffic only
//	                -o vmon+ ! -i vmon+ -j DROP              nothing new reaches a guest from outside
//	filter INPUT    -i vmon+ tcp --dport P ctstate DNAT -j ACCEPT   only redirected flows reach
//	                                                        the proxy port P (Config.ProxyPort)
//	                -i vmon+ -j REJECT                      a guest reaches no other address of the node
//	VMON-DENIED     the always-denied ranges minus --egress-internal-allow, refused
//
// Refusals fail fast: TCP gets a reset, everything else ICMP admin-prohibited; only the closed
// pre-attach chain and anti-spoofing drop silently. With Config.LogGroup every refusal is first
// copied to that NFLOG group.
//
// IPv4 rules go to iptables and IPv6 rules to ip6tables; both families get the same chains, so a
// policy is enforced on IPv6 the day guests get an IPv6 route. Attach and live updates are
// add-only transactions (on nf_tables a deletion waits for an RCU grace period, ~15 ms, which
// would break the latency budget); the shadowed rules of an update are compacted in the
// background.
//
// The package must never touch links, addresses, routes or conntrack (netpool owns those), nor
// any rule it did not create: removal only deletes rules tagged vmon-egress in built-in chains
// that reference one of its own links or chains, its own per-link chains, and (RemoveGlobal,
// once no per-link chain is left) its node-wide DENIED chain.
package firewall

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

// ErrUnsupported is returned (wrapped) on systems without iptables.
var ErrUnsupported = errors.New("firewall: iptables rules are only supported on Linux")

// Comment tags every rule vmon adds to a built-in chain.
const Comment = "vmon-egress"

// DefaultPrefix names links vmon<N> and chains VMON-<kind><N>.
const DefaultPrefix = "vmon"

// Chain kinds, the letter after "<PREFIX>-" in a per-link chain name.
const (
	chainGuard      = 'F' // filter: everything a guest sends through the node
	chainEgress     = 'E' // filter: the egress policy, closed (DROP) until attached
	chainMasquerade = 'M' // nat: MASQUERADE for the guest
	chainProxy      = 'T' // nat: transparent-proxy slot, empty until domain rules exist
)

// Link is one sandbox link as its rules see it.
type Link struct {
	// Index is the lease index N: link vmon<N>, chains VMON-?<N>, connection mark N+1.
	Index int
	// Guest is the only IPv4 source allowed to leave the link.
	Guest netip.Addr
	// Pool holds every lease: guests never reach another lease and traffic to it is never
	// masqueraded.
	Pool netip.Prefix
	// Guest6 and Pool6 are the IPv6 equivalents. Guests have no IPv6 address today: without
	// Guest6 every IPv6 packet from the link is dropped, but the IPv6 policy chain still exists
	// and is attached and updated like the IPv4 one.
	Guest6 netip.Addr
	Pool6  netip.Prefix
	// Unrestricted links (template builds) get no egress hooks: no policy chain, no proxy slot.
	// Anti-spoofing, lease isolation, host isolation, marks and NAT still apply.
	Unrestricted bool
}

// Mark is the connection mark of the link's flows.
func (l Link) Mark() uint32 { return uint32(l.Index) + 1 }

// Tools names the binaries the firewall runs.
type Tools struct {
	Restore4, Restore6 string // iptables-restore, ip6tables-restore
	Save4, Save6       string // iptables-save, ip6tables-save
}

// DefaultTools are the binaries found on $PATH (nft or legacy, whichever the host selects).
var DefaultTools = Tools{
	Restore4: "iptables-restore", Restore6: "ip6tables-restore",
	Save4: "iptables-save", Save6: "ip6tables-save",
}

// Config configures a Firewall.
type Config struct {
	// Prefix names links <prefix><N> and chains <PREFIX>-<kind><N>. Default "vmon". Nodes that
	// share a namespace need different prefixes.
	Prefix string
	// Env holds the node's always-denied ranges and --egress-internal-allow exemptions.
	Env egress.Env
	// NetNS is the path of the namespace the rules live in; "" is the process's own namespace
	// (production). Tests pass a throwaway namespace.
	NetNS string
	// Tools overrides the binaries; zero fields take DefaultTools.
	Tools Tools
	// ProxyPort is the node's transparent egress proxy port (egressproxy): links whose policy
	// has allowOut domains redirect guest TCP to ports 80/443 there. 0 leaves the slot empty,
	// and such policies are then enforced by their CIDR rules alone (the node must not
	// advertise egress-domains).
	ProxyPort uint16
	// DNSPort is the node's filtering resolver (--egress-dns filter, the default): links whose
	// policy has allowOut domains (and no allowOut CIDR reaching every address) redirect guest
	// DNS (UDP and TCP 53, to any address but their own allowOut CIDRs) there. 0: guests resolve
	// as their policy lets them.
	DNSPort uint16
	// LogGroup, when not 0, is the NFLOG group every refusal of the CIDR rules is copied to
	// before it is refused (the guard's refusal tail and the always-denied chain), so the node
	// can say what was blocked. Only refused packets are logged.
	LogGroup uint16
	Log      *slog.Logger
}

var prefixRe = regexp.MustCompile(`^[a-z]{1,8}$`)

// names derives every name of a link from the prefix.
type names struct {
	prefix string // links
	chain  string // chains: upper-case prefix + "-"
	ownRe  *regexp.Regexp
}

func newNames(prefix string) (names, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if !prefixRe.MatchString(prefix) {
		return names{}, errdefs.InvalidArgument("link prefix %q: want 1-8 lower-case letters", prefix)
	}
	up := strings.ToUpper(prefix) + "-"
	return names{
		prefix: prefix,
		chain:  up,
		ownRe:  regexp.MustCompile(`^` + up + `([A-Z])([0-9]+)$`),
	}, nil
}

func (n names) iface(i int) string { return n.prefix + strconv.Itoa(i) }

// deniedChain is the node-wide chain of the always-denied ranges (see deniedRules). Its name has
// no link index, so ownChain never takes it for a link's.
func (n names) deniedChain() string { return n.chain + "DENIED" }

// logChain is the node-wide chain that copies refusals to NFLOG (logRule).
func (n names) logChain() string { return n.chain + "LOG" }

func (n names) chainName(kind byte, i int) string {
	return n.chain + string(kind) + strconv.Itoa(i)
}

// ownChain returns the link index of one of our per-link chains.
func (n names) ownChain(name string) (int, bool) {
	m := n.ownRe.FindStringSubmatch(name)
	if m == nil {
		return 0, false
	}
	i, err := strconv.Atoi(m[2])
	return i, err == nil
}

// ownIface returns the link index of one of our links.
func (n names) ownIface(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, n.prefix)
	if !ok || digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(digits)
	return i, err == nil
}

// family is an address family: which binary, which addresses, which ICMP refusal.
type family int

const (
	v4 family = iota
	v6
)

var families = [...]family{v4, v6}

func (f family) String() string {
	if f == v6 {
		return "ipv6"
	}
	return "ipv4"
}

func (f family) has(a netip.Addr) bool { return a.IsValid() && a.Is6() == (f == v6) }

func (f family) rejectOther() string {
	if f == v6 {
		return "icmp6-adm-prohibited"
	}
	return "icmp-admin-prohibited"
}

func (f family) hostBits() int {
	if f == v6 {
		return 128
	}
	return 32
}

func validateLink(l Link) error {
	if l.Index < 0 {
		return errdefs.InvalidArgument("link index %d is negative", l.Index)
	}
	if !l.Guest.Is4() || !l.Pool.IsValid() || !l.Pool.Addr().Is4() || !l.Pool.Contains(l.Guest) {
		return errdefs.InvalidArgument("link %d: guest %s must be an IPv4 address inside pool %s",
			l.Index, l.Guest, l.Pool)
	}
	if l.Guest6.IsValid() && (!l.Guest6.Is6() || l.Guest6.Is4In6()) {
		return errdefs.InvalidArgument("link %d: guest6 %s is not an IPv6 address", l.Index, l.Guest6)
	}
	if l.Pool6.IsValid() && (!l.Pool6.Addr().Is6() || !l.Guest6.IsValid() || !l.Pool6.Contains(l.Guest6)) {
		return errdefs.InvalidArgument("link %d: pool6 %s needs a guest6 inside it", l.Index, l.Pool6)
	}
	return nil
}

func (l Link) String() string { return fmt.Sprintf("link %d (guest %s)", l.Index, l.Guest) }
