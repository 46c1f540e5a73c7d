package server_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/vibemon/vmon/internal/envd/gen/filesystem"
)

type uploaded struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata"`
}

// multipartBody builds a body like the SDK's: field "file", filename = target path with dirs.
func multipartBody(t *testing.T, files [][2]string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, f[0]))
		h.Set("Content-Type", "application/octet-stream")
		pw, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = pw.Write([]byte(f[1]))
	}
	// A part with another field name is ignored.
	_ = mw.WriteField("other", "ignored")
	_ = mw.Close()
	return mw.FormDataContentType(), &buf
}

func doRequest(t *testing.T, method, url, contentType string, body io.Reader, hdr map[string]string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

func statOwner(t *testing.T, path string) (uid, gid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

func TestFilesMultipart(t *testing.T) {
	u := needTestUser(t)
	e := startEnv(t)
	abs := filepath.Join(t.TempDir(), "abs", "a.txt")
	ct, body := multipartBody(t, [][2]string{{abs, "alpha"}, {"rel/b.txt", "bravo"}})
	status, resp, _ := doRequest(t, "POST", e.url+"/files?username="+u.Name, ct, body, nil)
	if status != http.StatusOK {
		t.Fatalf("upload: %d %s", status, resp)
	}
	var got []uploaded
	if err := json.Unmarshal(resp, &got); err != nil {
		t.Fatal(err)
	}
	rel := filepath.Join(u.Home, "rel", "b.txt")
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(rel)) })
	if len(got) != 2 || !reflect.DeepEqual(got, []uploaded{{Path: abs, Name: "a.txt", Type: "file"}, {Path: rel, Name: "b.txt", Type: "file"}}) {
		t.Fatalf("response %s", resp)
	}
	for _, p := range []string{abs, rel, filepath.Dir(abs), filepath.Dir(rel)} {
		uid, gid, mode := statOwner(t, p)
		wantMode := os.FileMode(0o644)
		if mode.IsDir() {
			wantMode = os.ModeDir | 0o755
		}
		if uid != u.UID || gid != u.GID || mode != wantMode {
			t.Errorf("%s: owner %d:%d mode %v, want %d:%d %v", p, uid, gid, mode, u.UID, u.GID, wantMode)
		}
	}
	status, data, hdr := doRequest(t, "GET", e.url+"/files?path=rel/b.txt&username="+u.Name, "", nil, nil)
	if status != http.StatusOK || string(data) != "bravo" || hdr.Get("Content-Disposition") != "inline; filename=b.txt" {
		t.Fatalf("download: %d %q %v", status, data, hdr)
	}
	// Single-file write: the path query wins over the filename; overwrite truncates.
	ct, body = multipartBody(t, [][2]string{{"ignored-name.txt", "a"}})
	status, resp, _ = doRequest(t, "POST", e.url+"/files?path="+url.QueryEscape(abs), ct, body, nil)
	if status != http.StatusOK {
		t.Fatalf("single upload: %d %s", status, resp)
	}
	if b, _ := os.ReadFile(abs); string(b) != "a" {
		t.Fatalf("overwrite: %q", b)
	}
	// Two parts for one path are refused.
	ct, body = multipartBody(t, [][2]string{{abs, "1"}, {abs, "2"}})
	if status, resp, _ := doRequest(t, "POST", e.url+"/files", ct, body, nil); status != http.StatusBadRequest {
		t.Fatalf("duplicate parts: %d %s", status, resp)
	}
}

func TestFilesOctetStreamGzipMetadata(t *testing.T) {
	e := startEnv(t)
	path := filepath.Join(t.TempDir(), "deep", "z.bin")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	payload := bytes.Repeat([]byte("0123456789"), 10000)
	_, _ = zw.Write(payload)
	_ = zw.Close()
	status, resp, _ := doRequest(t, "POST", e.url+"/files?path="+url.QueryEscape(path), "application/octet-stream", &gz,
		map[string]string{"Content-Encoding": "gzip", "X-Metadata-Owner": "alice", "X-Metadata-Build-Id": "42"})
	if status != http.StatusOK {
		t.Fatalf("upload: %d %s", status, resp)
	}
	var got []uploaded
	_ = json.Unmarshal(resp, &got)
	if len(got) != 1 || got[0].Path != path || got[0].Metadata["owner"] != "alice" || got[0].Metadata["build-id"] != "42" {
		t.Fatalf("response %s", resp)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, payload) {
		t.Fatalf("content mismatch (%d bytes)", len(b))
	}
	st, err := e.fsJSON.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: path}))
	if err != nil || st.Msg.GetEntry().GetMetadata()["owner"] != "alice" {
		t.Fatalf("stat metadata: %v %v", st, err)
	}
	// Each upload replaces the set.
	status, _, _ = doRequest(t, "POST", e.url+"/files?path="+url.QueryEscape(path), "application/octet-stream", bytes.NewBufferString("x"),
		map[string]string{"X-Metadata-Owner": "bob"})
	st, err = e.fsBin.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: path}))
	if status != http.StatusOK || err != nil || len(st.Msg.GetEntry().GetMetadata()) != 1 || st.Msg.GetEntry().GetMetadata()["owner"] != "bob" {
		t.Fatalf("metadata replace: %d %v %v", status, st, err)
	}
	// GET returns the bytes uncompressed, whatever Accept-Encoding says.
	status, data, _ := doRequest(t, "GET", e.url+"/files?path="+url.QueryEscape(path), "", nil, map[string]string{"Accept-Encoding": "gzip, deflate"})
	if status != http.StatusOK || string(data) != "x" {
		t.Fatalf("download: %d %q", status, data)
	}
}

func TestFilesErrors(t *testing.T) {
	e := startEnv(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, method, target, ct string
		body                     string
		hdr                      map[string]string
		status                   int
	}{
		{"missing file", "GET", "/files?path=" + url.QueryEscape(dir+"/nope"), "", "", nil, 404},
		{"directory", "GET", "/files?path=" + url.QueryEscape(dir), "", "", nil, 400},
		{"unknown user", "GET", "/files?path=/etc/hostname&username=no-such-user-envd", "", "", nil, 401},
		{"octet-stream without path", "POST", "/files", "application/octet-stream", "x", nil, 400},
		{"upload onto a directory", "POST", "/files?path=" + url.QueryEscape(dir), "application/octet-stream", "x", nil, 400},
		{"unsupported encoding", "POST", "/files?path=" + url.QueryEscape(dir+"/f"), "application/octet-stream", "x", map[string]string{"Content-Encoding": "br"}, 406},
		{"unsupported content type", "POST", "/files?path=" + url.QueryEscape(dir+"/f"), "text/plain", "x", nil, 400},
		{"bad gzip", "POST", "/files?path=" + url.QueryEscape(dir+"/f"), "application/octet-stream", "not gzip", map[string]string{"Content-Encoding": "gzip"}, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, hdr := doRequest(t, tc.method, e.url+tc.target, tc.ct, bytes.NewBufferString(tc.body), tc.hdr)
			var eb struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if status != tc.status || json.Unmarshal(body, &eb) != nil || eb.Code != tc.status || eb.Message == "" ||
				hdr.Get("Content-Type") != "application/json" {
				t.Fatalf("got %d %s, want %d", status, body, tc.status)
			}
		})
	}
	status, body, _ := doRequest(t, "GET", e.url+"/files?path="+url.QueryEscape(dir+"/nope"), "", nil, nil)
	if want := fmt.Sprintf(`{"code":404,"message":"path '%s/nope' does not exist"}`, dir); status != 404 || string(bytes.TrimSpace(body)) != want {
		t.Fatalf("404 body %s, want %s", body, want)
	}
}

// sign is the SDK's URL signature (e2b getSignature), computed independently of envd's code.
func sign(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

func TestFilesSignedURLs(t *testing.T) {
	e := startEnv(t)
	const token = "tok-signed"
	e.initEnvd(t, map[string]any{"accessToken": token})
	path := filepath.Join(t.TempDir(), "s.txt")
	if err := os.WriteFile(path, []byte("signed"), 0o644); err != nil {
		t.Fatal(err)
	}
	q := func(op string, exp int64, sig string) string {
		v := url.Values{"path": {path}, "signature": {sig}}
		if exp != 0 {
			v.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		return e.url + "/files?" + v.Encode()
	}
	future, past := time.Now().Unix()+60, time.Now().Unix()-60
	if status, body, _ := doRequest(t, "GET", q("read", 0, sign(path, "read", "", token, 0)), "", nil, nil); status != 200 || string(body) != "signed" {
		t.Fatalf("signed download: %d %s", status, body)
	}
	if status, _, _ := doRequest(t, "GET", q("read", future, sign(path, "read", "", token, future)), "", nil, nil); status != 200 {
		t.Fatalf("unexpired signed download: %d", status)
	}
	for name, target := range map[string]string{
		"expired":    q("read", past, sign(path, "read", "", token, past)),
		"bad":        q("read", 0, "v1_bogus"),
		"wrong op":   q("read", 0, sign(path, "write", "", token, 0)),
		"no sig":     e.url + "/files?path=" + url.QueryEscape(path),
		"other user": q("read", 0, sign(path, "read", "root", token, 0)),
	} {
		if status, _, _ := doRequest(t, "GET", target, "", nil, nil); status != 401 {
			t.Errorf("%s: %d, want 401", name, status)
		}
	}
	up := q("write", future, sign(path, "write", "", token, future))
	if status, body, _ := doRequest(t, "POST", up, "application/octet-stream", bytes.NewBufferString("new"), nil); status != 200 {
		t.Fatalf("signed upload: %d %s", status, body)
	}
	if status, _, _ := doRequest(t, "GET", e.url+"/files?path="+url.QueryEscape(path), "", nil, map[string]string{"X-Access-Token": token}); status != 200 {
		t.Fatalf("token download: %d", status)
	}
}
