package egress

import "net/netip"

// Decide is the reference engine: the verdict for a new flow from a sandbox under policy p to dst
// on port, by the seed's precedence for addresses:
//
//  1. dst in an always-denied range, unless env.InternalAllow covers it → deny;
//  2. dst in an allowOut CIDR → allow;
//  3. dst in a denyOut CIDR → deny;
//  4. otherwise → allow.
//
// TCP, UDP and ICMP are judged alike. The seed's first TCP step (a flow to an allowed domain on
// port 80/443 is allowed) is not decided here: it needs the Host header or TLS SNI, which only the
// transparent proxy sees (Judge takes it), so Decide answers for a flow that carries no name, and
// a backend must hand ports 80/443 of a policy with AllowDomains to the proxy before these rules
// deny them. proto and port are part of the signature so that backends are tested with the full
// tuple they match on.
//
// An IPv4-mapped IPv6 destination is judged as its IPv4 address; IPv4 prefixes never match IPv6
// destinations and vice versa. An invalid dst is denied.
func Decide(p Policy, env Env, proto Proto, dst netip.Addr, port uint16) Verdict {
	return Judge(p, env, proto, dst, port, "").Verdict
}
