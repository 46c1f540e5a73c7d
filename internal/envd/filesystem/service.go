// Package filesystem owns envd's filesystem.Filesystem Connect service (Stat, ListDir, MakeDir,
// Move, Remove, WatchDir and the polling watchers), the EntryInfo rendering shared with /files,
// the user.e2b.* metadata xattrs, and directory creation owned by the requesting user.
//
// Paths arrive as the client wrote them and are resolved for the calling user (relative and "~"
// against the home directory). Operations run with envd's privileges, as E2B's envd does; new
// directories are chowned to the caller so the files it asked for are its own.
package filesystem

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"connectrpc.com/connect"

	pb "github.com/vibemon/vmon/internal/envd/gen/filesystem"
	"github.com/vibemon/vmon/internal/envd/gen/filesystem/filesystemconnect"
	"github.com/vibemon/vmon/internal/envd/rpcerr"
	"github.com/vibemon/vmon/internal/envd/users"
	"github.com/vibemon/vmon/internal/errdefs"
)

// Env is what the service needs from envd's session state.
type Env interface {
	// Caller returns the user a request acts as: the Basic-auth user, else the default user.
	Caller(h http.Header) (*users.User, error)
}

// Options configures a Service.
type Options struct {
	Logger *slog.Logger
	Env    Env
	// Users names file owners; the zero value reads /etc/passwd and /etc/group.
	Users users.DB
}

// Service implements filesystemconnect.FilesystemHandler.
type Service struct {
	log   *slog.Logger
	env   Env
	users users.DB

	mu sync.Mutex
	// watchers are the polling watchers by id. +checklocks:mu
	watchers map[string]*pollWatcher
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// New returns a filesystem service.
func New(opts Options) (*Service, error) {
	if opts.Env == nil {
		return nil, errors.New("filesystem: Options.Env is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{
		log:      log.With("component", "filesystem"),
		env:      opts.Env,
		users:    opts.Users,
		watchers: map[string]*pollWatcher{},
	}, nil
}

// Close stops every polling watcher.
func (s *Service) Close() {
	s.mu.Lock()
	ws := s.watchers
	s.watchers = map[string]*pollWatcher{}
	s.mu.Unlock()
	for _, w := range ws {
		w.close()
	}
}

// resolve returns the caller and the absolute path p means for it.
func (s *Service) resolve(h http.Header, p string) (*users.User, string, error) {
	u, err := s.env.Caller(h)
	if err != nil {
		return nil, "", err
	}
	abs, err := u.Resolve(p, "")
	if err != nil {
		return nil, "", err
	}
	return u, abs, nil
}

// Stat describes one entry (a symlink itself, reporting its target's type and mode).
func (s *Service) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	e, err := Entry(path, s.users.Names())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

// ListDir lists the entries below a directory, up to depth levels, in lexical pre-order.
func (s *Service) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	entries, err := s.listDir(path, depth)
	if err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.ListDirResponse{Entries: entries}), nil
}

func (s *Service) listDir(path string, depth int) ([]*pb.EntryInfo, error) {
	// The root may be a symlink to a directory; below it, symlinks are reported, not followed.
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errdefs.NotFound("directory '%s' does not exist", path)
		}
		return nil, errdefs.Wrap(errdefs.KindUnknown, err, "resolve '%s'", path)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.KindUnknown, err, "stat '%s'", path)
	}
	if !fi.IsDir() {
		return nil, errdefs.InvalidArgument("path '%s' is not a directory", path)
	}
	names := s.users.Names()
	entries := []*pb.EntryInfo{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			// An unreadable subdirectory is listed (it was visited) but not descended into.
			s.log.Debug("listdir: skipping unreadable entry", "path", p, "err", err)
			return nil
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		level := strings.Count(rel, string(filepath.Separator)) + 1
		info, err := d.Info()
		if err != nil {
			return nil // vanished while walking
		}
		entries = append(entries, entryFrom(filepath.Join(path, rel), info, names))
		if d.IsDir() && level >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return nil, errdefs.Wrap(errdefs.KindUnknown, err, "read directory '%s'", path)
	}
	return entries, nil
}

// MakeDir creates a directory and its missing parents, owned by the caller.
func (s *Service) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	u, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory already exists: "+path))
		}
		return nil, rpcerr.From(errdefs.InvalidArgument("path already exists but it is not a directory: %s", path))
	}
	if err := MkdirAllOwned(path, u.UID, u.GID); err != nil {
		return nil, rpcerr.From(err)
	}
	e, err := Entry(path, s.users.Names())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating the destination's parents.
func (s *Service) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	u, src, err := s.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	dst, err := u.Resolve(req.Msg.GetDestination(), "")
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if _, err := os.Lstat(src); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, rpcerr.From(errdefs.NotFound("source '%s' does not exist", src))
		}
		return nil, rpcerr.From(errdefs.Wrap(errdefs.KindUnknown, err, "stat '%s'", src))
	}
	if err := MkdirAllOwned(filepath.Dir(dst), u.UID, u.GID); err != nil {
		return nil, rpcerr.From(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, rpcerr.From(errdefs.Wrap(errdefs.KindUnknown, err, "move '%s' to '%s'", src, dst))
	}
	e, err := Entry(dst, s.users.Names())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

// Remove deletes a file or a directory tree; a missing path is not an error.
func (s *Service) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, rpcerr.From(errdefs.Wrap(errdefs.KindUnknown, err, "remove '%s'", path))
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// MkdirAllOwned is os.MkdirAll(path, 0755) that chowns every directory it creates to uid:gid.
// An existing non-directory on the way is an InvalidArgument error.
func MkdirAllOwned(path string, uid, gid uint32) error {
	fi, err := os.Stat(path)
	if err == nil {
		if !fi.IsDir() {
			return errdefs.InvalidArgument("path '%s' exists and is not a directory", path)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return errdefs.Wrap(errdefs.KindUnknown, err, "stat '%s'", path)
	}
	if parent := filepath.Dir(path); parent != path {
		if err := MkdirAllOwned(parent, uid, gid); err != nil {
			return err
		}
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil // created concurrently
		}
		return errdefs.Wrap(errdefs.KindUnknown, err, "create directory '%s'", path)
	}
	if err := os.Chown(path, int(uid), int(gid)); err != nil {
		return errdefs.Wrap(errdefs.KindUnknown, err, "chown '%s'", path)
	}
	return nil
}
