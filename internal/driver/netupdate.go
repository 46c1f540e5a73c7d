package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

// NetworkStore records a live network update on a sandbox record: the new network JSON and
// allow_internet_access, only while the record is running (a Conflict otherwise, NotFound for an
// unknown id). *store.Store is one.
type NetworkStore interface {
	SetSandboxNetwork(ctx context.Context, id string, network json.RawMessage, allowInternetAccess *bool) error
}

var _ NetworkStore = (*store.Store)(nil)

// updateTimeout bounds one live policy update on the node.
const updateTimeout = 30 * time.Second

// UpdateNetwork replaces the egress policy of a running sandbox (PUT /sandboxes/{id}/network).
// It is a full replacement: allowOut, denyOut, rules, egressProxy and allow_internet_access all
// take the values in c, omitted ones are cleared, and the ingress settings (allowPublicTraffic,
// maskRequestHost, httpsPorts) are kept. The node applies the policy first; the record changes
// only once it has, so a failed update leaves both as they were.
//
// Errors: InvalidArgument for an invalid policy or one needing a feature the sandbox's node lacks,
// NotFound for an unknown sandbox, Conflict unless it is running.
func (d *Driver) UpdateNetwork(ctx context.Context, id string, c NetworkUpdate) error {
	norm, err := egress.Normalize(c)
	if err != nil {
		return err
	}
	p, err := egress.Parse(norm)
	if err != nil {
		return fmt.Errorf("re-parse normalised egress config: %w", err)
	}
	unlock := d.lock(id)
	defer unlock()
	if err := d.checkRecovered(id); err != nil {
		return err
	}
	sb, err := d.store.GetSandbox(ctx, id)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return notFound(id)
	}
	if err != nil {
		return err
	}
	if sb.State != store.StateRunning {
		return errdefs.Conflict("sandbox %q is %s; only a running sandbox's network can be updated", id, sb.State)
	}
	if missing := d.missingFeaturesOn(sb.NodeID, p); len(missing) > 0 {
		return errdefs.InvalidArgument("the sandbox's node cannot enforce this network policy: %s",
			d.describeMissingOn(sb.NodeID, missing))
	}
	if err := d.checkSecrets(ctx, p); err != nil {
		return err
	}
	old, err := decodeNetwork(sb.Network)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(old.withEgress(norm))
	if err != nil {
		return fmt.Errorf("encode network config: %w", err)
	}

	// Detached from the client: a hang-up must not leave the node on the new policy while the
	// record keeps the old one.
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), updateTimeout)
	defer cancel()
	if err := d.node.UpdateEgress(uctx, id, p); err != nil {
		d.log.Error("node failed to update egress policy", "sandbox", id, "err", err)
		if errdefs.Is(err, errdefs.KindNotFound) {
			return notFound(id)
		}
		if errdefs.KindOf(err) != errdefs.KindUnknown {
			return err
		}
		return errdefs.Wrap(errdefs.KindUnknown, err, "failed to apply the network policy to sandbox %q", id)
	}
	if err := d.netStore.SetSandboxNetwork(uctx, id, raw, norm.AllowInternetAccess); err != nil {
		// The node runs the new policy but the record says otherwise; put the node back so that
		// what is enforced is what a restart would restore.
		if prev, perr := policyOf(sb); perr != nil {
			d.log.Error("rebuild previous egress policy for rollback", "sandbox", id, "err", perr)
		} else if rerr := d.node.UpdateEgress(uctx, id, prev); rerr != nil {
			d.log.Error("roll back egress policy after failing to record it", "sandbox", id, "err", rerr)
		}
		return fmt.Errorf("record network update of sandbox %s: %w", id, err)
	}
	d.log.Info("sandbox network updated", "sandbox", id, "allow_out", len(norm.AllowOut),
		"deny_out", len(norm.DenyOut), "rules", len(norm.Rules), "proxy", norm.EgressProxy != nil)
	d.sbLog(id, sandboxlog.LevelInfo, "network policy updated", "allowOut", clipList(norm.AllowOut), "denyOut", clipList(norm.DenyOut), "ruleDomains", itoa(len(norm.Rules)), "egressProxy", strconv.FormatBool(norm.EgressProxy != nil))
	return nil
}
