package store

import (
	"context"
	"fmt"
	"slices"
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
	if n, err := s.BuildsUnderway(ctx, "tb"); err != nil || n != 1 {
		t.Fatalf("BuildsUnderway = %d, %v; want 1", n, err)
	}
	// A refused start releases its claim; the next start claims again.
	if err := s.ClaimBuild(ctx, "tb", "b3", "d1", t0); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.BuildsUnderway(ctx, "tb"); n != 2 {
		t.Fatalf("BuildsUnderway with a claimed waiting build = %d, want 2", n)
	}
	if err := s.ReleaseBuild(ctx, "tb", "b3"); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.BuildsUnderway(ctx, "tb"); n != 1 {
		t.Fatalf("BuildsUnderway after a release = %d, want 1", n)
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
	es, err := s.BuildLog(ctx, "b1", 99, 100)
	if err != nil || len(es) != 100 || es[0].Message != "line 99" || es[99].Message != "line 198" ||
		es[1].Step != "1" || !es[0].Time.Equal(entries[99].Time) {
		t.Fatalf("BuildLog(99, 100) = %d entries, %v; first %+v", len(es), err, es)
	}
	if es, _ := s.BuildLog(ctx, "b1", 240, 100); len(es) != 10 || es[9].Message != "line 249" {
		t.Fatalf("the log's end = %+v", es)
	}
	if es, _ := s.BuildLog(ctx, "b1", 250, 100); len(es) != 0 {
		t.Fatalf("past the end = %+v", es)
	}
	// A template's deletion takes its builds' logs along.
	if err := s.DeleteTemplate(ctx, "tb"); err != nil {
		t.Fatal(err)
	}
	if es, _ := s.BuildLog(ctx, "b1", 0, 100); len(es) != 0 {
		t.Fatalf("log after the template was deleted: %d entries", len(es))
	}
}
