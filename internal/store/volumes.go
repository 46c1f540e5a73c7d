package store

import (
	"context"
	"fmt"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Volume is a named directory sandboxes mount, with the token its content API takes.
type Volume struct {
	ID        string
	Name      string
	Token     string
	CreatedAt time.Time
	// NodeID is the node the volume lives on, in a cluster (empty in one process).
	NodeID string
}

// InsertVolume stores a new volume; a taken name is a Conflict.
func (s *Store) InsertVolume(ctx context.Context, v Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes (id, name, token, created_at, node_id) VALUES (?, ?, ?, ?, ?)`,
		v.ID, v.Name, v.Token, toMillis(v.CreatedAt), v.NodeID)
	if err != nil {
		if isUnique(err) {
			return errdefs.Conflict("a volume named %q already exists", v.Name)
		}
		return fmt.Errorf("insert volume: %w", err)
	}
	return nil
}

// GetVolume returns a volume by id or name.
func (s *Store) GetVolume(ctx context.Context, ref string) (Volume, error) {
	var v Volume
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT id, name, token, created_at, node_id FROM volumes WHERE id = ? OR name = ?`, ref, ref).
		Scan(&v.ID, &v.Name, &v.Token, &created, &v.NodeID)
	if isNoRows(err) {
		return Volume{}, errdefs.NotFound("volume %q not found", ref)
	}
	if err != nil {
		return Volume{}, fmt.Errorf("get volume: %w", err)
	}
	v.CreatedAt = fromMillis(created)
	return v, nil
}

// ListVolumes returns every volume, oldest first.
func (s *Store) ListVolumes(ctx context.Context) ([]Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, token, created_at, node_id FROM volumes ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	defer rows.Close()
	var out []Volume
	for rows.Next() {
		var v Volume
		var created int64
		if err := rows.Scan(&v.ID, &v.Name, &v.Token, &created, &v.NodeID); err != nil {
			return nil, err
		}
		v.CreatedAt = fromMillis(created)
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVolume removes a volume record unless a live sandbox (creating, running or paused) or a
// snapshot mounts it (Conflict). The check and the delete are one transaction.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	return s.tx(ctx, func(tx *tx) error {
		var users int
		err := tx.QueryRowContext(ctx, `
SELECT `+s.db.jsonArrayIDCount("sandboxes", "volume_mounts", "sandboxes.state != 'killed'")+`
     + `+s.db.jsonArrayIDCount("snapshots", "volume_mounts", "")+``, id, id).Scan(&users)
		if err != nil {
			return fmt.Errorf("count volume users: %w", err)
		}
		if users > 0 {
			return errdefs.Conflict("volume %q is mounted by %d sandbox(es) or snapshot(s); kill them first", id, users)
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, id)
		if err != nil {
			return fmt.Errorf("delete volume: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.NotFound("volume %q not found", id)
		}
		return nil
	})
}
