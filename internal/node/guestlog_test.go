package node

import (
	"fmt"
	"strings"
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
	if got := sanitize(agentproto.GuestEvent{Logger: "processSvc"}).Logger; got != "processSvc" {
		t.Errorf("envd's logger renamed to %q", got)
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
