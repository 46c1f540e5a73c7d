package build

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Entry is one line of a build's log, as E2B's status endpoint returns it.
type Entry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	// Step is "base", "finalize" or a 1-based step number; empty for build-wide lines.
	Step string `json:"step,omitempty"`
}

// Log is a build's append-only log. It is kept in memory for the status endpoint's polling and
// written through to a file, so a build's log outlives the server.
type Log struct {
	mu sync.Mutex
	// +checklocks:mu
	entries []Entry
	// +checklocks:mu
	f *os.File
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	changed chan struct{}
}

// maxLogEntries bounds one build's log: a step printing without end must not exhaust memory.
const maxLogEntries = 100_000

// NewLog creates the log of a build, writing through to path.
func NewLog(path string) (*Log, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create build log dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create build log: %w", err)
	}
	return &Log{f: f, changed: make(chan struct{})}, nil
}

// ReadLog loads a finished build's log from its file.
func ReadLog(path string) (*Log, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	l := &Log{closed: true, changed: make(chan struct{})}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e Entry
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			l.entries = append(l.entries, e)
		}
	}
	return l, sc.Err()
}

// Add appends one entry.
func (l *Log) Add(level, step, format string, args ...any) {
	e := Entry{Timestamp: time.Now().UTC(), Level: level, Message: fmt.Sprintf(format, args...), Step: step}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if len(l.entries) == maxLogEntries {
		e = Entry{Timestamp: e.Timestamp, Level: "warn", Message: "log truncated: too many lines", Step: step}
	} else if len(l.entries) > maxLogEntries {
		return
	}
	l.entries = append(l.entries, e)
	if l.f != nil {
		b, _ := json.Marshal(e)
		_, _ = l.f.Write(append(b, '\n'))
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// Since returns up to max entries from offset on.
func (l *Log) Since(offset, max int) []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	if offset < 0 || offset >= len(l.entries) {
		return []Entry{}
	}
	end := min(len(l.entries), offset+max)
	return append([]Entry(nil), l.entries[offset:end]...)
}

// Len is the number of entries so far.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}

// Changed is closed at the next Add (for followers such as the CLI's progress display).
func (l *Log) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Close ends the log; later Adds are dropped.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.changed)
	l.changed = make(chan struct{})
	var err error
	if l.f != nil {
		err = errors.Join(l.f.Sync(), l.f.Close())
	}
	return err
}

// lineWriter splits a process's output into log lines per stream.
type lineWriter struct {
	log   *Log
	step  string
	level string
	buf   []byte
	// tail keeps the last lines for a failure's reason.
	tail []string
}

const tailLines = 20

func (w *lineWriter) write(b []byte) {
	w.buf = append(w.buf, b...)
	for {
		i := indexNewline(w.buf)
		if i < 0 {
			break
		}
		w.emit(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	// A line without end must not grow without bound.
	if len(w.buf) > 16<<10 {
		w.emit(string(w.buf))
		w.buf = w.buf[:0]
	}
}

func (w *lineWriter) emit(line string) {
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	w.log.Add(w.level, w.step, "%s", line)
	w.tail = append(w.tail, line)
	if len(w.tail) > tailLines {
		w.tail = w.tail[1:]
	}
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.emit(string(w.buf))
		w.buf = w.buf[:0]
	}
}

func indexNewline(b []byte) int {
	for i, c := range b {
		if c == '\n' {
			return i
		}
	}
	return -1
}
