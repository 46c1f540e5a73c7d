package store

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// suite is the store's test suite; TestEngines runs every case on SQLite and on PostgreSQL.
var suite = map[string]func(t *testing.T, s *Store){
	"APIKeys":           testAPIKeys,
	"Templates":         testTemplates,
	"SandboxLifecycle":  testSandboxLifecycle,
	"ListSandboxes":     testListSandboxes,
	"SetSandboxNetwork": testSetSandboxNetwork,
	"Nodes":             testNodes,
	"Records":           testRecords,
	"SharedKey":         testSharedKey,
	"Drivers":           testDrivers,
	"EnsureAPIKey":      testEnsureAPIKey,
	"SandboxLog":        testSandboxLog,
	"Builds":            testBuilds,
}

func testSandboxLog(t *testing.T, s *Store) {
	ctx := context.Background()
	if es, found, err := s.QuerySandboxLog(ctx, "sb1", LogQuery{}); err != nil || found || len(es) != 0 {
		t.Fatalf("a log never written: %v %v %v", es, found, err)
	}
	base := t0.Add(123456789 * time.Nanosecond)
	for i, e := range []LogEntry{
		{Time: base, Level: 1, Logger: "lifecycleSvc", Message: "sandbox created", Fields: map[string]string{"template": "base"}},
		{Time: base.Add(time.Microsecond), Level: 2, Logger: "lifecycleSvc", Message: "paused 100%"},
		{Time: base.Add(2 * time.Second), Level: 3, Logger: "lifecycleSvc", Message: "sandbox ended: oom"},
	} {
		if err := s.AppendSandboxLog(ctx, "sb1", e); err != nil {
			t.Fatal(i, err)
		}
	}
	msgs := func(q LogQuery) []string {
		t.Helper()
		es, found, err := s.QuerySandboxLog(ctx, "sb1", q)
		if err != nil || !found {
			t.Fatalf("query %+v: %v %v", q, found, err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Message)
		}
		return out
	}
	if got := msgs(LogQuery{}); !slices.Equal(got, []string{"sandbox created", "paused 100%", "sandbox ended: oom"}) {
		t.Fatalf("all = %q", got)
	}
	es, _, _ := s.QuerySandboxLog(ctx, "sb1", LogQuery{Limit: 1})
	if !es[0].Time.Equal(base) || es[0].Fields["template"] != "base" || es[0].Level != 1 {
		t.Fatalf("first entry = %+v", es[0])
	}
	if got := msgs(LogQuery{Backward: true, Limit: 2}); !slices.Equal(got, []string{"sandbox ended: oom", "paused 100%"}) {
		t.Fatalf("backward = %q", got)
	}
	cursor := base.Add(time.Second).UnixMilli()
	if got := msgs(LogQuery{Cursor: cursor}); !slices.Equal(got, []string{"sandbox ended: oom"}) {
		t.Fatalf("from the cursor = %q", got)
	}
	if got := msgs(LogQuery{Cursor: cursor, Backward: true}); !slices.Equal(got, []string{"paused 100%", "sandbox created"}) {
		t.Fatalf("back from the cursor = %q", got)
	}
	if got := msgs(LogQuery{MinLevel: 2}); len(got) != 2 {
		t.Fatalf("level >= 2 = %q", got)
	}
	if got := msgs(LogQuery{Search: "100%"}); !slices.Equal(got, []string{"paused 100%"}) {
		t.Fatalf("search (a LIKE wildcard, taken literally) = %q", got)
	}
	if got := msgs(LogQuery{Search: "Sandbox"}); len(got) != 0 {
		t.Fatalf("search is case-sensitive: %q", got)
	}
	// Retention: the log of a sandbox killed before the cutoff goes, with its record's fate.
	sb := testSandbox("sb1", t0, nil)
	if err := s.InsertSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DeleteSandboxLogsBefore(ctx, t0.Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("a live sandbox's log was pruned: %d, %v", n, err)
	}
	if err := s.MarkKilled(ctx, "sb1", t0.Add(time.Minute), "test"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DeleteSandboxLogsBefore(ctx, t0.Add(time.Hour)); err != nil || n != 3 {
		t.Fatalf("DeleteSandboxLogsBefore = %d, %v", n, err)
	}
}

func testDrivers(t *testing.T, s *Store) {
	ctx := context.Background()
	for i, d := range []Driver{{"d1", "10.0.0.1:7946", t0}, {"d2", "10.0.0.2:7946", t0.Add(time.Minute)}, {"old", "10.0.0.9:7946", t0.Add(-time.Hour)}} {
		if err := s.SeenDriver(ctx, d.Name, d.Gossip, d.SeenAt); err != nil {
			t.Fatal(i, err)
		}
	}
	if err := s.SeenDriver(ctx, "d1", "10.0.0.3:7946", t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Drivers(ctx, t0.Add(30*time.Second), t0.Add(-10*time.Minute))
	if err != nil || len(got) != 2 || got[0].Name != "d1" || got[0].Gossip != "10.0.0.3:7946" || got[1].Name != "d2" {
		t.Fatalf("Drivers = %+v, %v", got, err)
	}
	all, _ := s.Drivers(ctx, time.Time{}, time.Time{})
	if len(all) != 2 {
		t.Fatalf("the long-gone driver was kept: %+v", all)
	}
}

func openPostgres(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestEngines(t *testing.T) {
	names := make([]string, 0, len(suite))
	for n := range suite {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			for _, n := range names {
				t.Run(n, func(t *testing.T) {
					var s *Store
					if engine == "sqlite" {
						s, _ = openTest(t)
					} else {
						s = openPostgres(t, pgtest.DSN(t))
					}
					if s.Engine() != engine {
						t.Fatalf("Engine() = %s", s.Engine())
					}
					suite[n](t, s)
				})
			}
		})
	}
}

// The records the other cases leave out, for the queries the engines spell differently (JSON,
// bytes, unique names, transactions).
func testRecords(t *testing.T, s *Store) {
	ctx := context.Background()
	// Volumes: a mounted one cannot go (the JSON array lookup), a free one can.
	for _, v := range []Volume{{ID: "v1", Name: "data", Token: "t", CreatedAt: t0}, {ID: "v2", Name: "free", Token: "t", CreatedAt: t0}} {
		if err := s.InsertVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.InsertVolume(ctx, Volume{ID: "v3", Name: "data", CreatedAt: t0}); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("duplicate volume name = %v, want Conflict", err)
	}
	sb := testSandbox("sb1", t0, nil)
	sb.VolumeMounts = []VolumeMount{{ID: "v1", Name: "data", Path: "/data"}}
	if err := s.InsertSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "v1"); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("delete mounted volume = %v, want Conflict", err)
	}
	if err := s.DeleteVolume(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "v2"); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("delete gone volume = %v", err)
	}
	if err := s.MarkKilled(ctx, "sb1", t0, "test"); err != nil {
		t.Fatal(err)
	}
	// A snapshot mounting it still holds it.
	sn := Snapshot{ID: "sn1", Name: "named", SandboxID: "sb1", TemplateID: "base", CPU: 1, MemoryMB: 512,
		EnvVars: map[string]string{"A": "b"}, Bytes: 1 << 40, CreatedAt: t0, VolumeMounts: sb.VolumeMounts}
	if err := s.InsertSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSnapshot(ctx, Snapshot{ID: "sn2", Name: "named", SandboxID: "sb1", CreatedAt: t0}); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("duplicate snapshot name = %v", err)
	}
	if err := s.DeleteVolume(ctx, "v1"); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("delete volume a snapshot mounts = %v", err)
	}
	got, err := s.GetSnapshot(ctx, "named")
	if err != nil || got.Bytes != 1<<40 || got.EnvVars["A"] != "b" || len(got.VolumeMounts) != 1 {
		t.Fatalf("GetSnapshot = %+v, %v", got, err)
	}
	if err := s.DeleteSnapshot(ctx, "sn1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatalf("delete volume nobody mounts: %v", err)
	}

	// Secrets keep their sealed bytes as they were.
	sealed := []byte{0, 1, 2, 0xff, 0}
	if err := s.InsertSecret(ctx, Secret{ID: "s1", Name: "tok", Metadata: map[string]string{"k": "v"}, Version: 1, Sealed: sealed, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSecret(ctx, Secret{ID: "s2", Name: "tok", Version: 1, Sealed: sealed, CreatedAt: t0, UpdatedAt: t0}); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("duplicate secret name = %v", err)
	}
	sec, err := s.GetSecret(ctx, "tok")
	if err != nil || string(sec.Sealed) != string(sealed) || sec.Metadata["k"] != "v" {
		t.Fatalf("GetSecret = %+v, %v", sec, err)
	}

	// A join token's last use goes to one of two racing nodes.
	if err := s.InsertJoinToken(ctx, JoinToken{ID: "j1", Hash: "h", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), UsesLeft: 1}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := s.UseJoinToken(ctx, "j1", "h", t0)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d nodes got the token's one use", wins)
	}

	// Builds and tags (a transaction each).
	if err := s.PutTemplate(ctx, Template{ID: "tpl", Status: TemplateReady, CPU: 1, MemoryMB: 512, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutBuild(ctx, Build{ID: "b1", TemplateID: "tpl", Status: TemplateBuilding, CPU: 1, MemoryMB: 512, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTags(ctx, "tpl", "b1", []string{"v1", "latest"}, t0); err != nil {
		t.Fatal(err)
	}
	if id, err := s.TagBuild(ctx, "tpl", "v1"); err != nil || id != "b1" {
		t.Fatalf("TagBuild = %q, %v", id, err)
	}
	if err := s.RemoveTags(ctx, "tpl", []string{"v1", "nope"}); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("remove a missing tag = %v", err)
	}
	if tags, _ := s.ListTags(ctx, "tpl"); len(tags) != 2 {
		t.Fatalf("a failed RemoveTags removed some: %+v", tags)
	}
	// Another driver's build under way is not this driver's to fail at its restart; once that
	// driver is gone, it is.
	if err := s.PutBuild(ctx, Build{ID: "b2", TemplateID: "tpl", Status: TemplateBuilding, CPU: 1, MemoryMB: 512, CreatedAt: t0, UpdatedAt: t0, Driver: "d2"}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.FailUnfinishedBuilds(ctx, "restart", t0, BuildsOf{Driver: "d1"}); err != nil || n != 1 {
		t.Fatalf("FailUnfinishedBuilds(d1) = %d, %v", n, err)
	}
	if b, _ := s.GetBuild(ctx, "tpl", "b2"); b.Status != TemplateBuilding || b.Driver != "d2" {
		t.Fatalf("d2's build after d1's restart: %+v", b)
	}
	if n, err := s.FailUnfinishedBuilds(ctx, "restart", t0, BuildsOf{NotAmong: []string{"d1", "d2"}}); err != nil || n != 0 {
		t.Fatalf("FailUnfinishedBuilds(not d1, d2) = %d, %v", n, err)
	}
	if n, err := s.FailUnfinishedBuilds(ctx, "its driver is gone", t0, BuildsOf{NotAmong: []string{"d1"}}); err != nil || n != 1 {
		t.Fatalf("FailUnfinishedBuilds(not d1) = %d, %v", n, err)
	}
}

func testSharedKey(t *testing.T, s *Store) {
	ctx := context.Background()
	calls := 0
	mk := func(v string) func() ([]byte, error) {
		return func() ([]byte, error) { calls++; return []byte(v), nil }
	}
	a, err := s.SharedKey(ctx, "ca", mk("first"))
	if err != nil || string(a) != "first" {
		t.Fatalf("SharedKey = %q, %v", a, err)
	}
	b, err := s.SharedKey(ctx, "ca", mk("second"))
	if err != nil || string(b) != "first" || calls != 1 {
		t.Fatalf("second SharedKey = %q, %v (%d makes)", b, err, calls)
	}
	if _, err := s.SharedKey(ctx, "other", func() ([]byte, error) { return nil, errors.New("no entropy") }); err == nil {
		t.Fatal("a failed make was not reported")
	}
}

// Drivers starting together on one empty database: migrations run once, both get the same keys.
func TestPostgresConcurrentStart(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	stores := make([]*Store, 4)
	errs := make([]error, 4)
	keys := make([][]byte, 4)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = OpenPostgres(ctx, dsn)
			if errs[i] == nil {
				keys[i], errs[i] = stores[i].SharedKey(ctx, "gossip", func() ([]byte, error) { return []byte{byte(i)}, nil })
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
		defer stores[i].Close()
		if string(keys[i]) != string(keys[0]) {
			t.Fatalf("store %d got key %v, store 0 %v", i, keys[i], keys[0])
		}
	}
	if v, err := stores[0].SchemaVersion(ctx); err != nil || v != len(migrations) {
		t.Fatalf("version = %d, %v", v, err)
	}
	// Reopening applies nothing; a newer schema is refused rather than misread.
	if _, err := stores[0].db.ExecContext(ctx, "UPDATE vmon_schema SET version = 999"); err != nil {
		t.Fatal(err)
	}
	if s, err := OpenPostgres(ctx, dsn); err == nil {
		s.Close()
		t.Fatal("OpenPostgres accepted a newer schema")
	}
	if _, err := OpenPostgres(ctx, "postgres://%zz"); err == nil {
		t.Fatal("a malformed DSN was accepted")
	}
}

// Every change to a sandbox record, by any store on the database, reaches every listener, and a
// listener that (re)connects resyncs first.
func TestPostgresListen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dsn := pgtest.DSN(t)
	a, b := openPostgres(t, dsn), openPostgres(t, dsn)
	resynced := make(chan struct{}, 1)
	changed := make(chan string, 16)
	go b.Listen(ctx, slog.Default(), func(context.Context) error { resynced <- struct{}{}; return nil }, func(_ context.Context, id string) { changed <- id })
	select {
	case <-resynced:
	case <-time.After(10 * time.Second):
		t.Fatal("no resync at connect")
	}
	if err := a.InsertSandbox(ctx, testSandbox("sbx", t0, nil)); err != nil {
		t.Fatal(err)
	}
	if err := a.SetEndAt(ctx, "sbx", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteSandbox(ctx, "sbx"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		select {
		case id := <-changed:
			if id != "sbx" {
				t.Fatalf("notification %d = %q", i, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("notification %d never came", i)
		}
	}
	// The listener's connection dies: it connects again and resyncs.
	if _, err := a.db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE query LIKE 'LISTEN%' AND pid != pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-resynced:
	case <-time.After(15 * time.Second):
		t.Fatal("no resync after the connection was cut")
	}
}

// One leader among the stores sharing a database; when its connection ends, another takes over.
func TestPostgresLeader(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dsn := pgtest.DSN(t)
	a, b := openPostgres(t, dsn), openPostgres(t, dsn)
	actx, acancel := context.WithCancel(ctx)
	la := a.Leader(actx, "expiry", slog.Default())
	waitFor(t, la.Leading)
	lb := b.Leader(ctx, "expiry", slog.Default())
	time.Sleep(3 * leaderCheck)
	if lb.Leading() {
		t.Fatal("two leaders")
	}
	changed := lb.Changed()
	acancel() // a's process goes away
	waitFor(t, lb.Leading)
	select {
	case <-changed:
	default:
		t.Fatal("Changed was not closed when b started leading")
	}
	waitFor(t, func() bool { return !la.Leading() })
	// Another lock name is another leadership.
	if lc := a.Leader(ctx, "other", slog.Default()); !waitFor(t, lc.Leading) {
		t.Fatal("unreachable")
	}
	// SQLite: alone, always leading.
	s, _ := openTest(t)
	if !s.Leader(ctx, "expiry", slog.Default()).Leading() {
		t.Fatal("a SQLite store does not lead")
	}
}

func waitFor(t *testing.T, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 15 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
