package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Build is one build of a template. Its status moves waiting → building → ready | error, once.
type Build struct {
	ID         string
	TemplateID string
	Status     TemplateStatus
	// ReasonMessage and ReasonStep explain a failed build; the step is "base" (FROM),
	// "finalize" (start and ready commands) or the 1-based step number.
	ReasonMessage  string
	ReasonStep     string
	CPU            int
	MemoryMB       int
	DiskMB         int
	DefaultUser    string
	DefaultWorkdir string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	FinishedAt     time.Time
	// Driver is the driver running the build (several may share a database); kept as first
	// recorded.
	Driver string
}

// Tag names one build of a template ("default" is the implicit tag).
type Tag struct {
	Tag       string
	BuildID   string
	CreatedAt time.Time
}

// PutBuild inserts or updates a build.
func (s *Store) PutBuild(ctx context.Context, b Build) error {
	switch b.Status {
	case TemplateWaiting, TemplateBuilding, TemplateReady, TemplateError:
	default:
		return errdefs.InvalidArgument("invalid build status %q", b.Status)
	}
	var finished any
	if !b.FinishedAt.IsZero() {
		finished = toMillis(b.FinishedAt)
	}
	_, err := s.db.ExecContext(ctx, `
INSERT INTO template_builds (id, template_id, status, reason_message, reason_step, cpu, memory_mb,
	disk_mb, default_user, default_workdir, created_at, updated_at, finished_at, driver)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET status = excluded.status, reason_message = excluded.reason_message,
	reason_step = excluded.reason_step, cpu = excluded.cpu, memory_mb = excluded.memory_mb,
	disk_mb = excluded.disk_mb, default_user = excluded.default_user,
	default_workdir = excluded.default_workdir, updated_at = excluded.updated_at,
	finished_at = excluded.finished_at`,
		b.ID, b.TemplateID, string(b.Status), b.ReasonMessage, b.ReasonStep, b.CPU, b.MemoryMB, b.DiskMB,
		b.DefaultUser, b.DefaultWorkdir, toMillis(b.CreatedAt), toMillis(b.UpdatedAt), finished, b.Driver)
	if err != nil {
		return fmt.Errorf("put build: %w", err)
	}
	return nil
}

const buildCols = `SELECT id, template_id, status, reason_message, reason_step, cpu, memory_mb, disk_mb,
	default_user, default_workdir, created_at, updated_at, finished_at, driver FROM template_builds`

func scanBuild(r scanner) (Build, error) {
	var (
		b                Build
		status           string
		created, updated int64
		finished         sql.NullInt64
	)
	if err := r.Scan(&b.ID, &b.TemplateID, &status, &b.ReasonMessage, &b.ReasonStep, &b.CPU, &b.MemoryMB,
		&b.DiskMB, &b.DefaultUser, &b.DefaultWorkdir, &created, &updated, &finished, &b.Driver); err != nil {
		return Build{}, err
	}
	b.Status = TemplateStatus(status)
	b.CreatedAt, b.UpdatedAt = fromMillis(created), fromMillis(updated)
	if finished.Valid {
		b.FinishedAt = fromMillis(finished.Int64)
	}
	return b, nil
}

// GetBuild returns one build of a template.
func (s *Store) GetBuild(ctx context.Context, templateID, buildID string) (Build, error) {
	b, err := scanBuild(s.db.QueryRowContext(ctx, buildCols+` WHERE id = ? AND template_id = ?`, buildID, templateID))
	if isNoRows(err) {
		return Build{}, errdefs.NotFound("build %q of template %q not found", buildID, templateID)
	}
	if err != nil {
		return Build{}, fmt.Errorf("get build: %w", err)
	}
	return b, nil
}

// BuildByID returns a build by its id alone (build ids are unique across templates).
func (s *Store) BuildByID(ctx context.Context, buildID string) (Build, error) {
	b, err := scanBuild(s.db.QueryRowContext(ctx, buildCols+` WHERE id = ?`, buildID))
	if isNoRows(err) {
		return Build{}, errdefs.NotFound("build %q not found", buildID)
	}
	if err != nil {
		return Build{}, fmt.Errorf("get build: %w", err)
	}
	return b, nil
}

// ListBuilds returns a template's builds, newest first.
func (s *Store) ListBuilds(ctx context.Context, templateID string) ([]Build, error) {
	rows, err := s.db.QueryContext(ctx, buildCols+` WHERE template_id = ? ORDER BY created_at DESC, id`, templateID)
	if err != nil {
		return nil, fmt.Errorf("list builds: %w", err)
	}
	defer rows.Close()
	var out []Build
	for rows.Next() {
		b, err := scanBuild(rows)
		if err != nil {
			return nil, fmt.Errorf("scan build: %w", err)
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// FailUnfinishedBuilds marks every build still waiting or building as failed with reason: after
// a restart nothing is running them. With drivers sharing the database, it takes only the builds
// of those it is told of (BuildsOf); with none, every unfinished build.
func (s *Store) FailUnfinishedBuilds(ctx context.Context, reason string, at time.Time, of ...BuildsOf) (int64, error) {
	cond, args := "", []any{reason, toMillis(at), toMillis(at)}
	for _, o := range of {
		c, a := o.cond()
		cond += " AND " + c
		args = append(args, a...)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE template_builds SET status = 'error', reason_message = ?,
	updated_at = ?, finished_at = ? WHERE status IN ('waiting', 'building')`+cond, args...)
	if err != nil {
		return 0, fmt.Errorf("fail unfinished builds: %w", err)
	}
	n, _ := res.RowsAffected()
	// A template whose only build died is in error too; one with an older good build stays ready.
	if _, err := s.db.ExecContext(ctx, `UPDATE templates SET status = 'error', updated_at = ?
	WHERE status IN ('waiting', 'building') AND NOT EXISTS (SELECT 1 FROM template_tags t WHERE t.template_id = templates.id)`,
		toMillis(at)); err != nil {
		return n, fmt.Errorf("fail unfinished templates: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE templates SET status = 'ready', updated_at = ?
	WHERE status IN ('waiting', 'building')`, toMillis(at)); err != nil {
		return n, fmt.Errorf("fail unfinished templates: %w", err)
	}
	return n, nil
}

// BuildsOf selects unfinished builds by the driver running them.
type BuildsOf struct {
	// Driver, when set, takes that driver's builds (and those no driver was recorded for: an
	// older binary's, alone on its database).
	Driver string
	// NotAmong, when Driver is empty, takes the builds of every driver not listed (drivers gone
	// without failing theirs).
	NotAmong []string
}

func (o BuildsOf) cond() (string, []any) {
	if o.Driver != "" {
		return "driver IN ('', ?)", []any{o.Driver}
	}
	if len(o.NotAmong) == 0 {
		return "1 = 1", nil
	}
	ph := strings.TrimSuffix(strings.Repeat("?, ", len(o.NotAmong)), ", ")
	args := make([]any, len(o.NotAmong))
	for i, n := range o.NotAmong {
		args[i] = n
	}
	return "driver NOT IN (" + ph + ")", args
}

// SetTags points each tag of a template at buildID, replacing where the tag was before.
func (s *Store) SetTags(ctx context.Context, templateID, buildID string, tags []string, at time.Time) error {
	return s.tx(ctx, func(tx *tx) error {
		for _, tag := range tags {
			if _, err := tx.ExecContext(ctx, `INSERT INTO template_tags (template_id, tag, build_id, created_at)
VALUES (?, ?, ?, ?) ON CONFLICT (template_id, tag) DO UPDATE SET build_id = excluded.build_id,
	created_at = excluded.created_at`, templateID, tag, buildID, toMillis(at)); err != nil {
				return fmt.Errorf("set tag: %w", err)
			}
		}
		return nil
	})
}

// RemoveTags removes tags from a template. Removing a tag it does not have is NotFound.
func (s *Store) RemoveTags(ctx context.Context, templateID string, tags []string) error {
	return s.tx(ctx, func(tx *tx) error {
		for _, tag := range tags {
			res, err := tx.ExecContext(ctx, `DELETE FROM template_tags WHERE template_id = ? AND tag = ?`, templateID, tag)
			if err != nil {
				return fmt.Errorf("remove tag: %w", err)
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return errdefs.NotFound("tag %q not found", tag)
			}
		}
		return nil
	})
}

// ListTags returns a template's tags, by name.
func (s *Store) ListTags(ctx context.Context, templateID string) ([]Tag, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT tag, build_id, created_at FROM template_tags WHERE template_id = ? ORDER BY tag`, templateID)
	if err != nil {
		return nil, fmt.Errorf("list tags: %w", err)
	}
	defer rows.Close()
	out := []Tag{}
	for rows.Next() {
		var t Tag
		var created int64
		if err := rows.Scan(&t.Tag, &t.BuildID, &created); err != nil {
			return nil, fmt.Errorf("scan tag: %w", err)
		}
		t.CreatedAt = fromMillis(created)
		out = append(out, t)
	}
	return out, rows.Err()
}

// TagBuild returns the build a tag of a template points at.
func (s *Store) TagBuild(ctx context.Context, templateID, tag string) (string, error) {
	var id string
	err := s.db.QueryRowContext(ctx,
		`SELECT build_id FROM template_tags WHERE template_id = ? AND tag = ?`, templateID, tag).Scan(&id)
	if isNoRows(err) {
		return "", errdefs.NotFound("tag %q not found", tag)
	}
	if err != nil {
		return "", fmt.Errorf("get tag: %w", err)
	}
	return id, nil
}
