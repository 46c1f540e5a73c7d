package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// threads is this process's OS thread count.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatal("no Threads line")
	return 0
}

// FIFOs, sockets and devices are refused by /files, reading and writing, without a thread ever
// waiting on them: 300 downloads of a FIFO nobody writes all answer, and envd's threads stay put.
func TestFilesRefuseSpecialFiles(t *testing.T) {
	e := startEnv(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct{ name, method, path string }{
		{"read a fifo", "GET", fifo},
		{"write a fifo", "POST", fifo},
		{"read a socket", "GET", sock},
		{"write a socket", "POST", sock},
		{"read /dev/zero", "GET", "/dev/zero"},
		{"write /dev/null", "POST", "/dev/null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, tc.method, e.url+"/files?path="+url.QueryEscape(tc.path), bytes.NewBufferString("x"))
			req.Header.Set("Content-Type", "application/octet-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("request did not answer: %v", err)
			}
			defer resp.Body.Close()
			var eb struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil || resp.StatusCode != 400 || eb.Code != 400 ||
				!strings.Contains(eb.Message, "not a regular file") {
				t.Fatalf("got %d %+v %v, want 400 'not a regular file'", resp.StatusCode, eb, err)
			}
		})
	}

	before := threads(t)
	var wg sync.WaitGroup
	errs := make(chan error, 300)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 32}}
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(e.url + "/files?path=" + url.QueryEscape(fifo))
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 400 {
				errs <- &url.Error{Op: "GET", URL: fifo, Err: os.ErrInvalid}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("FIFO download: %v", err)
	}
	client.CloseIdleConnections()
	// Threads this process needed for the burst (the client's side included) must be few, not
	// one per request as when each download blocked in open(2).
	if after := threads(t); after > before+64 {
		t.Fatalf("threads grew from %d to %d over 300 FIFO downloads", before, after)
	}
	// The FIFO is untouched and still usable by the guest.
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("fifo changed: %v %v", fi, err)
	}
}

// Errors net/http or ServeMux would write as plain text, and unclean paths ServeMux would
// redirect, come back in E2B's JSON shape.
func TestEnvdErrorShapes(t *testing.T) {
	e := startEnv(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		name, method, target string
		hdr                  map[string]string
		status               int
	}{
		{"unclean path", "GET", "//files?path=" + url.QueryEscape(file), nil, 404},
		{"dot segments", "GET", "/x/../files?path=" + url.QueryEscape(file), nil, 404},
		{"unknown route", "GET", "/nope", nil, 404},
		{"wrong method", "PUT", "/files", nil, 405},
		{"unsatisfiable range", "GET", "/files?path=" + url.QueryEscape(file), map[string]string{"Range": "bytes=100-"}, 416},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, e.url, nil)
			u, _ := url.Parse(tc.target)
			req.URL.Opaque, req.URL.RawQuery = u.Path, u.RawQuery
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var eb struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil || resp.StatusCode != tc.status || eb.Code != tc.status ||
				eb.Message == "" || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("got %d %q %+v %v, want %d with E2B's JSON body", resp.StatusCode, resp.Header.Get("Content-Type"), eb, err, tc.status)
			}
		})
	}
}

// procfs files report size 0 and some cannot seek: /files streams what they hold, and one that
// cannot be read at all (/proc/<pid>/mem at offset 0) is the client's 400, never a 500.
func TestFilesPseudoFiles(t *testing.T) {
	e := startEnv(t)
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(e.url + "/files?path=" + url.QueryEscape(path))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		if _, err := b.ReadFrom(resp.Body); err != nil {
			t.Fatalf("%s: read body: %v", path, err)
		}
		return resp.StatusCode, b.String()
	}
	if code, body := get("/proc/self/status"); code != 200 || !strings.Contains(body, "\nPid:") {
		t.Fatalf("/proc/self/status: %d %q, want 200 with its content", code, body)
	}
	if code, body := get(empty); code != 200 || body != "" {
		t.Fatalf("empty file: %d %q", code, body)
	}
	code, body := get("/proc/self/mem")
	var eb struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(body), &eb); err != nil || code != 400 || eb.Code != 400 || !strings.Contains(eb.Message, "cannot be read") {
		t.Fatalf("/proc/self/mem: %d %q, want 400 'cannot be read'", code, body)
	}
}
