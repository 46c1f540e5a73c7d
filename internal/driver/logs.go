package driver

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

// SandboxLog is where the driver writes what happens to each sandbox, and reads it back for the
// logs API (*sandboxlog.Store). Append and End never block for long and never fail the caller.
type SandboxLog interface {
	Append(id string, e sandboxlog.Entry)
	// End writes a sandbox's last entry; its log is kept for the retention period from then.
	End(id string, e sandboxlog.Entry)
	Query(id string, q sandboxlog.Query) ([]sandboxlog.Entry, error)
}

// contextQuerier is a SandboxLog whose reads reach across the network (cluster.Logs): they take
// the caller's context.
type contextQuerier interface {
	QueryContext(ctx context.Context, id string, q sandboxlog.Query) ([]sandboxlog.Entry, error)
}

// lifecycleLogger names the driver's entries in sandbox logs, in E2B's style.
const lifecycleLogger = "lifecycleSvc"

// sbLog adds a lifecycle entry to a sandbox's log; kv are field names and values. Field values
// must never carry environment values, secrets or header-rule values.
func (d *Driver) sbLog(id string, level sandboxlog.Level, msg string, kv ...string) {
	if d.opts.Logs == nil {
		return
	}
	d.opts.Logs.Append(id, sandboxlog.Entry{Time: d.clock.Now(), Level: level, Logger: lifecycleLogger,
		Message: msg, Fields: fieldsOf(kv)})
}

// sbEnded writes a sandbox's last entry: why it ended.
func (d *Driver) sbEnded(id, reason string) {
	if d.opts.Logs == nil {
		return
	}
	level := sandboxlog.LevelInfo
	switch {
	case reason == ReasonUser || reason == ReasonTimeout:
	case strings.HasPrefix(reason, "oom") || strings.HasPrefix(reason, "task-limit") ||
		strings.HasPrefix(reason, ReasonPauseFailed) || strings.HasPrefix(reason, ReasonResumeFailed):
		level = sandboxlog.LevelError
	default:
		level = sandboxlog.LevelWarn
	}
	msg := "sandbox ended: " + reason
	switch reason {
	case ReasonUser:
		msg = "sandbox killed by request"
	case ReasonTimeout:
		msg = "sandbox ended: its timeout was reached"
	}
	d.opts.Logs.End(id, sandboxlog.Entry{Time: d.clock.Now(), Level: level, Logger: lifecycleLogger,
		Message: msg, Fields: map[string]string{"reason": reason}})
}

func fieldsOf(kv []string) map[string]string {
	if len(kv) < 2 {
		return nil
	}
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func itoa(n int) string { return strconv.Itoa(n) }

func secs(t time.Duration) string { return strconv.FormatInt(int64(t/time.Second), 10) }

// Logs returns entries of a sandbox's log: running, paused and ended sandboxes alike, until the
// log of an ended one was removed after its retention. Unknown sandboxes are NotFound.
func (d *Driver) Logs(ctx context.Context, id string, q sandboxlog.Query) ([]sandboxlog.Entry, error) {
	if d.opts.Logs == nil {
		return nil, logsOff{}
	}
	sb, err := d.store.GetSandbox(ctx, id)
	if errdefs.Is(err, errdefs.KindNotFound) {
		return nil, notFound(id)
	}
	if err != nil {
		return nil, err
	}
	var es []sandboxlog.Entry
	if qc, ok := d.opts.Logs.(contextQuerier); ok {
		es, err = qc.QueryContext(ctx, id, q)
	} else {
		es, err = d.opts.Logs.Query(id, q)
	}
	if errors.Is(err, sandboxlog.ErrNotFound) {
		if sb.State == store.StateKilled {
			// Its retention has passed (or it ended before this vmon kept logs).
			return nil, notFound(id)
		}
		return []sandboxlog.Entry{}, nil
	}
	return es, err
}

// clipList joins a policy's list for a log field, bounded: policies may list many entries.
func clipList(l []string) string {
	const most = 20
	if len(l) > most {
		return strings.Join(l[:most], ",") + ",… (" + itoa(len(l)) + " in all)"
	}
	return strings.Join(l, ",")
}

// logsOff is the answer of a server whose sandbox logs are turned off: a 501 that says so.
type logsOff struct{}

func (logsOff) Error() string {
	return "sandbox logs are turned off on this server (vmon serve --sandbox-logs=false)"
}

func (logsOff) Is(target error) bool { return target == ErrNotImplemented }
