package channel

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
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
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = target.Close()
		http.Error(w, "connection cannot be hijacked", http.StatusInternalServerError)
		return
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		_ = target.Close()
		log.Warn("tunnel hijack failed", "err", err)
		return
	}
	if _, err := client.Write([]byte("HTTP/1.1 200 OK\r\n\r\n")); err != nil {
		_ = client.Close()
		_ = target.Close()
		return
	}
	// Bytes the client sent right after the request may already sit in the server's buffer.
	var fromClient io.Reader = client
	if n := buf.Reader.Buffered(); n > 0 {
		early, _ := buf.Reader.Peek(n)
		fromClient = io.MultiReader(bytes.NewReader(bytes.Clone(early)), client)
	}
	splice(client, fromClient, target)
}

// splice copies both ways. When one side finishes sending, only that direction is closed
// (half-close), so request/response protocols that shut down their write side keep working.
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
		// The guest side broke: the client will not get more data, so stop both directions.
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
