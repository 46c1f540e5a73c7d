package driver

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

// MaxListLimit is the largest page E2B serves, and the default.
const MaxListLimit = 100

// ListOptions filter and page a sandbox listing. Zero values do not filter.
type ListOptions struct {
	// States to include: running and/or paused; empty means both.
	States []store.SandboxState
	// Metadata must match exactly on every pair.
	Metadata map[string]string
	// Template is a template id or name.
	Template     string
	StartedAfter time.Time
	// Ascending orders oldest first; the default is newest first.
	Ascending bool
	// Limit is the page size, 1..MaxListLimit; 0 means MaxListLimit.
	Limit int
	// NextToken continues a previous listing.
	NextToken string
}

// ListResult is one page.
type ListResult struct {
	Sandboxes []Sandbox
	// NextToken is "" on the last page.
	NextToken string
	// TotalRunning counts all running sandboxes, ignoring filters and paging.
	TotalRunning int
}

// List returns one page of live sandboxes. Paging is keyset-based on (start time, id), so pages
// stay consistent while sandboxes are created or killed between calls: nothing is repeated and
// nothing that existed throughout is skipped.
func (d *Driver) List(ctx context.Context, o ListOptions) (ListResult, error) {
	limit := o.Limit
	if limit == 0 {
		limit = MaxListLimit
	}
	if limit < 0 || limit > MaxListLimit {
		return ListResult{}, errdefs.InvalidArgument("limit must be between 1 and %d", MaxListLimit)
	}
	states := o.States
	if len(states) == 0 {
		states = []store.SandboxState{store.StateRunning, store.StatePaused}
	}
	for _, s := range states {
		if s != store.StateRunning && s != store.StatePaused {
			return ListResult{}, errdefs.InvalidArgument("invalid state %q: expected running or paused", s)
		}
	}
	q := store.SandboxQuery{
		States:       states,
		Metadata:     o.Metadata,
		Template:     d.templateFilter(ctx, o.Template),
		StartedAfter: o.StartedAfter,
		Desc:         !o.Ascending,
		Limit:        limit + 1, // one extra row tells whether another page exists
	}
	if o.NextToken != "" {
		c, err := decodeCursor(o.NextToken)
		if err != nil {
			return ListResult{}, err
		}
		q.After = &c
	}
	sbs, err := d.store.ListSandboxes(ctx, q)
	if err != nil {
		return ListResult{}, err
	}
	var res ListResult
	if len(sbs) > limit {
		sbs = sbs[:limit]
		last := sbs[len(sbs)-1]
		res.NextToken = encodeCursor(store.Cursor{StartedAt: last.StartedAt, ID: last.ID})
	}
	res.Sandboxes = sbs
	res.TotalRunning, err = d.store.CountSandboxes(ctx, store.SandboxQuery{States: []store.SandboxState{store.StateRunning}})
	if err != nil {
		return ListResult{}, err
	}
	return res, nil
}

// ListRunning returns every running sandbox matching metadata, newest first (E2B's v1 list, which
// has no paging).
func (d *Driver) ListRunning(ctx context.Context, metadata map[string]string) ([]Sandbox, error) {
	return d.store.ListSandboxes(ctx, store.SandboxQuery{
		States:   []store.SandboxState{store.StateRunning},
		Metadata: metadata,
		Desc:     true,
	})
}

// templateFilter turns a template name into its id so that sandboxes created by either match;
// unknown names filter literally (their template may have been deleted).
func (d *Driver) templateFilter(ctx context.Context, ref string) string {
	if ref == "" {
		return ""
	}
	if tpl, _, err := d.LookupTemplate(ctx, ref); err == nil {
		return tpl.ID
	}
	return ref
}

// Cursor tokens are opaque to clients; the "1." prefix versions the format.
func encodeCursor(c store.Cursor) string {
	raw := "1." + strconv.FormatInt(c.StartedAt.UnixMilli(), 10) + "." + c.ID
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func decodeCursor(tok string) (store.Cursor, error) {
	bad := errdefs.InvalidArgument("invalid nextToken")
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return store.Cursor{}, bad
	}
	parts := strings.SplitN(string(raw), ".", 3)
	if len(parts) != 3 || parts[0] != "1" || !ValidSandboxID(parts[2]) {
		return store.Cursor{}, bad
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || ms < 0 {
		return store.Cursor{}, bad
	}
	return store.Cursor{StartedAt: time.UnixMilli(ms).UTC(), ID: parts[2]}, nil
}
