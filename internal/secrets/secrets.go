// Package secrets owns what vmon knows about E2B secrets apart from storing rows: the sealing of
// values at rest under a key of the data dir (AES-256-GCM from the standard library, each value
// bound to its secret id and version), the rules for names, values and metadata, and the
// `${e2b.secrets.NAME}` placeholders that header rules carry and the egress proxy fills in.
// It must never log, return or persist a value in the clear: Open's result goes straight into a
// request header on the node, never into an API response, a sandbox or a log line.
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Limits of the API (E2B's SecretMetadata: 32 entries, keys ≤ 128 bytes, values ≤ 1024, ≤ 8192 in
// total). Values become request headers, whose values egress rules cap at 2048 characters;
// a secret may be a part of one, so it is capped there too.
const (
	MaxNameBytes          = 128
	MaxValueBytes         = 2048
	MaxMetadataEntries    = 32
	MaxMetadataKeyBytes   = 128
	MaxMetadataValueBytes = 1024
	MaxMetadataBytes      = 8192
	// IDPrefix starts every secret id; names may not start with it.
	IDPrefix = "sec_"
)

// NormName validates a secret name and returns it lower-cased: not empty, at most MaxNameBytes,
// no '{', '}' or control characters (it is interpolated into a placeholder), not starting with
// the id prefix.
func NormName(name string) (string, error) {
	n := strings.ToLower(name)
	switch {
	case n == "":
		return "", errdefs.InvalidArgument("secret name must not be empty")
	case len(n) > MaxNameBytes:
		return "", errdefs.InvalidArgument("secret name must be at most %d bytes, got %d", MaxNameBytes, len(n))
	case strings.HasPrefix(n, IDPrefix):
		return "", errdefs.InvalidArgument("secret name %s: the %q prefix is reserved for secret ids", errdefs.Quote(name), IDPrefix)
	case strings.ContainsAny(n, "{}") || strings.ContainsFunc(n, unicode.IsControl):
		return "", errdefs.InvalidArgument("secret name %s: '{', '}' and control characters are not allowed", errdefs.Quote(name))
	}
	return n, nil
}

// CheckValue validates a secret value: not empty, at most MaxValueBytes, and usable in an HTTP
// header (no control characters but tab).
func CheckValue(v string) error {
	switch {
	case v == "":
		return errdefs.InvalidArgument("secret value must not be empty")
	case len(v) > MaxValueBytes:
		return errdefs.InvalidArgument("secret value must be at most %d bytes, got %d", MaxValueBytes, len(v))
	case strings.ContainsFunc(v, func(r rune) bool { return r != '\t' && unicode.IsControl(r) }):
		return errdefs.InvalidArgument("secret value must not contain control characters (it is sent as a header value)")
	}
	return nil
}

// CheckMetadata validates secret metadata against E2B's limits.
func CheckMetadata(m map[string]string) error {
	if len(m) > MaxMetadataEntries {
		return errdefs.InvalidArgument("secret metadata: at most %d entries, got %d", MaxMetadataEntries, len(m))
	}
	total := 0
	for k, v := range m {
		if k == "" || len(k) > MaxMetadataKeyBytes {
			return errdefs.InvalidArgument("secret metadata key %s: 1 to %d bytes", errdefs.Quote(k), MaxMetadataKeyBytes)
		}
		if len(v) > MaxMetadataValueBytes {
			return errdefs.InvalidArgument("secret metadata %s: the value must be at most %d bytes, got %d", errdefs.Quote(k), MaxMetadataValueBytes, len(v))
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return errdefs.InvalidArgument("secret metadata: at most %d bytes in total, got %d", MaxMetadataBytes, total)
	}
	return nil
}

// placeholderRe matches `${e2b.<kind>.<name>}`; the name runs to the first '}'.
var placeholderRe = regexp.MustCompile(`\$\{e2b\.([a-z]+(?:\.[a-z]+)?)\.([^}]*)\}`)

// Placeholders returns the secret names (lower-cased) header value v refers to, or an error for
// a placeholder vmon cannot fill (workload identity tokens, unknown kinds, empty names).
func Placeholders(v string) ([]string, error) {
	var names []string
	for _, m := range placeholderRe.FindAllStringSubmatch(v, -1) {
		switch m[1] {
		case "secrets":
			n, err := NormName(m[2])
			if err != nil {
				return nil, err
			}
			names = append(names, n)
		case "identity.tokens":
			return nil, errdefs.InvalidArgument("placeholder %s: workload identity tokens are not supported by vmon", errdefs.Quote(m[0]))
		default:
			return nil, errdefs.InvalidArgument("placeholder %s: unknown kind %q (only ${e2b.secrets.NAME})", errdefs.Quote(m[0]), m[1])
		}
	}
	return names, nil
}

// Fill replaces every secret placeholder of v with its value from lookup. ok is false when a
// secret is missing (deleted since the rule was accepted): the header must then not be sent.
func Fill(v string, lookup func(name string) (string, bool)) (_ string, ok bool) {
	ok = true
	out := placeholderRe.ReplaceAllStringFunc(v, func(m string) string {
		sub := placeholderRe.FindStringSubmatch(m)
		if sub[1] != "secrets" {
			ok = false
			return ""
		}
		val, found := lookup(strings.ToLower(sub[2]))
		if !found {
			ok = false
			return ""
		}
		return val
	})
	return out, ok
}

// KeyFile is the sealing key's file in the data dir.
const KeyFile = "secrets.key"

// Sealer seals and opens secret values.
type Sealer struct {
	aead cipher.AEAD
}

// LoadOrCreateKey reads the 32-byte key at path, or creates it (0600, written to a temporary
// name and renamed).
func LoadOrCreateKey(path string) (*Sealer, error) {
	key, err := LoadOrCreateRandom(path, 32)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	return NewSealer(key)
}

// NewSealer seals with a 32-byte key kept elsewhere than in a file (drivers sharing a database
// keep theirs there).
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("secrets key: want 32 bytes, got %d", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// LoadOrCreateRandom reads the n random bytes kept at path, or makes them once (0600, written to
// a temporary name and renamed, so a crash never leaves a short key): the secrets key, the
// cluster's gossip key.
func LoadOrCreateRandom(path string, n int) ([]byte, error) {
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key = make([]byte, n)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, key, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(key) != n {
		return nil, fmt.Errorf("%s: want %d bytes, got %d", path, n, len(key))
	}
	return key, nil
}

// aad binds a sealed value to its secret and version, so a row's ciphertext cannot be moved to
// another secret or replayed as another version.
func aad(id string, version int64) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(version))
	return append(b, id...)
}

// Seal encrypts value for secret id at version: a random nonce followed by the ciphertext.
func (s *Sealer) Seal(id string, version int64, value string) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(value)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, []byte(value), aad(id, version)), nil
}

// Open decrypts what Seal returned for the same id and version.
func (s *Sealer) Open(id string, version int64, sealed []byte) (string, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return "", errors.New("sealed secret too short")
	}
	pt, err := s.aead.Open(nil, sealed[:n], sealed[n:], aad(id, version))
	if err != nil {
		return "", fmt.Errorf("open secret %s: %w", id, err)
	}
	return string(pt), nil
}
