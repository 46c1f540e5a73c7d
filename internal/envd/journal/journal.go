// Package journal keeps envd's account of what happened in the guest (processes started and
// ended, the template start command's output, limits reached) in a bounded ring in memory, and
// streams it to the node over the agent channel (agentproto.EventsPath), which copies it into
// the sandbox's log. Being memory, the ring survives a pause with memory, so nothing that
// happened just before it is lost; a reader that fell behind by more than the ring holds is told
// how many events it missed.
//
// It owns only that memory and the stream; it never writes files, and it never records an
// environment value.
package journal

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/vibemon/vmon/internal/agentproto"
)

// Capacity is how many events the ring keeps. An event is a few hundred bytes, so the ring stays
// under a MiB even when the start command's output fills it.
const Capacity = 2048

// Coalesce is how long the stream waits after an event for more before it writes: a command's
// start and end then go out together, after the command's own reply, and the sandbox's agent
// channel carries one write where it would carry several (measured: writing each event at once
// cost commands.run('true') 6 % at the median).
const Coalesce = 100 * time.Millisecond

// Bounds of one event, so a long command line or output line cannot take the ring.
const (
	maxMessage = 1024
	maxField   = 1024
)

// Loggers, named in E2B's style: its CLI strips the Svc suffix and filters by what is left. The
// node keeps only these (agentproto), so a new one is added there.
const (
	ProcessLogger = agentproto.ProcessLogger
	LimitsLogger  = agentproto.LimitsLogger
)

// Journal is safe for concurrent use.
type Journal struct {
	boot     string
	now      func() time.Time
	size     int
	coalesce time.Duration

	mu sync.Mutex
	// ring holds the events with Seq first..next-1, oldest first. +checklocks:mu
	ring []agentproto.GuestEvent
	// +checklocks:mu
	next uint64
	// sandbox stamps new events (SetSandbox). +checklocks:mu
	sandbox string
	// dropped is the sandbox of the newest event the ring let go: a notice of lost events is
	// for that sandbox's reader, not for one restored from its snapshot. +checklocks:mu
	dropped string
	// wake is closed and replaced by every Add. +checklocks:mu
	wake chan struct{}
}

// New returns an empty journal with a fresh boot id.
func New() *Journal {
	return newJournal(Capacity, time.Now)
}

func newJournal(size int, now func() time.Time) *Journal {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Journal{boot: hex.EncodeToString(b[:]), now: now, size: size, coalesce: Coalesce, next: 1, wake: make(chan struct{})}
}

// Boot identifies this envd process's run: Seq values restart with a new one.
func (j *Journal) Boot() string { return j.boot }

// SetSandbox stamps the events that follow with the sandbox id the node gave in /init.
func (j *Journal) SetSandbox(id string) {
	j.mu.Lock()
	j.sandbox = id
	j.mu.Unlock()
}

// Add records one event. Field values are clipped; callers pass no environment values.
func (j *Journal) Add(level, logger, msg string, fields map[string]string) {
	for k, v := range fields {
		fields[k] = clip(v, maxField)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	ev := agentproto.GuestEvent{Seq: j.next, Sandbox: j.sandbox, Time: j.now().UTC(), Level: level,
		Logger: logger, Message: clip(msg, maxMessage), Fields: fields}
	j.next++
	if len(j.ring) == j.size {
		// Shift rather than wrap: reads copy a contiguous tail, and adds are rare next to them.
		j.dropped = j.ring[0].Sandbox
		copy(j.ring, j.ring[1:])
		j.ring[len(j.ring)-1] = ev
	} else {
		j.ring = append(j.ring, ev)
	}
	close(j.wake)
	j.wake = make(chan struct{})
}

// Since returns the events after seq, how many after it the ring no longer holds (and the
// sandbox the newest of those belonged to), and a channel closed by the next Add.
func (j *Journal) Since(seq uint64) (evs []agentproto.GuestEvent, lost uint64, lostSandbox string, wake <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	first := j.next - uint64(len(j.ring))
	if seq+1 < first {
		lost, lostSandbox = first-seq-1, j.dropped
		seq = first - 1
	}
	if seq+1 < j.next {
		evs = append(evs, j.ring[seq+1-first:]...)
	}
	return evs, lost, lostSandbox, j.wake
}

// ServeHTTP streams the events (agentproto.EventsPath) until the client goes away. The caller
// checks the access token.
func (j *Journal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var after uint64
	if v := r.URL.Query().Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			http.Error(w, fmt.Sprintf("after: %v", err), http.StatusBadRequest)
			return
		}
		after = n
	}
	if r.URL.Query().Get("boot") != j.boot {
		after = 0
	}
	drain := r.URL.Query().Get(agentproto.EventsDrain) == "1"
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set(agentproto.BootHeader, j.boot)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if flusher != nil {
		flusher.Flush()
	}
	enc := json.NewEncoder(w)
	for {
		evs, lost, sb, wake := j.Since(after)
		if lost > 0 {
			last := after + lost
			// The lost ones' Seq: a reader that keeps it does not hear of them twice.
			miss := agentproto.GuestEvent{Seq: last, Sandbox: sb, Time: j.now().UTC(), Level: "warn",
				Logger: ProcessLogger, Message: fmt.Sprintf("%d guest events were lost before they were read (envd keeps the last %d)", lost, j.size),
				Fields: map[string]string{"lost": strconv.FormatUint(lost, 10)}}
			if err := enc.Encode(miss); err != nil {
				return
			}
			after = last
		}
		for _, ev := range evs {
			if err := enc.Encode(ev); err != nil {
				return
			}
			after = ev.Seq
		}
		if flusher != nil && (len(evs) > 0 || lost > 0) {
			flusher.Flush()
		}
		if drain {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-wake:
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(j.coalesce):
		}
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
