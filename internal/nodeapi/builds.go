package nodeapi

import (
	"context"
	"errors"
	"io"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/errdefs"
	nodev1 "github.com/vibemon/vmon/internal/nodeapi/gen/node"
	"github.com/vibemon/vmon/internal/template"
)

// Builder runs template builds on a node (the node role's builds).
type Builder interface {
	// PutFile keeps a COPY step's archive for the template's builds.
	PutFile(ctx context.Context, templateID, hash string, r io.Reader, size int64) error
	// Build runs req, logging to log, and makes the result fetchable by every node. A build
	// that ran and failed is a *build.StepError.
	Build(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error)
	// LogPath is where the node keeps build buildID's log.
	LogPath(buildID string) string
}

// WithBuilds serves b's template builds too.
func (s *Server) WithBuilds(b Builder) *Server {
	s.builds = b
	return s
}

func (s *Server) PutBuildFile(ctx context.Context, stream *connect.ClientStream[nodev1.PutBuildFileRequest]) (*connect.Response[nodev1.PutBuildFileResponse], error) {
	if s.builds == nil {
		return nil, unsupported("template builds")
	}
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, toWire(errdefs.InvalidArgument("a build file without its header"))
	}
	h := stream.Msg().GetHeader()
	if h == nil {
		return nil, toWire(errdefs.InvalidArgument("a build file must name itself first"))
	}
	pr := pipeData(stream)
	err := s.builds.PutFile(ctx, h.GetTemplateId(), h.GetHash(), pr, h.GetSize())
	// A refused file stops the reader at its next write; the stream then ends with this call.
	pr.CloseWithError(errors.New("build file stored"))
	if err != nil {
		return nil, toWire(err)
	}
	return connect.NewResponse(&nodev1.PutBuildFileResponse{}), nil
}

func (s *Server) BuildTemplate(ctx context.Context, req *connect.Request[nodev1.BuildTemplateRequest], stream *connect.ServerStream[nodev1.BuildEvent]) error {
	if s.builds == nil {
		return unsupported("template builds")
	}
	breq := buildRequestFromWire(req.Msg)
	log, err := build.NewLog(s.builds.LogPath(breq.BuildID))
	if err != nil {
		return toWire(err)
	}
	defer log.Close()
	type result struct {
		m   template.Manifest
		err error
	}
	done := make(chan result, 1)
	go func() {
		m, err := s.builds.Build(ctx, breq, log)
		done <- result{m, err}
	}()
	sent := 0
	flush := func() error {
		for {
			es := log.Since(sent, 1000)
			if len(es) == 0 {
				return nil
			}
			for _, e := range es {
				sent++
				if err := stream.Send(&nodev1.BuildEvent{Event: &nodev1.BuildEvent_Log{Log: &nodev1.BuildLogEntry{
					Timestamp: timestamppb.New(e.Timestamp), Level: e.Level, Step: e.Step, Message: e.Message}}}); err != nil {
					return err
				}
			}
		}
	}
	for {
		changed := log.Changed()
		select {
		case r := <-done:
			if err := flush(); err != nil {
				return err
			}
			var se *build.StepError
			switch {
			case errors.As(r.err, &se):
				return stream.Send(&nodev1.BuildEvent{Event: &nodev1.BuildEvent_Failed{Failed: &nodev1.BuildFailed{Step: se.Step, Message: se.Msg}}})
			case r.err != nil:
				return toWire(r.err)
			}
			return stream.Send(&nodev1.BuildEvent{Event: &nodev1.BuildEvent_Done{Done: &nodev1.BuildDone{
				DefaultUser: r.m.DefaultUser, DefaultWorkdir: r.m.DefaultWorkdir, BuildSeconds: r.m.BuildSeconds}}})
		case <-changed:
			if err := flush(); err != nil {
				// The driver went away: the build is cancelled with ctx; wait for it to clean up.
				<-done
				return err
			}
		}
	}
}

// PutBuildFile hands the node the archive of a COPY step.
func (c *Client) PutBuildFile(ctx context.Context, templateID, hash string, r io.Reader, size int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := c.c.PutBuildFile(ctx)
	if err := stream.Send(&nodev1.PutBuildFileRequest{Header: &nodev1.BuildFileHeader{TemplateId: templateID, Hash: hash, Size: size}}); err != nil {
		_, cerr := stream.CloseAndReceive()
		return fromWire(errors.Join(cerr, err))
	}
	buf := make([]byte, volumeChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := stream.Send(&nodev1.PutBuildFileRequest{Data: buf[:n]}); serr != nil {
				break // the node refused early; its answer says why
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// Cancelled, the node's store fails rather than keeping a short archive.
			cancel()
			_, _ = stream.CloseAndReceive()
			return err
		}
	}
	_, err := stream.CloseAndReceive()
	return fromWire(err)
}

// BuildTemplate runs a build on the node, copying its log into log as it comes. A build that ran
// and failed is a *build.StepError, as from a build engine in the driver's process.
func (c *Client) BuildTemplate(ctx context.Context, req build.Request, log *build.Log) (template.Manifest, error) {
	stream, err := c.c.BuildTemplate(ctx, connect.NewRequest(buildRequestToWire(req)))
	if err != nil {
		return template.Manifest{}, fromWire(err)
	}
	defer stream.Close()
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *nodev1.BuildEvent_Log:
			log.Add(ev.Log.GetLevel(), ev.Log.GetStep(), "%s", ev.Log.GetMessage())
		case *nodev1.BuildEvent_Failed:
			return template.Manifest{}, &build.StepError{Step: ev.Failed.GetStep(), Msg: ev.Failed.GetMessage()}
		case *nodev1.BuildEvent_Done:
			return template.Manifest{ID: req.TemplateID, BuildID: req.BuildID, CPUs: req.CPUs, MemoryMB: req.MemoryMB,
				DefaultUser: ev.Done.GetDefaultUser(), DefaultWorkdir: ev.Done.GetDefaultWorkdir(),
				BuildSeconds: ev.Done.GetBuildSeconds()}, nil
		}
	}
	if err := stream.Err(); err != nil {
		return template.Manifest{}, fromWire(err)
	}
	return template.Manifest{}, errdefs.Unavailable("the node ended build %s without its result", req.BuildID)
}

func buildRequestToWire(r build.Request) *nodev1.BuildTemplateRequest {
	w := &nodev1.BuildTemplateRequest{TemplateId: r.TemplateID, BuildId: r.BuildID, FromImage: r.FromImage,
		StartCmd: r.StartCmd, ReadyCmd: r.ReadyCmd, Force: r.Force, Cpus: int32(r.CPUs), MemoryMb: int32(r.MemoryMB)}
	if g := r.FromImageRegistry; g != nil {
		w.FromImageRegistry = &nodev1.BuildRegistry{Type: g.Type, Username: g.Username, Password: g.Password}
	}
	if p := r.FromTemplate; p != nil {
		w.FromTemplate = &nodev1.BuildParent{TemplateId: p.TemplateID, BuildId: p.BuildID}
	}
	for _, s := range r.Steps {
		w.Steps = append(w.Steps, &nodev1.BuildStep{Type: s.Type, Args: s.Args, Force: s.Force, FilesHash: s.FilesHash})
	}
	return w
}

func buildRequestFromWire(w *nodev1.BuildTemplateRequest) build.Request {
	r := build.Request{TemplateID: w.GetTemplateId(), BuildID: w.GetBuildId(), FromImage: w.GetFromImage(),
		StartCmd: w.GetStartCmd(), ReadyCmd: w.GetReadyCmd(), Force: w.GetForce(), CPUs: int(w.GetCpus()), MemoryMB: int(w.GetMemoryMb())}
	if g := w.GetFromImageRegistry(); g != nil {
		r.FromImageRegistry = &build.Registry{Type: g.GetType(), Username: g.GetUsername(), Password: g.GetPassword()}
	}
	if p := w.GetFromTemplate(); p != nil {
		r.FromTemplate = &build.Parent{TemplateID: p.GetTemplateId(), BuildID: p.GetBuildId()}
	}
	for _, s := range w.GetSteps() {
		r.Steps = append(r.Steps, build.Step{Type: s.GetType(), Args: s.GetArgs(), Force: s.GetForce(), FilesHash: s.GetFilesHash()})
	}
	return r
}
