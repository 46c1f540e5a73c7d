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

// SandboxState is the lifecycle state of a sandbox record.
type SandboxState string

const (
	// StateCreating: the record reserves capacity while the node boots the sandbox. Clients never
	// see it; a record still creating after a restart belongs to an interrupted create.
	StateCreating SandboxState = "creating"
	StateRunning  SandboxState = "running"
	StatePaused   SandboxState = "paused"
	// StateKilled records are kept for inspection; the API treats them as gone.
	StateKilled SandboxState = "killed"
)

// Sandbox is one sandbox record.
type Sandbox struct {
	ID         string
	TemplateID string
	// Alias is the template name the sandbox was created from ("" if created by id).
	Alias              string
	State              SandboxState
	Metadata           map[string]string
	EnvVars            map[string]string
	EnvdAccessToken    string
	TrafficAccessToken string
	AllowPublicTraffic bool
	// AllowInternetAccess is nil when the client did not set it.
	AllowInternetAccess *bool
	CPU                 int
	MemoryMB            int
	DiskMB              int
	EnvdVersion         string
	StartedAt           time.Time
	EndAt               time.Time
	KilledAt            time.Time
	KillReason          string
	NodeID              string
	// Network is the client's network config as JSON; the driver owns its shape.
	Network json.RawMessage
	// AutoPause pauses the sandbox at expiry instead of killing it, keeping its memory when
	// AutoPauseMemory; AutoResume resumes it when a request reaches it through ingress.
	AutoPause       bool
	AutoPauseMemory bool
	AutoResume      bool
	// PausedAt, PausedMemory and PausedBytes describe the current pause of a paused sandbox.
	PausedAt     time.Time
	PausedMemory bool
	PausedBytes  int64
	// VolumeMounts are the volumes mounted into the sandbox.
	VolumeMounts []VolumeMount
	// Driver is the driver that made the record (several may share a database): while the record
	// is still creating, that driver's create is under way, and another driver starting up must
	// not take it for one a restart interrupted.
	Driver string
}

// VolumeMount is a volume mounted at Path in a sandbox.
type VolumeMount struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Path string `json:"path"`
}

func marshalMounts(m []VolumeMount) (string, error) {
	if m == nil {
		m = []VolumeMount{}
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// InsertSandbox stores a new record. A duplicate id is a Conflict.
func (s *Store) InsertSandbox(ctx context.Context, sb Sandbox) error {
	meta, err := marshalMap(sb.Metadata)
	if err != nil {
		return err
	}
	env, err := marshalMap(sb.EnvVars)
	if err != nil {
		return err
	}
	network := string(sb.Network)
	if network == "" {
		network = "{}"
	}
	mounts, err := marshalMounts(sb.VolumeMounts)
	if err != nil {
		return err
	}
	var internet sql.NullBool
	if sb.AllowInternetAccess != nil {
		internet = sql.NullBool{Bool: *sb.AllowInternetAccess, Valid: true}
	}
	_, err = s.db.ExecContext(ctx, `
INSERT INTO sandboxes (id, template_id, alias, state, metadata, env_vars, envd_access_token,
	traffic_access_token, allow_public_traffic, allow_internet_access, cpu, memory_mb, disk_mb,
	envd_version, started_at, end_at, killed_at, kill_reason, node_id, network,
	auto_pause, auto_pause_memory, auto_resume, volume_mounts, driver)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, sb.TemplateID, sb.Alias, string(sb.State), meta, env, sb.EnvdAccessToken,
		sb.TrafficAccessToken, sb.AllowPublicTraffic, internet, sb.CPU, sb.MemoryMB, sb.DiskMB,
		sb.EnvdVersion, toMillis(sb.StartedAt), toMillis(sb.EndAt), nullMillis(sb.KilledAt),
		sb.KillReason, sb.NodeID, network, sb.AutoPause, sb.AutoPauseMemory, sb.AutoResume, mounts, sb.Driver)
	if err != nil {
		if isUnique(err) {
			return errdefs.Conflict("sandbox %q already exists", sb.ID)
		}
		return fmt.Errorf("insert sandbox: %w", err)
	}
	return nil
}

// GetSandbox returns the record with the given id, whatever its state.
func (s *Store) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	sb, err := scanSandbox(s.db.QueryRowContext(ctx, sandboxCols+` WHERE id = ?`, id))
	if isNoRows(err) {
		return Sandbox{}, errdefs.NotFound("sandbox %q not found", id)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

// MarkRunning moves a creating record to running with its real start, end and agent version.
func (s *Store) MarkRunning(ctx context.Context, id string, startedAt, endAt time.Time, envdVersion string) error {
	return s.update(ctx, id, `UPDATE sandboxes SET state = 'running', started_at = ?, end_at = ?, envd_version = ?
WHERE id = ? AND state = 'creating'`, toMillis(startedAt), toMillis(endAt), envdVersion, id)
}

// SetSandboxNode records which node holds a creating or running sandbox (a driver with several
// nodes learns it once the sandbox booted).
func (s *Store) SetSandboxNode(ctx context.Context, id, nodeID string) error {
	return s.update(ctx, id, `UPDATE sandboxes SET node_id = ? WHERE id = ? AND state IN ('creating', 'running')`, nodeID, id)
}

// SetEndAt sets the expiry of a running record.
func (s *Store) SetEndAt(ctx context.Context, id string, endAt time.Time) error {
	return s.update(ctx, id, `UPDATE sandboxes SET end_at = ? WHERE id = ? AND state = 'running'`,
		toMillis(endAt), id)
}

// SetSandboxNetwork replaces a running record's network configuration (JSON) and its
// allow_internet_access (nil: unset), as a live network update does.
func (s *Store) SetSandboxNetwork(ctx context.Context, id string, network json.RawMessage, allowInternetAccess *bool) error {
	n := string(network)
	if n == "" {
		n = "{}"
	}
	var internet sql.NullBool
	if allowInternetAccess != nil {
		internet = sql.NullBool{Bool: *allowInternetAccess, Valid: true}
	}
	return s.update(ctx, id, `UPDATE sandboxes SET network = ?, allow_internet_access = ? WHERE id = ? AND state = 'running'`,
		n, internet, id)
}

// MarkPaused moves a running record to paused.
func (s *Store) MarkPaused(ctx context.Context, id string, at time.Time, memory bool, bytes int64) error {
	return s.update(ctx, id, `UPDATE sandboxes SET state = 'paused', paused_at = ?, paused_memory = ?, paused_bytes = ?
WHERE id = ? AND state = 'running'`, toMillis(at), memory, bytes, id)
}

// MarkResumed moves a paused record back to running with a new end, on nodeID (a sandbox of a
// cluster may come back on another node than the one that paused it).
func (s *Store) MarkResumed(ctx context.Context, id string, endAt time.Time, nodeID string) error {
	return s.update(ctx, id, `UPDATE sandboxes SET state = 'running', end_at = ?, node_id = ?, paused_at = NULL,
	paused_memory = 0, paused_bytes = 0 WHERE id = ? AND state = 'paused'`, toMillis(endAt), nodeID, id)
}

// MarkKilled marks a record killed. Killing an already killed record succeeds and keeps the first
// time and reason.
func (s *Store) MarkKilled(ctx context.Context, id string, at time.Time, reason string) error {
	err := s.update(ctx, id, `UPDATE sandboxes SET state = 'killed', killed_at = ?, kill_reason = ?
WHERE id = ? AND state != 'killed'`, toMillis(at), reason, id)
	if errdefs.Is(err, errdefs.KindConflict) {
		return nil
	}
	return err
}

// DeleteSandbox removes a record (used to roll back a failed create). Missing records succeed.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox: %w", err)
	}
	return nil
}

// DeleteKilledBefore removes killed records killed before t and returns how many went.
func (s *Store) DeleteKilledBefore(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE state = 'killed' AND killed_at < ?`, toMillis(t))
	if err != nil {
		return 0, fmt.Errorf("prune killed sandboxes: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// update runs a conditional single-row UPDATE: no row matched means NotFound if the record is
// missing, Conflict if it exists in a state the condition excludes.
func (s *Store) update(ctx context.Context, id, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("update sandbox: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	sb, err := s.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	return errdefs.Conflict("sandbox %q is %s", id, sb.State)
}

// Cursor is a position in a (started_at, id) ordered listing.
type Cursor struct {
	StartedAt time.Time
	ID        string
}

// SandboxQuery selects sandbox records. Zero fields do not filter.
type SandboxQuery struct {
	States []SandboxState
	NodeID string
	// Metadata must match exactly on every given pair.
	Metadata map[string]string
	// Template matches the template id or the alias the sandbox was created with.
	Template     string
	StartedAfter time.Time
	// Desc orders by start time, newest first; ties break on id in the same direction.
	Desc bool
	// After continues a listing after this position (exclusive).
	After *Cursor
	// Limit caps the result; 0 means no limit.
	Limit int
}

// ListSandboxes returns the records matching q in q's order.
func (s *Store) ListSandboxes(ctx context.Context, q SandboxQuery) ([]Sandbox, error) {
	where, args := q.where(s.db)
	order := "ASC"
	if q.Desc {
		order = "DESC"
	}
	query := sandboxCols + where + ` ORDER BY started_at ` + order + `, id ` + order
	if q.Limit > 0 {
		query += fmt.Sprintf(" LIMIT %d", q.Limit)
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("scan sandbox: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// CountSandboxes counts the records matching q's filters (order, cursor and limit are ignored).
func (s *Store) CountSandboxes(ctx context.Context, q SandboxQuery) (int, error) {
	q.After, q.Limit = nil, 0
	where, args := q.where(s.db)
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sandboxes`+where, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count sandboxes: %w", err)
	}
	return n, nil
}

func (q SandboxQuery) where(d *db) (string, []any) {
	var (
		conds []string
		args  []any
	)
	if len(q.States) > 0 {
		ph := make([]string, len(q.States))
		for i, st := range q.States {
			ph[i] = "?"
			args = append(args, string(st))
		}
		conds = append(conds, "state IN ("+strings.Join(ph, ", ")+")")
	}
	if q.NodeID != "" {
		conds = append(conds, "node_id = ?")
		args = append(args, q.NodeID)
	}
	for k, v := range q.Metadata {
		conds = append(conds, d.jsonMetadataMatch("sandboxes.metadata"))
		args = append(args, k, v)
	}
	if q.Template != "" {
		conds = append(conds, "(template_id = ? OR alias = ?)")
		args = append(args, q.Template, q.Template)
	}
	if !q.StartedAfter.IsZero() {
		// Inclusive, as E2B's: a sandbox started at exactly that instant is listed.
		conds = append(conds, "started_at >= ?")
		args = append(args, toMillis(q.StartedAfter))
	}
	if q.After != nil {
		cmp := ">"
		if q.Desc {
			cmp = "<"
		}
		conds = append(conds, "(started_at "+cmp+" ? OR (started_at = ? AND id "+cmp+" ?))")
		ms := toMillis(q.After.StartedAt)
		args = append(args, ms, ms, q.After.ID)
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

var sandboxCols = `SELECT ` + strings.Join([]string{"id", "template_id", "alias", "state", "metadata",
	"env_vars", "envd_access_token", "traffic_access_token", "allow_public_traffic",
	"allow_internet_access", "cpu", "memory_mb", "disk_mb", "envd_version", "started_at", "end_at",
	"killed_at", "kill_reason", "node_id", "network", "auto_pause", "auto_pause_memory", "auto_resume",
	"paused_at", "paused_memory", "paused_bytes", "volume_mounts", "driver"}, ", ") + ` FROM sandboxes`

func scanSandbox(r scanner) (Sandbox, error) {
	var (
		sb               Sandbox
		state, meta, env string
		network, mounts  string
		internet         sql.NullBool
		started, end     int64
		killed, paused   sql.NullInt64
	)
	err := r.Scan(&sb.ID, &sb.TemplateID, &sb.Alias, &state, &meta, &env, &sb.EnvdAccessToken,
		&sb.TrafficAccessToken, &sb.AllowPublicTraffic, &internet, &sb.CPU, &sb.MemoryMB, &sb.DiskMB,
		&sb.EnvdVersion, &started, &end, &killed, &sb.KillReason, &sb.NodeID, &network,
		&sb.AutoPause, &sb.AutoPauseMemory, &sb.AutoResume, &paused, &sb.PausedMemory, &sb.PausedBytes, &mounts, &sb.Driver)
	if err != nil {
		return Sandbox{}, err
	}
	sb.State = SandboxState(state)
	if err := json.Unmarshal([]byte(meta), &sb.Metadata); err != nil {
		return Sandbox{}, fmt.Errorf("decode metadata of %s: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &sb.EnvVars); err != nil {
		return Sandbox{}, fmt.Errorf("decode env vars of %s: %w", sb.ID, err)
	}
	if internet.Valid {
		v := internet.Bool
		sb.AllowInternetAccess = &v
	}
	sb.StartedAt = fromMillis(started)
	sb.EndAt = fromMillis(end)
	sb.KilledAt = fromNullMillis(killed)
	sb.PausedAt = fromNullMillis(paused)
	if err := json.Unmarshal([]byte(mounts), &sb.VolumeMounts); err != nil {
		return Sandbox{}, fmt.Errorf("decode volume mounts of %s: %w", sb.ID, err)
	}
	sb.Network = json.RawMessage(network)
	return sb, nil
}

func marshalMap(m map[string]string) (string, error) {
	if m == nil {
		m = map[string]string{}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encode map: %w", err)
	}
	return string(b), nil
}

// SandboxTally is how many records are in one state for one template.
type SandboxTally struct {
	State      SandboxState
	TemplateID string
	Count      int
}

// TallySandboxes counts the records by state and template (for metrics).
func (s *Store) TallySandboxes(ctx context.Context) ([]SandboxTally, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT state, template_id, COUNT(*) FROM sandboxes GROUP BY state, template_id`)
	if err != nil {
		return nil, fmt.Errorf("tally sandboxes: %w", err)
	}
	defer rows.Close()
	var out []SandboxTally
	for rows.Next() {
		var t SandboxTally
		if err := rows.Scan(&t.State, &t.TemplateID, &t.Count); err != nil {
			return nil, fmt.Errorf("tally sandboxes: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}
