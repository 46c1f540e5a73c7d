package driver

import (
	"context"
	"crypto/subtle"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
)

// VolumeDirs makes and removes the filesystems behind volumes (internal/volumes).
type VolumeDirs interface {
	// Create makes volume id of sizeMB MiB (0: the node's default; out of range is
	// InvalidArgument).
	Create(ctx context.Context, id string, sizeMB int) error
	Delete(id string) error
	// SizeBytes is the volume's size limit, 0 for none (a volume made by an older vmon).
	SizeBytes(id string) (int64, error)
}

// VolumePlacer is the optional part of VolumeDirs that spans nodes: a volume lives on the node it
// was made on, which the driver records.
type VolumePlacer interface {
	CreateVolumeOn(ctx context.Context, id string, sizeMB int) (node string, err error)
	// DeleteVolumeOn deletes volume id on node: the record naming the node may be gone already.
	DeleteVolumeOn(ctx context.Context, node, id string) error
}

// deleteDir deletes volume v's storage, wherever it lives.
func (d *Driver) deleteDir(ctx context.Context, dirs VolumeDirs, v store.Volume) error {
	if p, ok := dirs.(VolumePlacer); ok {
		return p.DeleteVolumeOn(ctx, v.NodeID, v.ID)
	}
	return dirs.Delete(v.ID)
}

// Volume is a volume record as the driver hands it out, with its size (0: no limit), which the
// node's storage holds rather than the record.
type Volume struct {
	store.Volume
	SizeMB int
}

// VolumeMountRequest is one entry of a create's volumeMounts.
type VolumeMountRequest struct {
	Name string
	Path string
}

// MaxVolumeMounts bounds the volumes one sandbox mounts.
const MaxVolumeMounts = 16

var volumeNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

func (d *Driver) volumeDirs() (VolumeDirs, error) {
	if d.opts.Volumes == nil {
		return nil, fmt.Errorf("volumes on this node are %w", ErrNotImplemented)
	}
	return d.opts.Volumes, nil
}

// CreateVolume makes a new, empty volume of sizeMB MiB (0: the node's default) and its content
// token.
func (d *Driver) CreateVolume(ctx context.Context, name string, sizeMB int) (Volume, error) {
	dirs, err := d.volumeDirs()
	if err != nil {
		return Volume{}, err
	}
	if !volumeNameRe.MatchString(name) {
		return Volume{}, errdefs.InvalidArgument("invalid volume name %s: 1 to 63 letters, digits, '_', '.' and '-', starting with a letter or digit", errdefs.Quote(name))
	}
	id, err := NewSandboxID()
	if err != nil {
		return Volume{}, err
	}
	token, err := newToken()
	if err != nil {
		return Volume{}, err
	}
	v := store.Volume{ID: id, Name: name, Token: token, CreatedAt: d.now()}
	if p, ok := dirs.(VolumePlacer); ok {
		if v.NodeID, err = p.CreateVolumeOn(ctx, id, sizeMB); err != nil {
			return Volume{}, err
		}
	} else if err := dirs.Create(ctx, id, sizeMB); err != nil {
		return Volume{}, err
	}
	if err := d.store.InsertVolume(ctx, v); err != nil {
		if derr := d.deleteDir(ctx, dirs, v); derr != nil {
			d.log.Warn("remove the storage of a volume whose record failed", "volume", id, "node", v.NodeID, "err", derr)
		}
		return Volume{}, err
	}
	out := d.withSize(dirs, v)
	d.log.Info("volume created", "volume", id, "name", name, "sizeMB", out.SizeMB, "node", v.NodeID)
	return out, nil
}

func (d *Driver) withSize(dirs VolumeDirs, v store.Volume) Volume {
	size, err := dirs.SizeBytes(v.ID)
	if err != nil {
		d.log.Warn("volume size", "volume", v.ID, "err", err)
	}
	return Volume{Volume: v, SizeMB: int(size >> 20)}
}

// GetVolume returns a volume by id.
func (d *Driver) GetVolume(ctx context.Context, id string) (Volume, error) {
	v, err := d.store.GetVolume(ctx, id)
	if err == nil && v.ID != id {
		return Volume{}, errdefs.NotFound("volume %q not found", id)
	}
	if err != nil {
		return Volume{}, err
	}
	if d.opts.Volumes == nil {
		return Volume{Volume: v}, nil
	}
	return d.withSize(d.opts.Volumes, v), nil
}

// ListVolumes returns every volume.
func (d *Driver) ListVolumes(ctx context.Context) ([]Volume, error) {
	vs, err := d.store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Volume, 0, len(vs))
	for _, v := range vs {
		if d.opts.Volumes == nil {
			out = append(out, Volume{Volume: v})
		} else {
			out = append(out, d.withSize(d.opts.Volumes, v))
		}
	}
	return out, nil
}

// DeleteVolume deletes a volume and its content, unless a live sandbox or a snapshot mounts it.
func (d *Driver) DeleteVolume(ctx context.Context, id string) error {
	dirs, err := d.volumeDirs()
	if err != nil {
		return err
	}
	v, err := d.GetVolume(ctx, id)
	if err != nil {
		return err
	}
	if err := d.store.DeleteVolume(ctx, id); err != nil {
		return err
	}
	d.log.Info("volume deleted", "volume", id, "node", v.NodeID)
	if err := d.deleteDir(ctx, dirs, v.Volume); err != nil && v.NodeID != "" {
		// The volume is gone for clients; only its node's storage is left to reclaim.
		d.log.Error("the storage of a deleted volume stays on its node", "volume", id, "node", v.NodeID, "err", err)
		return nil
	} else if err != nil {
		return err
	}
	return nil
}

// CheckVolumeToken authorises a content API call on volume id.
func (d *Driver) CheckVolumeToken(ctx context.Context, id, token string) error {
	v, err := d.GetVolume(ctx, id)
	if err != nil {
		return err
	}
	if token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(v.Token)) != 1 {
		return errdefs.Unauthorized("invalid volume token")
	}
	return nil
}

// reservedGuestPaths are where the guest's system or vmon's own mounts live.
var reservedGuestPaths = []string{"/proc", "/sys", "/dev", "/run/vmon", "/opt/vmon", "/etc", "/bin", "/sbin", "/lib", "/usr"}

// resolveMounts turns a create's volumeMounts into mounts of existing volumes at valid paths.
func (d *Driver) resolveMounts(ctx context.Context, reqs []VolumeMountRequest) ([]store.VolumeMount, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if _, err := d.volumeDirs(); err != nil {
		return nil, err
	}
	if len(reqs) > MaxVolumeMounts {
		return nil, errdefs.InvalidArgument("volumeMounts: at most %d volumes, got %d", MaxVolumeMounts, len(reqs))
	}
	out := make([]store.VolumeMount, 0, len(reqs))
	seen := map[string]bool{}
	for i, r := range reqs {
		p := r.Path
		if !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" || strings.ContainsAny(p, "\x00:") {
			return nil, errdefs.InvalidArgument("volumeMounts[%d].path %s must be a clean absolute path other than /", i, errdefs.Quote(p))
		}
		for _, res := range reservedGuestPaths {
			if p == res || strings.HasPrefix(p, res+"/") {
				return nil, errdefs.InvalidArgument("volumeMounts[%d].path %s is reserved for the system", i, errdefs.Quote(p))
			}
		}
		for prev := range seen {
			if prev == p || strings.HasPrefix(p, prev+"/") || strings.HasPrefix(prev, p+"/") {
				return nil, errdefs.InvalidArgument("volumeMounts[%d].path %s overlaps another mount", i, errdefs.Quote(p))
			}
		}
		seen[p] = true
		v, err := d.store.GetVolume(ctx, r.Name)
		if errdefs.Is(err, errdefs.KindNotFound) {
			return nil, errdefs.InvalidArgument("volumeMounts[%d]: volume %s not found", i, errdefs.Quote(r.Name))
		}
		if err != nil {
			return nil, err
		}
		out = append(out, store.VolumeMount{ID: v.ID, Name: v.Name, Path: p})
	}
	return out, nil
}

func nodeMounts(m []store.VolumeMount) []node.VolumeMount {
	out := make([]node.VolumeMount, 0, len(m))
	for _, v := range m {
		out = append(out, node.VolumeMount{ID: v.ID, Path: v.Path})
	}
	return out
}

func sameMounts(a, b []store.VolumeMount) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Path != b[i].Path {
			return false
		}
	}
	return true
}
