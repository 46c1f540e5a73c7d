// Package denied owns the stream of what a node refused a sandbox (seed 002, "Seeing what was
// blocked"): refusal events from every enforcement point (the kernel's CIDR rules through NFLOG,
// the transparent egress proxy), repeats of the same refusal within a window collapsed into one
// line with a count, a short backlog per sandbox, and fan-out to whoever watches. It must never
// decide anything: it reports what the firewall and the proxy already did. Publishing costs a map
// lookup and a ring-buffer write; with nobody watching nothing else happens.
package denied

import (
	"sync"
	"time"
)

// Event is one refusal, or a summary of its repeats (Count > 1).
type Event struct {
	Time      time.Time `json:"time"`
	SandboxID string    `json:"sandboxID"`
	Proto     string    `json:"proto"`
	Dst       string    `json:"dst"`
	Port      uint16    `json:"port,omitempty"`
	// Name is the SNI, Host or DNS question of the flow, when it had one.
	Name string `json:"name,omitempty"`
	// Stage is the precedence step that refused it (egress.Stage, or "dns").
	Stage string `json:"stage"`
	Rule  string `json:"rule,omitempty"`
	// Count is how many refusals this line stands for: 1 for the first of a burst, the number of
	// repeats for the line that closes it.
	Count int `json:"count"`
	// Repeats marks the line that closes a burst: Count repeats of the refusal above it were
	// suppressed within the window.
	Repeats bool `json:"repeats,omitempty"`
}

// key identifies "the same refusal".
type key struct {
	sandbox, proto, dst, name, stage string
	port                             uint16
}

func keyOf(e Event) key {
	return key{e.SandboxID, e.Proto, e.Dst, e.Name, e.Stage, e.Port}
}

// Defaults.
const (
	DefaultWindow  = 3 * time.Second
	DefaultBacklog = 256
	// subBuffer bounds what a slow watcher may fall behind by; it loses events, never blocks
	// the enforcement points.
	subBuffer = 256
)

// Hub collects events and hands them to watchers.
type Hub struct {
	window  time.Duration
	backlog int
	now     func() time.Time

	mu sync.Mutex
	// +checklocks:mu
	bursts map[key]*burst
	// +checklocks:mu
	recent map[string][]Event
	// +checklocks:mu
	subs map[string]map[*Sub]struct{}
	// +checklocks:mu
	tap func(Event)
}

type burst struct {
	first   Event
	repeats int
	timer   *time.Timer
}

// New returns a hub that collapses repeats within window and keeps backlog events per sandbox.
func New(window time.Duration, backlog int) *Hub {
	if window <= 0 {
		window = DefaultWindow
	}
	if backlog <= 0 {
		backlog = DefaultBacklog
	}
	return &Hub{window: window, backlog: backlog, now: time.Now,
		bursts: map[key]*burst{}, recent: map[string][]Event{}, subs: map[string]map[*Sub]struct{}{}}
}

// Publish records a refusal. The first of a burst goes out at once; repeats within the window
// are counted and go out as one line when the window closes.
func (h *Hub) Publish(e Event) {
	if e.Time.IsZero() {
		e.Time = h.now()
	}
	e.Count = 1
	k := keyOf(e)
	h.mu.Lock()
	defer h.mu.Unlock()
	if b, ok := h.bursts[k]; ok {
		b.repeats++
		return
	}
	b := &burst{first: e}
	h.bursts[k] = b
	b.timer = time.AfterFunc(h.window, func() { h.close(k, b) })
	h.emitLocked(e)
}

// close ends a burst: its repeats, if any, go out as one line.
func (h *Hub) close(k key, b *burst) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bursts[k] != b {
		return
	}
	delete(h.bursts, k)
	if b.repeats == 0 {
		return
	}
	e := b.first
	e.Time, e.Count, e.Repeats = h.now(), b.repeats, true
	h.emitLocked(e)
}

// +checklocks:h.mu
func (h *Hub) emitLocked(e Event) {
	r := append(h.recent[e.SandboxID], e)
	if len(r) > h.backlog {
		r = r[len(r)-h.backlog:]
	}
	h.recent[e.SandboxID] = r
	if h.tap != nil {
		h.tap(e)
	}
	for s := range h.subs[e.SandboxID] {
		select {
		case s.ch <- e:
		default: // a watcher that does not keep up loses events; the publisher never waits
		}
	}
}

// SetTap makes every line the hub emits, for every sandbox, go to f too (the sandboxes' logs). f
// runs with the hub's lock held, so it must not block: hand the event on and return.
func (h *Hub) SetTap(f func(Event)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tap = f
}

// Sub is one watcher of a sandbox.
type Sub struct {
	ch chan Event
}

// C delivers events as they happen.
func (s *Sub) C() <-chan Event { return s.ch }

// Subscribe returns the sandbox's recent events and a subscription to the next ones; cancel ends
// it.
func (h *Hub) Subscribe(sandboxID string) (backlog []Event, sub *Sub, cancel func()) {
	s := &Sub{ch: make(chan Event, subBuffer)}
	h.mu.Lock()
	defer h.mu.Unlock()
	backlog = append([]Event(nil), h.recent[sandboxID]...)
	if h.subs[sandboxID] == nil {
		h.subs[sandboxID] = map[*Sub]struct{}{}
	}
	h.subs[sandboxID][s] = struct{}{}
	return backlog, s, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs[sandboxID], s)
		if len(h.subs[sandboxID]) == 0 {
			delete(h.subs, sandboxID)
		}
	}
}

// Recent returns the sandbox's recent events, oldest first.
func (h *Hub) Recent(sandboxID string) []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.recent[sandboxID]...)
}

// Forget drops a sandbox's backlog (it was killed); watchers stay until they cancel.
func (h *Hub) Forget(sandboxID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.recent, sandboxID)
	for k, b := range h.bursts {
		if k.sandbox == sandboxID {
			b.timer.Stop()
			delete(h.bursts, k)
		}
	}
}
