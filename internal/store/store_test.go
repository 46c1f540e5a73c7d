package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

func openTest(t *testing.T) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func TestMigrations(t *testing.T) {
	ctx := context.Background()
	s, dir := openTest(t)
	v, err := s.SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v != len(migrations) {
		t.Fatalf("schema version = %d, want %d", v, len(migrations))
	}
	var mode string
	if err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q, %v; want wal", mode, err)
	}
	for _, table := range []string{"api_keys", "templates", "template_aliases", "sandboxes"} {
		var n int
		if err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Errorf("table %s: %v", table, err)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("database mode = %v, want 0600", fi.Mode().Perm())
	}

	// Data survives a reopen and migrations are not re-applied.
	if _, _, err := s.CreateAPIKey(ctx, "k", t0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(ctx, dir)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if n, err := s2.CountActiveAPIKeys(ctx); err != nil || n != 1 {
		t.Fatalf("keys after reopen = %d, %v", n, err)
	}

	// A database from a newer binary is refused rather than misread.
	if _, err := s2.db.ExecContext(ctx, "PRAGMA user_version = 999"); err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if s3, err := Open(ctx, dir); err == nil {
		s3.Close()
		t.Fatal("Open accepted a newer schema")
	}
}

func TestMigrationFromPartialVersion(t *testing.T) {
	// A database at version 0 with nothing in it (e.g. created by an older binary before any
	// migration) is migrated up to date.
	ctx := context.Background()
	dir := t.TempDir()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE unrelated (x)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, _ := s.SchemaVersion(ctx); v != len(migrations) {
		t.Fatalf("version = %d", v)
	}
}

func testAPIKeys(t *testing.T, s *Store) {
	ctx := context.Background()
	k, plain, err := s.CreateAPIKey(ctx, "admin", t0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.VerifyAPIKey(ctx, plain)
	if err != nil || got.ID != k.ID || got.Name != "admin" {
		t.Fatalf("VerifyAPIKey = %+v, %v", got, err)
	}
	other := "e2b_" + "0123456789abcdef0123456789abcdef01234567"
	for _, bad := range []string{"", "nope", other} {
		if _, err := s.VerifyAPIKey(ctx, bad); !errdefs.Is(err, errdefs.KindUnauthorized) {
			t.Errorf("VerifyAPIKey(%q) = %v, want Unauthorized", bad, err)
		}
	}
	if err := s.RevokeAPIKey(ctx, k.ID, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeAPIKey(ctx, k.ID, t0.Add(2*time.Hour)); err != nil {
		t.Fatalf("second revoke: %v", err)
	}
	if _, err := s.VerifyAPIKey(ctx, plain); !errdefs.Is(err, errdefs.KindUnauthorized) {
		t.Fatalf("revoked key verified: %v", err)
	}
	keys, err := s.ListAPIKeys(ctx)
	if err != nil || len(keys) != 1 || !keys[0].RevokedAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("ListAPIKeys = %+v, %v", keys, err)
	}
	if err := s.RevokeAPIKey(ctx, "missing", t0); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("revoke missing = %v", err)
	}
	if n, _ := s.CountActiveAPIKeys(ctx); n != 0 {
		t.Fatalf("active keys = %d", n)
	}
}

func testTemplates(t *testing.T, s *Store) {
	ctx := context.Background()
	base := Template{ID: "tpl1", Aliases: []string{"base", "base:v1"}, CPU: 2, MemoryMB: 512, DiskMB: 1024,
		EnvdVersion: "0.6.13", Status: TemplateReady, Rootfs: "/x", CreatedAt: t0, UpdatedAt: t0}
	if err := s.PutTemplate(ctx, base); err != nil {
		t.Fatal(err)
	}
	got, err := s.TemplateByAlias(ctx, "base:v1")
	if err != nil || got.ID != "tpl1" || len(got.Aliases) != 2 || got.Aliases[0] != "base" {
		t.Fatalf("TemplateByAlias = %+v, %v", got, err)
	}
	if err := s.PutTemplate(ctx, Template{ID: "tpl2", Aliases: []string{"base"}, Status: TemplateReady}); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("duplicate alias = %v, want Conflict", err)
	}
	if _, err := s.GetTemplate(ctx, "tpl2"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("failed put left a template behind: %v", err)
	}
	if err := s.PutTemplate(ctx, Template{ID: "x", Status: "bogus"}); !errdefs.Is(err, errdefs.KindInvalidArgument) {
		t.Fatalf("bad status = %v", err)
	}
	if err := s.RecordSpawn(ctx, "tpl1", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// Replacing keeps spawn statistics and creation time; aliases are replaced.
	base.Aliases = []string{"base"}
	base.UpdatedAt = t0.Add(time.Hour)
	base.CreatedAt = t0.Add(time.Hour)
	if err := s.PutTemplate(ctx, base); err != nil {
		t.Fatal(err)
	}
	got, err = s.GetTemplate(ctx, "tpl1")
	if err != nil || got.SpawnCount != 1 || !got.CreatedAt.Equal(t0) || len(got.Aliases) != 1 ||
		!got.LastSpawnedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after replace: %+v, %v", got, err)
	}
	if _, err := s.TemplateByAlias(ctx, "base:v1"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("removed alias still resolves: %v", err)
	}
	list, err := s.ListTemplates(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("ListTemplates = %+v, %v", list, err)
	}
	if err := s.DeleteTemplate(ctx, "tpl1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.TemplateByAlias(ctx, "base"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("alias survived delete: %v", err)
	}
}

func testSandbox(id string, started time.Time, meta map[string]string) Sandbox {
	return Sandbox{ID: id, TemplateID: "tpl1", Alias: "base", State: StateRunning, Metadata: meta,
		EnvVars: map[string]string{"A": "1"}, EnvdAccessToken: "tok", AllowPublicTraffic: true,
		CPU: 1, MemoryMB: 256, DiskMB: 512, StartedAt: started, EndAt: started.Add(time.Minute),
		NodeID: "n1", Network: json.RawMessage(`{"allowOut":["1.1.1.1"]}`)}
}

func testSandboxLifecycle(t *testing.T, s *Store) {
	ctx := context.Background()
	yes := true
	sb := testSandbox("sb1", t0, map[string]string{"k": "v"})
	sb.State = StateCreating
	sb.AllowInternetAccess = &yes
	if err := s.InsertSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSandbox(ctx, sb); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("duplicate insert = %v", err)
	}
	if err := s.SetEndAt(ctx, "sb1", t0); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("SetEndAt on creating = %v, want Conflict", err)
	}
	if err := s.MarkRunning(ctx, "sb1", t0.Add(time.Second), t0.Add(time.Hour), "0.6.13"); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateRunning || got.EnvdVersion != "0.6.13" || !got.EndAt.Equal(t0.Add(time.Hour)) ||
		got.Metadata["k"] != "v" || got.EnvVars["A"] != "1" || got.AllowInternetAccess == nil ||
		!*got.AllowInternetAccess || string(got.Network) != `{"allowOut":["1.1.1.1"]}` {
		t.Fatalf("record = %+v", got)
	}
	if err := s.MarkRunning(ctx, "sb1", t0, t0, ""); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("MarkRunning twice = %v", err)
	}
	if err := s.SetEndAt(ctx, "sb1", t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkKilled(ctx, "sb1", t0.Add(3*time.Hour), "killed by user"); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkKilled(ctx, "sb1", t0.Add(4*time.Hour), "again"); err != nil {
		t.Fatalf("second kill = %v", err)
	}
	got, _ = s.GetSandbox(ctx, "sb1")
	if got.State != StateKilled || got.KillReason != "killed by user" || !got.KilledAt.Equal(t0.Add(3*time.Hour)) {
		t.Fatalf("killed record = %+v", got)
	}
	for name, err := range map[string]error{
		"get":     func() error { _, err := s.GetSandbox(ctx, "nope"); return err }(),
		"kill":    s.MarkKilled(ctx, "nope", t0, ""),
		"endAt":   s.SetEndAt(ctx, "nope", t0),
		"running": s.MarkRunning(ctx, "nope", t0, t0, ""),
	} {
		if !errdefs.Is(err, errdefs.KindNotFound) {
			t.Errorf("%s on missing = %v, want NotFound", name, err)
		}
	}
	if n, err := s.DeleteKilledBefore(ctx, t0.Add(5*time.Hour)); err != nil || n != 1 {
		t.Fatalf("DeleteKilledBefore = %d, %v", n, err)
	}
	if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatalf("delete of gone record = %v", err)
	}
}

func testListSandboxes(t *testing.T, s *Store) {
	ctx := context.Background()
	// sb0..sb4 one second apart; sb2 and sb3 share a start time to exercise the id tie-break.
	starts := []time.Duration{0, time.Second, 2 * time.Second, 2 * time.Second, 4 * time.Second}
	for i, d := range starts {
		meta := map[string]string{"n": string(rune('0' + i)), "odd": "no"}
		if i%2 == 1 {
			meta["odd"] = "yes"
		}
		sb := testSandbox("sb"+string(rune('0'+i)), t0.Add(d), meta)
		if i == 4 {
			sb.State = StateKilled
			sb.TemplateID, sb.Alias = "tpl2", "other"
		}
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	// A key that needs JSON-path quoting must still filter exactly.
	weird := testSandbox("sbw", t0.Add(10*time.Second), map[string]string{`a."b c`: `d&e=f`})
	if err := s.InsertSandbox(ctx, weird); err != nil {
		t.Fatal(err)
	}
	ids := func(sbs []Sandbox) string {
		var out string
		for _, sb := range sbs {
			out += sb.ID + " "
		}
		return out
	}
	for _, tc := range []struct {
		name string
		q    SandboxQuery
		want string
	}{
		{"all asc", SandboxQuery{}, "sb0 sb1 sb2 sb3 sb4 sbw "},
		{"all desc", SandboxQuery{Desc: true}, "sbw sb4 sb3 sb2 sb1 sb0 "},
		{"running", SandboxQuery{States: []SandboxState{StateRunning}}, "sb0 sb1 sb2 sb3 sbw "},
		{"killed", SandboxQuery{States: []SandboxState{StateKilled}}, "sb4 "},
		{"meta one", SandboxQuery{Metadata: map[string]string{"odd": "yes"}}, "sb1 sb3 "},
		{"meta all pairs", SandboxQuery{Metadata: map[string]string{"odd": "yes", "n": "3"}}, "sb3 "},
		{"meta none", SandboxQuery{Metadata: map[string]string{"odd": "maybe"}}, ""},
		{"meta quoted key", SandboxQuery{Metadata: map[string]string{`a."b c`: `d&e=f`}}, "sbw "},
		{"template id", SandboxQuery{Template: "tpl2"}, "sb4 "},
		{"template alias", SandboxQuery{Template: "other"}, "sb4 "},
		// Inclusive: sb1 started exactly at t0+1s.
		{"started after", SandboxQuery{StartedAfter: t0.Add(time.Second)}, "sb1 sb2 sb3 sb4 sbw "},
		{"started after, just past", SandboxQuery{StartedAfter: t0.Add(time.Second + time.Millisecond)}, "sb2 sb3 sb4 sbw "},
		{"limit", SandboxQuery{Limit: 2}, "sb0 sb1 "},
		{"after asc tie", SandboxQuery{After: &Cursor{t0.Add(2 * time.Second), "sb2"}}, "sb3 sb4 sbw "},
		{"after desc tie", SandboxQuery{Desc: true, After: &Cursor{t0.Add(2 * time.Second), "sb3"}}, "sb2 sb1 sb0 "},
		{"node", SandboxQuery{NodeID: "other"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.ListSandboxes(ctx, tc.q)
			if err != nil {
				t.Fatal(err)
			}
			if ids(got) != tc.want {
				t.Fatalf("got %q, want %q", ids(got), tc.want)
			}
			n, err := s.CountSandboxes(ctx, tc.q)
			if err != nil {
				t.Fatal(err)
			}
			if tc.q.Limit == 0 && tc.q.After == nil && n != len(got) {
				t.Fatalf("count = %d, list = %d", n, len(got))
			}
		})
	}
}

func testSetSandboxNetwork(t *testing.T, s *Store) {
	ctx := context.Background()
	sb := testSandbox("sb1", t0, nil)
	if err := s.InsertSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	no := false
	if err := s.SetSandboxNetwork(ctx, "sb1", json.RawMessage(`{"denyOut":["0.0.0.0/0"]}`), &no); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Network) != `{"denyOut":["0.0.0.0/0"]}` || got.AllowInternetAccess == nil || *got.AllowInternetAccess {
		t.Fatalf("record = %s %v", got.Network, got.AllowInternetAccess)
	}
	// Unset clears allow_internet_access; an empty config is stored as {}.
	if err := s.SetSandboxNetwork(ctx, "sb1", nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.GetSandbox(ctx, "sb1"); string(got.Network) != `{}` || got.AllowInternetAccess != nil {
		t.Fatalf("after clearing: %s %v", got.Network, got.AllowInternetAccess)
	}
	if err := s.SetSandboxNetwork(ctx, "nope", nil, nil); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("unknown id = %v", err)
	}
	if err := s.MarkKilled(ctx, "sb1", t0, "test"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSandboxNetwork(ctx, "sb1", nil, nil); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("killed = %v, want Conflict", err)
	}
}
