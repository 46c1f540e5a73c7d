package channel

import (
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
)

// Tunnel returns a handler that serves CONNECT 127.0.0.1:<port> itself, as a raw TCP tunnel to
// that port on the guest's loopback, and passes every other request to next. Only loopback
// targets are allowed: the channel is how the node reaches guest services, not a general proxy.
func Tunnel(next http.Handler, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			next.ServeHTTP(w, r)
			return
		}
		tunnel(w, r, log)
	})
}

func tunnel(w http.ResponseWriter, r *http.Request, log *slog.Logger) {
	host, portStr, err := net.SplitHostPort(r.Host)
	if err != nil {
		http.Error(w, "CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	if host != "127.0.0.1" {
		http.Error(w, "only CONNECT to 127.0.0.1 is allowed", http.StatusForbidden)
		return
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		http.Error(w, "invalid port", http.StatusBadRequest)
		return
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	target, err := d.DialContext(r.Context(), "tcp", net.JoinHostPort(host, portStr))
	if err != nil {
		log.Debug("tunnel dial failed", "port", port, "err", err)
		http.Error(w, "cannot reach guest port "+portStr, http.StatusBadGateway)
		return
	}
	if err := agentproto.ServeTunnel(w, target); err != nil {
		log.Warn("tunnel failed", "port", port, "err", err)
	}
}
