package cluster

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/sandboxlog"
)

// logReader is the part of a node client that answers its part of sandbox logs (nodeapi.Client).
type logReader interface {
	SandboxLogs(ctx context.Context, id string, q sandboxlog.Query) ([]sandboxlog.Entry, error)
}

// logsAskTimeout bounds how long a read waits for one node's part of a log.
const logsAskTimeout = 5 * time.Second

// Logs is a driver's sandbox logs in a cluster: it writes its own entries (the lifecycle) to
// local, and a read merges them with what the nodes wrote about the sandbox (processes, limits,
// egress refusals), asked of every node, since a sandbox that moved has parts of its log on each
// node it ran on. A node that does not answer leaves its part out of that read.
type Logs struct {
	local driver.SandboxLog
	r     *Router
}

var _ driver.SandboxLog = (*Logs)(nil)

// NewLogs keeps the driver's entries in local and reads the nodes' through r.
func NewLogs(local driver.SandboxLog, r *Router) *Logs { return &Logs{local: local, r: r} }

func (l *Logs) Append(id string, e sandboxlog.Entry) { l.local.Append(id, e) }
func (l *Logs) End(id string, e sandboxlog.Entry)    { l.local.End(id, e) }

// Query is QueryContext without a caller's context.
func (l *Logs) Query(id string, q sandboxlog.Query) ([]sandboxlog.Entry, error) {
	return l.QueryContext(context.Background(), id, q)
}

// QueryContext returns the entries q selects from the driver's part and every node's, in q's
// order, at most q.Limit of them. No part anywhere is sandboxlog.ErrNotFound.
func (l *Logs) QueryContext(ctx context.Context, id string, q sandboxlog.Query) ([]sandboxlog.Entry, error) {
	all, err := l.local.Query(id, q)
	found := err == nil
	if err != nil && !errors.Is(err, sandboxlog.ErrNotFound) {
		return nil, err
	}
	var readers []logReader
	for _, n := range l.r.Nodes() {
		if n.Meta.Role != membership.RoleNode {
			continue
		}
		if c, ok := l.r.Client(n.Name); ok {
			if lr, ok := c.(logReader); ok {
				readers = append(readers, lr)
			}
		}
	}
	parts := make([][]sandboxlog.Entry, len(readers))
	var wg sync.WaitGroup
	for i, lr := range readers {
		wg.Go(func() {
			actx, cancel := context.WithTimeout(ctx, logsAskTimeout)
			defer cancel()
			if es, err := lr.SandboxLogs(actx, id, q); err == nil {
				parts[i] = append([]sandboxlog.Entry{}, es...)
			}
		})
	}
	wg.Wait()
	// envd keeps its recent events in the sandbox's memory, so a node that resumed a sandbox
	// paused elsewhere reads again the events the other node logged before the pause: an entry
	// another part holds too is one event, kept once.
	type key struct {
		t               int64
		level           sandboxlog.Level
		logger, message string
	}
	seen := map[key]int{}
	for i, part := range parts {
		if part == nil {
			continue
		}
		found = true
		for _, e := range part {
			k := key{e.Time.UnixNano(), e.Level, e.Logger, e.Message}
			if j, ok := seen[k]; ok && j != i {
				continue
			}
			seen[k] = i
			all = append(all, e)
		}
	}
	if !found {
		return nil, sandboxlog.ErrNotFound
	}
	// Each part is in q's order and holds at most q.Limit: the first q.Limit of their union are
	// the log's (fewer when parts repeated each other's entries near the limit).
	slices.SortStableFunc(all, func(a, b sandboxlog.Entry) int {
		if q.Backward {
			return b.Time.Compare(a.Time)
		}
		return a.Time.Compare(b.Time)
	})
	if q.Limit > 0 && len(all) > q.Limit {
		all = all[:q.Limit]
	}
	if all == nil {
		all = []sandboxlog.Entry{}
	}
	return all, nil
}
