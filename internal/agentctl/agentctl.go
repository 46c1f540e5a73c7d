//go:build linux

// Package agentctl owns the control socket of the agent channel: how the node hands envd the
// stream sockets its sessions run on, how envd says it let one go, and how a new control socket
// reaches a running envd. Both ends import it: the node (internal/agent) and envd
// (internal/envd/channel). It carries descriptors and session numbers only; it never touches
// HTTP, yamux or the sandbox's runtime.
//
// Why a control socket: the node gives envd one end of a socket pair as a descriptor when the
// sandbox starts (no host directory shared with the guest, so no file server beside it). A
// checkpoint saves that descriptor by number and a restore gives the number a new host socket,
// so the control socket lasts across pause and resume. A session's stream socket does not: a
// checkpoint cannot save a host socket it did not get at start. So each session gets a stream
// socket of its own, sent over the control socket, and envd closes it before every checkpoint.
//
// The wire: a SOCK_SEQPACKET socket pair, one message per event, MessageSize bytes each: a kind
// byte and a big-endian session number.
//   - node → envd, kindOffer with one descriptor (SCM_RIGHTS): serve a session on this stream
//     socket, ending the one before.
//   - envd → node, kindEnded: envd closed that session's socket and holds nothing of it.
//
// A control socket that reaches envd after start (the node restarted and its end of the first
// one is gone) comes over an in-guest unix socket only root can reach (Listen, Handoff).
package agentctl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MessageSize is the size of every control message.
const MessageSize = 5

const (
	kindOffer = 'S'
	kindEnded = 'E'
)

// Conn is one end of a control socket.
type Conn struct {
	c *net.UnixConn
}

// Pair makes a control socket: the node keeps host; guest is for envd, as a descriptor its
// process starts with (runtime.Spec.Files). The caller closes guest once the runtime has it.
func Pair() (host *Conn, guest *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("control socket pair: %w", err)
	}
	guest = os.NewFile(uintptr(fds[1]), "agent-control")
	host, err = FromFile(os.NewFile(uintptr(fds[0]), "agent-control"))
	if err != nil {
		guest.Close()
		return nil, nil, err
	}
	return host, guest, nil
}

// FromFile makes a Conn of a control socket descriptor and closes f: the Conn holds its own
// copy, marked close-on-exec, so no process envd starts inherits it.
func FromFile(f *os.File) (*Conn, error) {
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("control socket: descriptor %d is a %T, not a unix socket", f.Fd(), c)
	}
	return &Conn{c: uc}, nil
}

// Close closes this end.
func (c *Conn) Close() error { return c.c.Close() }

// Offer makes a stream socket pair for session n, sends one end to envd and returns the other.
func (c *Conn) Offer(n uint32) (net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("session socket pair: %w", err)
	}
	remote := os.NewFile(uintptr(fds[1]), "agent-session")
	defer remote.Close() // in flight, the message holds its own reference
	local, err := conn(os.NewFile(uintptr(fds[0]), "agent-session"))
	if err != nil {
		return nil, err
	}
	msg := message(kindOffer, n)
	wn, _, err := c.c.WriteMsgUnix(msg, unix.UnixRights(fds[1]), nil)
	if err == nil && wn != len(msg) {
		err = fmt.Errorf("short write (%d of %d bytes)", wn, len(msg))
	}
	if err != nil {
		local.Close()
		return nil, fmt.Errorf("offer session %d: %w", n, err)
	}
	return local, nil
}

// ErrProtocol marks a control message that broke the protocol: the socket itself still works.
var ErrProtocol = errors.New("control message")

// Next waits for the node's next session and returns its number and stream socket. A message
// without exactly one descriptor is an ErrProtocol; Next drops what came with it, and the caller
// may go on reading. Any other error means the socket is of no more use.
func (c *Conn) Next() (uint32, net.Conn, error) {
	buf := make([]byte, MessageSize+1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	bn, oobn, flags, _, err := c.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, err
	}
	fds, perr := rights(oob[:oobn])
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "agent-session")
	}
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	switch {
	case bn == 0:
		closeAll()
		return 0, nil, errEOF
	case perr != nil:
		closeAll()
		return 0, nil, fmt.Errorf("%w: %w", ErrProtocol, perr)
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || bn != MessageSize || buf[0] != kindOffer:
		closeAll()
		return 0, nil, fmt.Errorf("%w: not a session offer (%d bytes, kind %q, flags %#x)", ErrProtocol, bn, buf[0], flags)
	case len(files) != 1:
		closeAll()
		return 0, nil, fmt.Errorf("%w: a session offer with %d descriptors", ErrProtocol, len(files))
	}
	n := binary.BigEndian.Uint32(buf[1:MessageSize])
	sc, err := conn(files[0])
	if err != nil {
		return 0, nil, fmt.Errorf("%w: session %d: %w", ErrProtocol, n, err)
	}
	return n, sc, nil
}

// Ended tells the node that session n's socket is closed.
func (c *Conn) Ended(n uint32) error {
	_, err := c.c.Write(message(kindEnded, n))
	return err
}

// NextEnded waits for envd to report a session ended and returns its number. Messages that are
// not such a report (a guest that does not keep to the protocol) are skipped.
func (c *Conn) NextEnded() (uint32, error) {
	buf := make([]byte, MessageSize+1)
	for {
		// Any descriptors a guest sends are dropped: ReadMsgUnix with no room for them makes
		// the kernel close them (MSG_CTRUNC).
		bn, _, _, _, err := c.c.ReadMsgUnix(buf, nil)
		if err != nil {
			return 0, err
		}
		if bn == 0 {
			return 0, errEOF
		}
		if bn == MessageSize && buf[0] == kindEnded {
			return binary.BigEndian.Uint32(buf[1:MessageSize]), nil
		}
	}
}

// errEOF is what a read of a control socket whose other end is gone returns: a zero-length
// read of a SOCK_SEQPACKET socket is its peer's close (net returns io.EOF for most of them).
var errEOF = fmt.Errorf("control socket: %w", io.EOF)

func message(kind byte, n uint32) []byte {
	b := make([]byte, MessageSize)
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:], n)
	return b
}

// rights returns the descriptors an SCM_RIGHTS control message carries.
func rights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	var bad error
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			bad = err
			continue
		}
		fds = append(fds, got...)
	}
	return fds, bad
}

// conn makes a net.Conn of a stream socket and closes f.
func conn(f *os.File) (net.Conn, error) {
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("session socket: %w", err)
	}
	return c, nil
}

// Listener is envd's in-guest socket for control sockets that come after start.
type Listener struct {
	ln *net.UnixListener
}

// Listen creates the handoff socket at path, in a directory only root may enter (created or
// made so), replacing a stale socket.
func Listen(path string) (*Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("handoff socket directory: %w", err)
	}
	// MkdirAll leaves an existing directory's mode alone; the template may have made it.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("handoff socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale handoff socket: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("handoff socket: %w", err)
	}
	return &Listener{ln: ln}, nil
}

// Close stops accepting and removes the socket.
func (l *Listener) Close() error { return l.ln.Close() }

// handoffTimeout bounds one handoff connection: the helper sends at once.
const handoffTimeout = 5 * time.Second

// Accept waits for the next control socket handed over. A connection that sends no control
// socket is answered with an error and Accept goes on waiting.
func (l *Listener) Accept() (*Conn, error) {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			return nil, err
		}
		ctl, err := receive(c)
		if err != nil {
			_, _ = c.Write([]byte("error: " + err.Error() + "\n"))
			c.Close()
			continue
		}
		_, _ = c.Write([]byte("ok\n"))
		c.Close()
		return ctl, nil
	}
}

func receive(c *net.UnixConn) (*Conn, error) {
	_ = c.SetDeadline(time.Now().Add(handoffTimeout))
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	fds, err := rights(oob[:oobn])
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, err
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("want one control socket, got %d descriptors", len(fds))
	}
	if t, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_SEQPACKET {
		unix.Close(fds[0])
		return nil, fmt.Errorf("the descriptor handed over is not a control socket (type %d, %v)", t, err)
	}
	return FromFile(os.NewFile(uintptr(fds[0]), "agent-control"))
}

// Handoff sends control to the envd listening at path and waits for its answer. It is what the
// `envd handoff` helper the node runs in the sandbox does.
func Handoff(path string, control *os.File) error {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("reach envd: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(handoffTimeout))
	if _, _, err := c.WriteMsgUnix([]byte{kindOffer}, unix.UnixRights(int(control.Fd())), nil); err != nil {
		return fmt.Errorf("hand the control socket over: %w", err)
	}
	answer := make([]byte, 256)
	n, err := c.Read(answer)
	if err != nil {
		return fmt.Errorf("envd's answer: %w", err)
	}
	if got := string(answer[:n]); got != "ok\n" {
		return fmt.Errorf("envd refused the control socket: %s", got)
	}
	return nil
}

// IsClosed reports whether err means the control socket's other end is gone, as opposed to a
// message that broke the protocol.
func IsClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EBADF)
}
