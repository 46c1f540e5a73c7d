package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
)

func TestSanitizeBoundsAGuestsEvent(t *testing.T) {
	f := map[string]string{strings.Repeat("k", 100): "long key"}
	for i := 0; i < 40; i++ {
		f[fmt.Sprintf("f%02d", i)] = "v"
	}
	e := sanitize(agentproto.GuestEvent{Logger: "lifecycleSvcButNotReallyAndVeryLong", Fields: f})
	if e.Logger != "guestSvc" {
		t.Errorf("logger %q", e.Logger)
	}
	if len(e.Fields) > maxEventFields {
		t.Errorf("%d fields kept", len(e.Fields))
	}
	for k := range e.Fields {
		if len(k) > maxFieldKey {
			t.Errorf("long key kept")
		}
	}
	for _, l := range []string{agentproto.ProcessLogger, agentproto.LimitsLogger} {
		if got := sanitize(agentproto.GuestEvent{Logger: l}).Logger; got != l {
			t.Errorf("envd's logger %q renamed to %q", l, got)
		}
	}
	// The host's loggers: a guest that replaced envd must not pass its events off as the host's.
	for _, l := range []string{"lifecycleSvc", "egressSvc", "logsSvc", "fooSvc"} {
		if got := sanitize(agentproto.GuestEvent{Logger: l}).Logger; got != "guestSvc" {
			t.Errorf("a guest's event kept the logger %q", got)
		}
	}
	for b, ok := range map[string]bool{"0123abcdef": true, "": false, "a b": false, "x\n1": false, strings.Repeat("a", 65): false} {
		if validBoot(b) != ok {
			t.Errorf("validBoot(%q) = %v", b, !ok)
		}
	}
}

func TestGuestGateCapsTheRate(t *testing.T) {
	now := time.Now()
	g := newGuestGate(now)
	admitted := 0
	for i := 0; i < 5000; i++ {
		if g.admit(now) {
			admitted++
		}
	}
	if admitted != guestBurst {
		t.Fatalf("a burst of 5000 admitted %d, want %d", admitted, guestBurst)
	}
	note, ok := g.report(now.Add(2 * time.Second))
	if !ok || note.Fields["dropped"] != "4000" || note.Level != "warn" {
		t.Fatalf("report %+v %v", note, ok)
	}
	if _, ok := g.report(now.Add(2 * time.Second)); ok {
		t.Fatal("reported twice")
	}
	// A second later, guestRate more.
	later := now.Add(time.Second)
	admitted = 0
	for i := 0; i < 1000; i++ {
		if g.admit(later) {
			admitted++
		}
	}
	if admitted != guestRate {
		t.Fatalf("after a second %d admitted, want %d", admitted, guestRate)
	}
}

// recordingLog is a GuestLog that keeps what it is given and counts how often a follower
// (re)connected, which reads the cursor first.
type recordingLog struct {
	mu      sync.Mutex
	kept    []agentproto.GuestEvent
	cursors int
	boot    string
	seq     uint64
}

func (r *recordingLog) GuestCursor(string) (string, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cursors++
	return r.boot, r.seq
}

func (r *recordingLog) GuestEvents(_, boot string, last uint64, evs []agentproto.GuestEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kept = append(r.kept, evs...)
	r.boot, r.seq = boot, last
}

func (r *recordingLog) counts() (guest, cursors int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.kept {
		if e.Logger != "logsSvc" {
			guest++
		}
	}
	return guest, r.cursors
}

// A guest root that replaces envd with a server ending its stream after every burst must not
// get a fresh burst with each new stream: the rate cap is the sandbox's, not one stream's.
func TestGuestRateHoldsAcrossReconnects(t *testing.T) {
	e := newEnv(t)
	rec := &recordingLog{}
	e.guestLog = rec
	var seq atomic.Uint64
	e.rt.events = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(agentproto.BootHeader, "hostile")
		enc := json.NewEncoder(w)
		for range guestBurst {
			_ = enc.Encode(agentproto.GuestEvent{Seq: seq.Add(1), Sandbox: "flood", Time: time.Now(),
				Level: "info", Logger: "processSvc", Message: "flood"})
		}
	})
	n := e.node(t, nil)
	began := time.Now()
	if _, err := n.CreateSandbox(context.Background(), spec("flood")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a few streams", func() bool { _, c := rec.counts(); return c >= 5 })
	time.Sleep(500 * time.Millisecond)
	if err := n.DestroySandbox(context.Background(), "flood"); err != nil {
		t.Fatal(err)
	}
	kept, streams := rec.counts()
	allowed := guestBurst + int(time.Since(began).Seconds()*guestRate) + 1
	if kept > allowed {
		t.Fatalf("%d events kept over %d streams in %v; the cap allows %d", kept, streams, time.Since(began).Round(time.Millisecond), allowed)
	}
}

// A follower started for a sandbox that is already being torn down (its handing out raced a
// destroy, or its runtime died) must not go on dialling it until the node closes.
func TestNoFollowerForATornDownSandbox(t *testing.T) {
	e := newEnv(t)
	rec := &recordingLog{}
	e.guestLog = rec
	n := e.node(t, nil)
	if _, err := n.CreateSandbox(context.Background(), spec("gone")); err != nil {
		t.Fatal(err)
	}
	sb, ok := n.lookup("gone")
	if !ok {
		t.Fatal("no sandbox")
	}
	if err := n.DestroySandbox(context.Background(), "gone"); err != nil {
		t.Fatal(err)
	}
	// The order a create racing a destroy can produce: the teardown first, then the follower.
	n.followGuest(sb)
	time.Sleep(100 * time.Millisecond)
	_, before := rec.counts()
	time.Sleep(700 * time.Millisecond)
	if _, after := rec.counts(); after != before {
		t.Fatalf("a torn-down sandbox is still followed: %d more attempts", after-before)
	}
}

// A guest that streams events of another sandbox as fast as it can (none are logged) must cost
// the node neither a decode per line it cares to send nor a cursor write per burst.
func TestSkippedFloodIsPacedAndCursorWritesAreBounded(t *testing.T) {
	e := newEnv(t)
	rec := &recordingLog{}
	cl := &callCounter{GuestLog: rec}
	e.guestLog = cl
	var seq atomic.Uint64
	e.rt.events = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(agentproto.BootHeader, "hostile")
		if r.URL.Query().Get(agentproto.EventsDrain) == "1" {
			// Nothing held back: the pace is measured by the cursor, which the lines a
			// cancelled stream left unread would move on.
			return
		}
		enc := json.NewEncoder(w)
		for r.Context().Err() == nil {
			if enc.Encode(agentproto.GuestEvent{Seq: seq.Add(1), Sandbox: "someone-else"}) != nil {
				return
			}
		}
	})
	n := e.node(t, nil)
	began := time.Now()
	if _, err := n.CreateSandbox(context.Background(), spec("skips")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := n.DestroySandbox(context.Background(), "skips"); err != nil {
		t.Fatal(err)
	}
	// Let the follower's last stream end and flush its place.
	time.Sleep(200 * time.Millisecond)
	took := time.Since(began).Seconds()
	rec.mu.Lock()
	read := rec.seq
	rec.mu.Unlock()
	if allowed := uint64(guestLineBurst + took*guestLineRate); read > allowed {
		t.Errorf("%d lines read in %.1fs; the pace allows %d", read, took, allowed)
	}
	if read < guestLineBurst {
		t.Errorf("only %d lines read", read)
	}
	if calls := cl.calls.Load(); calls > int64(took)+3 {
		t.Errorf("%d cursor writes in %.1fs for lines that were all skipped", calls, took)
	}
}

// callCounter counts GuestEvents calls (each writes the cursor).
type callCounter struct {
	GuestLog
	calls atomic.Int64
}

func (c *callCounter) GuestEvents(id, boot string, last uint64, evs []agentproto.GuestEvent) {
	c.calls.Add(1)
	c.GuestLog.GuestEvents(id, boot, last, evs)
}

// What envd still holds back when its sandbox is killed (it coalesces its events for a moment)
// reaches the log: the destroy reads once more, without waiting.
func TestDestroyDrainsTheLastEvents(t *testing.T) {
	e := newEnv(t)
	rec := &recordingLog{}
	e.guestLog = rec
	var drains atomic.Int32
	e.rt.events = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(agentproto.BootHeader, "b1")
		enc := json.NewEncoder(w)
		if r.URL.Query().Get("after") != "1" {
			_ = enc.Encode(agentproto.GuestEvent{Seq: 1, Sandbox: "last", Time: time.Now(), Level: "info", Logger: "processSvc", Message: "started"})
		}
		if r.URL.Query().Get(agentproto.EventsDrain) == "1" {
			drains.Add(1)
			_ = enc.Encode(agentproto.GuestEvent{Seq: 2, Sandbox: "last", Time: time.Now(), Level: "info", Logger: "processSvc", Message: "ended"})
			return
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	n := e.node(t, nil)
	if _, err := n.CreateSandbox(context.Background(), spec("last")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first event", func() bool { g, _ := rec.counts(); return g >= 1 })
	if err := n.DestroySandbox(context.Background(), "last"); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var msgs []string
	for _, ev := range rec.kept {
		msgs = append(msgs, ev.Message)
	}
	if drains.Load() != 1 || !slices.Equal(msgs, []string{"started", "ended"}) || rec.seq != 2 {
		t.Fatalf("drains %d, kept %q up to %d", drains.Load(), msgs, rec.seq)
	}
}
