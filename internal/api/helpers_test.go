package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/store"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

const baseID = "basetemplate00000001"

type env struct {
	srv    *Server
	d      *driver.Driver
	node   *drivertest.Node
	clock  *drivertest.Clock
	store  *store.Store
	key    string
	keyID  string
	apiOpt Options
}

type envOpts struct {
	driver func(*driver.Options)
	api    func(*Options)
}

func newEnv(t *testing.T, eo envOpts) *env {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, tpl := range []store.Template{
		{ID: baseID, Aliases: []string{"base"}, BuildID: "6f1e3c9a-0000-4000-8000-000000000001", CPU: 2,
			MemoryMB: 512, DiskMB: 2048, EnvdVersion: "0.6.13", Status: store.TemplateReady, CreatedAt: t0, UpdatedAt: t0},
		{ID: "buildingtemplate0001", Aliases: []string{"wip"}, CPU: 1, MemoryMB: 256, DiskMB: 1024,
			Status: store.TemplateBuilding, CreatedAt: t0, UpdatedAt: t0},
	} {
		if err := st.PutTemplate(ctx, tpl); err != nil {
			t.Fatal(err)
		}
	}
	k, plain, err := st.CreateAPIKey(ctx, "admin", t0)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	e := &env{node: drivertest.NewNode(), clock: drivertest.NewClock(t0), store: st, key: plain, keyID: k.ID}
	dopts := driver.Options{Store: st, Node: e.node, Logger: log, Clock: e.clock,
		Features: []string{driver.FeatureNetTap}, NetworkStore: &drivertest.NetworkStore{Store: st}}
	if eo.driver != nil {
		eo.driver(&dopts)
	}
	if e.d, err = driver.New(dopts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.d.Close() })
	if err := e.d.Recover(ctx, e.node.Alive, nil); err != nil {
		t.Fatal(err)
	}
	e.apiOpt = Options{Driver: e.d, Store: st, Logger: log}
	if eo.api != nil {
		eo.api(&e.apiOpt)
	}
	if e.srv, err = New(e.apiOpt); err != nil {
		t.Fatal(err)
	}
	return e
}

// do sends a request with the env's API key and returns the recorded response.
func (e *env) do(method, target, body string) *httptest.ResponseRecorder {
	return e.doWith(method, target, body, map[string]string{"X-API-KEY": e.key})
}

func (e *env) doWith(method, target, body string, headers map[string]string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, r)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	e.srv.ServeHTTP(w, req)
	return w
}

// create makes a sandbox through the API and returns its decoded response.
func (e *env) create(t *testing.T, body string) map[string]any {
	t.Helper()
	w := e.do("POST", "/v2/sandboxes", body)
	if w.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	return decode(t, w)
}

func decode(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("decode %q: %v", w.Body, err)
	}
	return m
}

func decodeList(t *testing.T, w *httptest.ResponseRecorder) []map[string]any {
	t.Helper()
	var m []map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("decode %q: %v", w.Body, err)
	}
	return m
}

// wantError checks an E2B error response: status, JSON code equal to it, and a message fragment.
func wantError(t *testing.T, w *httptest.ResponseRecorder, status int, msg string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
	var b struct {
		Code    int     `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || b.Message == nil {
		t.Fatalf("error body %q: %v", w.Body, err)
	}
	if b.Code != status {
		t.Fatalf("JSON code %d, want %d", b.Code, status)
	}
	if !strings.Contains(*b.Message, msg) {
		t.Fatalf("message %q does not contain %q", *b.Message, msg)
	}
}

func (e *env) records(t *testing.T) int {
	t.Helper()
	n, err := e.store.CountSandboxes(context.Background(), store.SandboxQuery{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
