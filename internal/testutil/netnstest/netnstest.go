// Package netnstest builds throwaway network topologies for real-kernel tests: named network
// namespaces, veth pairs between them, addresses, routes and sysctls, commands run inside a
// namespace, TCP/UDP echo responders, and probes that tell an answered flow from one refused fast
// (RST or ICMP unreachable) and one silently dropped.
//
// It may only touch namespaces it creates itself. Every link, address, route, sysctl, firewall
// rule and socket it makes lives inside one of them, and t.Cleanup deletes them (which destroys
// everything inside). It never changes the calling goroutine's namespace nor the host's links,
// routes or firewall: each namespace switch happens on a locked OS thread that is thrown away
// afterwards. Traffic only ever goes to addresses inside namespaces it created; a topology has no
// route to the machine's real uplink.
package netnstest

import (
	"errors"
	"net/netip"
	"time"
)

// ErrUnsupported is returned (wrapped) on systems without network namespaces.
var ErrUnsupported = errors.New("netnstest: network namespaces are not supported on this OS")

// Outcome is what a probe saw.
type Outcome int

const (
	// Silent: no answer and no error before the probe's deadline (the packet was dropped).
	Silent Outcome = iota
	// Refused: a TCP reset or an ICMP unreachable (e.g. admin-prohibited) came back.
	Refused
	// Answered: the connection was accepted, or the echo came back.
	Answered
)

func (o Outcome) String() string {
	switch o {
	case Answered:
		return "answered"
	case Refused:
		return "refused"
	default:
		return "silent"
	}
}

// Result is an Outcome with how long the probe took, so a test can tell "refused fast" from a
// refusal that only came after retries.
type Result struct {
	Outcome Outcome
	Took    time.Duration
	// Err is the socket error behind a Refused outcome (ECONNREFUSED, EHOSTUNREACH, ...) or the
	// ICMP type/code of the answer to a ping, for failure messages.
	Err error
	// ICMPCode is the code of the ICMP unreachable that refused a ping (13 is IPv4
	// admin-prohibited, 1 IPv6 administratively prohibited), else -1.
	ICMPCode int
}

// Transit addresses of the link between a node namespace and its fake internet: the benchmarking
// range 198.18.0.0/15 and a corner of the documentation range 2001:db8::/32, which no real network
// uses and which egress.DecisionTable's destinations stay out of. Every packet to them stays
// inside the namespaces of the topology.
var (
	UplinkNode     = netip.MustParsePrefix("198.18.0.1/24")
	UplinkInternet = netip.MustParsePrefix("198.18.0.254/24")
	UplinkNode6    = netip.MustParsePrefix("2001:db8:ffff::1/64")
	UplinkInet6    = netip.MustParsePrefix("2001:db8:ffff::fe/64")
)
