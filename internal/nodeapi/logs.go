package nodeapi

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	nodev1 "github.com/vibemon/vmon/internal/nodeapi/gen/node"
	"github.com/vibemon/vmon/internal/sandboxlog"
)

// LogReader is a node's part of sandbox logs (*sandboxlog.Store): what it wrote itself about
// the sandboxes it ran.
type LogReader interface {
	Query(id string, q sandboxlog.Query) ([]sandboxlog.Entry, error)
}

// WithLogs serves l's sandbox logs too.
func (s *Server) WithLogs(l LogReader) *Server {
	s.logs = l
	return s
}

func (s *Server) SandboxLogs(_ context.Context, req *connect.Request[nodev1.SandboxLogsRequest]) (*connect.Response[nodev1.SandboxLogsResponse], error) {
	if s.logs == nil {
		// Logging is off on this node: it wrote nothing.
		return connect.NewResponse(&nodev1.SandboxLogsResponse{None: true}), nil
	}
	m := req.Msg
	es, err := s.logs.Query(m.GetId(), sandboxlog.Query{Cursor: m.GetCursorMs(), Backward: m.GetBackward(), Limit: int(m.GetLimit()),
		MinLevel: sandboxlog.Level(m.GetMinLevel()), Search: m.GetSearch()})
	if errors.Is(err, sandboxlog.ErrNotFound) {
		return connect.NewResponse(&nodev1.SandboxLogsResponse{None: true}), nil
	}
	if err != nil {
		return nil, toWire(err)
	}
	out := &nodev1.SandboxLogsResponse{Entries: make([]*nodev1.SandboxLogEntry, len(es))}
	for i, e := range es {
		out.Entries[i] = &nodev1.SandboxLogEntry{Time: timestamppb.New(e.Time), Level: int32(e.Level), Logger: e.Logger,
			Message: e.Message, Fields: e.Fields}
	}
	return connect.NewResponse(out), nil
}

// SandboxLogs returns what the node wrote in sandbox id's log; a node with none of it answers
// sandboxlog.ErrNotFound.
func (c *Client) SandboxLogs(ctx context.Context, id string, q sandboxlog.Query) ([]sandboxlog.Entry, error) {
	r, err := c.c.SandboxLogs(ctx, connect.NewRequest(&nodev1.SandboxLogsRequest{Id: id, CursorMs: q.Cursor, Backward: q.Backward,
		Limit: int32(q.Limit), MinLevel: int32(q.MinLevel), Search: q.Search}))
	if err != nil {
		return nil, fromWire(err)
	}
	if r.Msg.GetNone() {
		return nil, sandboxlog.ErrNotFound
	}
	out := make([]sandboxlog.Entry, len(r.Msg.GetEntries()))
	for i, e := range r.Msg.GetEntries() {
		out[i] = sandboxlog.Entry{Time: e.GetTime().AsTime(), Level: sandboxlog.Level(e.GetLevel()), Logger: e.GetLogger(),
			Message: e.GetMessage(), Fields: e.GetFields()}
	}
	return out, nil
}
