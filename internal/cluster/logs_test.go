package cluster

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/sandboxlog"
)

// A sandbox's log in a cluster is the driver's part and every node's it ran on, merged in time
// order under the query's cursor, filters and limit, an entry two parts hold kept once; a node
// that does not answer leaves its part out; a sandbox no part knows is ErrNotFound.
func TestLogsMergeTheNodesParts(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	open := func() *sandboxlog.Store {
		s, err := sandboxlog.Open(sandboxlog.Options{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	at := func(s int, logger, msg string) sandboxlog.Entry {
		return sandboxlog.Entry{Time: t0.Add(time.Duration(s) * time.Second), Level: sandboxlog.LevelInfo, Logger: logger, Message: msg}
	}
	driverPart := open()
	driverPart.AppendAll("sb1", []sandboxlog.Entry{at(0, "lifecycleSvc", "created"), at(5, "lifecycleSvc", "paused"), at(6, "lifecycleSvc", "resumed")})
	parts := map[string][]sandboxlog.Entry{
		"node-a": {at(1, "processSvc", "process started on a"), at(3, "egressSvc", "egress refused on a")},
		// node-b resumed the sandbox and read envd's earlier events again.
		"node-b": {at(1, "processSvc", "process started on a"), at(7, "processSvc", "process started on b")},
	}
	r := NewRouter(func(context.Context, string) (string, error) { return "", nil })
	var servers []*httptest.Server
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		s := open()
		s.AppendAll("sb1", parts[name])
		mux := http.NewServeMux()
		mux.Handle(nodeapi.NewServer(drivertest.NewNode(), nil).WithLogs(s).Handler())
		ts := httptest.NewServer(mux)
		t.Cleanup(ts.Close)
		servers = append(servers, ts)
		r.Upsert(name, membership.Meta{Role: membership.RoleNode, State: membership.StateReady}, nodeapi.NewClient(ts.Client(), ts.URL))
	}
	l := NewLogs(driverPart, r)
	msgs := func(es []sandboxlog.Entry) []string {
		out := make([]string, len(es))
		for i, e := range es {
			out[i] = e.Message
		}
		return out
	}
	ctx := context.Background()
	got, err := l.QueryContext(ctx, "sb1", sandboxlog.Query{})
	want := []string{"created", "process started on a", "egress refused on a", "paused", "resumed", "process started on b"}
	if err != nil || !slices.Equal(msgs(got), want) {
		t.Fatalf("whole log: %q, %v; want %q", msgs(got), err, want)
	}
	got, _ = l.QueryContext(ctx, "sb1", sandboxlog.Query{Backward: true, Limit: 2})
	if !slices.Equal(msgs(got), []string{"process started on b", "resumed"}) {
		t.Fatalf("newest two: %q", msgs(got))
	}
	got, _ = l.QueryContext(ctx, "sb1", sandboxlog.Query{Cursor: t0.Add(2 * time.Second).UnixMilli(), Limit: 2})
	if !slices.Equal(msgs(got), []string{"egress refused on a", "paused"}) {
		t.Fatalf("two from 2 s on: %q", msgs(got))
	}
	got, _ = l.QueryContext(ctx, "sb1", sandboxlog.Query{Search: "egress"})
	if !slices.Equal(msgs(got), []string{"egress refused on a"}) {
		t.Fatalf("search: %q", msgs(got))
	}
	// node-a goes away: its part is left out, the rest stands.
	servers[0].Close()
	got, err = l.QueryContext(ctx, "sb1", sandboxlog.Query{})
	if err != nil || !slices.Equal(msgs(got), []string{"created", "process started on a", "paused", "resumed", "process started on b"}) {
		t.Fatalf("without node-a: %q, %v", msgs(got), err)
	}
	if _, err := l.QueryContext(ctx, "nosuch", sandboxlog.Query{}); !errors.Is(err, sandboxlog.ErrNotFound) {
		t.Fatalf("an unknown sandbox: %v", err)
	}
}
