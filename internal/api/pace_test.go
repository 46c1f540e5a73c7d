package api

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A body that trickles in is cut off with 408 once it falls behind the minimum rate after the
// grace, so slow clients cannot hold connections and handlers open; a body that arrives in time
// (even slowly, within the grace) is served, and the connection stays usable for the next request.
func TestSlowBodyGets408(t *testing.T) {
	e := newEnv(t, envOpts{api: func(o *Options) { o.BodyGrace = 500 * time.Millisecond }})
	ts := httptest.NewServer(e.srv)
	defer ts.Close()

	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	head := func(n int) string {
		return fmt.Sprintf("POST /sandboxes/nope/timeout HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", e.key, n)
	}

	// The trickle: one byte, then nothing more within the grace.
	c, br := dial()
	body := `{"timeout": 30}`
	began := time.Now()
	if _, err := fmt.Fprint(c, head(len(body))+body[:1]); err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := 1; i < len(body); i++ {
			time.Sleep(2 * time.Second)
			if _, err := c.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to a trickling body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", resp.StatusCode)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("the trickle was held %s", took)
	}

	// In time, in two parts within the grace: served (404: no such sandbox), and the same
	// connection answers a second request (no stale deadline left on it).
	c, br = dial()
	for range 2 {
		if _, err := fmt.Fprint(c, head(len(body))+body[:5]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := fmt.Fprint(c, body[5:]); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("status %d (%s), want 404", resp.StatusCode, sb.String())
		}
		time.Sleep(700 * time.Millisecond) // past the first request's grace
	}
}
