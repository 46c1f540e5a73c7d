package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/envd/gen/process/processconnect"
	"github.com/vibemon/vmon/internal/envd/journal"
	"github.com/vibemon/vmon/internal/envd/server"
)

// TestProcessJournal: starts and exits reach the events stream with the sandbox of the last
// /init, at the level a reader looks for, without environment values; the start command's
// output is logged line by line; the node's own commands only at debug.
func TestProcessJournal(t *testing.T) {
	jr := journal.New()
	srv, err := server.New(server.Options{Journal: jr})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	defer srv.Close()
	e := &env{url: ts.URL, procBin: processconnect.NewProcessClient(ts.Client(), ts.URL)}
	e.initEnvd(t, map[string]any{"accessToken": "tok", "vmonSandboxID": "sbx1", "envVars": map[string]string{"SECRET": "s3cret-value"}})
	req := connect.NewRequest(shell("echo $SECRET; exit 3"))
	req.Header().Set("X-Access-Token", "tok")
	if r := runCmd(t, e.procBin, req); r.end.GetExitCode() != 3 {
		t.Fatalf("exit %v", r.end)
	}
	req = connect.NewRequest(shell("kill -9 $$"))
	req.Header().Set("X-Access-Token", "tok")
	runCmd(t, e.procBin, req)
	tag := agentproto.StartCmdTag
	start := shell("echo first line; echo 'to stderr' >&2; printf 'no newline'")
	start.Tag = &tag
	req = connect.NewRequest(start)
	req.Header().Set("X-Access-Token", "tok")
	runCmd(t, e.procBin, req)
	internal := agentproto.InternalTagPrefix + "sync"
	sync := shell("true")
	sync.Tag = &internal
	req = connect.NewRequest(sync)
	req.Header().Set("X-Access-Token", "tok")
	runCmd(t, e.procBin, req)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+agentproto.EventsPath, nil)
	resp, err := ts.Client().Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("events without the token: %s", resp.Status)
	}
	hreq.Header.Set("X-Access-Token", "tok")
	resp, err = ts.Client().Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got []string
	var evs []agentproto.GuestEvent
	sc := bufio.NewScanner(resp.Body)
	// 4 processes: 8 starts and ends, and 3 output lines.
	for len(evs) < 11 && sc.Scan() {
		var ev agentproto.GuestEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
		got = append(got, ev.Level+" "+ev.Logger+" "+ev.Message)
		if strings.Contains(sc.Text(), "s3cret-value") {
			t.Fatalf("an environment value reached the journal: %s", sc.Text())
		}
		if ev.Sandbox != "sbx1" {
			t.Fatalf("event of sandbox %q", ev.Sandbox)
		}
	}
	if len(evs) < 11 {
		t.Fatalf("got %d events: %s", len(evs), strings.Join(got, "\n"))
	}
	text := strings.Join(got, "\n")
	for _, want := range []string{
		"info processSvc process \\d+ started: echo \\$SECRET; exit 3",
		"warn processSvc process \\d+ exited with code 3: echo \\$SECRET; exit 3",
		"warn processSvc process \\d+ was killed by SIGKILL: kill -9 \\$\\$",
		"info processSvc first line",
		"warn processSvc to stderr",
		"info processSvc no newline",
		"debug processSvc process \\d+ started: true",
		"debug processSvc process \\d+ exited with code 0: true",
	} {
		if !regexpMatch(want, text) {
			t.Errorf("no line matching %q in:\n%s", want, text)
		}
	}
	for _, ev := range evs {
		if strings.Contains(ev.Message, "exited with code 3") {
			if ev.Fields["exitCode"] != "3" || ev.Fields["pid"] == "" {
				t.Errorf("exit fields %v", ev.Fields)
			}
		}
		if strings.Contains(ev.Message, "killed by") && ev.Fields["signal"] != "SIGKILL" {
			t.Errorf("kill fields %v", ev.Fields)
		}
		if strings.Contains(ev.Message, "started: echo $SECRET") && (ev.Fields["user"] != "root" || ev.Fields["cmd"] != "/bin/bash") {
			t.Errorf("start fields %v", ev.Fields)
		}
		if ev.Message == "first line" && (ev.Fields["stream"] != "stdout" || ev.Fields["source"] != "start command") {
			t.Errorf("output fields %v", ev.Fields)
		}
	}
}

func regexpMatch(re, s string) bool {
	for _, l := range strings.Split(s, "\n") {
		if regexp.MustCompile("^" + re + "$").MatchString(l) {
			return true
		}
	}
	return false
}
