package sandboxlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// clock is a settable time source.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func open(t *testing.T, o Options) *Store {
	t.Helper()
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func msgs(es []Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Message
	}
	return out
}

func TestAppendQueryRoundTrip(t *testing.T) {
	s := open(t, Options{})
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s.Append("sb1", Entry{Time: t0, Level: LevelInfo, Logger: "lifecycleSvc", Message: "created",
		Fields: map[string]string{"template": "base", "cpu": "2"}})
	s.Append("sb1", Entry{Time: t0, Level: LevelWarn, Logger: "egressSvc", Message: "refused"})
	got, err := s.Query("sb1", Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("got %d entries, want 2", len(got))
	}
	if got[0].Message != "created" || got[0].Logger != "lifecycleSvc" || got[0].Fields["template"] != "base" ||
		got[0].Level != LevelInfo || !got[0].Time.Equal(t0) {
		t.Errorf("first entry %+v", got[0])
	}
	// The same millisecond twice: the second is stamped one later, so cursors can tell them apart.
	if got[1].Time.Sub(got[0].Time) != time.Millisecond || got[1].Level != LevelWarn {
		t.Errorf("second entry %+v", got[1])
	}
	if _, err := s.Query("nobody", Query{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown sandbox: err %v, want ErrNotFound", err)
	}
	if _, err := s.Query("../etc", Query{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("path id: err %v, want ErrNotFound", err)
	}
}

func TestCapDropsOldestAndSaysSo(t *testing.T) {
	// One by one (the driver's entries) and in bursts (envd's, AppendAll): a burst that crosses
	// the rotation point is split there.
	for _, burst := range []int{1, 7} {
		t.Run(fmt.Sprint("burst-", burst), func(t *testing.T) { testCap(t, burst) })
	}
}

func testCap(t *testing.T, burst int) {
	const maxBytes = 4096
	s := open(t, Options{MaxBytes: maxBytes})
	t0 := time.UnixMilli(1_000_000)
	const n = 500
	var es []Entry
	for i := range n {
		es = append(es, Entry{Time: t0.Add(time.Duration(i) * time.Millisecond), Level: LevelInfo, Logger: "testSvc",
			Message: fmt.Sprintf("entry %03d", i)})
		if len(es) == burst || i == n-1 {
			if burst == 1 {
				s.Append("sb", es[0])
			} else {
				s.AppendAll("sb", es)
			}
			es = nil
		}
	}
	var size int64
	for _, f := range []string{currentFile, oldFile} {
		fi, err := os.Stat(filepath.Join(s.opts.Dir, "sb", f))
		if err != nil {
			t.Fatal(err)
		}
		size += fi.Size()
	}
	if size > maxBytes+200 {
		t.Errorf("log takes %d bytes, cap %d", size, maxBytes)
	}
	got, err := s.Query("sb", Query{})
	if err != nil {
		t.Fatal(err)
	}
	last := got[len(got)-1]
	if last.Message != fmt.Sprintf("entry %03d", n-1) {
		t.Errorf("newest entry %q, want entry %03d", last.Message, n-1)
	}
	// Entries kept are the newest ones, in order, with drop notices between them.
	dropped, prev := 0, -1
	for _, e := range got {
		if e.Logger == selfLogger {
			if e.Level != LevelWarn || !strings.Contains(e.Message, "older entries dropped") {
				t.Errorf("drop notice %+v", e)
			}
			var k int
			fmt.Sscanf(e.Fields["dropped"], "%d", &k)
			dropped += k
			continue
		}
		var i int
		fmt.Sscanf(e.Message, "entry %d", &i)
		if prev >= 0 && i != prev+1 {
			t.Errorf("entry %d follows %d", i, prev)
		}
		prev = i
	}
	if dropped == 0 {
		t.Fatal("no drop notice kept")
	}
	// Everything is accounted for: what was kept plus what notices said went, minus the notices
	// that themselves went with their segment. At least the oldest are gone.
	if first := got[0]; first.Message == "entry 000" {
		t.Errorf("oldest entry kept past the cap")
	}
}

func TestPagingEveryEntryOnce(t *testing.T) {
	s := open(t, Options{})
	t0 := time.UnixMilli(5_000_000)
	const n = 237
	for i := range n {
		// Bursts in one millisecond, as a busy sandbox writes them.
		s.Append("sb", Entry{Time: t0.Add(time.Duration(i/10) * time.Millisecond), Level: LevelInfo, Logger: "testSvc",
			Message: fmt.Sprint(i)})
	}
	for _, limit := range []int{1, 7, 100, 1000} {
		// Forward from the start, the next cursor one past the last stamp seen.
		var seen []string
		var cursor int64
		for pages := 0; ; pages++ {
			page, err := s.Query("sb", Query{Cursor: cursor, Limit: limit})
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			if pages > n {
				t.Fatal("paging does not end")
			}
			seen = append(seen, msgs(page)...)
			cursor = page[len(page)-1].Time.UnixMilli() + 1
		}
		checkOnce(t, fmt.Sprintf("forward limit %d", limit), seen, n, false)

		seen = nil
		cursor = 0
		for pages := 0; ; pages++ {
			page, err := s.Query("sb", Query{Cursor: cursor, Limit: limit, Backward: true})
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			if pages > n {
				t.Fatal("paging does not end")
			}
			seen = append(seen, msgs(page)...)
			cursor = page[len(page)-1].Time.UnixMilli() - 1
			if cursor <= 0 {
				break
			}
		}
		checkOnce(t, fmt.Sprintf("backward limit %d", limit), seen, n, true)
	}
}

func checkOnce(t *testing.T, name string, seen []string, n int, backward bool) {
	t.Helper()
	if len(seen) != n {
		t.Errorf("%s: %d entries, want %d", name, len(seen), n)
		return
	}
	for i, m := range seen {
		want := i
		if backward {
			want = n - 1 - i
		}
		if m != fmt.Sprint(want) {
			t.Errorf("%s: entry %d is %q, want %d", name, i, m, want)
			return
		}
	}
}

func TestLevelAndSearchFilters(t *testing.T) {
	s := open(t, Options{})
	t0 := time.UnixMilli(9_000_000)
	levels := []Level{LevelDebug, LevelInfo, LevelWarn, LevelError}
	for i := range 40 {
		s.Append("sb", Entry{Time: t0, Level: levels[i%4], Logger: "testSvc",
			Message: fmt.Sprintf("%s message %d \"quoted\" <tag>", levels[i%4], i)})
	}
	for _, min := range levels {
		got, err := s.Query("sb", Query{MinLevel: min})
		if err != nil {
			t.Fatal(err)
		}
		want := 10 * (4 - int(min))
		if len(got) != want {
			t.Errorf("level %s: %d entries, want %d", min, len(got), want)
		}
		for _, e := range got {
			if e.Level < min {
				t.Errorf("level %s: got a %s entry", min, e.Level)
			}
		}
	}
	for search, want := range map[string]int{
		"message 1":     11, // 1, 10..19
		"error message": 10,
		`"quoted" <tag`: 40, // needs the decoded message: JSON escapes these
		"Message":       0,  // case-sensitive
		"nowhere":       0,
	} {
		got, err := s.Query("sb", Query{Search: search})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != want {
			t.Errorf("search %q: %d entries, want %d", search, len(got), want)
		}
	}
	got, _ := s.Query("sb", Query{Search: "message 1", MinLevel: LevelWarn, Limit: 3})
	if strings.Join(msgs(got), "|") != `warn message 10 "quoted" <tag>|error message 11 "quoted" <tag>|warn message 14 "quoted" <tag>` {
		t.Errorf("combined filters: %q", msgs(got))
	}
}

func TestKeptAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Options{Dir: dir, MaxBytes: 2048})
	t0 := time.UnixMilli(1_000)
	for i := range 10 {
		s.Append("sb", Entry{Time: t0, Level: LevelInfo, Message: fmt.Sprint(i)})
	}
	s2 := open(t, Options{Dir: dir, MaxBytes: 2048})
	s2.Append("sb", Entry{Time: t0, Level: LevelInfo, Message: "after restart"})
	got, err := s2.Query("sb", Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 11 || got[10].Message != "after restart" || !got[10].Time.After(got[9].Time) {
		t.Fatalf("after restart: %q", msgs(got))
	}
	// The reopened log still knows how much it holds: it rotates and counts the drop.
	for i := range 100 {
		s2.Append("sb", Entry{Level: LevelInfo, Message: fmt.Sprint("more ", i)})
	}
	got, _ = s2.Query("sb", Query{Search: "older entries dropped"})
	if len(got) == 0 {
		t.Error("no drop after restart")
	}
}

func TestRetention(t *testing.T) {
	c := &clock{t: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)}
	live := map[string]bool{"running": true, "paused": true}
	s := open(t, Options{Retention: 24 * time.Hour, Now: c.now, Live: func(id string) bool { return live[id] }})
	for _, id := range []string{"running", "paused", "ended", "orphan"} {
		s.Append(id, Entry{Level: LevelInfo, Logger: "lifecycleSvc", Message: "created"})
	}
	s.End("ended", Entry{Level: LevelInfo, Logger: "lifecycleSvc", Message: "killed"})
	// After its end, nothing more is added to an ended sandbox's log.
	s.Append("ended", Entry{Level: LevelWarn, Message: "late"})
	if got, _ := s.Query("ended", Query{}); len(got) != 2 || got[1].Message != "killed" {
		t.Errorf("ended log: %q", msgs(got))
	}
	// The orphan's files are old (its sandbox ended while vmon was down).
	old := c.t.Add(-25 * time.Hour)
	for _, p := range []string{"orphan", "orphan/" + currentFile} {
		if err := os.Chtimes(filepath.Join(s.opts.Dir, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.Sweep()
	if err != nil || n != 1 {
		t.Fatalf("first sweep removed %d (%v), want the orphan only", n, err)
	}
	if _, err := s.Query("orphan", Query{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("orphan: %v", err)
	}
	if _, err := s.Query("ended", Query{}); err != nil {
		t.Errorf("ended sandbox's log within retention: %v", err)
	}
	c.t = c.t.Add(23 * time.Hour)
	if n, _ := s.Sweep(); n != 0 {
		t.Errorf("sweep before retention removed %d", n)
	}
	c.t = c.t.Add(2 * time.Hour)
	if n, _ := s.Sweep(); n != 1 {
		t.Errorf("sweep after retention removed %d, want 1", n)
	}
	if _, err := s.Query("ended", Query{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("ended sandbox's log after retention: %v", err)
	}
	// Live sandboxes keep their logs however long they are paused.
	for _, id := range []string{"running", "paused"} {
		if _, err := s.Query(id, Query{}); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
}

func TestEntryBounded(t *testing.T) {
	s := open(t, Options{})
	s.Append("sb", Entry{Level: LevelInfo, Message: strings.Repeat("x", 100_000),
		Fields: map[string]string{"k": strings.Repeat("y", 100_000)}})
	got, _ := s.Query("sb", Query{})
	if len(got) != 1 || len(got[0].Message) > maxMessage+4 || len(got[0].Fields["k"]) > maxField+4 {
		t.Errorf("entry not bounded: %d bytes message", len(got[0].Message))
	}
}

func TestQuery100k(t *testing.T) {
	s := open(t, Options{MaxBytes: 64 << 20})
	t0 := time.UnixMilli(1_700_000_000_000)
	for i := range 100_000 {
		s.Append("sb", Entry{Time: t0, Level: Level(i % 4), Logger: "processSvc", Message: fmt.Sprint("process ", i, " exited"),
			Fields: map[string]string{"pid": fmt.Sprint(i)}})
	}
	got, err := s.Query("sb", Query{Search: "process 99999 ", MinLevel: LevelWarn, Backward: true, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// How fast: BenchmarkQuery100k.
	if len(got) != 1 || got[0].Fields["pid"] != "99999" {
		t.Fatalf("got %q", msgs(got))
	}
}

func TestCursorKeptBesideTheLog(t *testing.T) {
	s, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Cursor("sb"); got != "" {
		t.Fatalf("cursor of a new log %q", got)
	}
	if err := s.SetCursor("sb", "boot 12"); err != nil {
		t.Fatal(err)
	}
	s2, _ := Open(Options{Dir: s.opts.Dir})
	if got := s2.Cursor("sb"); got != "boot 12" {
		t.Fatalf("cursor after reopening %q", got)
	}
	if err := s.SetCursor("../x", "b 1"); err == nil {
		t.Fatal("an invalid id was accepted")
	}
	if err := s.Remove("sb"); err != nil {
		t.Fatal(err)
	}
	if got := s.Cursor("sb"); got != "" {
		t.Fatalf("cursor outlived its log: %q", got)
	}
}

// BenchmarkQuery100k queries a log of 100,000 entries (about 17 MB, under a 64 MiB cap) as the
// logs API does: a page of 1000 from either end, a level filter and a search over all of it.
func BenchmarkQuery100k(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir(), MaxBytes: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now().Add(-time.Hour)
	for i := 0; i < 100_000; i++ {
		level := LevelInfo
		if i%100 == 0 {
			level = LevelWarn
		}
		s.Append("sb", Entry{Time: start.Add(time.Duration(i) * time.Millisecond), Level: level, Logger: "processSvc",
			Message: fmt.Sprintf("process %d exited with code 0: echo %d", 1000+i, i),
			Fields:  map[string]string{"pid": strconv.Itoa(1000 + i), "exitCode": "0", "status": "exit status 0"}})
	}
	if es, _ := s.Query("sb", Query{}); len(es) != 100_000 {
		b.Fatalf("the log holds %d entries, want 100000", len(es))
	}
	mid := start.Add(50 * time.Second).UnixMilli()
	for _, c := range []struct {
		name string
		q    Query
		want int
	}{
		{"forward-page", Query{Limit: 1000}, 1000},
		{"backward-page", Query{Limit: 1000, Backward: true}, 1000},
		{"cursor-middle-page", Query{Cursor: mid, Limit: 1000}, 1000},
		{"level-warn-all", Query{MinLevel: LevelWarn}, 1000},
		{"search-all", Query{Search: "echo 4242"}, 11},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				es, err := s.Query("sb", c.q)
				if err != nil || len(es) != c.want {
					b.Fatalf("%d entries, %v; want %d", len(es), err, c.want)
				}
			}
		})
	}
}

// A segment whose last line was torn (a host crash, or a disk that filled mid-write) must not
// swallow the entries appended after it: they start on a line of their own.
func TestTornLastLineDoesNotSwallowTheNext(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Options{Dir: dir})
	t0 := time.UnixMilli(1_000)
	s.Append("sb", Entry{Time: t0, Level: LevelInfo, Message: "whole"})
	f, err := os.OpenFile(filepath.Join(dir, "sb", currentFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"t":1001,"level":"info","logger":"x","msg":"to`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s2 := open(t, Options{Dir: dir})
	s2.Append("sb", Entry{Time: t0, Level: LevelInfo, Message: "after the tear"})
	got, err := s2.Query("sb", Query{})
	if err != nil {
		t.Fatal(err)
	}
	if m := msgs(got); len(m) != 2 || m[0] != "whole" || m[1] != "after the tear" {
		t.Fatalf("entries %q", m)
	}
}

// An append that fills the disk mid-write leaves no torn line behind: once there is room again,
// the next entry is whole.
func TestFullDiskLeavesNoTornLine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs (CI runs as root)")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 8<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, Options{Dir: filepath.Join(dir, "logs"), MaxBytes: 1 << 20})
	t0 := time.UnixMilli(1_000)
	big := strings.Repeat("x", 700)
	for i := range 40 {
		if err := s.append("sb", Entry{Time: t0, Level: LevelInfo, Message: fmt.Sprint(i, big)}, false); err != nil {
			break
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	s.Append("sb", Entry{Time: t0, Level: LevelInfo, Message: "room again"})
	got, err := s.Query("sb", Query{Search: "room again"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		b, _ := os.ReadFile(filepath.Join(dir, "logs", "sb", currentFile))
		t.Fatalf("the entry after a full disk was lost; the segment ends %q", b[max(0, len(b)-120):])
	}
}
