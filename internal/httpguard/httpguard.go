// Package httpguard keeps vmon's own HTTP surfaces (the E2B API and envd) answering in E2B's
// error shape, {"code": <status>, "message": "..."} with a JSON content type, whatever a client
// sends: net/http's own plain-text answers (ServeMux 404/405, http.Error from ServeContent, the
// 400 and 431 the server writes before any handler runs) are turned into that shape, unclean
// paths get a 404 instead of ServeMux's redirect, and oversized header sections a 431. Messages
// never echo more than a short prefix of what the client sent (errdefs.Quote).
//
// It owns only the wire form of those errors. It never decides a request's outcome otherwise and
// must not wrap traffic that is not vmon's own (ingress to guest ports passes through untouched).
package httpguard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
)

// MaxHeaderBytes bounds a request's header section (request line and headers). E2B's SDK sends
// a few hundred bytes; 64 KiB leaves room for large cookies and tokens.
const MaxHeaderBytes = 64 << 10

// ServerMaxHeaderBytes is what http.Server must accept for Handler to see (and answer in JSON)
// requests over MaxHeaderBytes; past it net/http answers on its own (see Listener).
const ServerMaxHeaderBytes = 1 << 20

// Body is E2B's error body.
type Body struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// WriteError writes E2B's error body with status.
func WriteError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(Body{Code: status, Message: msg})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// Handler guards next: a request whose header section is over MaxHeaderBytes gets 431, one whose
// path is not clean gets 404 (ServeMux would redirect it, and a redirect is not an API answer),
// and any plain-text error next writes is rewritten as E2B's JSON body.
func Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := headerBytes(r); n > MaxHeaderBytes {
			WriteError(w, http.StatusRequestHeaderFieldsTooLarge,
				fmt.Sprintf("request headers are %d bytes, over the limit of %d", n, MaxHeaderBytes))
			return
		}
		if r.Method != http.MethodConnect && !cleanPath(r.URL.Path) {
			WriteError(w, http.StatusNotFound, "path "+errdefs.Quote(r.RequestURI)+" not found")
			return
		}
		jw := &jsonErrors{ResponseWriter: w}
		next.ServeHTTP(jw, r)
		jw.finish()
	})
}

// cleanPath reports whether ServeMux would serve p without redirecting: p is already in the form
// path.Clean gives it, keeping a trailing slash. An empty path is not clean: net/http parses a
// request target like "//files" as an authority with no path, which ServeMux redirects to "/".
func cleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np == p
}

// headerBytes is the size of r's header section as the client sent it (near enough: the request
// line and each header line).
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// jsonErrors rewrites a plain-text error response (http.Error, ServeMux's 404 and 405) as E2B's
// JSON body; every other response passes through untouched, streaming included.
type jsonErrors struct {
	http.ResponseWriter
	status  int
	capture bool
	buf     bytes.Buffer
	wrote   bool
}

func (w *jsonErrors) WriteHeader(status int) {
	if status < 200 { // informational (100 Continue, 103): more headers follow
		w.ResponseWriter.WriteHeader(status)
		return
	}
	if w.wrote {
		return
	}
	w.wrote = true
	if status >= 400 && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.status, w.capture = status, true
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *jsonErrors) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.capture {
		if w.buf.Len() < 4096 {
			w.buf.Write(p[:min(len(p), 4096-w.buf.Len())])
		}
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Flush passes through, except while an error body is being captured.
func (w *jsonErrors) Flush() {
	if w.capture {
		return
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer (hijacking, deadlines).
func (w *jsonErrors) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *jsonErrors) finish() {
	if !w.capture {
		return
	}
	msg := strings.TrimSpace(w.buf.String())
	if msg == "" {
		msg = http.StatusText(w.status)
	}
	w.ResponseWriter.Header().Del("X-Content-Type-Options")
	WriteError(w.ResponseWriter, w.status, msg)
}
