package server

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// The vector from the e2b SDK's own test suite.
func TestSignatureVector(t *testing.T) {
	got := signature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0", nil)
	if want := "v1_gUtH/s9YCJWgCizjfUxuWfhFE4QSydOWEIIvfLwDr6E"; got != want {
		t.Fatalf("signature = %q, want %q", got, want)
	}
	exp := int64(1700000000)
	if withExp := signature("hello.txt", "read", "user", "0tQG31xiMp0IOQfaz9dcwi72L1CPo8e0", &exp); withExp == got {
		t.Fatal("the expiration must be part of the signed text")
	}
}

func newTestServer(t *testing.T, token string) *Server {
	t.Helper()
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	s.token = token
	return s
}

func TestAuthorizeFile(t *testing.T) {
	const token = "secret-token"
	s := newTestServer(t, token)
	now := time.Unix(1_800_000_000, 0)
	future, past := now.Unix()+60, now.Unix()-1

	req := func(q url.Values, header string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/files?"+q.Encode(), nil)
		if header != "" {
			r.Header.Set("X-Access-Token", header)
		}
		return r
	}
	signed := func(path, op, user string, exp *int64) url.Values {
		q := url.Values{"path": {path}, "signature": {signature(path, op, user, token, exp)}}
		if user != "" {
			q.Set("username", user)
		}
		if exp != nil {
			q.Set("signature_expiration", strconv.FormatInt(*exp, 10))
		}
		return q
	}
	for _, tc := range []struct {
		name string
		r    *http.Request
		op   string
		ok   bool
	}{
		{"header token", req(url.Values{"path": {"a"}}, token), "read", true},
		{"wrong header token wins over a good signature", req(signed("a", "read", "", nil), "nope"), "read", false},
		{"no credentials", req(url.Values{"path": {"a"}}, ""), "read", false},
		{"signature without user", req(signed("a", "read", "", nil), ""), "read", true},
		{"signature with user", req(signed("a", "read", "user", nil), ""), "read", true},
		{"signature for another operation", req(signed("a", "write", "", nil), ""), "read", false},
		{"signature for another path", req(func() url.Values { q := signed("a", "read", "", nil); q.Set("path", "b"); return q }(), ""), "read", false},
		{"unexpired signature", req(signed("a", "write", "user", &future), ""), "write", true},
		{"expired signature", req(signed("a", "write", "user", &past), ""), "write", false},
		{"tampered expiration", req(func() url.Values {
			q := signed("a", "read", "", &past)
			q.Set("signature_expiration", strconv.FormatInt(future, 10))
			return q
		}(), ""), "read", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.authorizeFile(tc.r, tc.op, now)
			if tc.ok && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if !tc.ok && !errdefs.Is(err, errdefs.KindUnauthorized) {
				t.Fatalf("got %v, want Unauthorized", err)
			}
		})
	}
	// Without a token everything is open.
	open := newTestServer(t, "")
	if err := open.authorizeFile(req(url.Values{}, ""), "read", now); err != nil {
		t.Fatalf("no token set: %v", err)
	}
}

func TestTokenMiddleware(t *testing.T) {
	s := newTestServer(t, "")
	do := func(method, target, token, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, target, bytes.NewBufferString(body))
		if token != "" {
			r.Header.Set("X-Access-Token", token)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}
	// Before /init sets a token, everything is open.
	if w := do("GET", "/envs", "", ""); w.Code != http.StatusOK {
		t.Fatalf("GET /envs before token: %d", w.Code)
	}
	if w := do("POST", "/init", "", `{"accessToken":"tok1","envVars":{"A":"1"}}`); w.Code != http.StatusNoContent || w.Header().Get("X-Envd-Version") == "" {
		t.Fatalf("POST /init: %d %v", w.Code, w.Header())
	}
	w := do("GET", "/envs", "", "")
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("GET /envs without token: %d", w.Code)
	}
	body, _ := io.ReadAll(w.Body)
	if got := string(bytes.TrimSpace(body)); got != unauthorizedBody {
		t.Fatalf("401 body = %s", got)
	}
	if w := do("GET", "/envs", "wrong", ""); w.Code != http.StatusUnauthorized {
		t.Fatalf("GET /envs with a wrong token: %d", w.Code)
	}
	if w := do("GET", "/envs", "tok1", ""); w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(`"A":"1"`)) {
		t.Fatalf("GET /envs with token: %d %s", w.Code, w.Body)
	}
	if w := do("POST", "/process.Process/List", "", `{}`); w.Code != http.StatusUnauthorized {
		t.Fatalf("RPC without token: %d", w.Code)
	}
	if w := do("GET", "/health", "", ""); w.Code != http.StatusNoContent {
		t.Fatalf("GET /health without token: %d", w.Code)
	}
	// /files passes the middleware and then needs the token or a signature itself.
	if w := do("GET", "/files?path=/nonexistent", "", ""); w.Code != http.StatusUnauthorized ||
		bytes.Contains(w.Body.Bytes(), []byte("method signing")) {
		t.Fatalf("GET /files without credentials: %d %s", w.Code, w.Body)
	}
	if w := do("GET", "/files?path=/nonexistent-envd-test", "tok1", ""); w.Code != http.StatusNotFound {
		t.Fatalf("GET /files with token: %d %s", w.Code, w.Body)
	}
	// Replacing the token needs the old one.
	if w := do("POST", "/init", "", `{"accessToken":"tok2"}`); w.Code != http.StatusUnauthorized {
		t.Fatalf("token replacement without the old token: %d", w.Code)
	}
	if w := do("POST", "/init", "", `{"accessToken":"tok1"}`); w.Code != http.StatusNoContent {
		t.Fatalf("re-init with the same token: %d", w.Code)
	}
	if w := do("POST", "/init", "tok1", `{"accessToken":"tok2"}`); w.Code != http.StatusNoContent {
		t.Fatalf("token replacement with the old token: %d", w.Code)
	}
	if w := do("GET", "/envs", "tok2", ""); w.Code != http.StatusOK {
		t.Fatalf("new token: %d", w.Code)
	}
	if w := do("GET", "/envs", "tok1", ""); w.Code != http.StatusUnauthorized {
		t.Fatalf("old token still accepted: %d", w.Code)
	}
}

func TestBasicUser(t *testing.T) {
	for _, tc := range []struct {
		header, want string
		err          bool
	}{
		{"", "", false},
		{"Basic cm9vdDo=", "root", false},
		{"basic dXNlcjo=", "user", false},
		{"Bearer abc", "", false},
		{"Basic !!!", "", true},
	} {
		got, err := basicUser(tc.header)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("basicUser(%q) = %q, %v", tc.header, got, err)
		}
	}
}
