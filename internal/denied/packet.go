package denied

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Packet is a refused packet as the kernel logged it: its addresses, protocol and destination
// port (0 for ICMP and other protocols).
type Packet struct {
	Src, Dst netip.Addr
	Proto    string
	Port     uint16
}

// IP protocol numbers the stream names.
const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
)

// ParsePacket reads the network and transport headers NFLOG copied (--nflog-size 128).
func ParsePacket(b []byte) (Packet, error) {
	if len(b) == 0 {
		return Packet{}, errors.New("empty packet")
	}
	var p Packet
	var proto int
	var rest []byte
	switch b[0] >> 4 {
	case 4:
		h, err := ipv4.ParseHeader(b)
		if err != nil {
			return Packet{}, err
		}
		src, _ := netip.AddrFromSlice(h.Src.To4())
		dst, _ := netip.AddrFromSlice(h.Dst.To4())
		p.Src, p.Dst, proto = src, dst, h.Protocol
		if h.Len <= len(b) {
			rest = b[h.Len:]
		}
	case 6:
		h, err := ipv6.ParseHeader(b)
		if err != nil {
			return Packet{}, err
		}
		src, _ := netip.AddrFromSlice(h.Src)
		dst, _ := netip.AddrFromSlice(h.Dst)
		p.Src, p.Dst, proto = src, dst, h.NextHeader
		if len(b) >= ipv6.HeaderLen {
			rest = b[ipv6.HeaderLen:]
		}
	default:
		return Packet{}, fmt.Errorf("not an IP packet (version %d)", b[0]>>4)
	}
	switch proto {
	case protoTCP, protoUDP:
		p.Proto = map[int]string{protoTCP: "tcp", protoUDP: "udp"}[proto]
		if len(rest) >= 4 {
			// Both transport headers start with the source and destination ports.
			p.Port = binary.BigEndian.Uint16(rest[2:4])
		}
	case protoICMP, protoICMPv6:
		p.Proto = "icmp"
	default:
		p.Proto = fmt.Sprintf("ip-%d", proto)
	}
	return p, nil
}
