package cluster

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/volumes"
)

// VolumeClient is the part of a node's client that reaches its volumes (nodeapi.Client).
type VolumeClient interface {
	VolumeCreate(ctx context.Context, id string, sizeMB int) (int64, error)
	VolumeDelete(ctx context.Context, id string) error
	VolumeSize(ctx context.Context, id string) (int64, error)
	VolumeStat(ctx context.Context, id, p string) (volumes.Entry, error)
	VolumeList(ctx context.Context, id, p string, depth int) ([]volumes.Entry, error)
	VolumeMkdir(ctx context.Context, id, p string, a volumes.Attrs, force bool) (volumes.Entry, error)
	VolumeChattr(ctx context.Context, id, p string, a volumes.Attrs) (volumes.Entry, error)
	VolumeRemove(ctx context.Context, id, p string) error
	VolumeOpen(ctx context.Context, id, p string) (io.ReadCloser, int64, error)
	VolumeWrite(ctx context.Context, id, p string, body io.Reader, a volumes.Attrs, force bool) (volumes.Entry, error)
}

// volumeCallTimeout bounds one volume call (a content request's, within its own context; the
// driver's deletes and sizes have none); reads and writes stream for as long as they last.
const volumeCallTimeout = time.Minute

// Volumes are a cluster's volumes: each lives on the node that made it (the driver records
// which), its sandboxes are placed there (Router.SetVolumeHome), and its content is reached
// through that node. It serves the driver (driver.VolumeDirs, driver.VolumePlacer) and the
// volume content API.
type Volumes struct {
	r *Router
	// home names the node volume id lives on, from the driver's records.
	home func(ctx context.Context, id string) (string, error)
}

// NewVolumes returns the volumes of r's nodes, located by home; it also tells r where volumes
// live.
func NewVolumes(r *Router, home func(ctx context.Context, id string) (string, error)) *Volumes {
	r.SetVolumeHome(home)
	return &Volumes{r: r, home: home}
}

var _ driver.VolumePlacer = (*Volumes)(nil)

// CreateVolumeOn makes volume id on the node placement picks (the one with room, least loaded)
// and names it.
func (v *Volumes) CreateVolumeOn(ctx context.Context, id string, sizeMB int) (string, error) {
	// Images are sparse: a node needs no free disk of the full size up front.
	order, clients, err := v.r.candidates(node.CreateSpec{}, nil, "")
	if err != nil {
		return "", err
	}
	var lastErr error
	for _, n := range order {
		c, ok := clients[n.Name].(VolumeClient)
		if !ok {
			lastErr = fmt.Errorf("node %s: volumes are %w", n.Name, driver.ErrNotImplemented)
			continue
		}
		_, err := c.VolumeCreate(ctx, id, sizeMB)
		if err == nil {
			return n.Name, nil
		}
		if k := errdefs.KindOf(err); k != errdefs.KindUnavailable && k != errdefs.KindResourceExhausted {
			return "", err
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = errdefs.Unavailable("no node can hold a volume")
	}
	return "", lastErr
}

// Create makes volume id on some node (driver.VolumeDirs; the driver uses CreateVolumeOn).
func (v *Volumes) Create(ctx context.Context, id string, sizeMB int) error {
	_, err := v.CreateVolumeOn(ctx, id, sizeMB)
	return err
}

// client is the client of the node volume id lives on.
func (v *Volumes) client(ctx context.Context, id string) (VolumeClient, error) {
	name, err := v.home(ctx, id)
	if err != nil {
		return nil, err
	}
	c, ok := v.r.Client(name)
	if !ok {
		return nil, errdefs.Unavailable("volume %q lives on node %s, which is not in reach", id, name)
	}
	vc, ok := c.(VolumeClient)
	if !ok {
		return nil, fmt.Errorf("node %s: volumes are %w", name, driver.ErrNotImplemented)
	}
	return vc, nil
}

func (v *Volumes) call(ctx context.Context, id string, f func(ctx context.Context, c VolumeClient) error) error {
	ctx, cancel := context.WithTimeout(ctx, volumeCallTimeout)
	defer cancel()
	c, err := v.client(ctx, id)
	if err != nil {
		return err
	}
	return f(ctx, c)
}

func (v *Volumes) Delete(id string) error {
	return v.call(context.Background(), id, func(ctx context.Context, c VolumeClient) error { return c.VolumeDelete(ctx, id) })
}

// DeleteVolumeOn deletes volume id on node name.
func (v *Volumes) DeleteVolumeOn(ctx context.Context, name, id string) error {
	c, ok := v.r.Client(name)
	if !ok {
		return errdefs.Unavailable("volume %q lives on node %s, which is not in reach; its storage stays there", id, name)
	}
	vc, ok := c.(VolumeClient)
	if !ok {
		return fmt.Errorf("node %s: volumes are %w", name, driver.ErrNotImplemented)
	}
	return vc.VolumeDelete(ctx, id)
}

func (v *Volumes) SizeBytes(id string) (size int64, err error) {
	err = v.call(context.Background(), id, func(ctx context.Context, c VolumeClient) error {
		size, err = c.VolumeSize(ctx, id)
		return err
	})
	return size, err
}

func (v *Volumes) Stat(ctx context.Context, id, p string) (e volumes.Entry, err error) {
	err = v.call(ctx, id, func(ctx context.Context, c VolumeClient) error {
		e, err = c.VolumeStat(ctx, id, p)
		return err
	})
	return e, err
}

func (v *Volumes) List(ctx context.Context, id, p string, depth int) (es []volumes.Entry, err error) {
	err = v.call(ctx, id, func(ctx context.Context, c VolumeClient) error {
		es, err = c.VolumeList(ctx, id, p, depth)
		return err
	})
	return es, err
}

func (v *Volumes) Mkdir(ctx context.Context, id, p string, a volumes.Attrs, force bool) (e volumes.Entry, err error) {
	err = v.call(ctx, id, func(ctx context.Context, c VolumeClient) error {
		e, err = c.VolumeMkdir(ctx, id, p, a, force)
		return err
	})
	return e, err
}

func (v *Volumes) Chattr(ctx context.Context, id, p string, a volumes.Attrs) (e volumes.Entry, err error) {
	err = v.call(ctx, id, func(ctx context.Context, c VolumeClient) error {
		e, err = c.VolumeChattr(ctx, id, p, a)
		return err
	})
	return e, err
}

func (v *Volumes) Remove(ctx context.Context, id, p string) error {
	return v.call(ctx, id, func(ctx context.Context, c VolumeClient) error { return c.VolumeRemove(ctx, id, p) })
}

// Open streams a file of volume id; the stream lasts until the reader is closed or ctx ends.
func (v *Volumes) Open(ctx context.Context, id, p string) (io.ReadCloser, int64, error) {
	c, err := v.client(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	return c.VolumeOpen(ctx, id, p)
}

// Write streams body into a file of volume id, for as long as the upload lasts; an upload
// cancelled with ctx leaves no file.
func (v *Volumes) Write(ctx context.Context, id, p string, body io.Reader, a volumes.Attrs, force bool) (volumes.Entry, error) {
	c, err := v.client(ctx, id)
	if err != nil {
		return volumes.Entry{}, err
	}
	return c.VolumeWrite(ctx, id, p, body, a, force)
}
