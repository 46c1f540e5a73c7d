package journal

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
)

func TestSinceAndLost(t *testing.T) {
	j := newJournal(3, time.Now)
	j.SetSandbox("a")
	j.Add("info", ProcessLogger, "one", nil)
	j.SetSandbox("b")
	for _, m := range []string{"two", "three", "four", "five"} {
		j.Add("info", ProcessLogger, m, nil)
	}
	evs, lost, lostSB, _ := j.Since(0)
	if lost != 2 || lostSB != "b" {
		t.Fatalf("lost %d (sandbox %q), want 2 of b", lost, lostSB)
	}
	if len(evs) != 3 || evs[0].Message != "three" || evs[0].Seq != 3 || evs[2].Seq != 5 {
		t.Fatalf("events %+v", evs)
	}
	if evs[0].Sandbox != "b" {
		t.Fatalf("sandbox stamp %q", evs[0].Sandbox)
	}
	evs, lost, _, _ = j.Since(4)
	if lost != 0 || len(evs) != 1 || evs[0].Message != "five" {
		t.Fatalf("since 4: %+v lost %d", evs, lost)
	}
	evs, _, _, wake := j.Since(5)
	if len(evs) != 0 {
		t.Fatalf("since the last: %+v", evs)
	}
	j.Add("warn", LimitsLogger, "six", map[string]string{"k": strings.Repeat("x", 5000)})
	select {
	case <-wake:
	default:
		t.Fatal("Add did not wake a reader")
	}
	evs, _, _, _ = j.Since(5)
	if len(evs[0].Fields["k"]) > maxField+len("…") {
		t.Fatalf("field not clipped: %d bytes", len(evs[0].Fields["k"]))
	}
}

func readEvents(t *testing.T, url string, n int) ([]agentproto.GuestEvent, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	var out []agentproto.GuestEvent
	for len(out) < n && sc.Scan() {
		var ev agentproto.GuestEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		out = append(out, ev)
	}
	if len(out) < n {
		t.Fatalf("read %d events, want %d (%v)", len(out), n, sc.Err())
	}
	return out, resp.Header.Get(agentproto.BootHeader)
}

func TestServeStreamsAndResumes(t *testing.T) {
	j := newJournal(4, time.Now)
	j.SetSandbox("sb")
	srv := httptest.NewServer(j)
	defer srv.Close()
	j.Add("info", ProcessLogger, "first", nil)
	go func() {
		time.Sleep(50 * time.Millisecond)
		j.Add("info", ProcessLogger, "second", nil)
	}()
	// A reader of another boot reads from the start; the stream carries what comes later.
	evs, boot := readEvents(t, srv.URL+"?after=7&boot=other", 2)
	if boot != j.Boot() || evs[0].Message != "first" || evs[1].Message != "second" {
		t.Fatalf("boot %q events %+v", boot, evs)
	}
	// The same boot resumes after its cursor.
	j.Add("info", ProcessLogger, "third", nil)
	evs, _ = readEvents(t, srv.URL+"?after=2&boot="+j.Boot(), 1)
	if evs[0].Message != "third" {
		t.Fatalf("resumed at %+v", evs)
	}
	// A reader that fell behind the ring hears how much it lost, once, with the last lost Seq.
	for i := 0; i < 6; i++ {
		j.Add("info", ProcessLogger, "more", nil)
	}
	evs, _ = readEvents(t, srv.URL+"?after=1&boot="+j.Boot(), 2)
	if evs[0].Level != "warn" || evs[0].Fields["lost"] != "4" || evs[0].Seq != 5 || evs[1].Seq != 6 {
		t.Fatalf("lost notice %+v then %+v", evs[0], evs[1])
	}
	resp, err := http.Get(srv.URL + "?after=x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad after: %s", resp.Status)
	}
}

// A drain carries what is held and ends, without waiting out the coalescing.
func TestServeDrain(t *testing.T) {
	j := newJournal(4, time.Now)
	j.coalesce = time.Hour
	j.SetSandbox("sb")
	srv := httptest.NewServer(j)
	defer srv.Close()
	for _, m := range []string{"one", "two", "three"} {
		j.Add("info", ProcessLogger, m, nil)
	}
	resp, err := http.Get(srv.URL + "?drain=1&after=1&boot=" + j.Boot())
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"two"`) || !strings.Contains(lines[1], `"three"`) {
		t.Fatalf("drain read %q", body)
	}
}
