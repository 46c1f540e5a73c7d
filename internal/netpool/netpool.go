// Package netpool owns sandbox links: the --net-pool address leases (/30 blocks handed out
// round-robin), the host link vmon<N> of each lease (a veth whose peer sits, configured, in the
// sandbox's network namespace for gVisor; a TAP for VM runtimes), and the ready pool that keeps
// one link per boot slot pre-created with its namespace, rules and closed policy chains, so a
// create takes a link without running ip or iptables on the request path (seed 000, "Linux: TAP
// and NAT", "Ready TAP pool").
//
// Rules are the firewall package's; netpool installs them with each link and delegates the
// egress policy to them: Pool.Attach, Update and Detach take the *Link the node holds, so the
// node never sees firewall handles. Releasing a link closes its policy chains, flushes its
// conntrack entries (one ctnetlink delete filtered by the lease's mark) and either keeps it ready
// or tears it down; start-up (Recover) removes every link, namespace, rule and conntrack entry a
// crash left behind that no recovered sandbox holds.
//
// It must never touch links, namespaces or rules that do not carry its prefix, nor the
// configuration of the host's other interfaces; the only host-wide setting it changes is
// net.ipv4.ip_forward=1, which routing guest traffic needs.
package netpool

import (
	"errors"
	"net/netip"
	"regexp"
	"strconv"

	"github.com/vibemon/vmon/internal/errdefs"
)

// DefaultPrefix is --net-pool's default: 16384 leases.
const DefaultPrefix = "172.20.0.0/16"

// GuestInterface is the guest's NIC: the veth peer inside a gVisor sandbox's namespace, and the
// first NIC of a Linux VM.
const GuestInterface = "eth0"

// MaxReady caps the ready pool target whatever --boot-concurrency says.
const MaxReady = 32

// ErrUnsupported is returned (wrapped) on systems without Linux networking.
var ErrUnsupported = errors.New("netpool: sandbox links are only supported on Linux")

// ParsePrefix parses --net-pool. "" is the default. The pool must be IPv4, between /8 and /30,
// without host bits set.
func ParsePrefix(s string) (netip.Prefix, error) {
	if s == "" {
		s = DefaultPrefix
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, errdefs.InvalidArgument("--net-pool %q is not a CIDR prefix such as %s", s, DefaultPrefix)
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, errdefs.InvalidArgument("--net-pool %s: must be an IPv4 prefix (leases are IPv4 /30 blocks)", s)
	}
	if p.Bits() < 8 || p.Bits() > 30 {
		return netip.Prefix{}, errdefs.InvalidArgument("--net-pool %s: prefix length must be between /8 and /30", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, errdefs.InvalidArgument("--net-pool %s: host bits are set (the network is %s)", s, m)
	}
	return p, nil
}

// Lease is one /30 block of the pool.
type Lease struct {
	// Index is N: the link is vmon<N>, its connection mark N+1.
	Index   int
	Network netip.Prefix // the /30
	Host    netip.Addr   // .1, the node's end (vmon<N>), the guest's gateway
	Guest   netip.Addr   // .2, the guest's address
}

// Mark is the connection mark of every flow of the lease.
func (l Lease) Mark() uint32 { return uint32(l.Index) + 1 }

// GuestPrefix is the guest's address with the lease's prefix length, as envd configures it.
func (l Lease) GuestPrefix() netip.Prefix { return netip.PrefixFrom(l.Guest, 30) }

// Leases is the number of /30 leases in pool.
func Leases(pool netip.Prefix) int { return 1 << (30 - pool.Bits()) }

// LeaseAt returns lease i of pool.
func LeaseAt(pool netip.Prefix, i int) (Lease, error) {
	if i < 0 || i >= Leases(pool) {
		return Lease{}, errdefs.NotFound("lease %d is outside pool %s", i, pool)
	}
	b := pool.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(i)*4
	network := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return Lease{
		Index:   i,
		Network: netip.PrefixFrom(network, 30),
		Host:    network.Next(),
		Guest:   network.Next().Next(),
	}, nil
}

// allocator hands out lease indices round-robin: the cursor only moves forward, so a released
// block is reused as late as possible and a new sandbox never inherits an address a peer may
// still remember.
type allocator struct {
	size int
	next int
	used map[int]bool
}

func newAllocator(size int) *allocator { return &allocator{size: size, used: map[int]bool{}} }

func (a *allocator) alloc() (int, bool) {
	for k := range a.size {
		i := (a.next + k) % a.size
		if !a.used[i] {
			a.used[i] = true
			a.next = (i + 1) % a.size
			return i, true
		}
	}
	return 0, false
}

// reserve marks i used (a link recovered after a restart).
func (a *allocator) reserve(i int) {
	if i >= 0 && i < a.size {
		a.used[i] = true
	}
}

func (a *allocator) free(i int) { delete(a.used, i) }

func (a *allocator) empty() bool { return len(a.used) == 0 }

func (a *allocator) full() bool { return len(a.used) >= a.size }

// Kind is the type of the host link.
type Kind int

const (
	// Veth: the host end of a veth pair whose peer, eth0, waits inside a network namespace the
	// runtime joins (gVisor's netstack takes it over; envd then configures the lease on it).
	Veth Kind = iota
	// TAP: a persistent TAP device the VMM opens (Firecracker), owned by VMMUser. It has no
	// namespace: the guest is configured over the agent channel.
	TAP
)

func (k Kind) String() string {
	if k == TAP {
		return "tap"
	}
	return "veth"
}

var (
	linkPrefixRe = regexp.MustCompile(`^[a-z]{1,8}$`)
	scopeRe      = regexp.MustCompile(`^[a-z0-9]{1,12}$`)
)

// names derives the link and namespace names of an index. scope separates the namespaces of
// nodes on one host: /run/netns is shared by every network namespace, links are not.
type names struct{ link, scope string }

func (n names) linkName(i int) string { return n.link + strconv.Itoa(i) }

// nsPrefix starts the namespace names. It contains a dash after the link prefix, so the node's
// recovery (which removes "vmon-<id>" namespaces of sandboxes it no longer has, ids being
// [a-z0-9]+) never takes a pooled namespace for an orphan.
func (n names) nsPrefix() string {
	if n.scope != "" {
		return n.link + "-net-" + n.scope + "-"
	}
	return n.link + "-net-"
}
func (n names) nsName(i int) string { return n.nsPrefix() + strconv.Itoa(i) }
