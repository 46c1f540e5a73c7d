// Package api serves E2B's REST control-plane API (the routes the `e2b` SDK calls: sandboxes,
// templates, health) as an http.Handler, wire-compatible with e2b@2.51.0.
//
// It owns only the HTTP edge: authentication with API keys, request decoding and validation of
// wire types, response shapes, and the single mapping from errdefs kinds to E2B error bodies.
// Lifecycle decisions belong to the driver; it never talks to nodes, runtimes or sandbox traffic
// (ingress is a separate handler on the same listener).
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/httpguard"
	"github.com/vibemon/vmon/internal/store"
)

// ClientID is the constant, deprecated but required `clientID` E2B's API sends.
const ClientID = "6532622b"

// DefaultMaxBodyBytes caps request bodies; E2B bodies are small JSON documents.
const DefaultMaxBodyBytes = 1 << 20

// Options configure the API. Driver, Store and Logger are required.
type Options struct {
	Driver *driver.Driver
	Store  *store.Store
	Logger *slog.Logger
	// Domain is returned as the sandboxes' `domain`; "" returns null, which makes the SDK use
	// E2B_SANDBOX_URL / its configured domain.
	Domain string
	// MaxBodyBytes defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Routes adds authenticated handlers by ServeMux pattern (e.g. the template build API). A
	// pattern equal to a built-in one replaces it, which is how a "not supported yet" answer is
	// swapped for a real implementation.
	Routes map[string]http.Handler
	// Builds serves the template build API; nil answers those routes with 501.
	Builds TemplateBuilds
	// MaxUploadBytes caps one COPY archive upload (and one volume file); default DefaultMaxUploadBytes.
	MaxUploadBytes int64
	// Volumes serves the volume content API; nil answers the volume routes with 501.
	Volumes VolumeFiles
	// BodyGrace overrides httpguard.BodyGrace (tests).
	BodyGrace time.Duration
}

// Server is the API handler.
type Server struct {
	driver  *driver.Driver
	store   *store.Store
	log     *slog.Logger
	domain  *string
	maxBody int64
	mux     *http.ServeMux
	builds  TemplateBuilds
	// bodyGrace is how long a body may take before it must keep up httpguard.BodyMinRate.
	bodyGrace time.Duration
	// maxUpload caps COPY archive uploads.
	maxUpload int64
}

// New builds the API handler.
func New(opts Options) (*Server, error) {
	if opts.Driver == nil || opts.Store == nil || opts.Logger == nil {
		return nil, errors.New("api: Driver, Store and Logger are required")
	}
	s := &Server{driver: opts.Driver, store: opts.Store, log: opts.Logger, maxBody: opts.MaxBodyBytes}
	if s.maxBody <= 0 {
		s.maxBody = DefaultMaxBodyBytes
	}
	s.bodyGrace = opts.BodyGrace
	if s.bodyGrace <= 0 {
		s.bodyGrace = httpguard.BodyGrace
	}
	s.builds, s.maxUpload = opts.Builds, opts.MaxUploadBytes
	if s.maxUpload <= 0 {
		s.maxUpload = DefaultMaxUploadBytes
	}
	if opts.Domain != "" {
		d := opts.Domain
		s.domain = &d
	}

	routes := map[string]http.Handler{
		"POST /sandboxes":                         s.handle(s.createV1),
		"POST /v2/sandboxes":                      s.handle(s.createV2),
		"GET /sandboxes":                          s.handle(s.listV1),
		"GET /v2/sandboxes":                       s.handle(s.listV2),
		"GET /sandboxes/{id}":                     s.handle(s.get),
		"DELETE /sandboxes/{id}":                  s.handle(s.kill),
		"POST /sandboxes/{id}/connect":            s.handle(s.connect),
		"POST /v2/sandboxes/{id}/connect":         s.handle(s.connect),
		"POST /sandboxes/{id}/timeout":            s.handle(s.setTimeout),
		"POST /sandboxes/{id}/refreshes":          s.handle(s.refresh),
		"GET /sandboxes/{id}/metrics":             s.handle(s.metrics),
		"GET /templates":                          s.handle(s.listTemplates),
		"GET /templates/{id}":                     s.handle(s.getTemplate),
		"GET /templates/aliases/{alias}":          s.handle(s.templateAlias),
		"POST /sandboxes/{id}/pause":              s.handle(s.pause),
		"POST /sandboxes/{id}/resume":             s.handle(s.resume),
		"PUT /sandboxes/{id}/network":             s.handle(s.updateNetwork),
		"GET /sandboxes/{id}/network/denied":      s.handle(s.watchDenied),
		"POST /sandboxes/{id}/snapshots":          s.handle(s.createSnapshot),
		"GET /snapshots":                          s.handle(s.listSnapshots),
		"POST /sandboxes/{id}/fork":               s.handle(s.fork),
		"GET /sandboxes/{id}/logs":                s.handle(s.logsV1),
		"GET /v2/sandboxes/{id}/logs":             s.handle(s.logsV2),
		"GET /sandboxes/metrics":                  notSupported("batch sandbox metrics"),
		"DELETE /templates/{id}":                  s.deleteTemplateOrSnapshot(notSupported("deleting templates")),
		"POST /v3/templates":                      notSupported("building templates"),
		"POST /v2/templates":                      notSupported("building templates"),
		"POST /v2/templates/{id}/builds/{bid}":    notSupported("building templates"),
		"GET /templates/{id}/builds/{bid}/status": notSupported("building templates"),
		"GET /templates/{id}/files/{hash}":        notSupported("building templates"),
		"POST /templates/tags":                    notSupported("template tags"),
		"DELETE /templates/tags":                  notSupported("template tags"),
	}
	if s.builds != nil {
		build := s.templateBuildRoutes()
		for p, h := range build {
			routes[p] = h
		}
		// The SDK deletes snapshots through the template route.
		routes["DELETE /templates/{id}"] = s.deleteTemplateOrSnapshot(build["DELETE /templates/{id}"])
	}
	if opts.Volumes != nil {
		for p, h := range s.volumeRoutes() {
			routes[p] = h
		}
	} else {
		for _, p := range []string{"POST /volumes", "GET /volumes", "GET /volumes/{id}", "DELETE /volumes/{id}"} {
			routes[p] = notSupported("volumes")
		}
	}
	for p, h := range s.secretRoutes() {
		routes[p] = h
	}
	for p, h := range opts.Routes {
		routes[p] = h
	}

	s.mux = http.NewServeMux()
	// served remembers every method-qualified pattern, for the catch-all's 405.
	served := map[string]http.Handler{}
	add := func(pattern string, h http.Handler) error {
		served[pattern] = h
		return register(s.mux, pattern, h)
	}
	if err := add("GET /health", http.HandlerFunc(s.health)); err != nil {
		return nil, err
	}
	if s.builds != nil {
		if err := add(uploadRoute, s.handle(s.upload)); err != nil {
			return nil, err
		}
	}
	if opts.Volumes != nil {
		for p, h := range s.volumeContentRoutes(opts.Volumes) {
			if err := add(p, h); err != nil {
				return nil, err
			}
		}
	}
	for p, h := range routes {
		if err := add(p, s.authenticate(h)); err != nil {
			return nil, err
		}
	}
	// Unknown routes still answer E2B's JSON error shape (after auth, like every other route).
	// The catch-all matches every method, so ServeMux never answers 405 by itself: a path some
	// route serves under another method gets 405 with Allow here.
	known, err := pathsOf(served)
	if err != nil {
		return nil, err
	}
	if err := register(s.mux, "/", s.authenticate(s.handle(func(w http.ResponseWriter, r *http.Request) error {
		if _, pattern := known.Handler(r); pattern != "" {
			w.Header().Set("Allow", strings.Join(methodsOf(served, pattern), ", "))
			return &httpError{status: http.StatusMethodNotAllowed,
				msg: fmt.Sprintf("method %s is not allowed for %s", errdefs.Clip(r.Method), errdefs.Clip(r.URL.Path))}
		}
		return &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no route for %s %s", errdefs.Clip(r.Method), errdefs.Clip(r.URL.Path))}
	}))); err != nil {
		return nil, err
	}
	return s, nil
}

// pathsOf is a mux of the paths of method-qualified route patterns, whatever their method: it
// tells whether a request's path is served under some other method.
func pathsOf(routes map[string]http.Handler) (*http.ServeMux, error) {
	mux := http.NewServeMux()
	seen := map[string]bool{}
	for p := range routes {
		_, path, ok := strings.Cut(p, " ")
		if !ok || seen[path] {
			continue
		}
		seen[path] = true
		if err := register(mux, path, http.NotFoundHandler()); err != nil {
			return nil, err
		}
	}
	return mux, nil
}

// methodsOf lists, sorted, the methods routes serve path (a pattern without method) under.
func methodsOf(routes map[string]http.Handler, path string) []string {
	var out []string
	for p := range routes {
		if m, rest, ok := strings.Cut(p, " "); ok && rest == path {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// register adds a route, turning ServeMux's panic on conflicting patterns into an error.
func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("api: route %q: %v", pattern, r)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// ServeHTTP serves the API with a body size limit and request logging.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if r.Body != nil {
		httpguard.PaceBody(w, r, s.bodyGrace, httpguard.BodyMinRate)
		limit := s.maxBody
		if isUpload(r) {
			limit = s.maxUpload
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
	}
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	s.mux.ServeHTTP(rec, r)
	level := slog.LevelDebug
	if rec.status >= 500 {
		level = slog.LevelWarn
	}
	s.log.Log(r.Context(), level, "api request", "method", r.Method, "path", r.URL.Path,
		"status", rec.status, "duration", time.Since(start))
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// authenticate requires a valid API key in X-API-KEY (what the SDK sends) or
// `Authorization: Bearer` (what the CLI sends).
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
				key = strings.TrimSpace(v)
			}
		}
		if key == "" {
			s.writeError(w, r, &httpError{status: http.StatusUnauthorized,
				msg: "missing API key: send it in the X-API-KEY header"})
			return
		}
		if _, err := s.store.VerifyAPIKey(r.Context(), key); err != nil {
			s.writeError(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// health answers 204 while the database answers; it needs no key, like E2B's.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.log.Error("health check", "err", err)
		s.writeError(w, r, &httpError{status: http.StatusServiceUnavailable, msg: "database unavailable"})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handle adapts a handler that returns an error: every failure goes through writeError.
func (s *Server) handle(f func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := f(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func notSupported(feature string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotImplemented, errorBody{Code: http.StatusNotImplemented,
			Message: feature + " is not supported yet"})
	})
}
