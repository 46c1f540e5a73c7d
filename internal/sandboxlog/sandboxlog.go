// Package sandboxlog owns each sandbox's log on the node's data dir: what happened to a sandbox
// (created, paused, resumed, forked, ended and why, egress refusals, and what envd reported from
// inside: processes, the start command's output, limits reached) as JSON lines in
// <data>/sandbox-logs/<id>/, served by the logs API after the sandbox ended until a retention
// period has passed. Beside each log it keeps a cursor for whoever feeds it from a stream (the
// node's place in envd's events). It never decides what is logged, nor removes sandbox records.
//
// A log is two segments, current.jsonl and old.jsonl: once the current one passes half the size
// cap it becomes the old one and the previous old one goes, so a log never takes much more than
// its cap and the oldest entries are dropped first, the drop itself logged. Appends are one
// write(2) under a per-sandbox mutex; nothing is fsynced, since a log that loses its last lines
// in a host crash is still the truth about what it kept.
//
// Timestamps are unique per sandbox at millisecond precision (an entry within the same
// millisecond as the previous one is stamped a millisecond later): E2B's API pages by a cursor in
// milliseconds, and unique stamps let a client that pages from the last one it saw, plus or minus
// one, see every entry exactly once.
package sandboxlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Level is an entry's severity, as E2B names them.
type Level uint8

// Levels, least severe first.
const (
	LevelDebug Level = iota
	LevelInfo
	LevelWarn
	LevelError
)

var levelNames = [...]string{"debug", "info", "warn", "error"}

func (l Level) String() string {
	if int(l) < len(levelNames) {
		return levelNames[l]
	}
	return "info"
}

// ParseLevel reads E2B's level names.
func ParseLevel(s string) (Level, error) {
	for i, n := range levelNames {
		if s == n {
			return Level(i), nil
		}
	}
	return 0, fmt.Errorf("unknown log level %q (want debug, info, warn or error)", s)
}

// Entry is one line of a sandbox's log. Logger names the part of vmon that wrote it, in E2B's
// style (lifecycleSvc, egressSvc): E2B's CLI strips the Svc suffix and filters by it.
type Entry struct {
	Time    time.Time
	Level   Level
	Logger  string
	Message string
	Fields  map[string]string
}

// Defaults.
const (
	DefaultMaxBytes  = 1 << 20
	DefaultRetention = 24 * time.Hour
	// SweepEvery is how often Run removes logs past their retention, or a quarter of the
	// retention when that is shorter, so nothing outlives it by much.
	SweepEvery = time.Hour
	// maxMessage and maxField bound one entry, so one entry cannot take a segment.
	maxMessage = 4096
	maxField   = 1024
	// Logger of the entries the log writes about itself.
	selfLogger = "logsSvc"
)

// Segment and marker file names in a sandbox's directory.
const (
	currentFile = "current.jsonl"
	oldFile     = "old.jsonl"
	endedFile   = "ended"
	cursorFile  = "cursor"
)

// ErrNotFound is returned by Query for a sandbox that has no log (never had one, or it was
// removed after its retention).
var ErrNotFound = errors.New("sandbox has no log")

// Options configure a Store. Dir is required.
type Options struct {
	// Dir holds one directory per sandbox (<data>/sandbox-logs).
	Dir string
	// MaxBytes caps one sandbox's log (--sandbox-log-max-bytes); default DefaultMaxBytes.
	MaxBytes int64
	// Retention is how long a log stays after its sandbox ended (--sandbox-log-retention);
	// default DefaultRetention.
	Retention time.Duration
	// Live reports whether a sandbox still exists (running or paused). A log without an end
	// marker (its sandbox ended while vmon was down, or its record went) is removed by a sweep
	// once Live says no and it was not written for Retention. Nil keeps such logs.
	Live func(id string) bool
	// Now defaults to time.Now (tests).
	Now func() time.Time
	Log *slog.Logger
}

// Store holds the logs of a node's sandboxes.
type Store struct {
	opts Options

	mu   sync.Mutex
	logs map[string]*sandboxLog // +checklocks:mu
}

// sandboxLog is what Append needs to know about one log, loaded from its files on first use.
type sandboxLog struct {
	mu       sync.Mutex
	loaded   bool
	size     int64 // bytes in the current segment
	count    int   // entries in the current segment
	oldCount int   // entries in the old segment
	lastMs   int64 // stamp of the newest entry
	ended    bool  // its sandbox ended: nothing more is added
}

// Open returns a store over opts.Dir, creating it.
func Open(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, errors.New("sandboxlog: Dir is required")
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox logs: %w", err)
	}
	return &Store{opts: opts, logs: map[string]*sandboxLog{}}, nil
}

// validID keeps ids from naming anything outside Dir.
func validID(id string) bool {
	return id != "" && id != "." && id != ".." && !strings.ContainsAny(id, "/\\\x00")
}

func (s *Store) dir(id string) string { return filepath.Join(s.opts.Dir, id) }

func (s *Store) get(id string) *sandboxLog {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.logs[id]
	if l == nil {
		l = &sandboxLog{}
		s.logs[id] = l
	}
	return l
}

// Append adds e to the sandbox's log. It never fails the caller: a log that cannot be written is
// reported in vmon's own log, and the sandbox operation goes on.
func (s *Store) Append(id string, e Entry) {
	if err := s.append(id, e, false); err != nil {
		s.opts.Log.Warn("append to sandbox log", "sandbox", id, "err", err)
	}
}

// AppendAll adds es to the sandbox's log in one write where it can (a burst from one source).
func (s *Store) AppendAll(id string, es []Entry) {
	if len(es) == 0 {
		return
	}
	if err := s.appendAll(id, es); err != nil {
		s.opts.Log.Warn("append to sandbox log", "sandbox", id, "err", err)
	}
}

// End adds the sandbox's last entry (why it ended) and starts its retention period.
func (s *Store) End(id string, e Entry) {
	if err := s.append(id, e, true); err != nil {
		s.opts.Log.Warn("append to sandbox log", "sandbox", id, "err", err)
	}
}

func (s *Store) append(id string, e Entry, end bool) error {
	return s.appendEntries(id, []Entry{e}, end)
}

func (s *Store) appendAll(id string, es []Entry) error {
	return s.appendEntries(id, es, false)
}

// appendEntries adds es in order, in one write(2) unless the log rotates among them; end marks
// the log ended first.
func (s *Store) appendEntries(id string, es []Entry, end bool) error {
	if !validID(id) {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	l := s.get(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	dir := s.dir(id)
	if !l.loaded {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := l.load(dir); err != nil {
			return err
		}
		l.loaded = true
	}
	if end {
		// The marker goes first: if the entry cannot be written, the log still expires.
		now := s.opts.Now().UTC()
		if err := os.WriteFile(filepath.Join(dir, endedFile), []byte(now.Format(time.RFC3339Nano)+"\n"), 0o600); err != nil {
			return err
		}
		l.ended = true
	} else if l.ended {
		// Something reported about a sandbox after it ended (a late refusal): the log stays as
		// the sandbox left it.
		return nil
	}
	var pending pendingWrite
	for _, e := range es {
		if l.size+int64(len(pending.buf)) >= s.opts.MaxBytes/2 {
			if err := pending.flush(l, dir); err != nil {
				return err
			}
			dropped := l.oldCount
			if err := os.Rename(filepath.Join(dir, currentFile), filepath.Join(dir, oldFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			l.oldCount, l.count, l.size = l.count, 0, 0
			if dropped > 0 {
				msg := fmt.Sprintf("%d older entries dropped (the log of a sandbox keeps about %d bytes)", dropped, s.opts.MaxBytes)
				if err := pending.add(l, Entry{Time: e.Time, Level: LevelWarn, Logger: selfLogger, Message: msg,
					Fields: map[string]string{"dropped": strconv.Itoa(dropped)}}, s.opts.Now); err != nil {
					return err
				}
			}
		}
		if err := pending.add(l, e, s.opts.Now); err != nil {
			return err
		}
	}
	return pending.flush(l, dir)
}

// pendingWrite gathers encoded lines for one write to the current segment; the caller holds l.mu.
type pendingWrite struct {
	buf    []byte
	n      int
	lastMs int64
}

func (p *pendingWrite) add(l *sandboxLog, e Entry, now func() time.Time) error {
	t := e.Time
	if t.IsZero() {
		t = now()
	}
	last := l.lastMs
	if p.n > 0 {
		last = p.lastMs
	}
	ms := t.UnixMilli()
	if ms <= last {
		ms = last + 1
	}
	b, err := encode(ms, e)
	if err != nil {
		return err
	}
	p.buf = append(p.buf, b...)
	p.n++
	p.lastMs = ms
	return nil
}

// flush appends what was gathered; the log's counters move only once it is written.
func (p *pendingWrite) flush(l *sandboxLog, dir string) error {
	if p.n == 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, currentFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(p.buf)
	if werr != nil {
		// A partial write (a full disk) would leave a torn line that the next append joins.
		_ = f.Truncate(l.size)
	}
	cerr := f.Close()
	if werr != nil {
		return werr
	}
	if cerr != nil {
		return cerr
	}
	l.lastMs = p.lastMs
	l.size += int64(len(p.buf))
	l.count += p.n
	*p = pendingWrite{}
	return nil
}

// line is an entry on disk. The stamp comes first so a query can skip lines without decoding
// them.
type line struct {
	T      int64             `json:"t"`
	Level  string            `json:"level"`
	Logger string            `json:"logger"`
	Msg    string            `json:"msg"`
	Fields map[string]string `json:"fields,omitempty"`
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func encode(ms int64, e Entry) ([]byte, error) {
	ln := line{T: ms, Level: e.Level.String(), Logger: e.Logger, Msg: clip(e.Message, maxMessage)}
	if len(e.Fields) > 0 {
		ln.Fields = make(map[string]string, len(e.Fields))
		for k, v := range e.Fields {
			ln.Fields[clip(k, 64)] = clip(v, maxField)
		}
	}
	b, err := json.Marshal(ln)
	if err != nil {
		return nil, fmt.Errorf("encode log entry: %w", err)
	}
	return append(b, '\n'), nil
}

func decode(b []byte) (Entry, bool) {
	var ln line
	if err := json.Unmarshal(b, &ln); err != nil {
		return Entry{}, false
	}
	lvl, err := ParseLevel(ln.Level)
	if err != nil {
		lvl = LevelInfo
	}
	return Entry{Time: time.UnixMilli(ln.T).UTC(), Level: lvl, Logger: ln.Logger, Message: ln.Msg, Fields: ln.Fields}, true
}

// stamp reads a line's millisecond stamp from its prefix (`{"t":<digits>,`) without decoding it.
func stamp(b []byte) (int64, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(`{"t":`))
	if !ok {
		return 0, false
	}
	i := bytes.IndexByte(rest, ',')
	if i <= 0 {
		return 0, false
	}
	var v int64
	for _, c := range rest[:i] {
		if c < '0' || c > '9' || v > (1<<62)/10 {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

// rawLevel reads a line's level from its prefix (`{"t":<digits>,"level":"<name>"`).
func rawLevel(b []byte) (Level, bool) {
	i := bytes.Index(b, []byte(`,"level":"`))
	if i < 0 || i > 32 {
		return 0, false
	}
	rest := b[i+len(`,"level":"`):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return 0, false
	}
	for i, n := range levelNames {
		if string(rest[:j]) == n {
			return Level(i), true
		}
	}
	return 0, false
}

// isPrintable reports whether JSON writes s without escapes (no control characters).
func isPrintable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// load reads what Append needs from the log's files (after a restart, or the first append).
func (l *sandboxLog) load(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, endedFile)); err == nil {
		l.ended = true
	}
	for _, name := range []string{oldFile, currentFile} {
		path := filepath.Join(dir, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if i := bytes.LastIndexByte(b, '\n'); name == currentFile && i+1 < len(b) {
			// A torn last line (a host crash, a full disk): appends must start a line of their
			// own, or the first one after it would be joined to it and lost with it.
			if err := os.Truncate(path, int64(i+1)); err != nil {
				return err
			}
			b = b[:i+1]
		}
		n := 0
		for _, ln := range lines(b) {
			n++
			if ms, ok := stamp(ln); ok && ms > l.lastMs {
				l.lastMs = ms
			}
		}
		if name == oldFile {
			l.oldCount = n
		} else {
			l.count, l.size = n, int64(len(b))
		}
	}
	return nil
}

// lines splits a segment into its complete lines (a torn last line from a crash is skipped).
func lines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		if i > 0 {
			out = append(out, b[:i])
		}
		b = b[i+1:]
	}
	return out
}

// Query selects entries of one log.
type Query struct {
	// Cursor is a stamp in Unix milliseconds: forward, entries at or after it, oldest first;
	// backward, entries at or before it, newest first. 0 means from the oldest (forward) or the
	// newest (backward).
	Cursor   int64
	Backward bool
	// Limit bounds the entries returned (0: no bound).
	Limit int
	// MinLevel leaves out entries below it.
	MinLevel Level
	// Search keeps only entries whose message contains it (case-sensitive, as E2B's).
	Search string
}

// Query returns the entries of the sandbox's log that q selects. A sandbox without a log is
// ErrNotFound.
func (s *Store) Query(id string, q Query) ([]Entry, error) {
	if !validID(id) {
		return nil, ErrNotFound
	}
	dir := s.dir(id)
	l := s.get(id)
	// Reading under the log's mutex keeps a rotation from moving entries between the reads of the
	// two segments; the reads are of at most MaxBytes.
	l.mu.Lock()
	oldB, oerr := os.ReadFile(filepath.Join(dir, oldFile))
	curB, cerr := os.ReadFile(filepath.Join(dir, currentFile))
	l.mu.Unlock()
	if oerr != nil && !errors.Is(oerr, fs.ErrNotExist) {
		return nil, oerr
	}
	if cerr != nil && !errors.Is(cerr, fs.ErrNotExist) {
		return nil, cerr
	}
	if oerr != nil && cerr != nil {
		if _, err := os.Stat(dir); err != nil {
			return nil, ErrNotFound
		}
	}
	all := append(lines(oldB), lines(curB)...)
	out := []Entry{}
	keep := func(ln []byte) bool {
		ms, ok := stamp(ln)
		if !ok {
			return true
		}
		if q.Cursor == 0 {
			return true
		}
		if q.Backward {
			return ms <= q.Cursor
		}
		return ms >= q.Cursor
	}
	// Cheap tests on the raw line first, so a filter over a long log decodes only what can match:
	// the level sits right after the stamp, and a search string JSON writes as is must appear in
	// the line as is.
	rawSearch := q.Search != "" && !strings.ContainsAny(q.Search, `\"<>&`+"\u2028\u2029") && isPrintable(q.Search)
	match := func(ln []byte) {
		if q.MinLevel > LevelDebug {
			if lvl, ok := rawLevel(ln); ok && lvl < q.MinLevel {
				return
			}
		}
		if rawSearch && !bytes.Contains(ln, []byte(q.Search)) {
			return
		}
		e, ok := decode(ln)
		if !ok || e.Level < q.MinLevel || (q.Search != "" && !strings.Contains(e.Message, q.Search)) {
			return
		}
		out = append(out, e)
	}
	if q.Backward {
		for i := len(all) - 1; i >= 0 && (q.Limit <= 0 || len(out) < q.Limit); i-- {
			if keep(all[i]) {
				match(all[i])
			}
		}
		return out, nil
	}
	for i := 0; i < len(all) && (q.Limit <= 0 || len(out) < q.Limit); i++ {
		if keep(all[i]) {
			match(all[i])
		}
	}
	return out, nil
}

// Cursor returns what SetCursor last kept for the sandbox ("" if nothing).
func (s *Store) Cursor(id string) string {
	if !validID(id) {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(s.dir(id), cursorFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// SetCursor keeps, beside the sandbox's log, how far a source of its entries has been read (the
// node's place in envd's events), so a restarted vmon goes on from there.
func (s *Store) SetCursor(id, cursor string) error {
	if !validID(id) {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	l := s.get(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	dir := s.dir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(dir, cursorFile+".tmp")
	if err := os.WriteFile(tmp, []byte(cursor+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, cursorFile))
}

// Remove deletes a sandbox's log at once (its create failed, so nobody will ask for it).
func (s *Store) Remove(id string) error {
	if !validID(id) {
		return nil
	}
	l := s.get(id)
	l.mu.Lock()
	defer l.mu.Unlock()
	s.mu.Lock()
	delete(s.logs, id)
	s.mu.Unlock()
	return os.RemoveAll(s.dir(id))
}

// Sweep removes the logs whose retention has passed: those of sandboxes that ended more than
// Retention ago, and those no live sandbox owns that were not written for Retention. It returns
// how many went.
func (s *Store) Sweep() (int, error) {
	ents, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return 0, fmt.Errorf("sweep sandbox logs: %w", err)
	}
	cutoff := s.opts.Now().Add(-s.opts.Retention)
	removed := 0
	var errs []error
	for _, de := range ents {
		if !de.IsDir() || !validID(de.Name()) {
			continue
		}
		id := de.Name()
		if !s.expired(id, cutoff) {
			continue
		}
		if err := s.Remove(id); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

func (s *Store) expired(id string, cutoff time.Time) bool {
	dir := s.dir(id)
	if b, err := os.ReadFile(filepath.Join(dir, endedFile)); err == nil {
		t, perr := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
		if perr != nil {
			return true
		}
		return t.Before(cutoff)
	}
	if s.opts.Live == nil || s.opts.Live(id) {
		return false
	}
	newest := time.Time{}
	for _, name := range []string{"", currentFile, oldFile} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
	}
	return newest.Before(cutoff)
}

// Run sweeps at once and then every SweepEvery (or a quarter of the retention, if shorter) until
// ctx ends; after each sweep, also is called (when set) with the cutoff: what ended before it is
// past its retention.
func (s *Store) Run(ctx context.Context, also func(cutoff time.Time)) {
	sweep := func() {
		cutoff := s.opts.Now().Add(-s.opts.Retention)
		n, err := s.Sweep()
		if err != nil {
			s.opts.Log.Warn("sweep sandbox logs", "err", err)
		}
		if n > 0 {
			s.opts.Log.Info("removed sandbox logs past their retention", "count", n, "retention", s.opts.Retention)
		}
		if also != nil {
			also(cutoff)
		}
	}
	sweep()
	t := time.NewTicker(min(SweepEvery, max(s.opts.Retention/4, time.Second)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sweep()
		}
	}
}
