package templates

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/build"
	"github.com/vibemon/vmon/internal/store"
)

// logFlushEvery is how long a running build's new log lines may wait before they are stored:
// the SDK polls a build's status about every 200 ms, through whichever driver.
const logFlushEvery = 100 * time.Millisecond

// logSink copies a running build's log to the store, where drivers share it, so any of them
// answers the build's status. Lines keep their numbers, so a page asked of one driver continues
// the page another gave.
type logSink struct {
	st      *store.Store
	buildID string
	log     *build.Log
	warn    *slog.Logger

	mu sync.Mutex
	// written is how many of the log's lines the store holds.
	// +checklocks:mu
	written int
}

// flush stores the lines not stored yet.
func (k *logSink) flush(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for {
		es := k.log.Since(k.written, 1000)
		if len(es) == 0 {
			return nil
		}
		rows := make([]store.BuildLogEntry, len(es))
		for i, e := range es {
			rows[i] = store.BuildLogEntry{Time: e.Timestamp, Level: e.Level, Step: e.Step, Message: e.Message}
		}
		if err := k.st.AppendBuildLog(ctx, k.buildID, k.written, rows); err != nil {
			return err
		}
		k.written += len(es)
	}
}

// follow stores lines as the build logs them until done closes; the build's end stores the
// rest itself (running.flush) before it records how the build ended.
func (k *logSink) follow(ctx context.Context, done <-chan struct{}) {
	failing := false
	for {
		// Taken before the flush: a line added while it runs wakes the next round.
		changed := k.log.Changed()
		err := k.flush(context.WithoutCancel(ctx))
		if err != nil && !failing {
			k.warn.Warn("store a build's log; retrying", "build", k.buildID, "err", err)
		}
		failing = err != nil
		select {
		case <-changed:
		case <-done:
			return
		}
		select {
		case <-time.After(logFlushEvery):
		case <-done:
			return
		}
	}
}

// finalFlushTries bounds how long a finished build waits for its log to be stored (about a
// minute in all) before it records how it ended anyway.
const finalFlushTries = 8

// flush stores what the build logged so far, where drivers share the store. The build's end
// calls it: until the whole log is stored, other drivers would serve a short one for good, so
// it tries again while the database does not answer.
func (r *running) flush(ctx context.Context) {
	if r.sink == nil {
		return
	}
	wait := 250 * time.Millisecond
	for try := 1; ; try++ {
		err := r.sink.flush(ctx)
		if err == nil {
			return
		}
		if try == finalFlushTries {
			r.sink.warn.Error("store a finished build's log: other drivers serve it short", "build", r.sink.buildID, "err", err)
			return
		}
		r.sink.warn.Warn("store a finished build's log; retrying", "build", r.sink.buildID, "err", err)
		time.Sleep(wait)
		wait = min(2*wait, 15*time.Second)
	}
}
