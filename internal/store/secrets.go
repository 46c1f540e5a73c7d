package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Secret is a secret record. Sealed is the current version's value as internal/secrets sealed
// it; the store never sees a value in the clear.
type Secret struct {
	ID        string
	Name      string
	Metadata  map[string]string
	Version   int64
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

const secretCols = `id, name, metadata, version, sealed, created_at, updated_at`

func scanSecret(row interface{ Scan(...any) error }) (Secret, error) {
	var s Secret
	var meta string
	var created, updated int64
	if err := row.Scan(&s.ID, &s.Name, &meta, &s.Version, &s.Sealed, &created, &updated); err != nil {
		return Secret{}, err
	}
	if err := json.Unmarshal([]byte(meta), &s.Metadata); err != nil {
		return Secret{}, fmt.Errorf("secret %s metadata: %w", s.ID, err)
	}
	if s.Metadata == nil {
		s.Metadata = map[string]string{}
	}
	s.CreatedAt, s.UpdatedAt = fromMillis(created), fromMillis(updated)
	return s, nil
}

// InsertSecret stores a new secret; a taken name is a Conflict.
func (s *Store) InsertSecret(ctx context.Context, sec Secret) error {
	meta, err := json.Marshal(orEmpty(sec.Metadata))
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO secrets (`+secretCols+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		sec.ID, sec.Name, string(meta), sec.Version, sec.Sealed, toMillis(sec.CreatedAt), toMillis(sec.UpdatedAt))
	if err != nil {
		if isUnique(err) {
			return errdefs.Conflict("a secret named %q already exists", sec.Name)
		}
		return fmt.Errorf("insert secret: %w", err)
	}
	return nil
}

// GetSecret returns a secret by id or (lower-case) name.
func (s *Store) GetSecret(ctx context.Context, ref string) (Secret, error) {
	sec, err := scanSecret(s.db.QueryRowContext(ctx, `SELECT `+secretCols+` FROM secrets WHERE id = ? OR name = ?`, ref, strings.ToLower(ref)))
	if isNoRows(err) {
		return Secret{}, errdefs.NotFound("secret %s not found", errdefs.Quote(ref))
	}
	if err != nil {
		return Secret{}, fmt.Errorf("get secret: %w", err)
	}
	return sec, nil
}

// ListSecrets returns up to limit secrets, oldest first, after the (created_at, id) cursor
// (zero: from the start).
func (s *Store) ListSecrets(ctx context.Context, limit int, afterCreated time.Time, afterID string) ([]Secret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+secretCols+` FROM secrets
WHERE created_at > ? OR (created_at = ? AND id > ?) ORDER BY created_at, id LIMIT ?`,
		toMillis(afterCreated), toMillis(afterCreated), afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		sec, err := scanSecret(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sec)
	}
	return out, rows.Err()
}

// UpdateSecret stores a new version: sealed for version, and metadata when not nil. The version
// must be the current one plus one (a concurrent update loses with a Conflict).
func (s *Store) UpdateSecret(ctx context.Context, id string, version int64, sealed []byte, metadata map[string]string, at time.Time) error {
	q := `UPDATE secrets SET version = ?, sealed = ?, updated_at = ? WHERE id = ? AND version = ?`
	args := []any{version, sealed, toMillis(at), id, version - 1}
	if metadata != nil {
		meta, err := json.Marshal(metadata)
		if err != nil {
			return err
		}
		q = `UPDATE secrets SET version = ?, sealed = ?, updated_at = ?, metadata = ? WHERE id = ? AND version = ?`
		args = []any{version, sealed, toMillis(at), string(meta), id, version - 1}
	}
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("update secret: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.Conflict("secret %q changed concurrently; retry", id)
	}
	return nil
}

// DeleteSecret removes a secret.
func (s *Store) DeleteSecret(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete secret: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("secret %q not found", id)
	}
	return nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
