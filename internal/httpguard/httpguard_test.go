package httpguard

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestCleanPath(t *testing.T) {
	for p, want := range map[string]bool{
		"/": true, "/files": true, "/sandboxes/abc": true, "/a/b/": true, "": false,
		"//files": false, "/a/../files": false, "/./files": false, "/files/.": false, "/a//b": false, "files": false,
	} {
		if got := cleanPath(p); got != want {
			t.Errorf("cleanPath(%q) = %v, want %v", p, got, want)
		}
	}
}

// decodeError checks an E2B error body.
func decodeError(t *testing.T, resp *http.Response, status int) Body {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body Body
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/json" ||
		json.Unmarshal(b, &body) != nil || body.Code != status || body.Message == "" {
		t.Fatalf("got %d %q %s, want %d with E2B's JSON body", resp.StatusCode, resp.Header.Get("Content-Type"), b, status)
	}
	return body
}

func TestHandler(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /files", func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "f", time.Time{}, strings.NewReader("hello"))
	})
	mux.HandleFunc("POST /ok", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprint(w, `{"ok":true}`)
	})
	srv := httptest.NewServer(Handler(mux))
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest(method, srv.URL, nil)
		req.URL.Opaque = path // send the path exactly as given, unclean ones included
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	decodeError(t, do("GET", "//files", nil), 404)
	decodeError(t, do("GET", "/a/../files", nil), 404)
	decodeError(t, do("GET", "/nope", nil), 404)                                          // ServeMux's plain 404
	decodeError(t, do("DELETE", "/files", nil), 405)                                      // ServeMux's plain 405
	decodeError(t, do("GET", "/files", map[string]string{"Range": "bytes=100-200"}), 416) // ServeContent's http.Error
	decodeError(t, do("GET", "/files", map[string]string{"X-Big": strings.Repeat("a", MaxHeaderBytes)}), 431)

	resp := do("GET", "/files", map[string]string{"Range": "bytes=1-2"})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 206 || string(b) != "el" {
		t.Fatalf("range request: %d %q", resp.StatusCode, b)
	}
	resp = do("POST", "/ok", nil)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(b) != `{"ok":true}` {
		t.Fatalf("plain success altered: %d %q", resp.StatusCode, b)
	}
}

// net/http's own errors (before any handler) come out as JSON through Listener.
func TestListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(204)
	}), MaxHeaderBytes: 4096}
	go func() { _ = srv.Serve(Listener(ln)) }()
	defer srv.Close()
	raw := func(req string) *http.Response {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		return resp
	}
	decodeError(t, raw("GET / HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 16<<10)+"\r\n\r\n"), 431)
	decodeError(t, raw("GARBAGE\r\n\r\n"), 400)
	decodeError(t, raw("GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"), 501)
	resp := raw("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != 204 {
		t.Fatalf("normal request through the listener: %d", resp.StatusCode)
	}
}

func TestRewriteLeavesRegularResponses(t *testing.T) {
	for _, p := range []string{
		"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: x\r\n\r\n404 page not found\n",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nok",
		"hello",
	} {
		if _, ok := rewriteServerError([]byte(p)); ok {
			t.Errorf("rewrote a regular response: %q", p)
		}
	}
}
