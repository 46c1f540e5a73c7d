package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// Node states as the driver records them.
const (
	NodeReady    = "ready"
	NodeDraining = "draining"
	// NodeLost: gossip lost the node (it failed, or a partition cut it off); its sandboxes are
	// unreachable until it is back.
	NodeLost = "lost"
	// NodeLeft: the node said it was leaving (stopped on purpose).
	NodeLeft = "left"
)

// Drain modes an operator asks for.
const (
	DrainNone = ""
	// DrainStop stops placements on the node.
	DrainStop = "drain"
	// DrainPause also pauses its running sandboxes, so that they resume elsewhere.
	DrainPause = "drain-pause"
)

// Node is a node of the cluster as the driver last saw it.
type Node struct {
	Name, RPC, Gossip string
	State             string
	Features          []string
	Templates         []string
	FreeSlots         int
	FreeMemoryMB      int64
	FreeDiskMB        int64
	Load              float64
	// Drain is what an operator asked for (DrainNone, DrainStop, DrainPause); UpsertNode leaves
	// it as it is.
	Drain string
	// SeenAt is when the driver last heard from the node; Since when State last changed.
	SeenAt, Since time.Time
}

// UpsertNode records what the driver sees of a node; Since moves only when the state changes.
func (s *Store) UpsertNode(ctx context.Context, n Node) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO nodes (name, rpc, gossip, state, features, templates, free_slots,
	free_memory_mb, free_disk_mb, load, seen_at, since) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET rpc = excluded.rpc, gossip = excluded.gossip, features = excluded.features,
	templates = excluded.templates, free_slots = excluded.free_slots, free_memory_mb = excluded.free_memory_mb,
	free_disk_mb = excluded.free_disk_mb, load = excluded.load, seen_at = excluded.seen_at,
	since = CASE WHEN nodes.state = excluded.state THEN nodes.since ELSE excluded.since END,
	state = excluded.state`,
		n.Name, n.RPC, n.Gossip, n.State, strings.Join(n.Features, ","), strings.Join(n.Templates, ","), n.FreeSlots,
		n.FreeMemoryMB, n.FreeDiskMB, n.Load, toMillis(n.SeenAt), toMillis(n.Since))
	if err != nil {
		return fmt.Errorf("record node %s: %w", n.Name, err)
	}
	return nil
}

// SetNodeState changes a recorded node's state (lost, left) without what only its reports carry.
func (s *Store) SetNodeState(ctx context.Context, name, state string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET since = CASE WHEN state = ? THEN since ELSE ? END, state = ? WHERE name = ?`,
		state, toMillis(at), state, name)
	if err != nil {
		return fmt.Errorf("set node %s %s: %w", name, state, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("node %q is not known", name)
	}
	return nil
}

// SetNodeDrain records an operator's drain (or its end, DrainNone) for node name.
func (s *Store) SetNodeDrain(ctx context.Context, name, mode string) error {
	switch mode {
	case DrainNone, DrainStop, DrainPause:
	default:
		return errdefs.InvalidArgument("unknown drain mode %q", mode)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET drain = ? WHERE name = ?`, mode, name)
	if err != nil {
		return fmt.Errorf("drain node %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("node %q is not known", name)
	}
	return nil
}

// GetNode returns node name.
func (s *Store) GetNode(ctx context.Context, name string) (Node, error) {
	ns, err := s.queryNodes(ctx, `WHERE name = ?`, name)
	if err != nil {
		return Node{}, err
	}
	if len(ns) == 0 {
		return Node{}, errdefs.NotFound("node %q is not known", name)
	}
	return ns[0], nil
}

// ListNodes returns every recorded node, by name.
func (s *Store) ListNodes(ctx context.Context) ([]Node, error) {
	return s.queryNodes(ctx, ``)
}

func (s *Store) queryNodes(ctx context.Context, where string, args ...any) ([]Node, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, rpc, gossip, state, features, templates, free_slots, free_memory_mb,
	free_disk_mb, load, drain, seen_at, since FROM nodes `+where+` ORDER BY name`, args...)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	var out []Node
	for rows.Next() {
		var n Node
		var features, templates string
		var seen, since int64
		if err := rows.Scan(&n.Name, &n.RPC, &n.Gossip, &n.State, &features, &templates, &n.FreeSlots, &n.FreeMemoryMB,
			&n.FreeDiskMB, &n.Load, &n.Drain, &seen, &since); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		n.Features, n.Templates = splitList(features), splitList(templates)
		n.SeenAt, n.Since = fromMillis(seen), fromMillis(since)
		out = append(out, n)
	}
	if err := rows.Err(); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
