package store

import (
	"context"
	"fmt"
	"time"
)

// Driver is a driver sharing the database, as it last said: where it gossips, and when.
type Driver struct {
	Name   string
	Gossip string
	SeenAt time.Time
}

// SeenDriver records that driver name gossips at gossip, as of at. Drivers call it now and then,
// so that one starting finds the others' gossip through the database they share.
func (s *Store) SeenDriver(ctx context.Context, name, gossip string, at time.Time) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO drivers (name, gossip, seen_at) VALUES (?, ?, ?)
ON CONFLICT (name) DO UPDATE SET gossip = excluded.gossip, seen_at = excluded.seen_at`, name, gossip, toMillis(at)); err != nil {
		return fmt.Errorf("record driver: %w", err)
	}
	return nil
}

// Drivers lists the drivers seen since since, and forgets those not seen for long (before
// forgetBefore).
func (s *Store) Drivers(ctx context.Context, since, forgetBefore time.Time) ([]Driver, error) {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM drivers WHERE seen_at < ?`, toMillis(forgetBefore)); err != nil {
		return nil, fmt.Errorf("forget old drivers: %w", err)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT name, gossip, seen_at FROM drivers WHERE seen_at >= ? ORDER BY name`, toMillis(since))
	if err != nil {
		return nil, fmt.Errorf("list drivers: %w", err)
	}
	defer rows.Close()
	var out []Driver
	for rows.Next() {
		var d Driver
		var seen int64
		if err := rows.Scan(&d.Name, &d.Gossip, &seen); err != nil {
			return nil, fmt.Errorf("list drivers: %w", err)
		}
		d.SeenAt = fromMillis(seen)
		out = append(out, d)
	}
	return out, rows.Err()
}
