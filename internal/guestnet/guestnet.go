// Package guestnet owns the guest's view of its network: the interface, address and gateway the
// node pushes to envd over the agent channel after every boot (seed 000: guests run no DHCP
// client), and the netlink calls that put them in place inside the guest.
//
// It runs on both sides of the channel: the node builds a Config from a sandbox's lease, envd
// applies it in the guest's network stack. It must never touch anything but the one interface
// it is given and the main routing table's default route, and it imports no other vmon package
// (envd links it).
package guestnet

import (
	"errors"
	"fmt"
	"net/netip"
)

// Config is what a guest configures on its interface. Its JSON form travels in envd's /init body.
type Config struct {
	// Interface is the guest's NIC (eth0 in a gVisor sandbox and in a Linux VM).
	Interface string `json:"interface"`
	// Address is the guest's address with the lease's prefix length, e.g. 172.20.0.2/30.
	Address netip.Prefix `json:"address"`
	// Gateway is the node's end of the link, the guest's default route.
	Gateway netip.Addr `json:"gateway"`
}

// maxInterfaceName is IFNAMSIZ without the terminating NUL.
const maxInterfaceName = 15

// ErrNoInterface is returned (wrapped) by Apply when the guest has no interface of that name:
// sending the same config again cannot help.
var ErrNoInterface = errors.New("no such interface")

// Validate reports why c cannot be applied, or nil.
func (c Config) Validate() error {
	if c.Interface == "" || len(c.Interface) > maxInterfaceName {
		return fmt.Errorf("guest network: interface name %q must be 1 to %d characters", c.Interface, maxInterfaceName)
	}
	if !c.Address.IsValid() {
		return errors.New("guest network: address is missing")
	}
	if c.Address.Addr() != c.Address.Addr().Unmap() || !c.Address.Addr().Is4() {
		return fmt.Errorf("guest network: address %s is not IPv4 (leases are IPv4 /30 blocks)", c.Address)
	}
	if c.Address.Bits() == 32 {
		return fmt.Errorf("guest network: address %s has no other host to route through", c.Address)
	}
	if !isHost(c.Address, c.Address.Addr()) {
		return fmt.Errorf("guest network: address %s names its network or broadcast address, not a host", c.Address)
	}
	if !c.Gateway.IsValid() || !c.Gateway.Is4() {
		return fmt.Errorf("guest network: gateway %s is not an IPv4 address", c.Gateway)
	}
	if !c.Address.Contains(c.Gateway) || c.Gateway == c.Address.Addr() || !isHost(c.Address, c.Gateway) {
		return fmt.Errorf("guest network: gateway %s is not another host of %s", c.Gateway, c.Address.Masked())
	}
	return nil
}

// isHost reports whether a (inside p) may be a host's address: anything in a /31 (RFC 3021),
// else neither the network nor the broadcast address.
func isHost(p netip.Prefix, a netip.Addr) bool {
	if p.Bits() >= 31 {
		return true
	}
	network := p.Masked().Addr()
	b := network.As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	broadcast := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return a != network && a != broadcast
}
