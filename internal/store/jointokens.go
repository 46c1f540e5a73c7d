package store

import (
	"context"
	"fmt"
	"time"
)

// JoinToken is a token nodes join the cluster with; only its secret's hash is kept.
type JoinToken struct {
	ID        string
	Hash      string
	CreatedAt time.Time
	ExpiresAt time.Time
	UsesLeft  int
}

// InsertJoinToken keeps a new token.
func (s *Store) InsertJoinToken(ctx context.Context, t JoinToken) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO join_tokens (id, hash, created_at, expires_at, uses_left) VALUES (?, ?, ?, ?, ?)`,
		t.ID, t.Hash, toMillis(t.CreatedAt), toMillis(t.ExpiresAt), t.UsesLeft)
	if err != nil {
		return fmt.Errorf("insert join token: %w", err)
	}
	return nil
}

// UseJoinToken spends one use of the token id whose secret hashes to hash, if it has not expired
// at now; it reports whether it did. One statement, so two nodes racing for a token's last use
// cannot both have it.
func (s *Store) UseJoinToken(ctx context.Context, id, hash string, now time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE join_tokens SET uses_left = uses_left - 1
WHERE id = ? AND hash = ? AND expires_at > ? AND uses_left > 0`, id, hash, toMillis(now))
	if err != nil {
		return false, fmt.Errorf("use join token: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// DeleteExpiredJoinTokens removes tokens that expired or were used up before now.
func (s *Store) DeleteExpiredJoinTokens(ctx context.Context, now time.Time) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM join_tokens WHERE expires_at <= ? OR uses_left <= 0`, toMillis(now)); err != nil {
		return fmt.Errorf("delete expired join tokens: %w", err)
	}
	return nil
}

// JoinTokenHash returns the hash of token id's secret, and whether the token can still be used at
// now (unknown, expired and used-up tokens report false).
func (s *Store) JoinTokenHash(ctx context.Context, id string, now time.Time) (string, bool, error) {
	var hash string
	err := s.db.QueryRowContext(ctx, `SELECT hash FROM join_tokens WHERE id = ? AND expires_at > ? AND uses_left > 0`,
		id, toMillis(now)).Scan(&hash)
	if isNoRows(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("look up join token: %w", err)
	}
	return hash, true, nil
}

// PutBootstrapJoinToken keeps t, replacing a token of the same id (an upsert, so drivers starting
// together cannot collide) and every other token with more than minUses uses left: issued tokens
// never have that many, so those are earlier bootstrap tokens, which a new one replaces.
func (s *Store) PutBootstrapJoinToken(ctx context.Context, t JoinToken, minUses int) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO join_tokens (id, hash, created_at, expires_at, uses_left) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET hash = excluded.hash, expires_at = excluded.expires_at, uses_left = excluded.uses_left`,
		t.ID, t.Hash, toMillis(t.CreatedAt), toMillis(t.ExpiresAt), t.UsesLeft); err != nil {
		return fmt.Errorf("put bootstrap join token: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM join_tokens WHERE uses_left > ? AND id <> ?`, minUses, t.ID); err != nil {
		return fmt.Errorf("remove earlier bootstrap join tokens: %w", err)
	}
	return nil
}
