package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// LogEntry is one entry of a sandbox's log as the drivers sharing a database keep it (their
// part: the lifecycle). Level is internal/sandboxlog's, as a number.
type LogEntry struct {
	Time    time.Time
	Level   int
	Logger  string
	Message string
	Fields  map[string]string
}

// LogQuery selects entries, as internal/sandboxlog's Query does.
type LogQuery struct {
	// Cursor in Unix milliseconds: forward, entries at or after it, oldest first; backward, at or
	// before it, newest first; 0: from the oldest (forward) or the newest (backward).
	Cursor   int64
	Backward bool
	Limit    int
	MinLevel int
	// Search keeps entries whose message contains it (case-sensitive).
	Search string
}

// AppendSandboxLog adds e to sandbox id's log.
func (s *Store) AppendSandboxLog(ctx context.Context, id string, e LogEntry) error {
	fields, err := marshalMap(e.Fields)
	if err != nil {
		return err
	}
	// seq orders entries of one millisecond: the time in nanoseconds.
	if _, err := s.db.ExecContext(ctx, `INSERT INTO sandbox_log (sandbox_id, at, seq, level, logger, message, fields)
VALUES (?, ?, ?, ?, ?, ?, ?)`, id, e.Time.UnixMilli(), e.Time.UnixNano(), e.Level, e.Logger, e.Message, fields); err != nil {
		return fmt.Errorf("append to sandbox log: %w", err)
	}
	return nil
}

// QuerySandboxLog returns the entries of sandbox id's log that q selects, and whether the log has
// any entry at all.
func (s *Store) QuerySandboxLog(ctx context.Context, id string, q LogQuery) ([]LogEntry, bool, error) {
	conds, args := []string{"sandbox_id = ?"}, []any{id}
	if q.Cursor != 0 {
		if q.Backward {
			conds = append(conds, "at <= ?")
		} else {
			conds = append(conds, "at >= ?")
		}
		args = append(args, q.Cursor)
	}
	if q.MinLevel > 0 {
		conds = append(conds, "level >= ?")
		args = append(args, q.MinLevel)
	}
	if q.Search != "" {
		conds = append(conds, s.db.contains("message"))
		args = append(args, q.Search)
	}
	order := "ASC"
	if q.Backward {
		order = "DESC"
	}
	query := `SELECT at, seq, level, logger, message, fields FROM sandbox_log WHERE ` + strings.Join(conds, " AND ") +
		` ORDER BY at ` + order + `, seq ` + order
	if q.Limit > 0 {
		query += fmt.Sprintf(" LIMIT %d", q.Limit)
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, false, fmt.Errorf("read sandbox log: %w", err)
	}
	defer rows.Close()
	out := []LogEntry{}
	for rows.Next() {
		var (
			e         LogEntry
			at, seq   int64
			fieldsRaw string
		)
		if err := rows.Scan(&at, &seq, &e.Level, &e.Logger, &e.Message, &fieldsRaw); err != nil {
			return nil, false, fmt.Errorf("read sandbox log: %w", err)
		}
		e.Time = time.Unix(0, seq).UTC()
		if err := json.Unmarshal([]byte(fieldsRaw), &e.Fields); err != nil {
			return nil, false, fmt.Errorf("decode sandbox log fields: %w", err)
		}
		if len(e.Fields) == 0 {
			e.Fields = nil
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("read sandbox log: %w", err)
	}
	if len(out) > 0 {
		return out, true, nil
	}
	var any int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sandbox_log WHERE sandbox_id = ?`, id).Scan(&any); err != nil {
		return nil, false, fmt.Errorf("read sandbox log: %w", err)
	}
	return out, any > 0, nil
}

// DeleteSandboxLogsBefore removes the logs of sandboxes killed before cutoff, and the entries
// older than cutoff of sandboxes no record names (a failed create's).
func (s *Store) DeleteSandboxLogsBefore(ctx context.Context, cutoff time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandbox_log WHERE
	sandbox_id IN (SELECT id FROM sandboxes WHERE state = 'killed' AND killed_at < ?)
	OR (at < ? AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE sandboxes.id = sandbox_log.sandbox_id))`,
		toMillis(cutoff), toMillis(cutoff))
	if err != nil {
		return 0, fmt.Errorf("remove sandbox logs past their retention: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}
