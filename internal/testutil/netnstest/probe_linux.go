package netnstest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Responder is a TCP and UDP echo server on one address and port inside a namespace. It records
// every UDP payload it saw, so a test can prove a packet never arrived.
type Responder struct {
	Addr netip.AddrPort

	mu       sync.Mutex
	payloads map[string]int
	accepts  int
}

// Serve starts TCP and UDP echo servers on ap inside the namespace; they stop when the test
// ends.
func (n *NS) Serve(ap netip.AddrPort) *Responder {
	n.tb.Helper()
	r := &Responder{Addr: ap, payloads: map[string]int{}}
	var ln net.Listener
	var pc net.PacketConn
	err := n.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp", ap.String()); err != nil {
			return err
		}
		if pc, err = net.ListenPacket("udp", ap.String()); err != nil {
			ln.Close()
			return err
		}
		return nil
	})
	if err != nil {
		n.tb.Fatalf("responder on %s in %s: %v", ap, n.Name, err)
	}
	var wg sync.WaitGroup
	n.tb.Cleanup(func() {
		ln.Close()
		pc.Close()
		wg.Wait()
	})
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.accepts++
			r.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			r.mu.Lock()
			r.payloads[string(buf[:k])]++
			r.mu.Unlock()
			_, _ = pc.WriteTo(buf[:k], from)
		}
	}()
	return r
}

// Seen reports how many UDP datagrams with exactly this payload arrived.
func (r *Responder) Seen(payload string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.payloads[payload]
}

// Accepts reports how many TCP connections were accepted.
func (r *Responder) Accepts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepts
}

// classify maps a socket error to an outcome.
func classify(err error) Outcome {
	switch {
	case err == nil:
		return Answered
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return Refused
	default:
		return Silent
	}
}

// DialTCP opens a TCP connection from inside the namespace; the connection stays usable from any
// goroutine.
func (n *NS) DialTCP(dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", dst.String(), timeout)
		return err
	})
	return c, err
}

// TCP connects to dst from inside the namespace and, once connected, checks one byte echoes.
func (n *NS) TCP(dst netip.AddrPort, wait time.Duration) Result {
	start := time.Now()
	c, err := n.DialTCP(dst, wait)
	res := Result{Outcome: classify(err), Err: err}
	if err == nil {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(wait))
		buf := []byte{'x'}
		if _, err := c.Write(buf); err != nil {
			res = Result{Outcome: classify(err), Err: err}
		} else if _, err := io.ReadFull(c, buf); err != nil {
			res = Result{Outcome: Silent, Err: fmt.Errorf("connected but no echo: %w", err)}
		}
	}
	res.Took = time.Since(start)
	return res
}

// UDP sends payload to dst from a connected socket (bound to src when valid) and waits up to
// wait for the echo. An ICMP unreachable for the datagram shows up as a refused read.
func (n *NS) UDP(src netip.Addr, dst netip.AddrPort, payload string, wait time.Duration) Result {
	start := time.Now()
	var res Result
	err := n.Do(func() error {
		var laddr *net.UDPAddr
		if src.IsValid() {
			laddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
		}
		c, err := net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(wait))
		if _, err := c.Write([]byte(payload)); err != nil {
			res = Result{Outcome: classify(err), Err: err}
			return nil
		}
		buf := make([]byte, 2048)
		k, err := c.Read(buf)
		switch {
		case err == nil && string(buf[:k]) == payload:
			res = Result{Outcome: Answered}
		case err == nil:
			res = Result{Outcome: Silent, Err: fmt.Errorf("unexpected echo %q", buf[:k])}
		default:
			res = Result{Outcome: classify(err), Err: err}
		}
		return nil
	})
	if err != nil {
		return Result{Outcome: Silent, Err: err, Took: time.Since(start)}
	}
	res.Took = time.Since(start)
	return res
}

// Ping sends one ICMP echo to dst and waits up to wait for the reply or an ICMP unreachable that
// quotes it.
func (n *NS) Ping(dst netip.Addr, wait time.Duration) Result {
	start := time.Now()
	var res Result
	err := n.Do(func() error {
		network, proto := "ip4:icmp", 1
		var echoType, replyType, unreachType icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply,
			ipv4.ICMPTypeDestinationUnreachable
		if dst.Is6() {
			network, proto = "ip6:ipv6-icmp", 58
			echoType, replyType, unreachType = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply,
				ipv6.ICMPTypeDestinationUnreachable
		}
		c, err := icmp.ListenPacket(network, "")
		if err != nil {
			return err
		}
		defer c.Close()
		id := (os.Getpid() + int(seq.Add(1))) & 0xffff
		msg := icmp.Message{Type: echoType, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("vmon-netnstest")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			res = Result{Outcome: classify(err), Err: err}
			return nil
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 2048)
		for {
			k, _, err := c.ReadFrom(buf)
			if err != nil {
				res = Result{Outcome: Silent, Err: err}
				return nil
			}
			m, err := icmp.ParseMessage(proto, buf[:k])
			if err != nil {
				continue
			}
			switch body := m.Body.(type) {
			case *icmp.Echo:
				if m.Type == replyType && body.ID == id {
					res = Result{Outcome: Answered}
					return nil
				}
			case *icmp.DstUnreach:
				if m.Type == unreachType && quotedEchoID(body.Data, dst.Is6()) == id {
					res = Result{Outcome: Refused, ICMPCode: m.Code,
						Err: fmt.Errorf("icmp unreachable code %d", m.Code)}
					return nil
				}
			}
		}
	})
	if err != nil {
		return Result{Outcome: Silent, Err: err, Took: time.Since(start), ICMPCode: -1}
	}
	if res.Outcome != Refused {
		res.ICMPCode = -1
	}
	res.Took = time.Since(start)
	return res
}

// quotedEchoID returns the echo id of the packet an ICMP error quotes, or -1.
func quotedEchoID(data []byte, v6 bool) int {
	hdr := 40
	if !v6 {
		if len(data) < 1 {
			return -1
		}
		hdr = int(data[0]&0x0f) * 4
	}
	if len(data) < hdr+8 {
		return -1
	}
	return int(binary.BigEndian.Uint16(data[hdr+4 : hdr+6]))
}
