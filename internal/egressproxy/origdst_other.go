//go:build !linux

package egressproxy

import (
	"errors"
	"net"
	"net/netip"
)

func originalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("transparent proxying needs Linux (SO_ORIGINAL_DST)")
}
