package nodeapi

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
)

// Sandbox traffic between a driver's edge and the node that holds the sandbox goes through
// tunnels: the driver opens a TLS connection to the node and asks (HTTP/1.1 CONNECT
// "<sandbox id>:<guest port>") for a raw byte stream to that port, or, for agentproto.EnvdPort,
// to envd's own HTTP listener on the agent channel. Nothing is parsed or buffered on the way, so
// streamed output, uploads, WebSockets and HTTP/2 pass as they are.

// Tunnels is what a node gives a tunnel for one sandbox (agent.Channel).
type Tunnels interface {
	DialPort(ctx context.Context, port int) (net.Conn, error)
	DialEnvd(ctx context.Context) (net.Conn, error)
}

// TunnelHandler is a node's end: it serves CONNECT requests for the sandboxes lookup finds.
type TunnelHandler struct {
	Lookup func(id string) (Tunnels, bool)
}

var sandboxIDRe = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

func (h TunnelHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "tunnels are CONNECT requests", http.StatusMethodNotAllowed)
		return
	}
	host, p, err := net.SplitHostPort(r.Host)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil || port < 1 || port > 65535 || !sandboxIDRe.MatchString(host) {
		http.Error(w, "the tunnel target is <sandbox id>:<guest port>", http.StatusBadRequest)
		return
	}
	t, ok := h.Lookup(host)
	if !ok {
		http.Error(w, "sandbox not found on this node", http.StatusNotFound)
		return
	}
	var up net.Conn
	if port == agentproto.EnvdPort {
		up, err = t.DialEnvd(r.Context())
	} else {
		up, err = t.DialPort(r.Context(), port)
	}
	if err != nil {
		http.Error(w, "the sandbox's port cannot be reached", http.StatusBadGateway)
		return
	}
	_ = agentproto.ServeTunnel(w, up)
}

// TunnelDialer is a driver's end: it opens tunnels to sandboxes on one node.
type TunnelDialer struct {
	// Addr is the node's host:port; TLS its mutual TLS configuration (join.MutualTLS).
	Addr string
	TLS  *tls.Config
}

// Dial opens a tunnel to port of sandbox id (agentproto.EnvdPort: envd's HTTP listener). A
// sandbox the node does not hold is NotFound; a port nothing listens on is Unavailable.
func (d TunnelDialer) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	conf := d.TLS.Clone()
	// CONNECT needs HTTP/1.1: the node must not pick HTTP/2 for this connection.
	conf.NextProtos = []string{"http/1.1"}
	conn, err := (&tls.Dialer{Config: conf}).DialContext(ctx, "tcp", d.Addr)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.KindUnavailable, err, "the node holding sandbox %q cannot be reached", id)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	tunnel, err := agentproto.ConnectTunnel(conn, net.JoinHostPort(id, strconv.Itoa(port)))
	var te *agentproto.TunnelError
	switch {
	case errors.As(err, &te) && te.Status == http.StatusNotFound:
		return nil, errdefs.NotFound("sandbox %q is not on its node", id)
	case errors.As(err, &te):
		return nil, errdefs.Wrap(errdefs.KindUnavailable, err, "port %d of sandbox %q cannot be reached", port, id)
	case err != nil:
		return nil, errdefs.Wrap(errdefs.KindUnavailable, err, "the node holding sandbox %q cannot be reached", id)
	}
	_ = conn.SetDeadline(time.Time{})
	return tunnel, nil
}
