package firewall

import (
	"net/netip"
	"slices"
)

// forFamily returns the prefixes of ps that apply to family f, masked and without duplicates, in
// their original order. IPv4 prefixes never match IPv6 destinations and vice versa, as in
// egress.Decide: a normalised policy already carries E2B's ALL_TRAFFIC as both 0.0.0.0/0 and ::/0.
func forFamily(ps []netip.Prefix, f family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if !p.IsValid() {
			continue
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			// A mapped IPv4 prefix is judged as IPv4 by egress.Decide; Parse already unmaps
			// it, but a hand-built one must render the same way.
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Addr().Is6() != (f == v6) {
			continue
		}
		p = p.Masked()
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// subtract returns the addresses of from that are in none of minus, as a minimal list of
// prefixes in address order. It is how "always-denied minus --egress-internal-allow" becomes a
// flat list of refusals that needs no RETURN tricks and reads as exactly what it blocks.
func subtract(from, minus []netip.Prefix) []netip.Prefix {
	cur := slices.Clone(from)
	for _, m := range minus {
		var next []netip.Prefix
		for _, p := range cur {
			next = append(next, subtractOne(p, m)...)
		}
		cur = next
	}
	slices.SortFunc(cur, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(cur)
}

// subtractOne returns p without m.
func subtractOne(p, m netip.Prefix) []netip.Prefix {
	if p.Addr().Is4() != m.Addr().Is4() || !p.Overlaps(m) {
		return []netip.Prefix{p}
	}
	if m.Bits() <= p.Bits() {
		return nil // m covers p
	}
	// m is strictly inside p: keep the half of p that does not hold m, recurse into the other.
	lo, hi := halves(p)
	if lo.Contains(m.Addr()) {
		return append([]netip.Prefix{hi}, subtractOne(lo, m)...)
	}
	return append([]netip.Prefix{lo}, subtractOne(hi, m)...)
}

// halves splits p (not a host prefix) into its two sub-prefixes one bit longer.
func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	lo := netip.PrefixFrom(p.Addr(), bits)
	b := p.Addr().AsSlice()
	idx := p.Bits() / 8
	b[idx] |= 0x80 >> (p.Bits() % 8)
	hiAddr, _ := netip.AddrFromSlice(b)
	if p.Addr().Is4() {
		hiAddr = hiAddr.Unmap()
	}
	return lo, netip.PrefixFrom(hiAddr, bits)
}
