package driver

import (
	"context"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

// Changed brings what this driver keeps in memory of sandbox id (its route for ingress, its expiry)
// in line with the record, after a driver sharing the store changed it: a running record is
// routed and scheduled, anything else is forgotten. Callers feed it the store's notifications
// (store.Listen) one at a time, in order: each reads the record as it is now, so the last
// notification of a burst leaves memory as the record ends up. It returns the record and whether
// there is one; on an error reading it, memory is left as it was.
func (d *Driver) Changed(ctx context.Context, id string) (Sandbox, bool, error) {
	sb, err := d.store.GetSandbox(ctx, id)
	if errdefs.Is(err, errdefs.KindNotFound) {
		d.forget(id)
		return Sandbox{}, false, nil
	}
	if err != nil {
		d.log.Warn("reload a changed sandbox record", "sandbox", id, "err", err)
		return Sandbox{}, false, err
	}
	if sb.State == store.StateRunning {
		d.track(sb)
	} else {
		d.forget(id)
	}
	return sb, true, nil
}

// Resync reloads every running record into memory and forgets the sandboxes no running record
// names any more: what Changed would have done for the notifications missed while the driver was
// not listening. It returns the running records.
func (d *Driver) Resync(ctx context.Context) ([]Sandbox, error) {
	recs, err := d.store.ListSandboxes(ctx, store.SandboxQuery{States: []store.SandboxState{store.StateRunning}})
	if err != nil {
		return nil, err
	}
	running := make(map[string]bool, len(recs))
	for _, sb := range recs {
		running[sb.ID] = true
		d.track(sb)
	}
	var gone []string
	d.mu.Lock()
	for id := range d.routes {
		if !running[id] {
			gone = append(gone, id)
		}
	}
	d.mu.Unlock()
	for _, id := range gone {
		// Read again: a create of this driver may have made it running since the listing.
		d.Changed(ctx, id)
	}
	return recs, nil
}
