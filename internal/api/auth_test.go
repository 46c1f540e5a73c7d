package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/errdefs"
)

func TestAuth(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	revoked, revokedPlain, err := e.store.CreateAPIKey(ctx, "old", t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.RevokeAPIKey(ctx, revoked.ID, t0); err != nil {
		t.Fatal(err)
	}
	unknown := "e2b_" + strings.Repeat("0", 40)
	for _, tc := range []struct {
		name    string
		headers map[string]string
		status  int
		msg     string
	}{
		{"missing", nil, 401, "missing API key"},
		{"empty", map[string]string{"X-API-KEY": ""}, 401, "missing API key"},
		{"malformed", map[string]string{"X-API-KEY": "anything"}, 401, "invalid API key format"},
		{"unknown", map[string]string{"X-API-KEY": unknown}, 401, "invalid API key"},
		{"revoked", map[string]string{"X-API-KEY": revokedPlain}, 401, "revoked"},
		{"bearer revoked", map[string]string{"Authorization": "Bearer " + revokedPlain}, 401, "revoked"},
		{"basic is not bearer", map[string]string{"Authorization": "Basic " + e.key}, 401, "missing API key"},
		{"header lowercase", map[string]string{"x-api-key": e.key}, 200, ""},
		{"bearer", map[string]string{"Authorization": "Bearer " + e.key}, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := e.doWith("GET", "/v2/sandboxes", "", tc.headers)
			if tc.status == 200 {
				if w.Code != 200 {
					t.Fatalf("status %d: %s", w.Code, w.Body)
				}
				return
			}
			wantError(t, w, tc.status, tc.msg)
		})
	}
	// Every route needs a key except /health, including unknown and unsupported routes, so the
	// API reveals nothing to anonymous callers.
	for _, rt := range []struct{ method, path string }{
		{"POST", "/v2/sandboxes"}, {"DELETE", "/sandboxes/abc"}, {"GET", "/templates"},
		{"POST", "/sandboxes/abc/pause"}, {"GET", "/nope"},
	} {
		wantError(t, e.doWith(rt.method, rt.path, "{}", nil), 401, "missing API key")
	}
	if w := e.doWith("GET", "/health", "", nil); w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Fatalf("health = %d %q", w.Code, w.Body)
	}
	wantError(t, e.do("GET", "/nope", ""), 404, "no route for GET /nope")
}

// A path the API serves, asked with a method it does not serve there, is 405 with Allow (the
// catch-all route would otherwise answer 404 for it).
func TestWrongMethodIs405(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, tc := range []struct{ method, path, allow string }{
		{"PATCH", "/sandboxes", "GET, POST"},
		{"PUT", "/v2/sandboxes", "GET, POST"},
		{"POST", "/sandboxes/abc", "DELETE, GET"},
		{"DELETE", "/sandboxes/abc/pause", "POST"},
		{"POST", "/health", "GET"},
	} {
		w := e.do(tc.method, tc.path, "{}")
		wantError(t, w, 405, "method "+tc.method+" is not allowed for "+tc.path)
		if got := w.Header().Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
	}
	wantError(t, e.do("PATCH", "/nope", ""), 404, "no route for PATCH /nope")
	// Still after authentication: an anonymous caller learns nothing of the routes.
	wantError(t, e.doWith("PATCH", "/sandboxes", "{}", nil), 401, "missing API key")
}

func TestNotSupportedAndExtraRoutes(t *testing.T) {
	called := false
	e := newEnv(t, envOpts{api: func(o *Options) {
		o.Routes = map[string]http.Handler{
			"POST /v3/templates": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				called = true
				w.WriteHeader(http.StatusAccepted)
			}),
		}
	}})
	for _, rt := range []struct{ method, path, msg string }{
		{"POST", "/sandboxes/abc/pause", "pausing sandboxes on this node is not supported yet"},
		{"POST", "/sandboxes/abc/snapshots", "snapshots"},
		{"POST", "/sandboxes/abc/fork", "forking"},
		{"DELETE", "/templates/abc%3Adefault", "deleting templates"},
		{"POST", "/v2/templates/abc/builds/def", "building templates"},
	} {
		wantError(t, e.do(rt.method, rt.path, "{}"), http.StatusNotImplemented, rt.msg)
	}
	// Listing needs only the records: a node that cannot snapshot has none.
	if w := e.do("GET", "/snapshots", ""); w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != "[]" {
		t.Fatalf("GET /snapshots on a node without snapshots: %d %s", w.Code, w.Body)
	}
	if w := e.do("POST", "/v3/templates", "{}"); w.Code != http.StatusAccepted || !called {
		t.Fatalf("extra route: %d, called %v", w.Code, called)
	}
	called = false
	if w := e.doWith("POST", "/v3/templates", "{}", nil); w.Code != 401 || called {
		t.Fatal("extra route served without a key")
	}

	// A conflicting extra route is an error from New, not a panic.
	opts := e.apiOpt
	opts.Routes = map[string]http.Handler{"GET /templates/{id}/tags": http.NotFoundHandler()}
	if _, err := New(opts); err == nil {
		t.Fatal("New accepted a conflicting route")
	}
}

func TestErrorResponse(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		msg    string
		code   string
	}{
		{errdefs.InvalidArgument("bad %s", "x"), 400, "bad x", ""},
		{errdefs.NotFound("sandbox \"x\" not found"), 404, "sandbox \"x\" not found", ""},
		{errdefs.Conflict("c"), 409, "c", ""},
		{errdefs.Unauthorized("u"), 401, "u", ""},
		{errdefs.Unavailable("busy"), 503, "busy", ""},
		{errdefs.WithCode(errdefs.ResourceExhausted("full"), driver.CapacityErrorCode), 429, "full", "sandbox_capacity_unavailable"},
		{fmt.Errorf("wrapped: %w", errdefs.NotFound("nf")), 404, "nf", ""},
		{errors.New("open /var/lib/vmon/secret: denied"), 500, "internal error", ""},
		{errdefs.Wrap(errdefs.KindUnknown, errors.New("/var/lib/x"), "failed to start the sandbox"), 500, "failed to start the sandbox", ""},
		{fmt.Errorf("volume mounts are %w", driver.ErrNotImplemented), 501, "volume mounts are not supported yet", ""},
		{&http.MaxBytesError{Limit: 10}, 413, "limit of 10 bytes", ""},
		{context.DeadlineExceeded, 504, "timed out", ""},
	} {
		status, body := errorResponse(tc.err)
		if status != tc.status || body.Code != tc.status || !strings.Contains(body.Message, tc.msg) || body.ErrorCode != tc.code {
			t.Errorf("errorResponse(%v) = %d %+v, want %d %q %q", tc.err, status, body, tc.status, tc.msg, tc.code)
		}
	}
}
