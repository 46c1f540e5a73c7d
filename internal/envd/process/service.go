// Package process owns the processes envd starts for clients: the Connect service
// process.Process (Start, Connect, List, SendInput, StreamInput, CloseStdin, SendSignal, Update),
// the table of running and recently exited processes, and their output fan-out to streams.
//
// Semantics follow E2B envd 0.6.x as the e2b SDK relies on them: every stream starts with a start
// event and ends with exactly one end event; a client that disconnects does not stop the process;
// Connect-Timeout-Ms of Start bounds the process's lifetime. Who a request acts as and the /init
// defaults come from the Env the server passes in; this package never reads them itself.
package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/agentproto"
	pb "github.com/vibemon/vmon/internal/envd/gen/process"
	"github.com/vibemon/vmon/internal/envd/gen/process/processconnect"
	"github.com/vibemon/vmon/internal/envd/rpcerr"
	"github.com/vibemon/vmon/internal/envd/users"
	"github.com/vibemon/vmon/internal/errdefs"
)

const (
	// retainExited is how long an exited process can still be Connect-ed to (start + end replay).
	retainExited = 30 * time.Second
	// defaultKeepalive applies when the client sends no Keepalive-Ping-Interval.
	defaultKeepalive = 90 * time.Second
	// defaultPath is used when envd itself runs without PATH (as PID 1 it often does).
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Env is what the service needs from envd's session state.
type Env interface {
	// Caller returns the user a request acts as: the Basic-auth user, else the default user.
	Caller(h http.Header) (*users.User, error)
	// Defaults returns /init's default working directory and environment variables.
	Defaults() (workdir string, envVars map[string]string)
}

// Options configures a Service.
type Options struct {
	Logger *slog.Logger
	Env    Env
	// Starter starts processes; nil uses exec.Cmd.Start. As PID 1, envd passes its reaper so
	// the processes it waits for are not reaped from under it.
	Starter Starter
	// Journal, when set, hears of every process's start and end, and of the template start
	// command's output (agentproto.StartCmdTag), for the sandbox's log.
	Journal Journal
}

// Journal records what happened for the sandbox's log (journal.Journal).
type Journal interface {
	Add(level, logger, msg string, fields map[string]string)
}

// journalLogger names process entries in the sandbox's log.
const journalLogger = agentproto.ProcessLogger

type plainStarter struct{}

func (plainStarter) Start(cmd *exec.Cmd) error { return cmd.Start() }
func (plainStarter) Forget(int)                {}

// Starter starts a child whose exit status the caller will collect with cmd.Wait, and is told
// when that happened.
type Starter interface {
	Start(cmd *exec.Cmd) error
	Forget(pid int)
}

// Service implements processconnect.ProcessHandler.
type Service struct {
	log     *slog.Logger
	env     Env
	starter Starter
	journal Journal

	mu sync.Mutex
	// procs holds running processes and, for retainExited, exited ones. +checklocks:mu
	procs map[uint32]*proc
	// streams is the generation of event streams EndStreams would end now. +checklocks:mu
	streams *streamGen
}

// streamGen is the set of process event streams open between two EndStreams calls.
type streamGen struct {
	end  chan struct{}
	why  func(pid uint32) error
	open sync.WaitGroup
}

func newStreamGen() *streamGen { return &streamGen{end: make(chan struct{})} }

// joinStreams counts a stream into the current generation; the caller calls open.Done at its end.
func (s *Service) joinStreams() *streamGen {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.streams
	g.open.Add(1)
	return g
}

// EndStreams ends every process event stream open now (Start and Connect) with the error why
// gives for its process, and waits until they have ended or ctx is done. The processes are not
// touched, and streams opened afterwards are not affected. The node calls it before a pause or
// snapshot freezes the sandbox: a stream that ends with a reason tells the client what happened,
// where one cut by the freeze looks like a sandbox that died.
func (s *Service) EndStreams(ctx context.Context, why func(pid uint32) error) error {
	s.mu.Lock()
	g := s.streams
	s.streams = newStreamGen()
	s.mu.Unlock()
	g.why = why
	close(g.end)
	done := make(chan struct{})
	go func() {
		g.open.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var _ processconnect.ProcessHandler = (*Service)(nil)

// New returns a process service.
func New(opts Options) (*Service, error) {
	if opts.Env == nil {
		return nil, errors.New("process: Options.Env is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	starter := opts.Starter
	if starter == nil {
		starter = plainStarter{}
	}
	return &Service{log: log.With("component", "process"), env: opts.Env, starter: starter, journal: opts.Journal,
		procs: map[uint32]*proc{}, streams: newStreamGen()}, nil
}

// Start launches a process and streams its events.
func (s *Service) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	p, err := s.launch(ctx, req)
	if err != nil {
		return rpcerr.From(err)
	}
	sub, _ := p.subscribe()
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	p.run(func() { s.forgetLater(p) })
	// The stream counts for EndStreams from before its client hears of it: a pause the client
	// asks for right after the start event must end it too.
	gen := s.joinStreams()
	defer gen.open.Done()
	if err := send(startEvent(p.pid)); err != nil {
		p.unsubscribe(sub)
		return err
	}
	return s.follow(ctx, req.Header(), p, sub, gen, p.timedOut, send)
}

func (s *Service) launch(ctx context.Context, req *connect.Request[pb.StartRequest]) (*proc, error) {
	u, err := s.env.Caller(req.Header())
	if err != nil {
		return nil, err
	}
	cfg := req.Msg.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return nil, errdefs.InvalidArgument("process.cmd is required")
	}
	workdir, envVars := s.env.Defaults()
	dir, err := u.Resolve(cfg.GetCwd(), workdir)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, errdefs.InvalidArgument("cwd '%s' does not exist", dir)
	}
	envPath := os.Getenv("PATH")
	if envPath == "" {
		envPath = defaultPath
	}
	env := []string{"PATH=" + envPath, "HOME=" + u.Home, "USER=" + u.Name, "LOGNAME=" + u.Name}
	// Later entries win (os/exec keeps the last value of a key): /init vars, then the request's.
	for _, k := range slices.Sorted(maps.Keys(envVars)) {
		env = append(env, k+"="+envVars[k])
	}
	for _, k := range slices.Sorted(maps.Keys(cfg.GetEnvs())) {
		env = append(env, k+"="+cfg.GetEnvs()[k])
	}
	if err := checkExecSize(cfg.GetCmd(), cfg.GetArgs(), env, cfg.GetEnvs()); err != nil {
		return nil, err
	}
	if tag := req.Msg.Tag; tag != nil {
		if _, err := s.lookup(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: *tag}}, false); err == nil {
			return nil, errdefs.InvalidArgument("a process with tag %q is already running", *tag)
		}
	}
	sp := spec{
		user: u, path: cfg.GetCmd(), args: cfg.GetArgs(), env: env, dir: dir,
		pty: req.Msg.Pty, stdin: req.Msg.Stdin == nil || req.Msg.GetStdin(),
	}
	if sp.pty != nil {
		sp.stdin = false
	}
	p, err := spawn(sp, cfg, req.Msg.Tag, s.starter)
	if err != nil {
		return nil, err
	}
	p.user = u.Name
	if s.journal != nil && req.Msg.GetTag() == agentproto.StartCmdTag {
		p.outTap = newOutputTap(s.journal, p.pid)
	}
	// The request deadline (Connect-Timeout-Ms) bounds the process, not only the stream; a client
	// that merely disconnects cancels ctx without a deadline having passed and leaves it running.
	if dl, ok := ctx.Deadline(); ok {
		p.timer = time.AfterFunc(time.Until(dl), p.timeout)
	}
	s.mu.Lock()
	s.procs[p.pid] = p
	s.mu.Unlock()
	s.log.Info("process started", "pid", p.pid, "cmd", cfg.GetCmd(), "user", u.Name, "pty", sp.pty != nil)
	s.journalStart(p, dir)
	return p, nil
}

// forgetLater drops an exited process from the table once its replay window has passed.
func (s *Service) forgetLater(p *proc) {
	p.mu.Lock()
	end := p.end
	p.mu.Unlock()
	s.log.Info("process ended", "pid", p.pid, "status", end.GetStatus())
	s.journalEnd(p, end)
	time.AfterFunc(retainExited, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.procs[p.pid] == p {
			delete(s.procs, p.pid)
		}
	})
}

// Connect attaches a stream to a running process (or replays a recently exited one).
func (s *Service) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.lookup(req.Msg.GetProcess(), true)
	if err != nil {
		return rpcerr.From(err)
	}
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	sub, end := p.subscribe()
	gen := s.joinStreams()
	defer gen.open.Done()
	if err := send(startEvent(p.pid)); err != nil {
		if sub != nil {
			p.unsubscribe(sub)
		}
		return err
	}
	if sub == nil {
		return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
	}
	// A Connect stream's own deadline ends the stream only; the process keeps running.
	return s.follow(ctx, req.Header(), p, sub, gen, nil, send)
}

// follow forwards a process's events to one stream until the end event, the stream's failure or
// the request's end, or gen's end (EndStreams). timedOut, when non-nil, turns a timeout kill into
// deadline_exceeded.
func (s *Service) follow(ctx context.Context, h http.Header, p *proc, sub *subscriber, gen *streamGen, timedOut <-chan struct{}, send func(*pb.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	interval := keepaliveInterval(h)
	tick := time.NewTimer(interval)
	defer tick.Stop()
	emit := func(ev *pb.ProcessEvent) error {
		tick.Reset(interval)
		return send(ev)
	}
	deadlineErr := func() error {
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("process %d killed: request timeout reached", p.pid))
	}
	for {
		select {
		case ev := <-sub.ch:
			if err := emit(ev); err != nil {
				return err
			}
		case <-p.exited:
			if isClosed(timedOut) {
				return deadlineErr()
			}
			// Everything the pumps produced is already queued; deliver it before the end.
		drain:
			for {
				select {
				case ev := <-sub.ch:
					if err := emit(ev); err != nil {
						return err
					}
				default:
					break drain
				}
			}
			p.mu.Lock()
			end := p.end
			p.mu.Unlock()
			return emit(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}})
		case <-timedOut:
			return deadlineErr()
		case <-gen.end:
			return gen.why(p.pid)
		case <-tick.C:
			if err := emit(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if isClosed(timedOut) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return deadlineErr()
			}
			return rpcerr.From(ctx.Err())
		}
	}
}

func isClosed(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
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

func startEvent(pid uint32) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}
}

// lookup finds a process by pid or tag; exited processes are found only when withExited is set.
func (s *Service) lookup(sel *pb.ProcessSelector, withExited bool) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := s.procs[v.Pid]; ok && (withExited || !p.ended()) {
			return p, nil
		}
		return nil, errdefs.NotFound("process with pid %d not found", v.Pid)
	case *pb.ProcessSelector_Tag:
		for _, p := range s.procs {
			if p.tag != nil && *p.tag == v.Tag && (withExited || !p.ended()) {
				return p, nil
			}
		}
		return nil, errdefs.NotFound("process with tag %q not found", v.Tag)
	default:
		return nil, errdefs.InvalidArgument("process selector (pid or tag) is required")
	}
}

// List returns the running processes; each entry carries its config (the SDK dereferences it).
func (s *Service) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	var out []*pb.ProcessInfo
	for _, p := range s.procs {
		if !p.ended() {
			out = append(out, p.info())
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *pb.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
	return connect.NewResponse(&pb.ListResponse{Processes: out}), nil
}

// SendInput writes to a process's stdin pipe or PTY.
func (s *Service) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if err := writeInput(p, req.Msg.GetInput()); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func writeInput(p *proc, in *pb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		return p.writeStdin(v.Stdin)
	case *pb.ProcessInput_Pty:
		return p.writePTY(v.Pty)
	default:
		return errdefs.InvalidArgument("input (stdin or pty) is required")
	}
}

// StreamInput writes a client stream of inputs, in order, to one process.
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch v := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := s.lookup(v.Start.GetProcess(), false)
			if err != nil {
				return nil, rpcerr.From(err)
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, rpcerr.From(errdefs.InvalidArgument("the first message must be start"))
			}
			if err := writeInput(p, v.Data.GetInput()); err != nil {
				return nil, rpcerr.From(err)
			}
		case *pb.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// CloseStdin closes a pipe process's stdin so it sees EOF.
func (s *Service) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if p.ptmx != nil {
		return nil, rpcerr.From(fmt.Errorf("process %d has a PTY: send Ctrl-D (0x04) instead of closing stdin", p.pid))
	}
	p.closeStdin()
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// SendSignal signals a process's process group. Only SIGTERM and SIGKILL exist in the protocol.
func (s *Service) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("signal %v is not supported", req.Msg.GetSignal()))
	}
	p, err := s.lookup(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if err := p.signal(sig); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// Update resizes a PTY process's terminal.
func (s *Service) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if req.Msg.Pty != nil {
		if err := p.resize(req.Msg.GetPty().GetSize()); err != nil {
			return nil, rpcerr.From(err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// What execve takes (Linux, and gVisor alike): one argument or NAME=value string of at most
// MAX_ARG_STRLEN bytes with its NUL, and arguments and environment together within ARG_MAX,
// which is a quarter of the default 8 MiB stack.
const (
	maxArgStrLen = 128 << 10
	maxArgTotal  = 2 << 20
)

// checkExecSize refuses, as the client's error naming what is too long, a command that execve
// would refuse with a bare "file name too long" or "argument list too long".
func checkExecSize(cmd string, args, env []string, requested map[string]string) error {
	total := 0
	for _, kv := range env {
		if len(kv)+1 > maxArgStrLen {
			name, _, _ := strings.Cut(kv, "=")
			if _, ok := requested[name]; ok {
				return errdefs.InvalidArgument("envs: %q is %d bytes as NAME=value, over the limit of %d", name, len(kv), maxArgStrLen-1)
			}
			return errdefs.InvalidArgument("environment variable %q is %d bytes as NAME=value, over the limit of %d", name, len(kv), maxArgStrLen-1)
		}
		total += len(kv) + 1
	}
	for i, a := range append([]string{cmd}, args...) {
		if len(a)+1 > maxArgStrLen {
			return errdefs.InvalidArgument("argument %d is %d bytes, over the limit of %d", i, len(a), maxArgStrLen-1)
		}
		total += len(a) + 1
	}
	if total > maxArgTotal {
		return errdefs.InvalidArgument("arguments and environment are %d bytes in all, over the limit of %d", total, maxArgTotal)
	}
	return nil
}
