package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/vibemon/vmon/internal/apikey"
	"github.com/vibemon/vmon/internal/errdefs"
)

// APIKey is a stored admin key. The plaintext is never stored.
type APIKey struct {
	ID        string
	Name      string
	Hash      string
	Mask      string
	CreatedAt time.Time
	// RevokedAt is zero while the key is valid.
	RevokedAt time.Time
}

// Revoked reports whether the key has been revoked.
func (k APIKey) Revoked() bool { return !k.RevokedAt.IsZero() }

// CreateAPIKey generates a new key, stores its hash and returns the record with the plaintext,
// which the caller must show once and drop.
func (s *Store) CreateAPIKey(ctx context.Context, name string, now time.Time) (APIKey, string, error) {
	k, err := apikey.Generate()
	if err != nil {
		return APIKey{}, "", err
	}
	rec := APIKey{ID: uuid.NewString(), Name: name, Hash: k.Hash, Mask: k.Mask, CreatedAt: now.UTC()}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO api_keys (id, name, hash, mask, created_at) VALUES (?, ?, ?, ?, ?)`,
		rec.ID, rec.Name, rec.Hash, rec.Mask, toMillis(rec.CreatedAt))
	if err != nil {
		return APIKey{}, "", fmt.Errorf("insert api key: %w", err)
	}
	return rec, k.Plain, nil
}

// EnsureAPIKey makes plain (a key in apikey's format made elsewhere, e.g. by Helm) a stored key
// named name, unless it is stored already; a key that was revoked stays revoked, and is an
// Unauthorized error.
func (s *Store) EnsureAPIKey(ctx context.Context, name, plain string, now time.Time) (APIKey, error) {
	if !apikey.WellFormed(plain) {
		return APIKey{}, errdefs.InvalidArgument("not an API key: want e2b_ followed by 40 lower-case hex characters")
	}
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO api_keys (id, name, hash, mask, created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING`,
		uuid.NewString(), name, apikey.Hash(plain), apikey.Mask(plain), toMillis(now.UTC()))
	if err != nil {
		return APIKey{}, fmt.Errorf("insert api key: %w", err)
	}
	return s.VerifyAPIKey(ctx, plain)
}

// VerifyAPIKey returns the key record matching plain. It fails with an Unauthorized error when the
// key is malformed, unknown or revoked.
func (s *Store) VerifyAPIKey(ctx context.Context, plain string) (APIKey, error) {
	if !apikey.WellFormed(plain) {
		return APIKey{}, errdefs.Unauthorized("invalid API key format: expected e2b_ followed by 40 hex characters")
	}
	k, err := s.scanAPIKey(s.db.QueryRowContext(ctx, apiKeyCols+` WHERE hash = ?`, apikey.Hash(plain)))
	if isNoRows(err) {
		return APIKey{}, errdefs.Unauthorized("invalid API key")
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("look up api key: %w", err)
	}
	// The lookup was by hash; compare again in constant time so the decision never depends on
	// how the database compares strings.
	if !apikey.Verify(plain, k.Hash) {
		return APIKey{}, errdefs.Unauthorized("invalid API key")
	}
	if k.Revoked() {
		return APIKey{}, errdefs.Unauthorized("API key has been revoked")
	}
	return k, nil
}

// ListAPIKeys returns all keys, revoked included, oldest first.
func (s *Store) ListAPIKeys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, apiKeyCols+` ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, err := s.scanAPIKey(rows)
		if err != nil {
			return nil, fmt.Errorf("scan api key: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return out, nil
}

// CountActiveAPIKeys returns how many unrevoked keys exist (first start creates one when zero).
func (s *Store) CountActiveAPIKeys(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM api_keys WHERE revoked_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count api keys: %w", err)
	}
	return n, nil
}

// RevokeAPIKey revokes the key with the given id. Revoking an already revoked key succeeds (the
// original revocation time is kept); an unknown id is NotFound.
func (s *Store) RevokeAPIKey(ctx context.Context, id string, now time.Time) error {
	res, err := s.db.ExecContext(ctx,
		`UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, toMillis(now), id)
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("API key %q not found", id)
	}
	return nil
}

const apiKeyCols = `SELECT id, name, hash, mask, created_at, revoked_at FROM api_keys`

func (s *Store) scanAPIKey(r scanner) (APIKey, error) {
	var (
		k       APIKey
		created int64
		revoked sql.NullInt64
	)
	if err := r.Scan(&k.ID, &k.Name, &k.Hash, &k.Mask, &created, &revoked); err != nil {
		return APIKey{}, err
	}
	k.CreatedAt = fromMillis(created)
	k.RevokedAt = fromNullMillis(revoked)
	return k, nil
}

type scanner interface{ Scan(dest ...any) error }
