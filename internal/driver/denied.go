package driver

import (
	"context"
	"fmt"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
)

// DeniedWatcher is the part of a node that reports what it refused its sandboxes (*node.Node).
type DeniedWatcher interface {
	WatchDenied(id string) ([]node.DeniedEvent, <-chan node.DeniedEvent, func(), error)
}

// WatchDenied returns a running sandbox's recent refusals and a channel of the next ones; cancel
// ends the watch. A paused sandbox has none (its node holds no link for it).
func (d *Driver) WatchDenied(ctx context.Context, id string) ([]node.DeniedEvent, <-chan node.DeniedEvent, func(), error) {
	w, ok := d.opts.Node.(DeniedWatcher)
	if !ok {
		return nil, nil, nil, fmt.Errorf("refusal streams on this node are %w", ErrNotImplemented)
	}
	sb, err := d.Get(ctx, id)
	if err != nil {
		return nil, nil, nil, err
	}
	if sb.State != store.StateRunning {
		return nil, nil, nil, errdefs.Conflict("sandbox %q is %s; only a running sandbox has a network to watch", id, sb.State)
	}
	return w.WatchDenied(id)
}
