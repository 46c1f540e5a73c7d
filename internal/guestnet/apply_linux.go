package guestnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Apply puts c in place in the calling thread's network namespace (inside a gVisor sandbox, the
// sentry's netstack): the address on the interface, the interface up, the default route via the
// gateway. It is idempotent, and it removes any other IPv4 address of the interface, so a guest
// resumed or forked onto a new lease keeps no trace of the old one.
func Apply(c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("guest network: open netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(c.Interface)
	if err != nil {
		if nf := (netlink.LinkNotFoundError{}); errors.As(err, &nf) {
			err = ErrNoInterface
		}
		return fmt.Errorf("guest network: find interface %s: %w", c.Interface, err)
	}
	if err := PruneIPv4(h, link, c.Address); err != nil {
		return fmt.Errorf("guest network: %w", err)
	}
	if err := h.AddrReplace(link, &netlink.Addr{IPNet: ipNet(c.Address)}); err != nil {
		return fmt.Errorf("guest network: address %s on %s: %w", c.Address, c.Interface, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("guest network: set %s up: %w", c.Interface, err)
	}
	route := &netlink.Route{
		LinkIndex: link.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw:        c.Gateway.AsSlice(),
	}
	if err := h.RouteReplace(route); err != nil {
		return fmt.Errorf("guest network: default route via %s: %w", c.Gateway, err)
	}
	return nil
}

// PruneIPv4 removes every IPv4 address of link except keep (which it does not add). It works in
// a kernel namespace and in gVisor's netstack alike: the node uses it to reset a sandbox
// namespace's peer, envd to drop a previous lease.
func PruneIPv4(h *netlink.Handle, link netlink.Link, keep netip.Prefix) error {
	name := link.Attrs().Name
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if p, ok := prefixOf(a.IPNet); ok && p == keep {
			continue
		}
		// Only the prefix: gVisor's netstack answers EOPNOTSUPP to an RTM_DELADDR carrying any
		// attribute besides IFA_LOCAL and IFA_ADDRESS (a listed address has a label, and the
		// library adds a broadcast address below /31 unless told it is zero).
		del := &netlink.Addr{IPNet: a.IPNet, Broadcast: net.IPv4zero}
		if err := h.AddrDel(link, del); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove stale address %s from %s: %w", a.IPNet, name, err)
		}
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}
