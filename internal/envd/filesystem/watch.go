package filesystem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	pb "github.com/vibemon/vmon/internal/envd/gen/filesystem"
	"github.com/vibemon/vmon/internal/envd/rpcerr"
	"github.com/vibemon/vmon/internal/errdefs"
)

const (
	// defaultKeepalive applies when the client sends no Keepalive-Ping-Interval.
	defaultKeepalive = 90 * time.Second
	// maxPolledEvents bounds a polling watcher nobody polls; the oldest events are dropped.
	maxPolledEvents = 10000
)

// rawEvent is one change, named relative to the watched directory.
type rawEvent struct {
	name string
	typ  pb.EventType
}

// watcher is the OS-specific change source (inotify on Linux).
type watcher interface {
	// Events is closed when the watch ends: Close was called or the root went away.
	Events() <-chan rawEvent
	Close()
}

type watchParams struct {
	path, root              string
	recursive, includeEntry bool
}

// startWatch validates a watch request and starts the watcher.
func (s *Service) startWatch(h http.Header, p string, recursive, includeEntry, allowNetwork bool) (watcher, watchParams, error) {
	_, path, err := s.resolve(h, p)
	if err != nil {
		return nil, watchParams{}, err
	}
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, watchParams{}, errdefs.NotFound("path '%s' does not exist", path)
		}
		return nil, watchParams{}, errdefs.Wrap(errdefs.KindUnknown, err, "resolve '%s'", path)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, watchParams{}, errdefs.Wrap(errdefs.KindUnknown, err, "stat '%s'", path)
	}
	if !fi.IsDir() {
		return nil, watchParams{}, errdefs.InvalidArgument("path '%s' is not a directory", path)
	}
	if !allowNetwork {
		if nw, err := isNetworkMount(root); err != nil {
			return nil, watchParams{}, errdefs.Wrap(errdefs.KindUnknown, err, "check filesystem of '%s'", path)
		} else if nw {
			return nil, watchParams{}, errdefs.InvalidArgument("path '%s' is on a network filesystem; set allowNetworkMounts to watch it", path)
		}
	}
	w, err := newWatcher(root, recursive)
	if err != nil {
		return nil, watchParams{}, err
	}
	return w, watchParams{path: path, root: root, recursive: recursive, includeEntry: includeEntry}, nil
}

func (s *Service) toEvent(wp watchParams, ev rawEvent) *pb.FilesystemEvent {
	out := &pb.FilesystemEvent{Name: ev.name, Type: ev.typ}
	if wp.includeEntry {
		// Best effort: the entry may already be gone again (remove, rename away).
		if e, err := Entry(filepath.Join(wp.path, ev.name), s.users.Names()); err == nil {
			out.Entry = e
		}
	}
	return out
}

// WatchDir streams changes below a directory: start{} first, then filesystem events and keepalives.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	m := req.Msg
	w, wp, err := s.startWatch(req.Header(), m.GetPath(), m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts())
	if err != nil {
		return rpcerr.From(err)
	}
	defer w.Close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	interval := keepaliveInterval(req.Header())
	tick := time.NewTimer(interval)
	defer tick.Stop()
	for {
		var resp *pb.WatchDirResponse
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return nil // the watched directory went away
			}
			resp = &pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: s.toEvent(wp, ev)}}
		case <-tick.C:
			resp = &pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}
		case <-ctx.Done():
			return rpcerr.From(ctx.Err())
		}
		tick.Reset(interval)
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func keepaliveInterval(h http.Header) time.Duration {
	if v := h.Get("Keepalive-Ping-Interval"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	return defaultKeepalive
}

// pollWatcher buffers a watcher's events between GetWatcherEvents calls.
type pollWatcher struct {
	w    watcher
	done chan struct{}

	mu sync.Mutex
	// +checklocks:mu
	events []*pb.FilesystemEvent
}

func (p *pollWatcher) close() {
	p.w.Close()
	<-p.done
}

// CreateWatcher starts a watcher whose events are fetched with GetWatcherEvents.
func (s *Service) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	m := req.Msg
	w, wp, err := s.startWatch(req.Header(), m.GetPath(), m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	var idb [16]byte
	_, _ = rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	pw := &pollWatcher{w: w, done: make(chan struct{})}
	go func() {
		defer close(pw.done)
		for ev := range w.Events() {
			fe := s.toEvent(wp, ev)
			pw.mu.Lock()
			if len(pw.events) >= maxPolledEvents {
				pw.events = pw.events[1:]
			}
			pw.events = append(pw.events, fe)
			pw.mu.Unlock()
		}
	}()
	s.mu.Lock()
	s.watchers[id] = pw
	s.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents returns and clears the events a watcher buffered since the last call.
func (s *Service) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	s.mu.Lock()
	pw, ok := s.watchers[req.Msg.GetWatcherId()]
	s.mu.Unlock()
	if !ok {
		return nil, rpcerr.From(errdefs.NotFound("watcher %q not found", req.Msg.GetWatcherId()))
	}
	pw.mu.Lock()
	events := pw.events
	pw.events = nil
	pw.mu.Unlock()
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: events}), nil
}

// RemoveWatcher stops a polling watcher.
func (s *Service) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	s.mu.Lock()
	pw, ok := s.watchers[req.Msg.GetWatcherId()]
	delete(s.watchers, req.Msg.GetWatcherId())
	s.mu.Unlock()
	if !ok {
		return nil, rpcerr.From(errdefs.NotFound("watcher %q not found", req.Msg.GetWatcherId()))
	}
	pw.close()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
