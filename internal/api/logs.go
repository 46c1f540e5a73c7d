package api

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/sandboxlog"
)

// Bounds of the logs API's parameters, as E2B's spec states them.
const (
	logsDefaultLimit = 1000
	logsMaxLimit     = 1000
	logsMaxSearch    = 256
	// logsV1MaxLimit bounds v1's limit, which the spec leaves unbounded: a log holds about
	// --sandbox-log-max-bytes of entries anyway.
	logsV1MaxLimit = 100000
)

// logEntryJSON is E2B's SandboxLogEntry.
type logEntryJSON struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logLineJSON is E2B's SandboxLog: a line that E2B's CLI parses as a JSON object with at least
// level and logger.
type logLineJSON struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

func entryJSON(e sandboxlog.Entry) logEntryJSON {
	fields := map[string]string{}
	for k, v := range e.Fields {
		fields[k] = v
	}
	// v2 carries the logger as a field, so its entries say what v1's lines say.
	if e.Logger != "" {
		fields["logger"] = e.Logger
	}
	return logEntryJSON{Timestamp: e.Time.UTC(), Level: e.Level.String(), Message: e.Message, Fields: fields}
}

// lineOf renders an entry as the JSON object E2B's envd writes (zerolog's shape): the entry's
// fields, then level, logger, message and time, which a field of the same name cannot replace.
func lineOf(e sandboxlog.Entry) string {
	m := make(map[string]string, len(e.Fields)+4)
	for k, v := range e.Fields {
		m[k] = v
	}
	m["level"], m["logger"], m["message"] = e.Level.String(), e.Logger, e.Message
	m["time"] = e.Time.UTC().Format(time.RFC3339Nano)
	b, err := json.Marshal(m)
	if err != nil {
		return `{"level":"error","logger":"logsSvc","message":"unencodable log entry"}`
	}
	return string(b)
}

// intParam reads an optional non-negative integer query parameter (def when absent).
func intParam(q url.Values, name string, def, maxV int64) (int64, error) {
	s := q.Get(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, errdefs.InvalidArgument("%s must be a non-negative integer, got %q", name, errdefs.Clip(s))
	}
	if maxV > 0 && v > maxV {
		return 0, errdefs.InvalidArgument("%s must be at most %d, got %d", name, maxV, v)
	}
	return v, nil
}

// logsV1 is GET /sandboxes/{id}/logs: entries from `start` (ms) on, oldest first, as lines and as
// structured entries.
func (s *Server) logsV1(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	start, err := intParam(q, "start", 0, 0)
	if err != nil {
		return err
	}
	limit, err := intParam(q, "limit", logsDefaultLimit, logsV1MaxLimit)
	if err != nil {
		return err
	}
	out := struct {
		Logs       []logLineJSON  `json:"logs"`
		LogEntries []logEntryJSON `json:"logEntries"`
	}{Logs: []logLineJSON{}, LogEntries: []logEntryJSON{}}
	// E2B's spec allows limit 0: no entries, but the sandbox must still exist (404 otherwise).
	es, err := s.driver.Logs(r.Context(), r.PathValue("id"), sandboxlog.Query{Cursor: start, Limit: max(int(limit), 1)})
	if err != nil {
		return err
	}
	if limit == 0 {
		es = nil
	}
	for _, e := range es {
		out.Logs = append(out.Logs, logLineJSON{Timestamp: e.Time.UTC(), Line: lineOf(e)})
		out.LogEntries = append(out.LogEntries, entryJSON(e))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// logsV2 is GET /v2/sandboxes/{id}/logs: `cursor` (ms, inclusive), `limit` (≤ 1000),
// `direction` (forward from the cursor, oldest first; backward from it, newest first), `level`
// (minimum) and `search` (case-sensitive substring of the message).
func (s *Server) logsV2(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	cursor, err := intParam(q, "cursor", 0, 0)
	if err != nil {
		return err
	}
	limit, err := intParam(q, "limit", logsDefaultLimit, logsMaxLimit)
	if err != nil {
		return err
	}
	query := sandboxlog.Query{Cursor: cursor, Limit: int(limit)}
	switch d := q.Get("direction"); d {
	case "", "forward":
	case "backward":
		query.Backward = true
	default:
		return errdefs.InvalidArgument("direction must be forward or backward, got %q", errdefs.Clip(d))
	}
	if l := q.Get("level"); l != "" {
		if query.MinLevel, err = sandboxlog.ParseLevel(l); err != nil {
			return errdefs.InvalidArgument("level must be debug, info, warn or error, got %q", errdefs.Clip(l))
		}
	}
	query.Search = q.Get("search")
	if n := utf8.RuneCountInString(query.Search); n > logsMaxSearch {
		return errdefs.InvalidArgument("search must be at most %d characters, got %d", logsMaxSearch, n)
	}
	out := struct {
		Logs []logEntryJSON `json:"logs"`
	}{Logs: []logEntryJSON{}}
	query.Limit = max(query.Limit, 1)
	es, err := s.driver.Logs(r.Context(), r.PathValue("id"), query)
	if err != nil {
		return err
	}
	if limit == 0 {
		es = nil
	}
	for _, e := range es {
		out.Logs = append(out.Logs, entryJSON(e))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
