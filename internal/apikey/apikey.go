// Package apikey owns the format of vmon's admin API keys: generation in E2B's format
// (`e2b_` + 40 lowercase hex), the hash that is stored instead of the key, constant-time
// verification, and the short mask shown in listings.
//
// It never stores, logs or prints a key itself: callers persist only Hash and Mask, and show the
// plaintext once. It imports nothing of vmon.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
)

// Prefix is the fixed start of every key, as E2B issues them; the SDK does not check it, but users
// and secret scanners recognise it.
const Prefix = "e2b_"

// secretBytes is the number of random bytes behind the 40 hex characters.
const secretBytes = 20

// Key is a freshly generated key. Plain must be shown to the user once and then dropped.
type Key struct {
	Plain string
	Hash  string
	Mask  string
}

// Generate returns a new random key in E2B's format with its hash and mask.
func Generate() (Key, error) {
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Key{}, fmt.Errorf("read random bytes: %w", err)
	}
	plain := Prefix + hex.EncodeToString(b[:])
	return Key{Plain: plain, Hash: Hash(plain), Mask: Mask(plain)}, nil
}

// WellFormed reports whether s has the shape of a key (prefix + 40 lowercase hex). It lets the API
// reject garbage without a database lookup; it says nothing about validity.
func WellFormed(s string) bool {
	if len(s) != len(Prefix)+2*secretBytes || !strings.HasPrefix(s, Prefix) {
		return false
	}
	for _, c := range s[len(Prefix):] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Hash returns the storage form of a key: hex SHA-256. A slow KDF is not needed because keys carry
// 160 random bits; nobody can brute-force them from the hash.
func Hash(plain string) string {
	sum := sha256.Sum256([]byte(plain))
	return hex.EncodeToString(sum[:])
}

// Verify reports whether plain hashes to storedHash, in time independent of where they differ.
func Verify(plain, storedHash string) bool {
	h := Hash(plain)
	return subtle.ConstantTimeCompare([]byte(h), []byte(storedHash)) == 1
}

// Mask returns a display form that identifies a key without revealing it: "e2b_…" + last 4.
func Mask(plain string) string {
	if len(plain) < len(Prefix)+4 {
		return Prefix + "…"
	}
	return Prefix + "…" + plain[len(plain)-4:]
}
