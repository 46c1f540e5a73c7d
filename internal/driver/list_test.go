package driver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/store"
)

func TestListPaging(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	var ids []string // creation order = start order
	for i := range 5 {
		sb := e.create(t, CreateRequest{Metadata: map[string]string{"i": string(rune('0' + i)), "g": "x"}})
		ids = append(ids, sb.ID)
		e.clock.Advance(time.Second)
	}
	killed := e.create(t, CreateRequest{})
	if err := e.d.Kill(ctx, killed.ID); err != nil {
		t.Fatal(err)
	}

	page := func(o ListOptions) ListResult {
		t.Helper()
		r, err := e.d.List(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Desc (default): newest first, two per page; a sandbox created between pages must neither
	// duplicate nor hide the ones that existed.
	r1 := page(ListOptions{Limit: 2})
	if got := idsOf(r1.Sandboxes); got != ids[4]+" "+ids[3] || r1.NextToken == "" || r1.TotalRunning != 5 {
		t.Fatalf("page 1 = %q next %q total %d", got, r1.NextToken, r1.TotalRunning)
	}
	fresh := e.create(t, CreateRequest{})
	r2 := page(ListOptions{Limit: 2, NextToken: r1.NextToken})
	if got := idsOf(r2.Sandboxes); got != ids[2]+" "+ids[1] || r2.TotalRunning != 6 {
		t.Fatalf("page 2 = %q", got)
	}
	r3 := page(ListOptions{Limit: 2, NextToken: r2.NextToken})
	if got := idsOf(r3.Sandboxes); got != ids[0] || r3.NextToken != "" {
		t.Fatalf("page 3 = %q next %q", got, r3.NextToken)
	}
	// Asc: oldest first, and the fresh one shows up at the end.
	a1 := page(ListOptions{Limit: 3, Ascending: true})
	a2 := page(ListOptions{Limit: 3, Ascending: true, NextToken: a1.NextToken})
	if got := idsOf(a1.Sandboxes) + " | " + idsOf(a2.Sandboxes); got != strings.Join(ids[:3], " ")+" | "+ids[3]+" "+ids[4]+" "+fresh.ID {
		t.Fatalf("asc pages = %q", got)
	}
	// Exactly one full page: no next token.
	if r := page(ListOptions{Limit: 6}); len(r.Sandboxes) != 6 || r.NextToken != "" {
		t.Fatalf("exact page: %d, next %q", len(r.Sandboxes), r.NextToken)
	}
	if r := page(ListOptions{}); len(r.Sandboxes) != 6 {
		t.Fatalf("default limit page: %d", len(r.Sandboxes))
	}
}

func TestListFilters(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil)
	a := e.create(t, CreateRequest{Metadata: map[string]string{"a b": "c&d", "team": "x"}})
	e.clock.Advance(time.Second)
	b := e.create(t, CreateRequest{Template: baseID, Metadata: map[string]string{"team": "x"}})
	e.clock.Advance(time.Second)
	c := e.create(t, CreateRequest{Template: "base:v2", Metadata: map[string]string{"team": "y"}})

	for _, tc := range []struct {
		name string
		o    ListOptions
		want string
	}{
		{"metadata one pair", ListOptions{Metadata: map[string]string{"team": "x"}}, b.ID + " " + a.ID},
		{"metadata all pairs", ListOptions{Metadata: map[string]string{"team": "x", "a b": "c&d"}}, a.ID},
		{"metadata no match", ListOptions{Metadata: map[string]string{"team": "z"}}, ""},
		{"state running", ListOptions{States: []store.SandboxState{store.StateRunning}}, c.ID + " " + b.ID + " " + a.ID},
		{"state paused", ListOptions{States: []store.SandboxState{store.StatePaused}}, ""},
		{"template alias", ListOptions{Template: "base"}, c.ID + " " + b.ID + " " + a.ID},
		{"template id", ListOptions{Template: baseID}, c.ID + " " + b.ID + " " + a.ID},
		{"template unknown", ListOptions{Template: "other"}, ""},
		{"started after", ListOptions{StartedAfter: t0.Add(500 * time.Millisecond), Ascending: true}, b.ID + " " + c.ID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := e.d.List(ctx, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if got := idsOf(r.Sandboxes); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}

	for _, tc := range []struct {
		name string
		o    ListOptions
		msg  string
	}{
		{"limit too big", ListOptions{Limit: 101}, "limit"},
		{"limit negative", ListOptions{Limit: -1}, "limit"},
		{"bad state", ListOptions{States: []store.SandboxState{"killed"}}, "invalid state"},
		{"bad token", ListOptions{NextToken: "!!!"}, "nextToken"},
		{"token wrong version", ListOptions{NextToken: encodeCursor(store.Cursor{ID: "abc"})[1:]}, "nextToken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.d.List(ctx, tc.o)
			wantKind(t, err, errdefs.KindInvalidArgument)
			if !strings.Contains(errdefs.PublicMessage(err), tc.msg) {
				t.Fatalf("message %q", errdefs.PublicMessage(err))
			}
		})
	}

	all, err := e.d.ListRunning(ctx, map[string]string{"team": "x"})
	if err != nil || idsOf(all) != b.ID+" "+a.ID {
		t.Fatalf("ListRunning = %q, %v", idsOf(all), err)
	}
}

func TestCursorRoundTrip(t *testing.T) {
	c := store.Cursor{StartedAt: t0.Add(1234 * time.Millisecond), ID: "abc123"}
	got, err := decodeCursor(encodeCursor(c))
	if err != nil || !got.StartedAt.Equal(c.StartedAt) || got.ID != c.ID {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
}

func idsOf(sbs []Sandbox) string {
	var s []string
	for _, sb := range sbs {
		s = append(s, sb.ID)
	}
	return strings.Join(s, " ")
}
