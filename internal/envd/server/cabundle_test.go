package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/tlsutil"
)

// /init's caBundle goes into every trust store that exists, once however often /init repeats
// (after every resume); with none, the first is created; anything but certificates is refused.
func TestInitCABundle(t *testing.T) {
	ca, err := tlsutil.LoadOrCreateCA(t.TempDir(), "vmon egress CA")
	if err != nil {
		t.Fatal(err)
	}
	bundle := string(ca.CertPEM)
	post := func(s *Server, body map[string]any) *httptest.ResponseRecorder {
		b, _ := json.Marshal(body)
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest("POST", "/init", bytes.NewReader(b)))
		return w
	}
	newServer := func(paths []string) *Server {
		s, err := New(Options{TrustBundles: paths})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}

	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "a/ca-certificates.crt"), filepath.Join(dir, "b/ca-bundle.crt"), filepath.Join(dir, "cert.pem")}
	if err := os.MkdirAll(filepath.Dir(paths[1]), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(paths[1], []byte("-----BEGIN CERTIFICATE-----\nexisting\n-----END CERTIFICATE-----"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(paths[2], nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Repeats on one envd (resumes), then on a fresh envd over the same files (a reboot).
	s := newServer(paths)
	for range 3 {
		if w := post(s, map[string]any{"caBundle": bundle}); w.Code != http.StatusNoContent {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
	if w := post(newServer(paths), map[string]any{"caBundle": bundle}); w.Code != http.StatusNoContent {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if _, err := os.Stat(paths[0]); !os.IsNotExist(err) {
		t.Fatalf("a store was created although others exist: %v", err)
	}
	for _, p := range paths[1:] {
		b, _ := os.ReadFile(p)
		if n := strings.Count(string(b), strings.TrimSpace(bundle)); n != 1 {
			t.Fatalf("%s holds the bundle %d times:\n%s", p, n, b)
		}
	}
	if b, _ := os.ReadFile(paths[1]); !strings.HasPrefix(string(b), "-----BEGIN CERTIFICATE-----\nexisting\n-----END CERTIFICATE-----\n-----BEGIN") {
		t.Fatalf("existing content changed or not separated:\n%s", b)
	}

	// No store at all: the first is created.
	empty := filepath.Join(t.TempDir(), "etc/ssl/certs/ca-certificates.crt")
	s2 := newServer([]string{empty, filepath.Join(t.TempDir(), "x.pem")})
	if w := post(s2, map[string]any{"caBundle": bundle}); w.Code != http.StatusNoContent {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if b, err := os.ReadFile(empty); err != nil || strings.TrimSpace(string(b)) != strings.TrimSpace(bundle) {
		t.Fatalf("created store: %q %v", b, err)
	}

	// Not certificates: 400, nothing written.
	key := "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
	for _, bad := range []string{"not pem", key, strings.Repeat("x", 70<<10)} {
		w := post(s2, map[string]any{"caBundle": bad})
		if w.Code != http.StatusBadRequest {
			t.Fatalf("caBundle %.20q: status %d", bad, w.Code)
		}
	}
	if b, _ := os.ReadFile(empty); strings.Contains(string(b), "PRIVATE KEY") {
		t.Fatal("a refused bundle was written")
	}
}
