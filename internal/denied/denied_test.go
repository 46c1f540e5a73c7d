package denied

import (
	"fmt"
	"testing"
	"time"
)

func ev(dst string) Event {
	return Event{SandboxID: "sb1", Proto: "tcp", Dst: dst, Port: 443, Stage: "denyOut", Rule: "0.0.0.0/0"}
}

func next(t *testing.T, s *Sub) Event {
	t.Helper()
	select {
	case e := <-s.C():
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
		return Event{}
	}
}

// The first refusal goes out at once; repeats within the window become one line with their
// count when it closes; another destination is its own burst; other sandboxes see nothing.
func TestRepeatsCollapse(t *testing.T) {
	h := New(200*time.Millisecond, 10)
	_, s, cancel := h.Subscribe("sb1")
	defer cancel()
	_, other, cancelOther := h.Subscribe("sb2")
	defer cancelOther()
	for range 5 {
		h.Publish(ev("203.0.113.10"))
	}
	h.Publish(ev("203.0.113.11"))
	if e := next(t, s); e.Dst != "203.0.113.10" || e.Count != 1 || e.Repeats {
		t.Fatalf("first: %+v", e)
	}
	if e := next(t, s); e.Dst != "203.0.113.11" || e.Count != 1 {
		t.Fatalf("second destination: %+v", e)
	}
	if e := next(t, s); e.Dst != "203.0.113.10" || e.Count != 4 || !e.Repeats {
		t.Fatalf("summary: %+v", e)
	}
	select {
	case e := <-s.C():
		t.Fatalf("unexpected %+v (a burst of one has no summary)", e)
	case <-time.After(400 * time.Millisecond):
	}
	select {
	case e := <-other.C():
		t.Fatalf("another sandbox saw %+v", e)
	default:
	}
	// After the window, the same refusal starts a new burst.
	h.Publish(ev("203.0.113.10"))
	if e := next(t, s); e.Count != 1 {
		t.Fatalf("new burst: %+v", e)
	}
}

func TestBacklogIsBoundedAndForgotten(t *testing.T) {
	h := New(time.Millisecond, 3)
	for i := range 5 {
		h.Publish(ev("198.51.100." + string(rune('0'+i))))
	}
	r := h.Recent("sb1")
	if len(r) != 3 || r[0].Dst != "198.51.100.2" || r[2].Dst != "198.51.100.4" {
		t.Fatalf("backlog %+v", r)
	}
	backlog, _, cancel := h.Subscribe("sb1")
	cancel()
	if len(backlog) != 3 {
		t.Fatalf("subscribe backlog %d", len(backlog))
	}
	h.Forget("sb1")
	if len(h.Recent("sb1")) != 0 {
		t.Fatal("forgotten sandbox kept its backlog")
	}
}

// A watcher that does not read loses events; publishing never blocks.
func TestSlowWatcherNeverBlocks(t *testing.T) {
	h := New(time.Millisecond, 10)
	_, s, cancel := h.Subscribe("sb1")
	defer cancel()
	done := make(chan struct{})
	go func() {
		for i := range subBuffer * 3 {
			h.Publish(Event{SandboxID: "sb1", Proto: "udp", Dst: "x", Port: uint16(i + 1), Stage: "denyOut"})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked on a slow watcher")
	}
	if len(s.C()) != subBuffer {
		t.Fatalf("buffered %d", len(s.C()))
	}
}

// BenchmarkPublish is the cost an enforcement point pays per refusal when nobody watches: one
// first-of-burst event, then repeats that are only counted.
func BenchmarkPublish(b *testing.B) {
	h := New(time.Minute, DefaultBacklog)
	e := ev("203.0.113.10")
	for b.Loop() {
		h.Publish(e)
	}
}

// The tap sees every line the hub emits, first refusals and repeat summaries, of every sandbox.
func TestTapSeesEveryLine(t *testing.T) {
	h := New(100*time.Millisecond, 10)
	got := make(chan Event, 10)
	h.SetTap(func(e Event) { got <- e })
	for range 3 {
		h.Publish(ev("203.0.113.10"))
	}
	other := ev("203.0.113.12")
	other.SandboxID = "sb2"
	h.Publish(other)
	want := []string{"sb1 203.0.113.10 1 false", "sb2 203.0.113.12 1 false", "sb1 203.0.113.10 2 true"}
	for _, w := range want {
		select {
		case e := <-got:
			if g := fmt.Sprint(e.SandboxID, " ", e.Dst, " ", e.Count, " ", e.Repeats); g != w {
				t.Errorf("tap got %q, want %q", g, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("tap missed %q", w)
		}
	}
}
