package httpguard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
)

// Listener wraps a plain-TCP listener so that the error responses net/http writes by itself,
// before any handler runs (400 for a malformed request, 431 for headers over the server's
// MaxHeaderBytes, 505, ...), carry E2B's JSON body instead of plain text. net/http writes those
// in one piece straight to the connection, always with serverErrorHeaders in this order; its
// regular responses sort their headers (Connection before Content-Type) and so never contain that
// sequence. Over TLS the connection net/http writes to is the tls.Conn, which this cannot wrap
// without hiding TLS from the server: there such errors stay plain text.
func Listener(ln net.Listener) net.Listener { return listener{ln} }

// serverErrorHeaders is what net/http's server puts between the status line and the body of the
// errors it writes itself (net/http/server.go, errorHeaders).
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return conn{c}, nil
}

type conn struct{ net.Conn }

func (c conn) Write(p []byte) (int, error) {
	if out, ok := rewriteServerError(p); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// rewriteServerError turns one of net/http's own plain-text error responses into the same status
// with E2B's JSON body; ok is false for anything else.
func rewriteServerError(p []byte) ([]byte, bool) {
	rest, found := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !found || len(rest) < 4 || rest[3] != ' ' {
		return nil, false
	}
	statusLine, body, found := bytes.Cut(rest, []byte(serverErrorHeaders))
	if !found {
		return nil, false
	}
	code, err := strconv.Atoi(string(statusLine[:3]))
	if err != nil || code < 400 || code > 599 {
		return nil, false
	}
	msg := string(bytes.TrimSpace(body))
	b, _ := json.Marshal(Body{Code: code, Message: msg})
	return fmt.Appendf(nil, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		statusLine, len(b), b), true
}
