// Package agentproto holds the facts both ends of the agent channel agree on: where its sockets
// are, how streams are multiplexed and how a guest port is tunnelled. It is imported by envd (guest) and
// by the node (host), so it must stay free of any other vmon package and of OS-specific code.
//
// The channel: envd runs a yamux *server* session on a stream socket and serves its whole HTTP
// API (REST + Connect RPC) on the streams the node opens; the node runs the yamux *client*
// session. Each stream is one HTTP/1.1 connection. A request with method CONNECT and authority
// "127.0.0.1:<port>" (TunnelAuthority) turns the stream into a raw TCP tunnel to that guest port,
// which is how ingress reaches guest services without the guest network.
//
// How envd gets the stream socket, two ways:
//   - Control socket (envd --agent-fd): the node gives envd a control socket as a descriptor at
//     start and sends it one stream socket per session (internal/agentctl); a checkpoint keeps
//     the control socket, and envd lets go of its session before one. A new control socket
//     reaches a running envd over HandoffSocket. Nothing is shared with the host's filesystem.
//   - Dialled socket (envd --agent-socket, sandboxes checkpointed by older vmon): the node
//     listens on a unix socket in a per-sandbox host directory bind mounted at GuestDir; envd
//     dials GuestSocket, and redials on EOF because checkpoint/restore breaks the connection.
package agentproto

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

const (
	// GuestDir is where the per-sandbox agent directory is mounted in the guest.
	GuestDir = "/run/vmon"
	// SocketName is the socket's file name inside the agent directory.
	SocketName = "agent.sock"
	// GuestSocket is the socket path as envd sees it.
	GuestSocket = GuestDir + "/" + SocketName
	// HandoffSocket is where envd with a control socket takes a new one (`envd handoff`), in a
	// directory only the guest's root may enter.
	HandoffSocket = GuestDir + "/handoff.sock"
	// EnvdPort is the port clients address envd with (E2B's fixed port).
	EnvdPort = 49983
	// EnvdVersion is the envd protocol version envd reports; ≥ 0.6.4 enables every SDK feature.
	EnvdVersion = "0.6.13"
)

// EndStreamsPath is vmon's own envd endpoint (POST, access token required) that ends every open
// process event stream with a reason before the node freezes the sandbox (EndStreamsRequest).
const EndStreamsPath = "/vmon/end-streams"

// The reasons EndStreamsRequest may give.
const (
	// EndStreamsPause: a pause that keeps memory; the processes go on after the resume.
	EndStreamsPause = "pause"
	// EndStreamsPauseFiles: a pause that keeps files only; the processes end.
	EndStreamsPauseFiles = "pause-files"
	// EndStreamsSnapshot: a snapshot or fork; the sandbox goes on at once.
	EndStreamsSnapshot = "snapshot"
)

// EndStreamsRequest is EndStreamsPath's body.
type EndStreamsRequest struct {
	Reason string `json:"reason"`
}

// MemoryHintPath is vmon's own envd endpoint (POST, access token required) by which the node
// tells envd whether the sandbox is near its memory (MemoryHint), from its host cgroup's use: an
// idle guest then need not poll its own memory often. An envd too old to know it answers 404.
const MemoryHintPath = "/vmon/memory-hint"

// MemoryHint is MemoryHintPath's body.
type MemoryHint struct {
	Near bool `json:"near"`
}

// TunnelAuthority is the CONNECT authority that asks envd for a tunnel to a guest loopback port.
func TunnelAuthority(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// YamuxConfig is the session configuration both ends use.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	// No keepalive: the channel is a unix socket between two processes on one host, so a peer
	// that goes away (a sandbox killed or checkpointed, a node restarted) ends the session at
	// once with EOF; a ping would find nothing more. Pings every 10 s from both ends were most
	// of an idle sandbox's wake-ups, each one a round of host context switches for its sentry.
	c.EnableKeepAlive = false
	c.ConnectionWriteTimeout = 30 * time.Second
	// Large windows keep bulk file transfers from stalling on one stream.
	c.MaxStreamWindowSize = 4 << 20
	c.LogOutput = nil
	c.Logger = nopLogger{}
	return c
}

type nopLogger struct{}

func (nopLogger) Print(...any)          {}
func (nopLogger) Printf(string, ...any) {}
func (nopLogger) Println(...any)        {}

// FileSignature computes E2B's v1 signature of a /files URL: "v1_" + unpadded base64 of the
// SHA-256 of "<path>:<operation>:<user>:<token>[:<expiration>]". The node uses it to find which
// sandbox a header-less signed URL belongs to; envd uses it to check the URL.
func FileSignature(path, operation, user, token string, expiration int64) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != 0 {
		raw += ":" + strconv.FormatInt(expiration, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// EventsPath is vmon's own envd endpoint (GET, access token required) that streams what envd
// saw happen in the guest, as GuestEvent JSON lines, for the node to copy into the sandbox's log.
// Query: after (the last Seq the reader has, 0 for all) and boot (the BootHeader value that Seq
// belongs to; another boot's cursor reads from the start). The stream stays open and carries new
// events as they happen, unless the query has EventsDrain=1: then it carries what envd holds at
// once and ends (the node's last read before it destroys the sandbox).
const EventsPath = "/vmon/events"

// EventsDrain is the EventsPath query parameter that asks for what envd holds now, without
// waiting for more.
const EventsDrain = "drain"

// BootHeader, on an EventsPath response, names envd's boot: its events' Seq restart with it.
const BootHeader = "X-Vmon-Boot"

// StartCmdTag is the process tag the node gives a template's start command, so envd can tell it
// from other processes and report its output too.
const StartCmdTag = InternalTagPrefix + "start-cmd"

// InternalTagPrefix starts the process tags of commands the node runs itself (other than the
// start command), which envd logs at debug level only.
const InternalTagPrefix = "vmon-"

// Loggers of envd's events, in E2B's style. The node files an event naming any other logger as
// guestSvc, so a guest that replaced envd cannot pass its events off as the host's
// (lifecycleSvc, egressSvc, logsSvc).
const (
	ProcessLogger = "processSvc"
	LimitsLogger  = "limitsSvc"
)

// GuestEvent is one thing envd reports about the guest.
type GuestEvent struct {
	// Seq orders a boot's events from 1; a reader resumes after the last one it kept.
	Seq uint64 `json:"seq"`
	// Sandbox is the sandbox envd served when the event happened (the vmonSandboxID of the last
	// /init): a sandbox restored from another's snapshot inherits its events and must skip them.
	Sandbox string            `json:"sandbox,omitempty"`
	Time    time.Time         `json:"time"`
	Level   string            `json:"level"`
	Logger  string            `json:"logger"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
}

// ConnectTunnel asks the far end of conn for a tunnel to authority (HTTP/1.1 CONNECT) and returns
// the tunnel: conn itself, or conn with what the far end sent early when it did. On error conn
// is closed. The agent channel (to a guest port) and a node's sandbox tunnels (to a sandbox on
// another machine) both speak it.
func ConnectTunnel(conn net.Conn, authority string) (net.Conn, error) {
	// ReadResponse only needs the method, to know a CONNECT reply has no body.
	req := &http.Request{Method: http.MethodConnect}
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority); err != nil {
		conn.Close()
		return nil, fmt.Errorf("send tunnel request: %w", err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("read tunnel response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		conn.Close()
		return nil, &TunnelError{Status: resp.StatusCode, Text: resp.Status}
	}
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// TunnelError is a CONNECT the far end refused.
type TunnelError struct {
	Status int
	Text   string
}

func (e *TunnelError) Error() string { return "tunnel refused: " + e.Text }

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// ServeTunnel answers a CONNECT whose target is already open: it takes over the client's
// connection, says 200, and copies bytes both ways until both sides are done. When one side
// finishes sending, only that direction is closed (half-close), so protocols that shut their
// write side keep working. The caller closes nothing; on error target is closed.
func ServeTunnel(w http.ResponseWriter, target net.Conn) error {
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = target.Close()
		http.Error(w, "tunnels need HTTP/1.1", http.StatusHTTPVersionNotSupported)
		return errors.New("the connection cannot be hijacked")
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		_ = target.Close()
		return fmt.Errorf("hijack: %w", err)
	}
	if _, err := client.Write([]byte("HTTP/1.1 200 OK\r\n\r\n")); err != nil {
		_ = client.Close()
		_ = target.Close()
		return err
	}
	// Bytes the client sent right after the request may already sit in the server's buffer.
	var fromClient io.Reader = client
	if n := buf.Reader.Buffered(); n > 0 {
		early, _ := buf.Reader.Peek(n)
		fromClient = io.MultiReader(bytes.NewReader(bytes.Clone(early)), client)
	}
	splice(client, fromClient, target)
	return nil
}

func splice(client net.Conn, fromClient io.Reader, target net.Conn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(target, fromClient)
		closeWrite(target)
	}()
	_, err := io.Copy(client, target)
	closeWrite(client)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		// The target side broke: the client will not get more data, so stop both directions.
		_ = client.Close()
		_ = target.Close()
	}
	wg.Wait()
	_ = client.Close()
	_ = target.Close()
}

// closeWrite half-closes c. A yamux stream has no CloseWrite: its Close sends FIN and keeps
// receiving until the peer closes too, which is the same thing.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
