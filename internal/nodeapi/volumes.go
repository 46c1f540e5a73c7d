package nodeapi

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vibemon/vmon/internal/errdefs"
	nodev1 "github.com/vibemon/vmon/internal/nodeapi/gen/node"
	"github.com/vibemon/vmon/internal/volumes"
)

// VolumeHost is a node's volume storage (*volumes.Dir).
type VolumeHost interface {
	Create(ctx context.Context, id string, sizeMB int) error
	Delete(id string) error
	SizeBytes(id string) (int64, error)
	Stat(id, p string) (volumes.Entry, error)
	List(id, p string, depth int) ([]volumes.Entry, error)
	Mkdir(id, p string, a volumes.Attrs, force bool) (volumes.Entry, error)
	Chattr(id, p string, a volumes.Attrs) (volumes.Entry, error)
	Open(id, p string) (io.ReadCloser, int64, error)
	Write(id, p string, body io.Reader, a volumes.Attrs, force bool) (volumes.Entry, error)
	Remove(id, p string) error
}

// volumeChunk bounds one message of a volume file's bytes.
const volumeChunk = 256 << 10

// WithVolumes serves v's volumes too.
func (s *Server) WithVolumes(v VolumeHost) *Server {
	s.vols = v
	return s
}

func (s *Server) volumes() (VolumeHost, error) {
	if s.vols == nil {
		return nil, unsupported("volumes")
	}
	return s.vols, nil
}

func (s *Server) CreateVolume(ctx context.Context, req *connect.Request[nodev1.CreateVolumeRequest]) (*connect.Response[nodev1.VolumeSize], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	if err := v.Create(ctx, req.Msg.GetId(), int(req.Msg.GetSizeMb())); err != nil {
		return nil, toWire(err)
	}
	size, err := v.SizeBytes(req.Msg.GetId())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.VolumeSize{Bytes: size}), nil
}

func (s *Server) DeleteVolume(_ context.Context, req *connect.Request[nodev1.VolumeRequest]) (*connect.Response[nodev1.DeleteVolumeResponse], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	if err := v.Delete(req.Msg.GetId()); err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.DeleteVolumeResponse{}), nil
}

func (s *Server) GetVolumeSize(_ context.Context, req *connect.Request[nodev1.VolumeRequest]) (*connect.Response[nodev1.VolumeSize], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	size, err := v.SizeBytes(req.Msg.GetId())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.VolumeSize{Bytes: size}), nil
}

func (s *Server) VolumeStat(_ context.Context, req *connect.Request[nodev1.VolumePathRequest]) (*connect.Response[nodev1.VolumeEntry], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	e, err := v.Stat(req.Msg.GetId(), req.Msg.GetPath())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(entryToWire(e)), nil
}

func (s *Server) VolumeList(_ context.Context, req *connect.Request[nodev1.VolumeListRequest]) (*connect.Response[nodev1.VolumeEntries], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	es, err := v.List(req.Msg.GetId(), req.Msg.GetPath(), int(req.Msg.GetDepth()))
	if err != nil {
		return nil, toWire(err)
	}
	out := &nodev1.VolumeEntries{Entries: make([]*nodev1.VolumeEntry, len(es))}
	for i, e := range es {
		out.Entries[i] = entryToWire(e)
	}
	return connect.NewResponse(out), nil
}

func (s *Server) VolumeMkdir(_ context.Context, req *connect.Request[nodev1.VolumeMkdirRequest]) (*connect.Response[nodev1.VolumeEntry], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	e, err := v.Mkdir(req.Msg.GetId(), req.Msg.GetPath(), attrsFromWire(req.Msg.GetAttrs()), req.Msg.GetForce())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(entryToWire(e)), nil
}

func (s *Server) VolumeChattr(_ context.Context, req *connect.Request[nodev1.VolumeChattrRequest]) (*connect.Response[nodev1.VolumeEntry], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	e, err := v.Chattr(req.Msg.GetId(), req.Msg.GetPath(), attrsFromWire(req.Msg.GetAttrs()))
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(entryToWire(e)), nil
}

func (s *Server) VolumeRemove(_ context.Context, req *connect.Request[nodev1.VolumePathRequest]) (*connect.Response[nodev1.VolumeRemoveResponse], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	if err := v.Remove(req.Msg.GetId(), req.Msg.GetPath()); err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.VolumeRemoveResponse{}), nil
}

func (s *Server) VolumeRead(_ context.Context, req *connect.Request[nodev1.VolumePathRequest], stream *connect.ServerStream[nodev1.VolumeChunk]) error {
	v, err := s.volumes()
	if err != nil {
		return err
	}
	f, size, err := v.Open(req.Msg.GetId(), req.Msg.GetPath())
	if err != nil {
		return toWire(err)
	}
	defer f.Close()
	if err := stream.Send(&nodev1.VolumeChunk{Size: size}); err != nil {
		return err
	}
	buf := make([]byte, volumeChunk)
	for {
		n, rerr := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&nodev1.VolumeChunk{Data: buf[:n]}); err != nil {
				return err
			}
		}
		if errors.Is(rerr, io.EOF) {
			return nil
		}
		if rerr != nil {
			return toWire(rerr)
		}
	}
}

func (s *Server) VolumeWrite(_ context.Context, stream *connect.ClientStream[nodev1.VolumeWriteRequest]) (*connect.Response[nodev1.VolumeEntry], error) {
	v, err := s.volumes()
	if err != nil {
		return nil, err
	}
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, toWire(errdefs.InvalidArgument("a volume write without its target"))
	}
	h := stream.Msg().GetHeader()
	if h == nil {
		return nil, toWire(errdefs.InvalidArgument("a volume write must name its target first"))
	}
	pr := pipeData(stream)
	e, err := v.Write(h.GetId(), h.GetPath(), pr, attrsFromWire(h.GetAttrs()), h.GetForce())
	// The reader goroutine stops at its next write; the stream itself ends with this handler.
	pr.CloseWithError(errors.New("volume write ended"))
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(entryToWire(e)), nil
}

// VolumeCreate makes volume id on the node (sizeMB 0: its default) and returns its size in bytes.
func (c *Client) VolumeCreate(ctx context.Context, id string, sizeMB int) (int64, error) {
	r, err := c.c.CreateVolume(ctx, connect.NewRequest(&nodev1.CreateVolumeRequest{Id: id, SizeMb: int64(sizeMB)}))
	if err != nil {
		return 0, fromWire(err)
	}
	return r.Msg.GetBytes(), nil
}

// VolumeDelete deletes volume id and its content.
func (c *Client) VolumeDelete(ctx context.Context, id string) error {
	_, err := c.c.DeleteVolume(ctx, connect.NewRequest(&nodev1.VolumeRequest{Id: id}))
	return fromWire(err)
}

// VolumeSize is volume id's size limit in bytes (0: none).
func (c *Client) VolumeSize(ctx context.Context, id string) (int64, error) {
	r, err := c.c.GetVolumeSize(ctx, connect.NewRequest(&nodev1.VolumeRequest{Id: id}))
	if err != nil {
		return 0, fromWire(err)
	}
	return r.Msg.GetBytes(), nil
}

func (c *Client) VolumeStat(ctx context.Context, id, p string) (volumes.Entry, error) {
	r, err := c.c.VolumeStat(ctx, connect.NewRequest(&nodev1.VolumePathRequest{Id: id, Path: p}))
	if err != nil {
		return volumes.Entry{}, fromWire(err)
	}
	return entryFromWire(r.Msg), nil
}

func (c *Client) VolumeList(ctx context.Context, id, p string, depth int) ([]volumes.Entry, error) {
	r, err := c.c.VolumeList(ctx, connect.NewRequest(&nodev1.VolumeListRequest{Id: id, Path: p, Depth: int32(depth)}))
	if err != nil {
		return nil, fromWire(err)
	}
	out := make([]volumes.Entry, len(r.Msg.GetEntries()))
	for i, e := range r.Msg.GetEntries() {
		out[i] = entryFromWire(e)
	}
	return out, nil
}

func (c *Client) VolumeMkdir(ctx context.Context, id, p string, a volumes.Attrs, force bool) (volumes.Entry, error) {
	r, err := c.c.VolumeMkdir(ctx, connect.NewRequest(&nodev1.VolumeMkdirRequest{Id: id, Path: p, Attrs: attrsToWire(a), Force: force}))
	if err != nil {
		return volumes.Entry{}, fromWire(err)
	}
	return entryFromWire(r.Msg), nil
}

func (c *Client) VolumeChattr(ctx context.Context, id, p string, a volumes.Attrs) (volumes.Entry, error) {
	r, err := c.c.VolumeChattr(ctx, connect.NewRequest(&nodev1.VolumeChattrRequest{Id: id, Path: p, Attrs: attrsToWire(a)}))
	if err != nil {
		return volumes.Entry{}, fromWire(err)
	}
	return entryFromWire(r.Msg), nil
}

func (c *Client) VolumeRemove(ctx context.Context, id, p string) error {
	_, err := c.c.VolumeRemove(ctx, connect.NewRequest(&nodev1.VolumePathRequest{Id: id, Path: p}))
	return fromWire(err)
}

// VolumeOpen streams a volume file's bytes; the reader holds the call open until it is closed.
func (c *Client) VolumeOpen(ctx context.Context, id, p string) (io.ReadCloser, int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.c.VolumeRead(ctx, connect.NewRequest(&nodev1.VolumePathRequest{Id: id, Path: p}))
	if err != nil {
		cancel()
		return nil, 0, fromWire(err)
	}
	if !stream.Receive() {
		err := stream.Err()
		_ = stream.Close()
		cancel()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, 0, fromWire(err)
	}
	return &chunkReader{stream: stream, cancel: cancel}, stream.Msg().GetSize(), nil
}

type chunkReader struct {
	stream *connect.ServerStreamForClient[nodev1.VolumeChunk]
	cancel context.CancelFunc
	buf    []byte
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if !r.stream.Receive() {
			if err := r.stream.Err(); err != nil {
				return 0, fromWire(err)
			}
			return 0, io.EOF
		}
		r.buf = r.stream.Msg().GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *chunkReader) Close() error {
	r.cancel()
	return r.stream.Close()
}

// VolumeWrite streams body into a volume file.
func (c *Client) VolumeWrite(ctx context.Context, id, p string, body io.Reader, a volumes.Attrs, force bool) (volumes.Entry, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := c.c.VolumeWrite(ctx)
	if err := stream.Send(&nodev1.VolumeWriteRequest{Header: &nodev1.VolumeWriteHeader{Id: id, Path: p, Attrs: attrsToWire(a), Force: force}}); err != nil {
		_, cerr := stream.CloseAndReceive()
		return volumes.Entry{}, fromWire(errors.Join(cerr, err))
	}
	buf := make([]byte, volumeChunk)
	var rerr error
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if serr := stream.Send(&nodev1.VolumeWriteRequest{Data: buf[:n]}); serr != nil {
				// The node refused early (its answer says why): stop sending.
				break
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			rerr = err
			break
		}
	}
	if rerr != nil {
		// The client's upload broke off: the call is cancelled, so the node's write fails rather
		// than keeping a truncated file as whole.
		cancel()
		_, _ = stream.CloseAndReceive()
		return volumes.Entry{}, rerr
	}
	r, err := stream.CloseAndReceive()
	if err != nil {
		return volumes.Entry{}, fromWire(err)
	}
	return entryFromWire(r.Msg), nil
}

func entryToWire(e volumes.Entry) *nodev1.VolumeEntry {
	return &nodev1.VolumeEntry{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, Mode: e.Mode, Uid: e.UID, Gid: e.GID,
		Atime: timestamppb.New(e.Atime), Mtime: timestamppb.New(e.Mtime), Ctime: timestamppb.New(e.Ctime), Target: e.Target}
}

func entryFromWire(e *nodev1.VolumeEntry) volumes.Entry {
	return volumes.Entry{Name: e.GetName(), Path: e.GetPath(), Type: e.GetType(), Size: e.GetSize(), Mode: e.GetMode(),
		UID: e.GetUid(), GID: e.GetGid(), Atime: e.GetAtime().AsTime(), Mtime: e.GetMtime().AsTime(), Ctime: e.GetCtime().AsTime(),
		Target: e.GetTarget()}
}

func attrsToWire(a volumes.Attrs) *nodev1.VolumeAttrs {
	return &nodev1.VolumeAttrs{Uid: a.UID, Gid: a.GID, Mode: a.Mode}
}

func attrsFromWire(a *nodev1.VolumeAttrs) volumes.Attrs {
	var out volumes.Attrs
	if a == nil {
		return out
	}
	if a.Uid != nil {
		v := a.GetUid()
		out.UID = &v
	}
	if a.Gid != nil {
		v := a.GetGid()
		out.GID = &v
	}
	if a.Mode != nil {
		v := a.GetMode()
		out.Mode = &v
	}
	return out
}
