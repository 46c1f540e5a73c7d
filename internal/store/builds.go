package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

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
	// Driver is the driver running the build (several may share a database): the one that
	// created it until a start claims it (ClaimBuild), then the one that runs it.
	Driver string
	// Tags are what a successful build is tagged with (besides the default tag's rule); set when
	// the build is created.
	Tags []string
	// Started is set by the one start that claimed the build (ClaimBuild).
	Started bool
}

// Tag names one build of a template ("default" is the implicit tag).
type Tag struct {
	Tag       string
	BuildID   string
	CreatedAt time.Time
}

// PutBuild inserts or updates a build. An update leaves its tags, its driver and whether it was
// started as they are: those change only through ClaimBuild and ReleaseBuild.
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
	if b.Tags == nil {
		b.Tags = []string{}
	}
	tags, err := json.Marshal(b.Tags)
	if err != nil {
		return fmt.Errorf("put build: %w", err)
	}
	_, err = s.db.ExecContext(ctx, `
INSERT INTO template_builds (id, template_id, status, reason_message, reason_step, cpu, memory_mb,
	disk_mb, default_user, default_workdir, created_at, updated_at, finished_at, driver, tags, started)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET status = excluded.status, reason_message = excluded.reason_message,
	reason_step = excluded.reason_step, cpu = excluded.cpu, memory_mb = excluded.memory_mb,
	disk_mb = excluded.disk_mb, default_user = excluded.default_user,
	default_workdir = excluded.default_workdir, updated_at = excluded.updated_at,
	finished_at = excluded.finished_at`,
		b.ID, b.TemplateID, string(b.Status), b.ReasonMessage, b.ReasonStep, b.CPU, b.MemoryMB, b.DiskMB,
		b.DefaultUser, b.DefaultWorkdir, toMillis(b.CreatedAt), toMillis(b.UpdatedAt), finished, b.Driver,
		string(tags), b.Started)
	if err != nil {
		return fmt.Errorf("put build: %w", err)
	}
	return nil
}

// ClaimBuild marks a waiting build started by driver, once: a second claim, from this driver or
// another sharing the database, is a Conflict. The claimer runs the build.
func (s *Store) ClaimBuild(ctx context.Context, templateID, buildID, driver string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE template_builds SET started = ?, driver = ?, updated_at = ?
	WHERE id = ? AND template_id = ? AND status = 'waiting' AND started = ?`,
		true, driver, toMillis(at), buildID, templateID, false)
	if err != nil {
		return fmt.Errorf("claim build: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		b, err := s.GetBuild(ctx, templateID, buildID)
		if err != nil {
			return err
		}
		if b.Status == TemplateError {
			return errdefs.Conflict("build %s cannot be started: it failed (%s)", buildID, b.ReasonMessage)
		}
		return errdefs.Conflict("build %s was already started", buildID)
	}
	return nil
}

// ReleaseBuild undoes a claim whose start was refused, so a corrected start may claim it.
func (s *Store) ReleaseBuild(ctx context.Context, templateID, buildID string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE template_builds SET started = ?
	WHERE id = ? AND template_id = ? AND status = 'waiting'`, false, buildID, templateID); err != nil {
		return fmt.Errorf("release build: %w", err)
	}
	return nil
}

// FailUnstartedBuilds fails the builds created before and never started: a client that created
// one and went away leaves it waiting for ever otherwise.
func (s *Store) FailUnstartedBuilds(ctx context.Context, before, at time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE template_builds SET status = 'error',
	reason_message = 'the build was never started', updated_at = ?, finished_at = ?
	WHERE status = 'waiting' AND started = ? AND created_at < ?`, toMillis(at), toMillis(at), false, toMillis(before))
	if err != nil {
		return 0, fmt.Errorf("fail unstarted builds: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

const buildCols = `SELECT id, template_id, status, reason_message, reason_step, cpu, memory_mb, disk_mb,
	default_user, default_workdir, created_at, updated_at, finished_at, driver, tags, started FROM template_builds`

func scanBuild(r scanner) (Build, error) {
	var (
		b                Build
		status           string
		created, updated int64
		finished         sql.NullInt64
		tags             string
	)
	if err := r.Scan(&b.ID, &b.TemplateID, &status, &b.ReasonMessage, &b.ReasonStep, &b.CPU, &b.MemoryMB,
		&b.DiskMB, &b.DefaultUser, &b.DefaultWorkdir, &created, &updated, &finished, &b.Driver, &tags, &b.Started); err != nil {
		return Build{}, err
	}
	if err := json.Unmarshal([]byte(tags), &b.Tags); err != nil {
		return Build{}, fmt.Errorf("build %s tags: %w", b.ID, err)
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

// underway is the condition "a start claimed the build and it has not finished"; its one
// argument is true (started).
const underway = `(status = 'building' OR (status = 'waiting' AND started = ?))`

// FailUnfinishedBuilds marks every build a start claimed and that has not finished as failed with
// reason: after a restart nothing is running them. A build created and not started yet stays: its
// start may still come (FailUnstartedBuilds ends those that wait too long). With drivers sharing
// the database, it takes only the builds of those it is told of (BuildsOf); with none, every
// unfinished build.
func (s *Store) FailUnfinishedBuilds(ctx context.Context, reason string, at time.Time, of ...BuildsOf) (int64, error) {
	cond, args := "", []any{reason, toMillis(at), toMillis(at), true}
	for _, o := range of {
		c, a := o.cond()
		cond += " AND " + c
		args = append(args, a...)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE template_builds SET status = 'error', reason_message = ?,
	updated_at = ?, finished_at = ? WHERE `+underway+cond, args...)
	if err != nil {
		return 0, fmt.Errorf("fail unfinished builds: %w", err)
	}
	n, _ := res.RowsAffected()
	// A template without a good build is in error once no build of it is left to run; one with a
	// good build is ready again once none of its builds runs (through another driver).
	const (
		tagged  = `EXISTS (SELECT 1 FROM template_tags t WHERE t.template_id = templates.id)`
		pending = `EXISTS (SELECT 1 FROM template_builds b WHERE b.template_id = templates.id AND b.status IN ('waiting', 'building'))`
		running = `EXISTS (SELECT 1 FROM template_builds b WHERE b.template_id = templates.id AND ` + underway + `)`
	)
	if _, err := s.db.ExecContext(ctx, `UPDATE templates SET status = 'error', updated_at = ?
	WHERE status IN ('waiting', 'building') AND NOT `+tagged+` AND NOT `+pending, toMillis(at)); err != nil {
		return n, fmt.Errorf("fail unfinished templates: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE templates SET status = 'ready', updated_at = ?
	WHERE status IN ('waiting', 'building') AND `+tagged+` AND NOT `+running, toMillis(at), true); err != nil {
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

// BuildLogEntry is one line of a build's log as drivers sharing a database keep it.
type BuildLogEntry struct {
	Time    time.Time
	Level   string
	Step    string
	Message string
}

// AppendBuildLog stores entries as lines first, first+1, … of a build's log. Lines already
// stored are left as they are, so a write retried after an error repeats nothing.
func (s *Store) AppendBuildLog(ctx context.Context, buildID string, first int, entries []BuildLogEntry) error {
	if len(entries) == 0 {
		return nil
	}
	// Many rows per statement: a build logs thousands of lines, and a round trip per line to a
	// database across the network would make the log lag behind the build.
	const rowsPer = 100
	return s.tx(ctx, func(tx *tx) error {
		for start := 0; start < len(entries); start += rowsPer {
			batch := entries[start:min(start+rowsPer, len(entries))]
			args := make([]any, 0, 6*len(batch))
			for i, e := range batch {
				args = append(args, buildID, first+start+i, toMillis(e.Time), cleanText(e.Level), cleanText(e.Step), cleanText(e.Message))
			}
			values := strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?), ", len(batch)), ", ")
			if _, err := tx.ExecContext(ctx, `INSERT INTO build_log (build_id, seq, at, level, step, message)
VALUES `+values+` ON CONFLICT (build_id, seq) DO NOTHING`, args...); err != nil {
				return fmt.Errorf("append to build log: %w", err)
			}
		}
		return nil
	})
}

// BuildLog returns up to limit lines of a build's log from line offset on.
func (s *Store) BuildLog(ctx context.Context, buildID string, offset, limit int) ([]BuildLogEntry, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT at, level, step, message FROM build_log
	WHERE build_id = ? AND seq >= ? ORDER BY seq LIMIT ?`, buildID, offset, limit)
	if err != nil {
		return nil, fmt.Errorf("read build log: %w", err)
	}
	defer rows.Close()
	out := []BuildLogEntry{}
	for rows.Next() {
		var e BuildLogEntry
		var at int64
		if err := rows.Scan(&at, &e.Level, &e.Step, &e.Message); err != nil {
			return nil, fmt.Errorf("scan build log: %w", err)
		}
		e.Time = fromMillis(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// cleanText makes a program's output storable as TEXT on both engines: PostgreSQL refuses NUL
// bytes and invalid UTF-8 (which a build's output may hold, e.g. `find -print0`).
func cleanText(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
