package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

// testBuilds covers what lets any driver sharing the database serve a build: its tags, the one
// claim that runs it, builds never started, and its log.
func testBuilds(t *testing.T, s *Store) {
	ctx := context.Background()
	if err := s.PutTemplate(ctx, Template{ID: "tb", Aliases: []string{"tb"}, CPU: 1, MemoryMB: 256,
		Status: TemplateWaiting, CreatedAt: t0, UpdatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	put := func(id string, created time.Time, tags []string) Build {
		t.Helper()
		b := Build{ID: id, TemplateID: "tb", Status: TemplateWaiting, CPU: 1, MemoryMB: 256,
			CreatedAt: created, UpdatedAt: created, Driver: "d1", Tags: tags}
		if err := s.PutBuild(ctx, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	b1 := put("b1", t0, []string{"v1", "prod"})
	put("b2", t0.Add(-2*time.Hour), nil)
	put("b3", t0.Add(-time.Hour), nil)

	got, err := s.GetBuild(ctx, "tb", "b1")
	if err != nil || !slices.Equal(got.Tags, []string{"v1", "prod"}) || got.Started || got.Driver != "d1" {
		t.Fatalf("GetBuild = %+v, %v", got, err)
	}
	if got, _ := s.GetBuild(ctx, "tb", "b2"); got.Tags == nil || len(got.Tags) != 0 {
		t.Fatalf("no tags read back as %#v, want empty", got.Tags)
	}

	// One claim wins, from whichever driver; the winner is recorded as the build's driver.
	if err := s.ClaimBuild(ctx, "tb", "b1", "d2", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.ClaimBuild(ctx, "tb", "b1", "d1", t0); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("second claim = %v, want Conflict", err)
	}
	if err := s.ClaimBuild(ctx, "tb", "nope", "d1", t0); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("claim of a missing build = %v, want NotFound", err)
	}
	if err := s.ClaimBuild(ctx, "other", "b1", "d1", t0); !errdefs.Is(err, errdefs.KindNotFound) {
		t.Fatalf("claim through another template = %v, want NotFound", err)
	}
	if got, _ := s.GetBuild(ctx, "tb", "b1"); !got.Started || got.Driver != "d2" {
		t.Fatalf("claimed build = %+v", got)
	}
	// A later PutBuild (the runner recording progress) keeps the claim and the tags.
	b1.Status = TemplateBuilding
	if err := s.PutBuild(ctx, b1); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetBuild(ctx, "tb", "b1"); !got.Started || got.Driver != "d2" || len(got.Tags) != 2 {
		t.Fatalf("after PutBuild: %+v", got)
	}
	// A template with a started build is not deleted.
	if err := s.DeleteTemplate(ctx, "tb"); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("delete while b1 runs = %v, want Conflict", err)
	}
	// A refused start releases its claim; the next start claims again.
	if err := s.ClaimBuild(ctx, "tb", "b3", "d1", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseBuild(ctx, "tb", "b3"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetBuild(ctx, "tb", "b3"); got.Started || got.Status != TemplateWaiting {
		t.Fatalf("released build = %+v", got)
	}

	// A driver's restart fails its started builds, not those still to be started (their start
	// may come through another driver), and leaves their template waiting.
	put("b4", t0, nil)
	if err := s.ClaimBuild(ctx, "tb", "b4", "d1", t0); err != nil {
		t.Fatal(err)
	}
	if n, err := s.FailUnfinishedBuilds(ctx, "restart", t0, BuildsOf{Driver: "d1"}); err != nil || n != 1 {
		t.Fatalf("FailUnfinishedBuilds(d1) = %d, %v; want 1 (b4)", n, err)
	}
	if got, _ := s.GetBuild(ctx, "tb", "b4"); got.Status != TemplateError {
		t.Fatalf("b4 after d1's restart = %+v", got)
	}
	for _, id := range []string{"b2", "b3"} {
		if got, _ := s.GetBuild(ctx, "tb", id); got.Status != TemplateWaiting {
			t.Fatalf("%s (never started) after d1's restart = %+v", id, got)
		}
	}
	if tpl, _ := s.GetTemplate(ctx, "tb"); tpl.Status != TemplateWaiting {
		t.Fatalf("template with builds still to run after a restart: %s", tpl.Status)
	}
	if err := s.ClaimBuild(ctx, "tb", "b4", "d2", t0); !errdefs.Is(err, errdefs.KindConflict) || !strings.Contains(err.Error(), "failed") {
		t.Fatalf("claim of a failed build = %v, want a Conflict saying it failed", err)
	}

	// Only builds never started and created before the cut fail: b2 (2 h old) and b3 (1 h old,
	// released) with a cut just over an hour back takes b2 alone; b1 is running.
	n, err := s.FailUnstartedBuilds(ctx, t0.Add(-time.Hour-time.Millisecond), t0)
	if err != nil || n != 1 {
		t.Fatalf("FailUnstartedBuilds = %d, %v; want 1", n, err)
	}
	if got, _ := s.GetBuild(ctx, "tb", "b2"); got.Status != TemplateError || got.ReasonMessage != "the build was never started" {
		t.Fatalf("b2 = %+v", got)
	}
	if got, _ := s.GetBuild(ctx, "tb", "b3"); got.Status != TemplateWaiting {
		t.Fatalf("b3, created 1 ms after the cut, = %+v", got)
	}
	if err := s.ClaimBuild(ctx, "tb", "b2", "d1", t0); !errdefs.Is(err, errdefs.KindConflict) {
		t.Fatalf("claim of a failed build = %v, want Conflict", err)
	}

	// The log: in order, paged, a retried write repeats nothing.
	var entries []BuildLogEntry
	for i := range 250 {
		entries = append(entries, BuildLogEntry{Time: t0.Add(time.Duration(i) * time.Millisecond), Level: "info",
			Step: fmt.Sprint(i % 3), Message: fmt.Sprintf("line %d", i)})
	}
	if es, err := s.BuildLog(ctx, "b1", 0, 100); err != nil || len(es) != 0 {
		t.Fatalf("empty log = %v, %v", es, err)
	}
	if err := s.AppendBuildLog(ctx, "b1", 0, entries[:120]); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendBuildLog(ctx, "b1", 100, entries[100:]); err != nil {
		t.Fatal(err)
	}
	// Output a program wrote is stored whatever its bytes: NUL and invalid UTF-8 (PostgreSQL's TEXT
	// refuses both) are replaced.
	if err := s.AppendBuildLog(ctx, "b1", 250, []BuildLogEntry{{Time: t0, Level: "info", Step: "2", Message: "a\x00b\xffc"}}); err != nil {
		t.Fatal(err)
	}
	if es, err := s.BuildLog(ctx, "b1", 250, 10); err != nil || len(es) != 1 || es[0].Message != "a\uFFFDb\uFFFDc" {
		t.Fatalf("the line with a NUL = %+v, %v", es, err)
	}
	es, err := s.BuildLog(ctx, "b1", 99, 100)
	if err != nil || len(es) != 100 || es[0].Message != "line 99" || es[99].Message != "line 198" ||
		es[1].Step != "1" || !es[0].Time.Equal(entries[99].Time) {
		t.Fatalf("BuildLog(99, 100) = %d entries, %v; first %+v", len(es), err, es)
	}
	if es, _ := s.BuildLog(ctx, "b1", 240, 100); len(es) != 11 || es[9].Message != "line 249" {
		t.Fatalf("the log's end = %+v", es)
	}
	if es, _ := s.BuildLog(ctx, "b1", 251, 100); len(es) != 0 {
		t.Fatalf("past the end = %+v", es)
	}
	// Once no build runs, the template goes, and its builds' logs with it.
	b1.Status = TemplateReady
	if err := s.PutBuild(ctx, b1); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "tb"); err != nil {
		t.Fatal(err)
	}
	if es, _ := s.BuildLog(ctx, "b1", 0, 100); len(es) != 0 {
		t.Fatalf("log after the template was deleted: %d entries", len(es))
	}
}
