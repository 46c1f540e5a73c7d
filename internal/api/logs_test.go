package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/sandboxlog"
)

type logsV2Body struct {
	Logs []struct {
		Timestamp time.Time         `json:"timestamp"`
		Level     string            `json:"level"`
		Message   string            `json:"message"`
		Fields    map[string]string `json:"fields"`
	} `json:"logs"`
}

func newLogsEnv(t *testing.T) (*env, *sandboxlog.Store) {
	t.Helper()
	logs, err := sandboxlog.Open(sandboxlog.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envOpts{driver: func(o *driver.Options) { o.Logs = logs }})
	return e, logs
}

func (e *env) logsV2(t *testing.T, id, query string) logsV2Body {
	t.Helper()
	w := e.do("GET", "/v2/sandboxes/"+id+"/logs"+query, "")
	if w.Code != http.StatusOK {
		t.Fatalf("logs %s: %d %s", query, w.Code, w.Body)
	}
	var b logsV2Body
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLogsLifecycleThroughBothVersions(t *testing.T) {
	e, _ := newLogsEnv(t)
	id := e.create(t, `{"templateID":"base","envVars":{"SECRET_TOKEN":"hunter2-value"}}`)["sandboxID"].(string)
	if w := e.do("POST", "/sandboxes/"+id+"/timeout", `{"timeout":600}`); w.Code != http.StatusNoContent {
		t.Fatalf("timeout: %d %s", w.Code, w.Body)
	}
	if w := e.do("DELETE", "/sandboxes/"+id, ""); w.Code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", w.Code, w.Body)
	}
	// An ended sandbox's logs are still served.
	b := e.logsV2(t, id, "")
	var got []string
	for _, l := range b.Logs {
		got = append(got, l.Level+" "+l.Message)
		if l.Fields["logger"] != "lifecycleSvc" {
			t.Errorf("entry %q: logger %q", l.Message, l.Fields["logger"])
		}
	}
	want := []string{"info sandbox created from template base", "info sandbox timeout changed: it ends in 600 s",
		"info sandbox killed by request"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("entries %q, want %q", got, want)
	}
	if f := b.Logs[0].Fields; f["template"] != baseID || f["cpu"] != "2" || f["memoryMB"] != "512" {
		t.Errorf("created fields %v", f)
	}
	if b.Logs[2].Fields["reason"] != driver.ReasonUser {
		t.Errorf("killed fields %v", b.Logs[2].Fields)
	}
	w := e.do("GET", "/sandboxes/"+id+"/logs?start=0", "")
	if w.Code != http.StatusOK {
		t.Fatalf("v1: %d %s", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), "hunter2") {
		t.Fatal("an environment value reached the logs")
	}
	var v1 struct {
		Logs []struct {
			Timestamp time.Time `json:"timestamp"`
			Line      string    `json:"line"`
		} `json:"logs"`
		LogEntries []map[string]any `json:"logEntries"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &v1); err != nil {
		t.Fatal(err)
	}
	if len(v1.Logs) != 3 || len(v1.LogEntries) != 3 {
		t.Fatalf("v1: %s", w.Body)
	}
	for i, l := range v1.Logs {
		var line map[string]string
		if err := json.Unmarshal([]byte(l.Line), &line); err != nil {
			t.Fatalf("v1 line %q is not a JSON object: %v", l.Line, err)
		}
		if line["level"] != b.Logs[i].Level || line["logger"] != "lifecycleSvc" || line["message"] != b.Logs[i].Message {
			t.Errorf("v1 line %q, v2 entry %+v", l.Line, b.Logs[i])
		}
		if !l.Timestamp.Equal(b.Logs[i].Timestamp) {
			t.Errorf("v1 timestamp %v, v2 %v", l.Timestamp, b.Logs[i].Timestamp)
		}
	}
	// start is inclusive and in milliseconds.
	from := b.Logs[1].Timestamp.UnixMilli()
	w = e.do("GET", fmt.Sprintf("/sandboxes/%s/logs?start=%d&limit=1", id, from), "")
	if err := json.Unmarshal(w.Body.Bytes(), &v1); err != nil || len(v1.Logs) != 1 || !strings.Contains(v1.Logs[0].Line, "timeout changed") {
		t.Errorf("v1 start+limit: %s", w.Body)
	}
}

func TestLogsV2PagingAndFilters(t *testing.T) {
	e, logs := newLogsEnv(t)
	id := e.create(t, `{"templateID":"base"}`)["sandboxID"].(string)
	for i := range 30 {
		lvl := sandboxlog.LevelInfo
		if i%3 == 0 {
			lvl = sandboxlog.LevelWarn
		}
		logs.Append(id, sandboxlog.Entry{Time: t0, Level: lvl, Logger: "egressSvc", Message: fmt.Sprint("refused ", i)})
	}
	all := e.logsV2(t, id, "")
	if len(all.Logs) != 31 {
		t.Fatalf("%d entries, want 31", len(all.Logs))
	}
	for _, dir := range []string{"forward", "backward"} {
		seen := map[string]int{}
		cursor := ""
		for range 100 {
			b := e.logsV2(t, id, "?limit=4&direction="+dir+cursor)
			if len(b.Logs) == 0 {
				break
			}
			for _, l := range b.Logs {
				seen[l.Message]++
			}
			last := b.Logs[len(b.Logs)-1].Timestamp.UnixMilli()
			if dir == "forward" {
				cursor = fmt.Sprintf("&cursor=%d", last+1)
			} else {
				cursor = fmt.Sprintf("&cursor=%d", last-1)
			}
		}
		if len(seen) != 31 {
			t.Errorf("%s: %d distinct entries, want 31", dir, len(seen))
		}
		for m, n := range seen {
			if n != 1 {
				t.Errorf("%s: %q seen %d times", dir, m, n)
			}
		}
	}
	if b := e.logsV2(t, id, "?level=warn"); len(b.Logs) != 10 {
		t.Errorf("level=warn: %d entries, want 10", len(b.Logs))
	}
	if b := e.logsV2(t, id, "?search=refused%202&level=warn"); len(b.Logs) != 3 {
		t.Errorf("search: %d entries, want 3 (21, 24, 27)", len(b.Logs))
	}
	if b := e.logsV2(t, id, "?limit=0"); len(b.Logs) != 0 {
		t.Errorf("limit=0: %d entries", len(b.Logs))
	}
}

func TestLogsBadParamsAndUnknown(t *testing.T) {
	e, _ := newLogsEnv(t)
	id := e.create(t, `{"templateID":"base"}`)["sandboxID"].(string)
	for _, c := range []struct{ query, msg string }{
		{"?limit=5000", "limit must be at most 1000"},
		{"?limit=-1", "limit must be a non-negative integer"},
		{"?limit=ten", "limit must be a non-negative integer"},
		{"?cursor=-5", "cursor must be a non-negative integer"},
		{"?direction=sideways", "direction must be forward or backward"},
		{"?level=fatal", "level must be debug, info, warn or error"},
		{"?search=" + strings.Repeat("x", 257), "search must be at most 256 characters"},
	} {
		wantError(t, e.do("GET", "/v2/sandboxes/"+id+"/logs"+c.query, ""), http.StatusBadRequest, c.msg)
	}
	// 256 characters (not bytes) is fine.
	e.logsV2(t, id, "?search="+strings.Repeat("é", 256))
	wantError(t, e.do("GET", "/sandboxes/"+id+"/logs?start=soon", ""), http.StatusBadRequest, "start must be")
	wantError(t, e.do("GET", "/v2/sandboxes/nosuchsandbox000000/logs", ""), http.StatusNotFound, "not found")
	wantError(t, e.do("GET", "/sandboxes/nosuchsandbox000000/logs", ""), http.StatusNotFound, "not found")
}

func TestLogsNotConfigured(t *testing.T) {
	e := newEnv(t, envOpts{})
	id := e.create(t, `{"templateID":"base"}`)["sandboxID"].(string)
	wantError(t, e.do("GET", "/v2/sandboxes/"+id+"/logs", ""), http.StatusNotImplemented, "sandbox logs")
}
