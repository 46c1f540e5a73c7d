package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Snapshot is a saved running sandbox new sandboxes can start from.
type Snapshot struct {
	ID string
	// Name is the optional name clients gave it (unique); "" when unnamed.
	Name      string
	SandboxID string
	// TemplateID and Alias are those of the sandbox it was taken from.
	TemplateID  string
	Alias       string
	CPU         int
	MemoryMB    int
	DiskMB      int
	EnvVars     map[string]string
	EnvdVersion string
	Bytes       int64
	NodeID      string
	CreatedAt   time.Time
	// VolumeMounts are the source's: its checkpoint restores only with them.
	VolumeMounts []VolumeMount
}

// InsertSnapshot stores a new snapshot. A taken name or id is a Conflict.
func (s *Store) InsertSnapshot(ctx context.Context, sn Snapshot) error {
	env, err := marshalMap(sn.EnvVars)
	if err != nil {
		return err
	}
	mounts, err := marshalMounts(sn.VolumeMounts)
	if err != nil {
		return err
	}
	var name sql.NullString
	if sn.Name != "" {
		name = sql.NullString{String: sn.Name, Valid: true}
	}
	_, err = s.db.ExecContext(ctx, `
INSERT INTO snapshots (id, name, sandbox_id, template_id, alias, cpu, memory_mb, disk_mb, env_vars,
	envd_version, bytes, node_id, created_at, volume_mounts)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, name, sn.SandboxID, sn.TemplateID, sn.Alias, sn.CPU, sn.MemoryMB, sn.DiskMB, env,
		sn.EnvdVersion, sn.Bytes, sn.NodeID, toMillis(sn.CreatedAt), mounts)
	if err != nil {
		if isUnique(err) {
			return errdefs.Conflict("a snapshot named %q already exists", sn.Name)
		}
		return fmt.Errorf("insert snapshot: %w", err)
	}
	return nil
}

const snapshotCols = `SELECT id, COALESCE(name, ''), sandbox_id, template_id, alias, cpu, memory_mb, disk_mb,
	env_vars, envd_version, bytes, node_id, created_at, volume_mounts FROM snapshots`

// GetSnapshot returns a snapshot by id or name.
func (s *Store) GetSnapshot(ctx context.Context, ref string) (Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, snapshotCols+` WHERE id = ? OR name = ?`, ref, ref))
	if isNoRows(err) {
		return Snapshot{}, errdefs.NotFound("snapshot %q not found", ref)
	}
	if err != nil {
		return Snapshot{}, fmt.Errorf("get snapshot: %w", err)
	}
	return sn, nil
}

// SnapshotQuery selects snapshots; zero fields do not filter. Listings are newest first.
type SnapshotQuery struct {
	SandboxID string
	Name      string
	// After continues a listing after this position (exclusive).
	After *Cursor
	Limit int
}

// ListSnapshots returns the snapshots matching q, newest first.
func (s *Store) ListSnapshots(ctx context.Context, q SnapshotQuery) ([]Snapshot, error) {
	var conds []string
	var args []any
	if q.SandboxID != "" {
		conds = append(conds, "sandbox_id = ?")
		args = append(args, q.SandboxID)
	}
	if q.Name != "" {
		conds = append(conds, "name = ?")
		args = append(args, q.Name)
	}
	if q.After != nil {
		ms := toMillis(q.After.StartedAt)
		conds = append(conds, "(created_at < ? OR (created_at = ? AND id < ?))")
		args = append(args, ms, ms, q.After.ID)
	}
	query := snapshotCols
	if len(conds) > 0 {
		query += " WHERE " + strings.Join(conds, " AND ")
	}
	query += " ORDER BY created_at DESC, id DESC"
	if q.Limit > 0 {
		query += fmt.Sprintf(" LIMIT %d", q.Limit)
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("scan snapshot: %w", err)
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes a snapshot record; a missing one is NotFound.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("snapshot %q not found", id)
	}
	return nil
}

func scanSnapshot(r scanner) (Snapshot, error) {
	var (
		sn          Snapshot
		env, mounts string
		created     int64
	)
	err := r.Scan(&sn.ID, &sn.Name, &sn.SandboxID, &sn.TemplateID, &sn.Alias, &sn.CPU, &sn.MemoryMB,
		&sn.DiskMB, &env, &sn.EnvdVersion, &sn.Bytes, &sn.NodeID, &created, &mounts)
	if err != nil {
		return Snapshot{}, err
	}
	if err := json.Unmarshal([]byte(env), &sn.EnvVars); err != nil {
		return Snapshot{}, fmt.Errorf("decode env vars of snapshot %s: %w", sn.ID, err)
	}
	sn.CreatedAt = fromMillis(created)
	if err := json.Unmarshal([]byte(mounts), &sn.VolumeMounts); err != nil {
		return Snapshot{}, fmt.Errorf("decode volume mounts of snapshot %s: %w", sn.ID, err)
	}
	return sn, nil
}
