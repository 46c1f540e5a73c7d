package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/denied"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

func TestRefusalEntry(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := refusalEntry(denied.Event{Time: at, SandboxID: "sb", Proto: "tcp", Dst: "203.0.113.7", Port: 443,
		Name: "blocked.example", Stage: "denyOut", Rule: "203.0.113.0/24", Count: 1})
	if e.Level != sandboxlog.LevelWarn || e.Logger != "egressSvc" || !e.Time.Equal(at) ||
		e.Message != "egress refused: tcp blocked.example (203.0.113.7:443) by denyOut (203.0.113.0/24)" {
		t.Errorf("first refusal: %+v", e)
	}
	for k, v := range map[string]string{"destination": "203.0.113.7", "port": "443", "rule": "203.0.113.0/24",
		"name": "blocked.example", "count": "1"} {
		if e.Fields[k] != v {
			t.Errorf("field %s = %q, want %q", k, e.Fields[k], v)
		}
	}
	r := refusalEntry(denied.Event{SandboxID: "sb", Proto: "udp", Dst: "198.51.100.1", Port: 53, Stage: "always-denied",
		Count: 12, Repeats: true})
	if r.Message != "egress refused 12 more times: udp 198.51.100.1:53 by always-denied" || r.Fields["count"] != "12" {
		t.Errorf("repeats: %+v", r)
	}
}

func TestPrintLogEntry(t *testing.T) {
	var b bytes.Buffer
	e := logEntry{Timestamp: time.Date(2026, 1, 1, 0, 0, 0, 5e6, time.UTC), Level: "warn", Message: "egress refused",
		Fields: map[string]string{"logger": "egressSvc", "port": "443", "destination": "203.0.113.7"}}
	if err := printLogEntry(&b, e, false); err != nil {
		t.Fatal(err)
	}
	want := "2026-01-01T00:00:00.005Z  WARN   egress     egress refused  destination=\"203.0.113.7\" port=\"443\"\n"
	if b.String() != want {
		t.Errorf("got  %q\nwant %q", b.String(), want)
	}
	b.Reset()
	if err := printLogEntry(&b, e, true); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b.Bytes(), []byte(`"fields":{"destination":"203.0.113.7","logger":"egressSvc","port":"443"}`)) {
		t.Errorf("json: %s", b.String())
	}
}

func TestPruneKilledGoesWithTheRetention(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	for _, id := range []string{"old", "recent", "live"} {
		if err := st.InsertSandbox(ctx, store.Sandbox{ID: id, TemplateID: "tpl", State: store.StateRunning,
			StartedAt: now.Add(-3 * time.Hour), EndAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.MarkKilled(ctx, "old", now.Add(-2*time.Hour), "killed by request"); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkKilled(ctx, "recent", now.Add(-time.Minute), "killed by request"); err != nil {
		t.Fatal(err)
	}
	pruneKilled(ctx, st, slog.New(slog.DiscardHandler))(now.Add(-time.Hour))
	if _, err := st.GetSandbox(ctx, "old"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Errorf("a record killed past the retention is still there: %v", err)
	}
	for _, id := range []string{"recent", "live"} {
		if _, err := st.GetSandbox(ctx, id); err != nil {
			t.Errorf("record %s: %v", id, err)
		}
	}
}
