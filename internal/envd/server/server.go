// Package server owns envd's HTTP surface: one handler that serves E2B envd's REST routes
// (/health, /init, /envs, /metrics, /files) and the process and filesystem Connect services on one
// mux, behind CORS and the access-token check, plus the session state /init sets (access token,
// default user and workdir, environment variables). It is transport-agnostic: the agent channel
// and the debug TCP listener both serve the same Server.
package server

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/envd/filesystem"
	"github.com/vibemon/vmon/internal/envd/gen/filesystem/filesystemconnect"
	"github.com/vibemon/vmon/internal/envd/gen/process/processconnect"
	"github.com/vibemon/vmon/internal/envd/journal"
	"github.com/vibemon/vmon/internal/envd/process"
	"github.com/vibemon/vmon/internal/envd/users"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/guestnet"
	"github.com/vibemon/vmon/internal/httpguard"
)

// builtinDefaultUser is the user requests act as until /init sets defaultUser (E2B: root).
const builtinDefaultUser = "root"

// Options configures a Server.
type Options struct {
	Logger *slog.Logger
	// Users is the guest account database; the zero value reads /etc/passwd and /etc/group.
	Users users.DB
	// SetClock lets /init set the guest's clock from its timestamp. Only the real agent sets it;
	// tests run on a host whose clock must not move.
	SetClock bool
	// ConfigureNetwork applies the address /init pushes (guestnet.Apply in the real agent). Nil
	// refuses such an /init: tests run on a host whose network must not change.
	ConfigureNetwork func(guestnet.Config) error
	// Starter starts the processes envd runs (see process.Options.Starter).
	Starter process.Starter
	// TrustBundles are the trust stores /init's caBundle goes to; nil is the guest's own
	// (TrustBundles). Tests point them at a temporary directory.
	TrustBundles []string
	// Journal is what envd reports for the sandbox's log (agentproto.EventsPath); nil starts an
	// empty one.
	Journal *journal.Journal
	// MemoryHint takes the node's word on whether the sandbox is near its memory
	// (agentproto.MemoryHintPath); nil takes it and does nothing with it.
	MemoryHint func(near bool)
}

// Server is envd's HTTP handler. It is safe for concurrent use.
type Server struct {
	log      *slog.Logger
	users    users.DB
	setClock bool
	netConf  func(guestnet.Config) error
	// trustBundles: see Options.TrustBundles.
	trustBundles []string
	handler      http.Handler
	fs           *filesystem.Service
	procs        *process.Service
	metrics      cpuSampler
	journal      *journal.Journal

	mu sync.RWMutex
	// token is the access token set by /init; empty means every request is allowed. +checklocks:mu
	token string
	// +checklocks:mu
	defaultUser string
	// +checklocks:mu
	defaultWorkdir string
	// +checklocks:mu
	envVars map[string]string
	// caBundle is the bundle /init last installed: the node sends it again after every resume,
	// and the trust stores already hold it. +checklocks:mu
	caBundle string
}

// New returns a Server with no access token and root as the default user.
func New(opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		log:          log,
		users:        opts.Users,
		setClock:     opts.SetClock,
		netConf:      opts.ConfigureNetwork,
		defaultUser:  builtinDefaultUser,
		trustBundles: opts.TrustBundles,
		envVars:      map[string]string{},
	}
	if s.trustBundles == nil {
		s.trustBundles = TrustBundles
	}
	s.journal = opts.Journal
	if s.journal == nil {
		s.journal = journal.New()
	}
	procs, err := process.New(process.Options{Logger: log, Env: s, Starter: opts.Starter, Journal: s.journal})
	if err != nil {
		return nil, err
	}
	s.procs = procs
	s.fs, err = filesystem.New(filesystem.Options{Logger: log, Env: s, Users: opts.Users})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(procs))
	mux.Handle(filesystemconnect.NewFilesystemHandler(s.fs))
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("POST /init", s.init)
	mux.HandleFunc("GET /envs", s.envs)
	mux.HandleFunc("GET /metrics", s.getMetrics)
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	mux.HandleFunc("POST "+agentproto.EndStreamsPath, s.endStreams)
	mux.HandleFunc("POST "+agentproto.MemoryHintPath, func(w http.ResponseWriter, r *http.Request) {
		var h agentproto.MemoryHint
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1024)).Decode(&h); err != nil {
			s.writeError(w, r, errdefs.InvalidArgument("invalid memory hint: %v", err))
			return
		}
		if opts.MemoryHint != nil {
			opts.MemoryHint(h.Near)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.Handle("GET "+agentproto.EventsPath, s.journal)
	// httpguard: unclean paths get a 404 instead of ServeMux's redirect, and the plain-text
	// errors of ServeMux and http.ServeContent come out in E2B's JSON shape.
	s.handler = httpguard.Handler(cors(s.requireToken(mux)))
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Close stops background work (directory watchers). Started processes keep running: they belong
// to the sandbox, not to this handler.
func (s *Server) Close() error {
	s.fs.Close()
	return nil
}

// Caller implements process.Env and filesystem.Env: the user named by "Authorization: Basic
// base64(user:)", else the default user. An unknown or malformed user is Unauthorized.
func (s *Server) Caller(h http.Header) (*users.User, error) {
	name, err := basicUser(h.Get("Authorization"))
	if err != nil {
		return nil, err
	}
	return s.lookupUser(name)
}

// Defaults implements process.Env.
func (s *Server) Defaults() (string, map[string]string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.defaultWorkdir, maps.Clone(s.envVars)
}

// lookupUser returns the named user, or the default user when name is empty.
func (s *Server) lookupUser(name string) (*users.User, error) {
	if name == "" {
		s.mu.RLock()
		name = s.defaultUser
		s.mu.RUnlock()
	}
	u, err := s.users.Lookup(name)
	if err != nil {
		if errdefs.Is(err, errdefs.KindNotFound) || errdefs.Is(err, errdefs.KindInvalidArgument) {
			return nil, errdefs.Unauthorized("invalid username: '%s'", name)
		}
		return nil, err
	}
	return u, nil
}

// basicUser extracts the user name of a Basic Authorization header; other schemes are ignored.
func basicUser(auth string) (string, error) {
	scheme, cred, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", errdefs.Unauthorized("invalid username: malformed Basic credentials")
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user, nil
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Envd-Version", agentproto.EnvdVersion)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) envs(w http.ResponseWriter, r *http.Request) {
	_, env := s.Defaults()
	writeJSON(w, http.StatusOK, env)
}

// cors answers preflights and lets browsers read responses; E2B's envd allows every origin
// because access is controlled by the token, not by the origin.
func cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Origin") == "" {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Expose-Headers", "*")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS")
			if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
				h.Set("Access-Control-Allow-Headers", req)
			}
			h.Set("Access-Control-Max-Age", "7200")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// errorBody is envd's REST error shape.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// statusError is a REST error whose status errdefs has no kind for (406, 507).
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

// writeError renders err as {"code","message"} with the status its kind maps to.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var se *statusError
	if errors.As(err, &se) {
		writeJSON(w, se.status, errorBody{Code: se.status, Message: se.msg})
		return
	}
	status := errdefs.HTTPStatus(err)
	msg := errdefs.PublicMessage(err)
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		if errdefs.KindOf(err) == errdefs.KindUnknown {
			msg = err.Error() // the guest's own paths and errno text help the caller and leak nothing
		}
	}
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}
