// Package nodeapi is the driver-node contract on the wire: a Connect server that serves a node
// (whatever implements driver.Node and its optional parts) and a client that implements the same
// interfaces, so the driver cannot tell a node in its process from one across the network. It
// owns the translation of specs, results and errors (their kinds, messages, E2B error codes and
// the sentinels the driver matches) and nothing else: it never decides, stores or retries.
package nodeapi

import (
	"context"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/driver"
	nodev1 "github.com/vibemon/vmon/internal/nodeapi/gen/node"
	"github.com/vibemon/vmon/internal/nodeapi/gen/node/nodev1connect"
)

// Capabilities a node may serve beyond driver.Node.
const (
	CapPause    = "pause"
	CapSnapshot = "snapshot"
	CapMetrics  = "metrics"
	CapDenied   = "denied"
)

// Holdings are the sandboxes a node holds.
type Holdings struct {
	Running, Paused []string
}

// Lister is the optional part of a node that says what it holds.
type Lister interface {
	ListSandboxes(ctx context.Context) (Holdings, error)
}

// Status is what a node reports of itself for placement.
type Status struct {
	Features     []string
	FreeMemoryMB int64
	FreeSlots    int
	FreeDiskMB   int64
	// Load is 0 (idle) to 1 (full).
	Load      float64
	Templates []string
}

// Server serves one node.
type Server struct {
	n      driver.Node
	status func() Status
	// vols, when set, are the node's volumes (WithVolumes).
	vols VolumeHost
	// builds, when set, runs template builds (WithBuilds).
	builds Builder
	// logs, when set, is the node's part of sandbox logs (WithLogs).
	logs LogReader
}

var _ nodev1connect.NodeServiceHandler = (*Server)(nil)

// NewServer serves n; status reports its features and room as of each call.
func NewServer(n driver.Node, status func() Status) *Server {
	return &Server{n: n, status: status}
}

// Handler returns the path and handler to mount.
func (s *Server) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return nodev1connect.NewNodeServiceHandler(s, opts...)
}

func (s *Server) capabilities() []string {
	var out []string
	if _, ok := s.n.(driver.Pauser); ok {
		out = append(out, CapPause)
	}
	if _, ok := s.n.(driver.Snapshotter); ok {
		out = append(out, CapSnapshot)
	}
	if _, ok := s.n.(driver.MetricsNode); ok {
		out = append(out, CapMetrics)
	}
	if _, ok := s.n.(driver.DeniedWatcher); ok {
		out = append(out, CapDenied)
	}
	return out
}

func unsupported(what string) error {
	return toWire(notImplemented(what + " on this node are not supported"))
}

func (s *Server) Info(context.Context, *connect.Request[nodev1.InfoRequest]) (*connect.Response[nodev1.InfoResponse], error) {
	var st Status
	if s.status != nil {
		st = s.status()
	}
	return connect.NewResponse(&nodev1.InfoResponse{Features: st.Features, Capabilities: s.capabilities(),
		FreeMemoryMb: st.FreeMemoryMB, FreeSlots: int32(st.FreeSlots), FreeDiskMb: st.FreeDiskMB, Load: st.Load,
		Templates: st.Templates}), nil
}

func (s *Server) ListSandboxes(ctx context.Context, _ *connect.Request[nodev1.ListSandboxesRequest]) (*connect.Response[nodev1.ListSandboxesResponse], error) {
	l, ok := s.n.(Lister)
	if !ok {
		return nil, unsupported("sandbox lists")
	}
	h, err := l.ListSandboxes(ctx)
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.ListSandboxesResponse{Running: h.Running, Paused: h.Paused}), nil
}

func (s *Server) CreateSandbox(ctx context.Context, req *connect.Request[nodev1.CreateSandboxRequest]) (*connect.Response[nodev1.SandboxInfo], error) {
	spec, err := specFromWire(req.Msg.GetSpec())
	if err != nil {
		return nil, toWire(err)
	}
	info, err := s.n.CreateSandbox(ctx, spec)
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(infoToWire(info)), nil
}

func (s *Server) DestroySandbox(ctx context.Context, req *connect.Request[nodev1.DestroySandboxRequest]) (*connect.Response[nodev1.DestroySandboxResponse], error) {
	if err := s.n.DestroySandbox(ctx, req.Msg.GetId()); err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.DestroySandboxResponse{}), nil
}

func (s *Server) UpdateEgress(ctx context.Context, req *connect.Request[nodev1.UpdateEgressRequest]) (*connect.Response[nodev1.UpdateEgressResponse], error) {
	p, err := policyFromWire(req.Msg.GetEgressPolicy())
	if err != nil {
		return nil, toWire(err)
	}
	if err := s.n.UpdateEgress(ctx, req.Msg.GetId(), p); err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.UpdateEgressResponse{}), nil
}

func (s *Server) PauseSandbox(ctx context.Context, req *connect.Request[nodev1.PauseSandboxRequest]) (*connect.Response[nodev1.PauseInfo], error) {
	p, ok := s.n.(driver.Pauser)
	if !ok {
		return nil, unsupported("pauses")
	}
	info, err := p.PauseSandbox(ctx, req.Msg.GetId(), req.Msg.GetMemory())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.PauseInfo{Memory: info.Memory, Bytes: info.Bytes}), nil
}

func (s *Server) ResumeSandbox(ctx context.Context, req *connect.Request[nodev1.ResumeSandboxRequest]) (*connect.Response[nodev1.SandboxInfo], error) {
	p, ok := s.n.(driver.Pauser)
	if !ok {
		return nil, unsupported("resumes")
	}
	spec, err := specFromWire(req.Msg.GetSpec())
	if err != nil {
		return nil, toWire(err)
	}
	info, err := p.ResumeSandbox(ctx, spec, req.Msg.GetMemory())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(infoToWire(info)), nil
}

func (s *Server) DeletePaused(ctx context.Context, req *connect.Request[nodev1.DeletePausedRequest]) (*connect.Response[nodev1.DeletePausedResponse], error) {
	p, ok := s.n.(driver.Pauser)
	if !ok {
		return nil, unsupported("pauses")
	}
	if err := p.DeletePaused(ctx, req.Msg.GetId()); err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.DeletePausedResponse{}), nil
}

func (s *Server) SnapshotSandbox(ctx context.Context, req *connect.Request[nodev1.SnapshotSandboxRequest]) (*connect.Response[nodev1.PauseInfo], error) {
	sn, ok := s.n.(driver.Snapshotter)
	if !ok {
		return nil, unsupported("snapshots")
	}
	info, err := sn.SnapshotSandbox(ctx, req.Msg.GetId(), req.Msg.GetSnapshotId())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.PauseInfo{Memory: info.Memory, Bytes: info.Bytes}), nil
}

func (s *Server) CreateFromSnapshot(ctx context.Context, req *connect.Request[nodev1.CreateFromSnapshotRequest]) (*connect.Response[nodev1.SandboxInfo], error) {
	sn, ok := s.n.(driver.Snapshotter)
	if !ok {
		return nil, unsupported("snapshots")
	}
	spec, err := specFromWire(req.Msg.GetSpec())
	if err != nil {
		return nil, toWire(err)
	}
	info, err := sn.CreateFromSnapshot(ctx, spec, req.Msg.GetSnapshotId(), req.Msg.GetPausedId())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(infoToWire(info)), nil
}

func (s *Server) DeleteSnapshot(ctx context.Context, req *connect.Request[nodev1.DeleteSnapshotRequest]) (*connect.Response[nodev1.DeleteSnapshotResponse], error) {
	sn, ok := s.n.(driver.Snapshotter)
	if !ok {
		return nil, unsupported("snapshots")
	}
	if err := sn.DeleteSnapshot(ctx, req.Msg.GetSnapshotId()); err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.DeleteSnapshotResponse{}), nil
}

// SnapshotPublisher is the optional part of a node that puts its snapshots in the cluster's
// store for other nodes (pausedstore.Carrier).
type SnapshotPublisher interface {
	PublishSnapshot(ctx context.Context, snapID string) error
}

func (s *Server) PublishSnapshot(ctx context.Context, req *connect.Request[nodev1.PublishSnapshotRequest]) (*connect.Response[nodev1.PublishSnapshotResponse], error) {
	p, ok := s.n.(SnapshotPublisher)
	if !ok {
		return nil, unsupported("snapshots shared through a store")
	}
	if err := p.PublishSnapshot(ctx, req.Msg.GetSnapshotId()); err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.PublishSnapshotResponse{}), nil
}

func (s *Server) SandboxMetrics(ctx context.Context, req *connect.Request[nodev1.SandboxMetricsRequest]) (*connect.Response[nodev1.Metrics], error) {
	m, ok := s.n.(driver.MetricsNode)
	if !ok {
		return nil, unsupported("metrics")
	}
	out, err := m.SandboxMetrics(ctx, req.Msg.GetId())
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(metricsToWire(out)), nil
}

func (s *Server) WatchDenied(ctx context.Context, req *connect.Request[nodev1.WatchDeniedRequest], stream *connect.ServerStream[nodev1.WatchDeniedResponse]) error {
	w, ok := s.n.(driver.DeniedWatcher)
	if !ok {
		return unsupported("refusal streams")
	}
	recent, next, cancel, err := w.WatchDenied(req.Msg.GetId())
	if err != nil {
		return toWire(err)
	}
	defer cancel()
	first := &nodev1.WatchDeniedResponse{}
	for _, e := range recent {
		first.Recent = append(first.Recent, deniedToWire(e))
	}
	if err := stream.Send(first); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-next:
			if !ok {
				return nil
			}
			if err := stream.Send(&nodev1.WatchDeniedResponse{Event: deniedToWire(e)}); err != nil {
				if errors.Is(err, context.Canceled) {
					return nil
				}
				return err
			}
		}
	}
}
