package driver

import (
	"crypto/rand"
	"fmt"
)

const (
	// Sandbox ids are lowercase alphanumerics: a '-' would break `<port>-<id>.<domain>` host parsing.
	idAlphabet    = "abcdefghijklmnopqrstuvwxyz0123456789"
	idLength      = 20
	tokenAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	// 32 characters of 62 ≈ 190 bits, the shape of the tokens E2B hands out.
	tokenLength = 32
)

// randomString returns n characters drawn uniformly from alphabet (len ≤ 256) using crypto/rand.
func randomString(n int, alphabet string) (string, error) {
	// Rejection sampling: bytes past the largest multiple of len(alphabet) would bias the result.
	limit := 256 - 256%len(alphabet)
	out := make([]byte, 0, n)
	buf := make([]byte, n+n/2)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("read random bytes: %w", err)
		}
		for _, b := range buf {
			if int(b) < limit && len(out) < n {
				out = append(out, alphabet[int(b)%len(alphabet)])
			}
		}
	}
	return string(out), nil
}

// NewSandboxID returns a fresh sandbox id: 20 characters of [a-z0-9].
func NewSandboxID() (string, error) { return randomString(idLength, idAlphabet) }

func newToken() (string, error) { return randomString(tokenLength, tokenAlphabet) }

// ValidSandboxID reports whether s has the shape of a sandbox id (`^[a-z0-9]+$`).
func ValidSandboxID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
