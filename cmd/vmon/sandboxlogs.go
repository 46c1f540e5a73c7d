package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/config"
	"github.com/vibemon/vmon/internal/denied"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/sandboxlog"
	"github.com/vibemon/vmon/internal/store"
)

// openSandboxLogs opens the node's sandbox logs (<data>/sandbox-logs) and sweeps them now and
// hourly until ctx ends. A log no live record owns (its sandbox ended while vmon was down, or
// its record went) goes after the retention like any other.
func openSandboxLogs(ctx context.Context, c *config.Serve, st *store.Store, log *slog.Logger) (*sandboxlog.Store, error) {
	return openSandboxLogsOf(c, func(id string) bool {
		sb, err := st.GetSandbox(ctx, id)
		if errdefs.Is(err, errdefs.KindNotFound) {
			return false
		}
		// On a store error the log is kept: a sweep an hour later decides again.
		return err != nil || sb.State != store.StateKilled
	}, log)
}

// openSandboxLogsOf opens the data dir's sandbox logs; live says which sandboxes' logs the
// retention must not touch yet.
func openSandboxLogsOf(c *config.Serve, live func(id string) bool, log *slog.Logger) (*sandboxlog.Store, error) {
	logs, err := sandboxlog.Open(sandboxlog.Options{Dir: filepath.Join(c.DataDir, "sandbox-logs"),
		MaxBytes: c.SandboxLogMaxBytes, Retention: c.SandboxLogRetention, Live: live, Log: log})
	if err != nil {
		return nil, err
	}
	return logs, nil
}

// pruneKilled removes, after each sweep of the logs, the records of sandboxes killed before the
// sweep's cutoff: a record and a log both say what happened to a sandbox, and neither is kept
// past the other.
func pruneKilled(ctx context.Context, st *store.Store, log *slog.Logger) func(cutoff time.Time) {
	return func(cutoff time.Time) {
		if st.Shared() {
			// The drivers' part of the logs is in the database: it goes before the records.
			if _, err := st.DeleteSandboxLogsBefore(ctx, cutoff); err != nil {
				log.Warn("remove sandbox logs past their retention", "err", err)
			}
		}
		n, err := st.DeleteKilledBefore(ctx, cutoff)
		if err != nil {
			log.Warn("remove the records of sandboxes past their retention", "err", err)
		} else if n > 0 {
			log.Info("removed the records of sandboxes past their retention", "count", n)
		}
	}
}

// egressLogger names refusals in sandbox logs, in E2B's style.
const egressLogger = "egressSvc"

// logRefusals copies what the denied hub reports (first refusals and their repeat counts) into
// the sandboxes' logs (when logs is set). The hub calls its tap under its lock, so events are handed to a goroutine
// through a buffer; if it fills, refusals miss the log (never the enforcement, nor the hub's own
// stream).
// A non-nil count is told of every refusal (metrics) as it happens.
func logRefusals(ctx context.Context, hub *denied.Hub, logs *sandboxlog.Store, count func(stage string, n int)) {
	ch := make(chan denied.Event, 1024)
	hub.SetTap(func(e denied.Event) {
		if count != nil {
			count(e.Stage, max(1, e.Count))
		}
		if logs == nil {
			return
		}
		select {
		case ch <- e:
		default:
		}
	})
	go func() {
		for {
			select {
			case <-ctx.Done():
				hub.SetTap(nil)
				return
			case e := <-ch:
				logs.Append(e.SandboxID, refusalEntry(e))
			}
		}
	}()
}

// refusalEntry is a refusal as a log entry: what was refused, by which rule, how often. Header
// rules' values never appear in refusals (a refusal names the destination and the rule only).
func refusalEntry(e denied.Event) sandboxlog.Entry {
	dst := e.Dst
	if e.Port != 0 {
		dst = net.JoinHostPort(e.Dst, strconv.Itoa(int(e.Port)))
	}
	if e.Name != "" {
		dst = e.Name + " (" + dst + ")"
	}
	msg := fmt.Sprintf("egress refused: %s %s by %s", e.Proto, dst, e.Stage)
	if e.Rule != "" {
		msg += " (" + e.Rule + ")"
	}
	if e.Repeats {
		msg = fmt.Sprintf("egress refused %d more times: %s %s by %s", e.Count, e.Proto, dst, e.Stage)
	}
	f := map[string]string{"destination": e.Dst, "proto": e.Proto, "stage": e.Stage, "count": strconv.Itoa(e.Count)}
	if e.Port != 0 {
		f["port"] = strconv.Itoa(int(e.Port))
	}
	if e.Name != "" {
		f["name"] = e.Name
	}
	if e.Rule != "" {
		f["rule"] = e.Rule
	}
	return sandboxlog.Entry{Time: e.Time, Level: sandboxlog.LevelWarn, Logger: egressLogger, Message: msg, Fields: f}
}

// logEntry is an entry of GET /v2/sandboxes/{id}/logs.
type logEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// sandboxLogsCmd is `vmon sandbox logs ID [--follow] [--level L] [--json]`: a sandbox's log,
// running, paused or ended, from the API (GET /v2/sandboxes/{id}/logs).
func sandboxLogsCmd() *cobra.Command {
	var dataDir, apiURL, apiKey, level string
	var follow, asJSON bool
	c := &cobra.Command{
		Use:   "logs ID",
		Short: "show what happened to a sandbox (created, paused, resumed, ended and why, egress refusals, processes, limits reached), also after it ended",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if level != "" {
				if _, err := sandboxlog.ParseLevel(level); err != nil {
					return err
				}
			}
			client, err := newAPIClient(dataDir, apiURL, apiKey, 30*time.Second)
			if err != nil {
				return err
			}
			var cursor int64
			for {
				q := url.Values{"limit": {"1000"}, "cursor": {strconv.FormatInt(cursor, 10)}}
				if level != "" {
					q.Set("level", level)
				}
				var page struct {
					Logs []logEntry `json:"logs"`
				}
				path := "/v2/sandboxes/" + url.PathEscape(args[0]) + "/logs?" + q.Encode()
				if err := client.do(cmd.Context(), "GET", path, nil, &page); err != nil {
					if cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				for _, e := range page.Logs {
					if err := printLogEntry(cmd.OutOrStdout(), e, asJSON); err != nil {
						return err
					}
					// Stamps are unique per sandbox, so the next page starts one past the last.
					cursor = e.Timestamp.UnixMilli() + 1
				}
				if len(page.Logs) == 1000 {
					continue
				}
				if !follow {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		},
	}
	config.BindDataDir(c.Flags(), &dataDir)
	c.Flags().StringVar(&apiURL, "api-url", "http://127.0.0.1:3000", "API of the running `vmon serve`")
	c.Flags().StringVar(&apiKey, "api-key", "", "API key (default: <data-dir>/api-key)")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing entries as they are written")
	c.Flags().StringVar(&level, "level", "", "show only entries at this level or above (debug, info, warn, error)")
	c.Flags().BoolVar(&asJSON, "json", false, "print each entry as a JSON object (the API's shape), one per line")
	return c
}

// printLogEntry prints one entry: time, level, logger (without E2B's Svc suffix), message and
// the other fields as key=value, sorted.
func printLogEntry(w io.Writer, e logEntry, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, string(b))
		return err
	}
	logger := strings.TrimSuffix(e.Fields["logger"], "Svc")
	var kv []string
	for k, v := range e.Fields {
		if k != "logger" {
			kv = append(kv, k+"="+strconv.Quote(v))
		}
	}
	slices.Sort(kv)
	line := fmt.Sprintf("%s  %-5s  %-9s  %s", e.Timestamp.UTC().Format("2006-01-02T15:04:05.000Z"),
		strings.ToUpper(e.Level), logger, e.Message)
	if len(kv) > 0 {
		line += "  " + strings.Join(kv, " ")
	}
	_, err := fmt.Fprintln(w, line)
	return err
}

// guestLog copies what envd reports about a sandbox (node.GuestLog) into its log. Entries are
// stamped with the guest's time unless it lies ahead of the host's: the guest's root can set the
// guest clock, and a log must not run ahead of what the host knows.
type guestLog struct{ logs *sandboxlog.Store }

func (g guestLog) GuestCursor(id string) (string, uint64) {
	boot, seq, _ := strings.Cut(g.logs.Cursor(id), " ")
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return "", 0
	}
	return boot, n
}

func (g guestLog) GuestEvents(id, boot string, last uint64, evs []agentproto.GuestEvent) {
	now := time.Now()
	es := make([]sandboxlog.Entry, 0, len(evs))
	for _, e := range evs {
		level, err := sandboxlog.ParseLevel(e.Level)
		if err != nil {
			level = sandboxlog.LevelInfo
		}
		t := e.Time
		if t.IsZero() || t.After(now) {
			t = now
		}
		es = append(es, sandboxlog.Entry{Time: t, Level: level, Logger: e.Logger, Message: e.Message, Fields: e.Fields})
	}
	g.logs.AppendAll(id, es)
	if err := g.logs.SetCursor(id, boot+" "+strconv.FormatUint(last, 10)); err != nil {
		// The entries are kept; a restarted vmon may add the last ones again.
		slog.Default().Warn("keep the place in a sandbox's guest events", "sandbox", id, "err", err)
	}
}

// sharedLogs keeps a driver's part of sandbox logs (the lifecycle) in the database several
// drivers share, so that a read through any of them has every driver's entries, and a driver
// that goes away takes none along.
type sharedLogs struct {
	st  *store.Store
	log *slog.Logger
}

// sharedLogWrite bounds one entry's write: a log entry never holds up the step it records.
const sharedLogWrite = 2 * time.Second

func (l sharedLogs) Append(id string, e sandboxlog.Entry) {
	ctx, cancel := context.WithTimeout(context.Background(), sharedLogWrite)
	defer cancel()
	if err := l.st.AppendSandboxLog(ctx, id, store.LogEntry{Time: e.Time, Level: int(e.Level), Logger: e.Logger,
		Message: e.Message, Fields: e.Fields}); err != nil {
		l.log.Warn("append to sandbox log", "sandbox", id, "err", err)
	}
}

// End is Append: the retention counts from the record's end (DeleteSandboxLogsBefore).
func (l sharedLogs) End(id string, e sandboxlog.Entry) { l.Append(id, e) }

func (l sharedLogs) Query(id string, q sandboxlog.Query) ([]sandboxlog.Entry, error) {
	es, found, err := l.st.QuerySandboxLog(context.Background(), id, store.LogQuery{Cursor: q.Cursor, Backward: q.Backward,
		Limit: q.Limit, MinLevel: int(q.MinLevel), Search: q.Search})
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, sandboxlog.ErrNotFound
	}
	out := make([]sandboxlog.Entry, len(es))
	for i, e := range es {
		out[i] = sandboxlog.Entry{Time: e.Time, Level: sandboxlog.Level(e.Level), Logger: e.Logger, Message: e.Message, Fields: e.Fields}
	}
	return out, nil
}
