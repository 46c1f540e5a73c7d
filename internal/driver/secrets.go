package driver

import (
	"context"
	"fmt"
	"strings"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/secrets"
	"github.com/vibemon/vmon/internal/store"
)

// SecretInfo is a secret record without its value (Sealed is always nil).
type SecretInfo = store.Secret

func (d *Driver) sealer() (*secrets.Sealer, error) {
	if d.opts.Secrets == nil {
		return nil, fmt.Errorf("secrets on this server are %w", ErrNotImplemented)
	}
	return d.opts.Secrets, nil
}

// info drops the sealed value from a record before it leaves the driver.
func info(s store.Secret) SecretInfo {
	s.Sealed = nil
	return s
}

// CreateSecret stores a new secret at version 1.
func (d *Driver) CreateSecret(ctx context.Context, name, value string, metadata map[string]string) (SecretInfo, error) {
	sealer, err := d.sealer()
	if err != nil {
		return SecretInfo{}, err
	}
	n, err := secrets.NormName(name)
	if err != nil {
		return SecretInfo{}, err
	}
	if err := secrets.CheckValue(value); err != nil {
		return SecretInfo{}, err
	}
	if err := secrets.CheckMetadata(metadata); err != nil {
		return SecretInfo{}, err
	}
	suffix, err := NewSandboxID()
	if err != nil {
		return SecretInfo{}, err
	}
	id := secrets.IDPrefix + suffix
	sealed, err := sealer.Seal(id, 1, value)
	if err != nil {
		return SecretInfo{}, err
	}
	now := d.now()
	sec := store.Secret{ID: id, Name: n, Metadata: metadata, Version: 1, Sealed: sealed, CreatedAt: now, UpdatedAt: now}
	if sec.Metadata == nil {
		sec.Metadata = map[string]string{}
	}
	if err := d.store.InsertSecret(ctx, sec); err != nil {
		return SecretInfo{}, err
	}
	d.log.Info("secret created", "secret", id, "name", n)
	return info(sec), nil
}

// UpdateSecret stores value as the secret's next version (and metadata, when given).
func (d *Driver) UpdateSecret(ctx context.Context, ref, value string, metadata map[string]string) (SecretInfo, error) {
	sealer, err := d.sealer()
	if err != nil {
		return SecretInfo{}, err
	}
	if err := secrets.CheckValue(value); err != nil {
		return SecretInfo{}, err
	}
	if metadata != nil {
		if err := secrets.CheckMetadata(metadata); err != nil {
			return SecretInfo{}, err
		}
	}
	sec, err := d.store.GetSecret(ctx, ref)
	if err != nil {
		return SecretInfo{}, err
	}
	sec.Version++
	if sec.Sealed, err = sealer.Seal(sec.ID, sec.Version, value); err != nil {
		return SecretInfo{}, err
	}
	sec.UpdatedAt = d.now()
	if err := d.store.UpdateSecret(ctx, sec.ID, sec.Version, sec.Sealed, metadata, sec.UpdatedAt); err != nil {
		return SecretInfo{}, err
	}
	if metadata != nil {
		sec.Metadata = metadata
	}
	d.log.Info("secret updated", "secret", sec.ID, "version", sec.Version)
	return info(sec), nil
}

// GetSecret returns a secret's metadata by id or name.
func (d *Driver) GetSecret(ctx context.Context, ref string) (SecretInfo, error) {
	if _, err := d.sealer(); err != nil {
		return SecretInfo{}, err
	}
	sec, err := d.store.GetSecret(ctx, ref)
	return info(sec), err
}

// ListSecrets returns one page of secrets, oldest first, and the next page's token.
func (d *Driver) ListSecrets(ctx context.Context, limit int, nextToken string) ([]SecretInfo, string, error) {
	if _, err := d.sealer(); err != nil {
		return nil, "", err
	}
	if limit == 0 {
		limit = MaxListLimit
	}
	if limit < 0 || limit > MaxListLimit {
		return nil, "", errdefs.InvalidArgument("limit must be between 1 and %d", MaxListLimit)
	}
	var after store.Cursor
	if nextToken != "" {
		c, err := decodeCursor(nextToken)
		if err != nil {
			return nil, "", err
		}
		// Cursors carry sandbox-shaped ids: the id without its prefix.
		after = store.Cursor{StartedAt: c.StartedAt, ID: secrets.IDPrefix + c.ID}
	}
	secs, err := d.store.ListSecrets(ctx, limit+1, after.StartedAt, after.ID)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(secs) > limit {
		secs = secs[:limit]
		last := secs[len(secs)-1]
		next = encodeCursor(store.Cursor{StartedAt: last.CreatedAt, ID: strings.TrimPrefix(last.ID, secrets.IDPrefix)})
	}
	out := make([]SecretInfo, len(secs))
	for i, s := range secs {
		out[i] = info(s)
	}
	return out, next, nil
}

// DeleteSecret destroys a secret: header rules that name it stop carrying it from their next
// request.
func (d *Driver) DeleteSecret(ctx context.Context, ref string) error {
	if _, err := d.sealer(); err != nil {
		return err
	}
	sec, err := d.store.GetSecret(ctx, ref)
	if err != nil {
		return err
	}
	if err := d.store.DeleteSecret(ctx, sec.ID); err != nil {
		return err
	}
	d.log.Info("secret deleted", "secret", sec.ID)
	return nil
}

// SecretValue opens a secret's current value for the egress proxy, which puts it in a request
// header on the node. ok is false when there is no such secret.
func (d *Driver) SecretValue(ctx context.Context, name string) (string, bool) {
	if d.opts.Secrets == nil {
		return "", false
	}
	sec, err := d.store.GetSecret(ctx, name)
	if err != nil || sec.Name != name {
		return "", false
	}
	v, err := d.opts.Secrets.Open(sec.ID, sec.Version, sec.Sealed)
	if err != nil {
		d.log.Error("a stored secret does not open with this server's key", "secret", sec.ID, "err", err)
		return "", false
	}
	return v, true
}

// checkSecrets refuses a policy whose header rules name a secret that does not exist (400), or a
// placeholder vmon cannot fill.
func (d *Driver) checkSecrets(ctx context.Context, p egress.Policy) error {
	for _, r := range p.Rules {
		for h, v := range r.Headers {
			names, err := secrets.Placeholders(v)
			if err != nil {
				return errdefs.InvalidArgument("network.rules[%s] header %s: %s", errdefs.Quote(r.Domain), errdefs.Quote(h), err.Error())
			}
			for _, n := range names {
				if d.opts.Secrets == nil {
					return errdefs.InvalidArgument("network.rules[%s] header %s: secrets are not supported on this server", errdefs.Quote(r.Domain), errdefs.Quote(h))
				}
				sec, err := d.store.GetSecret(ctx, n)
				if errdefs.Is(err, errdefs.KindNotFound) || (err == nil && sec.Name != n) {
					return errdefs.InvalidArgument("network.rules[%s] header %s: secret %s does not exist", errdefs.Quote(r.Domain), errdefs.Quote(h), errdefs.Quote(n))
				}
				if err != nil {
					return err
				}
			}
		}
	}
	return nil
}
