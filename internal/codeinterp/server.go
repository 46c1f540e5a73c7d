// Package codeinterp is the code-execution service on guest port 49999 of the
// code-interpreter-v1 template, wire-compatible with what @e2b/code-interpreter sends and parses
// (docs/design/code-interpreter-protocol.md): POST /execute streams one JSON object per line
// while a kernel runs the code, and /contexts creates, lists, restarts and removes the kernels
// (contexts) executions run in, each with its own language and working directory.
//
// It runs inside the sandbox, as the template's start command, and owns the kernel processes it
// starts (package jupyter); it never talks to the node, and reaches envd only through
// Options.SandboxEnv, which its command wires.
package codeinterp

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

// Options configure a Server.
type Options struct {
	// Languages are the kernels this sandbox can run, by normalized name.
	Languages map[string]Language
	// Cwd is a new context's working directory unless the client names one.
	Cwd string
	// RuntimeDir holds the kernels' connection files.
	RuntimeDir string
	// Env is the kernels' environment (nil: this process's).
	Env []string
	// StartTimeout bounds a kernel's start.
	StartTimeout time.Duration
	// SandboxEnv reads the sandbox's environment variables (envd's GET /envs), proving the
	// access token an execution came with; nil: kernels get none.
	SandboxEnv func(ctx context.Context, token string) (map[string]string, error)
	Log        *slog.Logger
}

// Server is the service's HTTP handler.
type Server struct {
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux

	mu sync.Mutex
	// +checklocks:mu
	contexts map[string]*kcontext
	// defaults are the per-language contexts executions without a context_id run in.
	// +checklocks:mu
	defaults map[string]*kcontext
	// closed is set by Close: contexts that finish starting after it are stopped. +checklocks:mu
	closed bool
	// created numbers contexts in the order they were made: GET /contexts lists them so.
	// +checklocks:mu
	created uint64
	ready   chan struct{}
}

// kcontext is one context: a kernel, its language and working directory. Executions in it run
// one at a time, in the order they arrive.
type kcontext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	seq uint64     // its place in creation order (set once, under Server.mu)
	run sync.Mutex // held by the execution in progress
	// envKernel is the kernel that has the sandbox's variables already. +checklocks:run
	envKernel kernel
	kmu       sync.Mutex
	kernel    kernel // +checklocks:kmu
	// restarted is closed when the context's kernel is replaced or removed, ending what ran in
	// the old one. +checklocks:kmu
	restarted chan struct{}
	// restarting counts restarts bringing up a kernel; an execution waits for them rather than
	// start another. +checklocks:kmu
	restarting int
	// removed is set once the context is deleted or the server closed: it takes no new kernel,
	// so a restart that ends after that leaves nothing running. +checklocks:kmu
	removed bool
	// changed is closed (and renewed) whenever any of the above changes. +checklocks:kmu
	changed chan struct{}
}

// errRemoved is a restart of a context that was removed meanwhile.
var errRemoved = errors.New("the context was removed")

// New returns a Server; Start brings up the default Python context.
func New(opts Options) *Server {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Cwd == "" {
		opts.Cwd = "/home/user"
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	s := &Server{opts: opts, log: opts.Log, contexts: map[string]*kcontext{}, defaults: map[string]*kcontext{},
		ready: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("POST /execute", s.execute)
	mux.HandleFunc("POST /contexts", s.createContext)
	mux.HandleFunc("GET /contexts", s.listContexts)
	mux.HandleFunc("DELETE /contexts/{id}", s.deleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	s.mux = mux
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Start starts the default Python context; /health answers 200 once it is up, so a template's
// ready command (and its started snapshot) waits for a warm kernel.
//
// A default JavaScript context starts too, as E2B's service has one from the start (it is in a
// template's started snapshot then); one that fails to start is logged, and the first JavaScript
// execution tries again.
func (s *Server) Start(ctx context.Context) error {
	if _, err := s.defaultContext(ctx, "python"); err != nil {
		return err
	}
	if _, ok := s.opts.Languages["javascript"]; ok {
		if _, err := s.defaultContext(ctx, "javascript"); err != nil {
			s.log.Warn("the default JavaScript context did not start", "err", err)
		}
	}
	close(s.ready)
	return nil
}

// Close stops every kernel.
func (s *Server) Close() {
	s.mu.Lock()
	all := make([]*kcontext, 0, len(s.contexts))
	for _, c := range s.contexts {
		all = append(all, c)
	}
	s.contexts = map[string]*kcontext{}
	s.defaults = map[string]*kcontext{}
	s.closed = true
	s.mu.Unlock()
	for _, c := range all {
		c.stop()
	}
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	select {
	case <-s.ready:
		writeJSON(w, http.StatusOK, "OK")
	default:
		http.Error(w, "the default Python kernel is starting", http.StatusServiceUnavailable)
	}
}

// errNoLanguage is returned for a language this sandbox has no kernel for.
type errNoLanguage struct{ lang string }

func (e errNoLanguage) Error() string {
	return fmt.Sprintf("language %q is not available in this sandbox", e.lang)
}

func (s *Server) available() string {
	names := make([]string, 0, len(s.opts.Languages))
	for n := range s.opts.Languages {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// newContext starts a kernel for lang (normalized) in cwd.
func (s *Server) newContext(ctx context.Context, lang, cwd string) (*kcontext, error) {
	if _, ok := s.opts.Languages[lang]; !ok {
		return nil, errNoLanguage{lang}
	}
	c := &kcontext{ID: newContextID(), Language: lang, Cwd: cwd}
	k, err := s.startKernel(ctx, c)
	if err != nil {
		return nil, err
	}
	c.kernel, c.restarted, c.changed = k, make(chan struct{}), make(chan struct{})
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		k.Shutdown()
		return nil, errors.New("the code-execution service is shutting down")
	}
	s.created++
	c.seq = s.created
	s.contexts[c.ID] = c
	s.mu.Unlock()
	s.log.Info("context created", "id", c.ID, "language", lang, "cwd", cwd)
	return c, nil
}

// startKernel starts c's kernel and moves it to c's directory.
func (s *Server) startKernel(ctx context.Context, c *kcontext) (kernel, error) {
	l := s.opts.Languages[c.Language]
	if fi, err := os.Stat(c.Cwd); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("working directory %s does not exist", c.Cwd)
	}
	spec := jupyter.Spec{Argv: l.Argv, Env: s.opts.Env, Dir: c.Cwd, RuntimeDir: s.opts.RuntimeDir,
		StartTimeout: s.opts.StartTimeout, Log: s.log.With("context", c.ID)}
	var k kernel
	var err error
	if l.Start != nil {
		k, err = l.Start(ctx, spec)
	} else {
		k, err = jupyter.Start(ctx, spec)
	}
	if err != nil {
		return nil, fmt.Errorf("start the %s kernel: %w", c.Language, err)
	}
	if l.Startup != "" {
		rep, err := k.Execute(ctx, l.Startup, true, func(jupyter.Output) {})
		if err == nil && rep.Status != "ok" {
			err = fmt.Errorf("status %s", rep.Status)
		}
		if errors.Is(err, jupyter.ErrDied) || ctx.Err() != nil {
			k.Shutdown()
			return nil, fmt.Errorf("start the %s kernel: %w", c.Language, err)
		}
		if err != nil {
			s.log.Warn("kernel startup code failed; rich results it adds are missing", "context", c.ID, "language", c.Language, "err", err)
		}
	}
	if l.Chdir != nil {
		// The process started there; this also sets what the language itself reports.
		rep, err := k.Execute(ctx, l.Chdir(c.Cwd), true, func(jupyter.Output) {})
		if err == nil && rep.Status != "ok" {
			err = fmt.Errorf("status %s", rep.Status)
		}
		if err != nil {
			k.Shutdown()
			return nil, fmt.Errorf("change the %s kernel's directory to %s: %w", c.Language, c.Cwd, err)
		}
	}
	return k, nil
}

// defaultContext returns lang's default context, starting it the first time.
func (s *Server) defaultContext(ctx context.Context, lang string) (*kcontext, error) {
	s.mu.Lock()
	c := s.defaults[lang]
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	// Two first executions of a language may race here; the loser's kernel is stopped. A client
	// that leaves does not stop the start (the language's next execution would only start it
	// again); StartTimeout bounds it.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StartTimeout)
	defer cancel()
	c, err := s.newContext(sctx, lang, s.opts.Cwd)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.defaults[lang]; d != nil {
		delete(s.contexts, c.ID)
		go c.stop()
		return d, nil
	}
	s.defaults[lang] = c
	return c, nil
}

func (s *Server) lookup(id string) *kcontext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.contexts[id]
}

// notify wakes whoever waits for a change of c's kernel state. +checklocks:c.kmu
func (c *kcontext) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// replace swaps c's kernel for k (nil: none), ending what ran in the old one. A removed context
// takes no new kernel: replace reports false, and k is the caller's to shut down.
func (c *kcontext) replace(k kernel) (old kernel, ok bool) {
	c.kmu.Lock()
	defer c.kmu.Unlock()
	if c.removed && k != nil {
		return nil, false
	}
	old = c.kernel
	close(c.restarted)
	c.kernel, c.restarted = k, make(chan struct{})
	c.notify()
	return old, true
}

// stop removes c's kernel for good.
func (c *kcontext) stop() {
	c.kmu.Lock()
	c.removed = true
	c.kmu.Unlock()
	if old, _ := c.replace(nil); old != nil {
		old.Shutdown()
	}
}

// kernelFor returns the kernel an execution in c runs in, and the channel closed when it is
// replaced: the current kernel; else the one a restart in progress brings up; else (the last
// start failed, so the context has none) one started now, under StartTimeout.
func (s *Server) kernelFor(ctx context.Context, c *kcontext) (kernel, <-chan struct{}, error) {
	for {
		c.kmu.Lock()
		k, restarted, restarting, removed, changed := c.kernel, c.restarted, c.restarting, c.removed, c.changed
		c.kmu.Unlock()
		switch {
		case removed:
			return nil, nil, errRemoved
		case k != nil:
			return k, restarted, nil
		case restarting > 0:
			select {
			case <-changed:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		default:
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.StartTimeout)
			err := s.restart(sctx, c)
			cancel()
			if err != nil {
				return nil, nil, err
			}
		}
	}
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeBody(r, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = s.opts.Cwd
	}
	c, err := s.newContext(r.Context(), normalize(req.Language), cwd)
	if err != nil {
		s.contextError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// contextError answers a context that could not be made. A missing language is 404, whose body
// the SDK shows (other statuses it reports by code alone).
func (s *Server) contextError(w http.ResponseWriter, err error) {
	var nl errNoLanguage
	if errors.As(err, &nl) {
		http.Error(w, fmt.Sprintf("%v (available: %s)", err, s.available()), http.StatusNotFound)
		return
	}
	s.log.Warn("context failed", "err", err)
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

func (s *Server) listContexts(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	list := make([]*kcontext, 0, len(s.contexts))
	for _, c := range s.contexts {
		list = append(list, c)
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b *kcontext) int { return cmp.Compare(a.seq, b.seq) })
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	c := s.contexts[id]
	delete(s.contexts, id)
	for lang, d := range s.defaults {
		if d == c {
			delete(s.defaults, lang)
		}
	}
	s.mu.Unlock()
	if c == nil {
		http.Error(w, fmt.Sprintf("Context %s not found", id), http.StatusNotFound)
		return
	}
	c.stop()
	s.log.Info("context removed", "id", id)
	writeJSON(w, http.StatusOK, nil)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c := s.lookup(id)
	if c == nil {
		http.Error(w, fmt.Sprintf("Context %s not found", id), http.StatusNotFound)
		return
	}
	if err := s.restart(r.Context(), c); err != nil {
		s.contextError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, nil)
}

// restart replaces c's kernel with a fresh one in c's directory (same id); an execution in the
// old one ends with ContextRestarting. A start that fails leaves c without a kernel: its next
// execution starts one.
func (s *Server) restart(ctx context.Context, c *kcontext) error {
	c.kmu.Lock()
	if c.removed {
		c.kmu.Unlock()
		return errRemoved
	}
	c.restarting++
	c.kmu.Unlock()
	if old, _ := c.replace(nil); old != nil {
		old.Shutdown()
	}
	k, err := s.startKernel(ctx, c)
	var old kernel
	ok := true
	if err == nil {
		// Installed before the count drops, so a waiting execution wakes to the new kernel.
		old, ok = c.replace(k)
	}
	c.kmu.Lock()
	c.restarting--
	c.notify()
	c.kmu.Unlock()
	if err != nil {
		return err
	}
	if !ok {
		k.Shutdown()
		return errRemoved
	}
	if old != nil {
		old.Shutdown()
	}
	s.log.Info("context restarted", "id", c.ID)
	return nil
}

func newContextID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	return nil
}

// maxBody bounds a request body (code is sent whole).
const maxBody = 16 << 20

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
