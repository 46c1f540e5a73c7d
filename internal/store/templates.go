package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// TemplateStatus is the build state of a template, as E2B names it.
type TemplateStatus string

const (
	TemplateWaiting  TemplateStatus = "waiting"
	TemplateBuilding TemplateStatus = "building"
	TemplateReady    TemplateStatus = "ready"
	TemplateError    TemplateStatus = "error"
)

// Template is a root filesystem sandboxes boot from, with its default resources.
type Template struct {
	ID string
	// Aliases are the names a template is addressed by ("base", "ns/name", "name:tag"), unique
	// across templates; the first is the primary one.
	Aliases  []string
	BuildID  string
	CPU      int
	MemoryMB int
	DiskMB   int
	// EnvdVersion is the agent version baked into the template.
	EnvdVersion string
	Status      TemplateStatus
	// Rootfs locates the built root filesystem for the node (a path under the data dir). It is
	// never shown to API clients.
	Rootfs         string
	DefaultUser    string
	DefaultWorkdir string
	Public         bool
	SpawnCount     int64
	LastSpawnedAt  time.Time
	CreatedAt      time.Time
	UpdatedAt      time.Time
}

// PutTemplate inserts or replaces a template and its aliases. Spawn statistics and CreatedAt of an
// existing template are kept. An alias owned by another template is a Conflict.
func (s *Store) PutTemplate(ctx context.Context, t Template) error {
	if t.ID == "" {
		return errdefs.InvalidArgument("template id is required")
	}
	switch t.Status {
	case TemplateWaiting, TemplateBuilding, TemplateReady, TemplateError:
	default:
		return errdefs.InvalidArgument("invalid template status %q", t.Status)
	}
	return s.tx(ctx, func(tx *tx) error {
		_, err := tx.ExecContext(ctx, `
INSERT INTO templates (id, build_id, cpu, memory_mb, disk_mb, envd_version, status, rootfs,
	default_user, default_workdir, public, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET build_id = excluded.build_id, cpu = excluded.cpu,
	memory_mb = excluded.memory_mb, disk_mb = excluded.disk_mb, envd_version = excluded.envd_version,
	status = excluded.status, rootfs = excluded.rootfs, default_user = excluded.default_user,
	default_workdir = excluded.default_workdir, public = excluded.public, updated_at = excluded.updated_at`,
			t.ID, t.BuildID, t.CPU, t.MemoryMB, t.DiskMB, t.EnvdVersion, string(t.Status), t.Rootfs,
			t.DefaultUser, t.DefaultWorkdir, t.Public, toMillis(t.CreatedAt), toMillis(t.UpdatedAt))
		if err != nil {
			return fmt.Errorf("upsert template: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM template_aliases WHERE template_id = ?`, t.ID); err != nil {
			return fmt.Errorf("clear template aliases: %w", err)
		}
		for i, a := range t.Aliases {
			var owner string
			err := tx.QueryRowContext(ctx, `SELECT template_id FROM template_aliases WHERE alias = ?`, a).Scan(&owner)
			if err == nil {
				return errdefs.Conflict("template name %q is already used by template %q", a, owner)
			}
			if !isNoRows(err) {
				return fmt.Errorf("check alias: %w", err)
			}
			if _, err := tx.ExecContext(ctx,
				`INSERT INTO template_aliases (alias, template_id, position) VALUES (?, ?, ?)`, a, t.ID, i); err != nil {
				return fmt.Errorf("insert alias: %w", err)
			}
		}
		return nil
	})
}

// GetTemplate returns the template with the given id.
func (s *Store) GetTemplate(ctx context.Context, id string) (Template, error) {
	t, err := scanTemplate(s.db.QueryRowContext(ctx, templateCols+` WHERE id = ?`, id))
	if isNoRows(err) {
		return Template{}, errdefs.NotFound("template %q not found", id)
	}
	if err != nil {
		return Template{}, fmt.Errorf("get template: %w", err)
	}
	return s.withAliases(ctx, t)
}

// TemplateByAlias returns the template that owns alias.
func (s *Store) TemplateByAlias(ctx context.Context, alias string) (Template, error) {
	var id string
	err := s.db.QueryRowContext(ctx, `SELECT template_id FROM template_aliases WHERE alias = ?`, alias).Scan(&id)
	if isNoRows(err) {
		return Template{}, errdefs.NotFound("template %q not found", alias)
	}
	if err != nil {
		return Template{}, fmt.Errorf("look up template alias: %w", err)
	}
	return s.GetTemplate(ctx, id)
}

// ListTemplates returns all templates, oldest first.
func (s *Store) ListTemplates(ctx context.Context) ([]Template, error) {
	rows, err := s.db.QueryContext(ctx, templateCols+` ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan template: %w", err)
		}
		out = append(out, t)
	}
	// Close before the alias queries: the store has a single connection.
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	for i := range out {
		if out[i], err = s.withAliases(ctx, out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DeleteTemplate removes a template and its aliases. Deleting a missing template succeeds.
//
// A template one of whose builds was started and has not finished is a Conflict: the check and
// the delete are one transaction, so a start claiming a build (ClaimBuild) either comes first and
// is seen, or finds the template gone.
func (s *Store) DeleteTemplate(ctx context.Context, id string) error {
	return s.tx(ctx, func(tx *tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM template_builds WHERE template_id = ? AND `+underway,
			id, true).Scan(&n); err != nil {
			return fmt.Errorf("delete template: %w", err)
		}
		if n > 0 {
			return errdefs.Conflict("template %s has a build in progress", id)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM templates WHERE id = ?`, id); err != nil {
			return fmt.Errorf("delete template: %w", err)
		}
		return nil
	})
}

// RecordSpawn counts one sandbox started from template id.
func (s *Store) RecordSpawn(ctx context.Context, id string, at time.Time) error {
	_, err := s.db.ExecContext(ctx,
		`UPDATE templates SET spawn_count = spawn_count + 1, last_spawned_at = ? WHERE id = ?`, toMillis(at), id)
	if err != nil {
		return fmt.Errorf("record template spawn: %w", err)
	}
	return nil
}

func (s *Store) withAliases(ctx context.Context, t Template) (Template, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT alias FROM template_aliases WHERE template_id = ? ORDER BY position`, t.ID)
	if err != nil {
		return Template{}, fmt.Errorf("list template aliases: %w", err)
	}
	defer rows.Close()
	t.Aliases = []string{}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			return Template{}, fmt.Errorf("scan alias: %w", err)
		}
		t.Aliases = append(t.Aliases, a)
	}
	if err := rows.Err(); err != nil {
		return Template{}, fmt.Errorf("list template aliases: %w", err)
	}
	return t, nil
}

var templateCols = `SELECT ` + strings.Join([]string{"id", "build_id", "cpu", "memory_mb", "disk_mb",
	"envd_version", "status", "rootfs", "default_user", "default_workdir", "public", "spawn_count",
	"last_spawned_at", "created_at", "updated_at"}, ", ") + ` FROM templates`

func scanTemplate(r scanner) (Template, error) {
	var (
		t                Template
		status           string
		lastSpawned      sql.NullInt64
		created, updated int64
	)
	err := r.Scan(&t.ID, &t.BuildID, &t.CPU, &t.MemoryMB, &t.DiskMB, &t.EnvdVersion, &status, &t.Rootfs,
		&t.DefaultUser, &t.DefaultWorkdir, &t.Public, &t.SpawnCount, &lastSpawned, &created, &updated)
	if err != nil {
		return Template{}, err
	}
	t.Status = TemplateStatus(status)
	t.LastSpawnedAt = fromNullMillis(lastSpawned)
	t.CreatedAt = fromMillis(created)
	t.UpdatedAt = fromMillis(updated)
	return t, nil
}
