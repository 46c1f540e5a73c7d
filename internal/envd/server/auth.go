package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// unauthorizedBody is exactly E2B envd's 401 body; SDKs and tests compare it.
const unauthorizedBody = `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}`

// requireToken enforces the access token set by /init. GET /health, /init and /files are exempt:
// /files checks the token or a URL signature itself, /init checks replacement itself.
func (s *Server) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := s.currentToken()
		if token == "" || tokenExempt(r) || tokenEqual(r.Header.Get("X-Access-Token"), token) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(unauthorizedBody))
	})
}

func tokenExempt(r *http.Request) bool {
	switch r.URL.Path {
	case "/health":
		return r.Method == http.MethodGet || r.Method == http.MethodHead
	case "/files":
		return r.Method == http.MethodGet || r.Method == http.MethodPost
	case "/init":
		return r.Method == http.MethodPost
	}
	return false
}

func (s *Server) currentToken() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.token
}

func tokenEqual(got, want string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// signature computes E2B's v1 URL signature: "v1_" + unpadded base64(sha256(
// "<path>:<operation>:<user>:<token>[:<expiration>]")). path is the caller's unresolved string.
func signature(path, operation, user, token string, expiration *int64) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != nil {
		raw += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// authorizeFile checks a /files request: with a token set, either the X-Access-Token header (which
// then must be right, and the signature is ignored) or a valid, unexpired signature for operation
// ("read" or "write") is required.
func (s *Server) authorizeFile(r *http.Request, operation string, now time.Time) error {
	token := s.currentToken()
	if token == "" {
		return nil
	}
	if h := r.Header.Get("X-Access-Token"); h != "" {
		if tokenEqual(h, token) {
			return nil
		}
		return errdefs.Unauthorized("invalid access token")
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return errdefs.Unauthorized("missing signature or access token")
	}
	var exp *int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return errdefs.Unauthorized("invalid signature expiration")
		}
		exp = &n
	}
	want := signature(q.Get("path"), operation, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return errdefs.Unauthorized("invalid signature")
	}
	if exp != nil && *exp < now.Unix() {
		return errdefs.Unauthorized("signature is already expired")
	}
	return nil
}
