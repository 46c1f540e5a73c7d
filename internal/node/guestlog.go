package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/errdefs"
)

// GuestLog takes what envd reports about a handed-out sandbox (processes started and ended, the
// template start command's output, limits reached) for the sandbox's log, and keeps how far it
// read, so that a restarted node neither repeats nor skips what envd still holds.
type GuestLog interface {
	// GuestCursor is the boot and sequence number of the last event kept for the sandbox.
	GuestCursor(id string) (boot string, seq uint64)
	// GuestEvents keeps evs (the sandbox's own, oldest first) and moves the cursor to boot and
	// last, which may be past them: events of another sandbox, inherited from a snapshot, are
	// read and skipped.
	GuestEvents(id, boot string, last uint64, evs []agentproto.GuestEvent)
}

// Retry pacing of a follower whose stream broke: a checkpoint or restore breaks the channel for
// a moment, and envd redials at once.
const (
	followRetryMin = 100 * time.Millisecond
	followRetryMax = 5 * time.Second
	// followBatch bounds how many events one GuestEvents call takes.
	followBatch = 256
)

// follower is one sandbox's copy of envd's events. Its gate and pacer outlive a broken stream:
// a guest that ends its stream after every burst must not get a fresh burst each time.
type follower struct {
	cancel context.CancelFunc
	done   chan struct{}
	gate   *guestGate
	pace   *linePacer
}

// followGuest copies envd's events about sb into the guest log until sb stops being handed out
// (stopFollowing) or the node closes. An envd without the events endpoint (an older build in a
// snapshot) ends it quietly.
func (n *Node) followGuest(sb *sandbox) {
	if n.opts.GuestLog == nil || sb.ch == nil || sb.id == "" {
		return
	}
	ctx, cancel := context.WithCancel(n.ctx)
	now := time.Now()
	f := &follower{cancel: cancel, done: make(chan struct{}), gate: newGuestGate(now),
		pace: &linePacer{tokens: guestLineBurst, last: now}}
	if old := sb.follow.Swap(f); old != nil {
		old.stop()
	}
	if sb.stopping.Load() {
		// Its teardown began before the follower was in place (a destroy racing the hand-out,
		// a runtime that died), so its stopFollowing may have found nothing to stop.
		cancel()
		close(f.done)
		sb.stopFollowing()
		return
	}
	go func() {
		defer close(f.done)
		defer cancel()
		wait := followRetryMin
		for ctx.Err() == nil {
			read, err := n.followOnce(ctx, sb, f, false)
			if errors.Is(err, errNoEvents) {
				n.log.Debug("envd reports no guest events (an older build)", "sandbox", sb.id)
				return
			}
			if read {
				wait = followRetryMin
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(wait*2, followRetryMax)
		}
	}()
}

// stopWait bounds how long a stop waits for the follower's last write to the log.
const stopWait = 2 * time.Second

// stop cancels the follower and waits for it to have written its last, so that nothing after it
// writes the cursor concurrently.
func (f *follower) stop() {
	f.cancel()
	select {
	case <-f.done:
	case <-time.After(stopWait):
	}
}

// stopFollowing ends sb's follower (pause, snapshot teardown, destroy) and returns it, nil when
// none ran.
func (sb *sandbox) stopFollowing() *follower {
	f := sb.follow.Swap(nil)
	if f != nil {
		f.stop()
	}
	return f
}

// drainWait bounds the last read of a sandbox being destroyed: a guest that does not answer
// must not hold up its own kill.
const drainWait = time.Second

// drainGuest reads once more what envd holds for sb, without waiting for more (its runtime is
// about to go, and envd sends its latest events only after a short coalescing pause).
func (n *Node) drainGuest(ctx context.Context, sb *sandbox, f *follower) {
	ctx, cancel := context.WithTimeout(ctx, drainWait)
	defer cancel()
	if _, err := n.followOnce(ctx, sb, f, true); err != nil && !errors.Is(err, errNoEvents) {
		n.log.Debug("last read of guest events failed", "sandbox", sb.id, "err", err)
	}
}

var errNoEvents = errors.New("envd has no events endpoint")

// followOnce reads one events stream until it breaks, or with drain what envd holds now;
// read says whether it delivered anything. A drain's stream ends with a nil error.
func (n *Node) followOnce(ctx context.Context, sb *sandbox, f *follower, drain bool) (read bool, err error) {
	gate, pace := f.gate, f.pace
	boot, seq := n.opts.GuestLog.GuestCursor(sb.id)
	q := url.Values{"after": {strconv.FormatUint(seq, 10)}, "boot": {boot}}
	if drain {
		q.Set(agentproto.EventsDrain, "1")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, envdURL(agentproto.EventsPath)+"?"+q.Encode(), nil)
	if err != nil {
		return false, err
	}
	if sb.token != "" {
		req.Header.Set("X-Access-Token", sb.token)
	}
	resp, err := (&http.Client{Transport: sb.ch.Transport()}).Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return false, errNoEvents
	default:
		return false, fmt.Errorf("envd events: %s", resp.Status)
	}
	boot = resp.Header.Get(agentproto.BootHeader)
	if !validBoot(boot) {
		return false, fmt.Errorf("envd events: invalid boot id %s", errdefs.Clip(strconv.Quote(boot)))
	}
	// The stream comes from inside the sandbox, where root can replace envd: every line is
	// bounded, every event checked, the rate of events logged capped (gate), and lines are read
	// no faster than pace, since each costs a decode whether it is logged or skipped.
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), maxEventLine)
	lines := make(chan agentproto.GuestEvent, followBatch)
	decErr := make(chan error, 1)
	go func() {
		defer close(lines)
		for {
			if err := pace.wait(ctx); err != nil {
				decErr <- err
				return
			}
			if !sc.Scan() {
				break
			}
			var ev agentproto.GuestEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				decErr <- fmt.Errorf("envd events: %w", err)
				return
			}
			lines <- ev
		}
		decErr <- sc.Err()
	}()
	// Events come in bursts (a process's start, then its end): what is already decoded goes in
	// one call, so the cursor is written once per burst. A burst with nothing to keep (another
	// sandbox's events, inherited or forged) moves the cursor at most once a cursorEvery, and
	// once more when the stream ends: reading them again after a restart only skips them again.
	var lastWrite time.Time
	var skipped uint64
	for ev := range lines {
		batch := []agentproto.GuestEvent{ev}
	more:
		for len(batch) < followBatch {
			select {
			case e, ok := <-lines:
				if !ok {
					break more
				}
				batch = append(batch, e)
			default:
				break more
			}
		}
		var mine []agentproto.GuestEvent
		for _, e := range batch {
			if e.Sandbox == sb.id && gate.admit(time.Now()) {
				mine = append(mine, sanitize(e))
			}
		}
		if note, ok := gate.report(time.Now()); ok {
			mine = append(mine, note)
		}
		last := batch[len(batch)-1].Seq
		read = true
		if len(mine) == 0 && time.Since(lastWrite) < cursorEvery {
			skipped = last
			continue
		}
		n.opts.GuestLog.GuestEvents(sb.id, boot, last, mine)
		lastWrite, skipped = time.Now(), 0
	}
	if skipped != 0 {
		n.opts.GuestLog.GuestEvents(sb.id, boot, skipped, nil)
	}
	err = <-decErr
	if err == nil && !drain {
		err = errors.New("envd events: the stream ended")
	}
	return read, err
}

// Bounds on what a guest can put in its sandbox's log through the events stream. envd's own
// events are far inside them (a message of at most 1 KiB, a handful of fields of at most 1 KiB).
const (
	maxEventLine   = 32 << 10
	maxEventFields = 16
	maxFieldKey    = 64
	// guestRate and guestBurst cap the events a sandbox logs per second; envd's start command
	// output alone stays under 20 a second.
	guestRate  = 200
	guestBurst = 1000
	// guestLineRate and guestLineBurst pace the lines read, logged or not; the burst holds twice
	// envd's journal, which a fork inherits and reads (and skips) at once.
	guestLineRate  = 2000
	guestLineBurst = 4096
	// cursorEvery spaces the cursor writes of bursts that kept nothing.
	cursorEvery = time.Second
)

func validBoot(b string) bool {
	if b == "" || len(b) > 64 {
		return false
	}
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// sanitize keeps an event within the bounds above: the logger is one of envd's (else guestSvc,
// never one of the host's), at most maxEventFields fields with short keys. Message and field
// values are clipped by the log itself.
func sanitize(e agentproto.GuestEvent) agentproto.GuestEvent {
	if e.Logger != agentproto.ProcessLogger && e.Logger != agentproto.LimitsLogger {
		e.Logger = "guestSvc"
	}
	if len(e.Fields) > maxEventFields {
		keys := slices.Sorted(maps.Keys(e.Fields))[:maxEventFields]
		kept := make(map[string]string, len(keys))
		for _, k := range keys {
			kept[k] = e.Fields[k]
		}
		e.Fields = kept
	}
	for k := range e.Fields {
		if len(k) > maxFieldKey {
			delete(e.Fields, k)
		}
	}
	return e
}

// guestGate is a token bucket over one stream's events, and counts what it refused.
type guestGate struct {
	tokens   float64
	last     time.Time
	dropped  int
	reported time.Time
}

func newGuestGate(now time.Time) *guestGate {
	return &guestGate{tokens: guestBurst, last: now}
}

func (g *guestGate) admit(now time.Time) bool {
	g.tokens = min(guestBurst, g.tokens+now.Sub(g.last).Seconds()*guestRate)
	g.last = now
	if g.tokens < 1 {
		g.dropped++
		return false
	}
	g.tokens--
	return true
}

// report returns, at most once a second, an entry counting the events refused since the last.
func (g *guestGate) report(now time.Time) (agentproto.GuestEvent, bool) {
	if g.dropped == 0 || now.Sub(g.reported) < time.Second {
		return agentproto.GuestEvent{}, false
	}
	n := g.dropped
	g.dropped, g.reported = 0, now
	return agentproto.GuestEvent{Time: now, Level: "warn", Logger: "logsSvc",
		Message: fmt.Sprintf("%d events from inside the sandbox were not logged (more than %d a second)", n, guestRate),
		Fields:  map[string]string{"dropped": strconv.Itoa(n)}}, true
}

// linePacer is a token bucket that waits rather than refuses: while it waits, the stream is not
// read, and the guest's writes wait with it.
type linePacer struct {
	tokens float64
	last   time.Time
}

func (p *linePacer) wait(ctx context.Context) error {
	for {
		now := time.Now()
		p.tokens = min(guestLineBurst, p.tokens+now.Sub(p.last).Seconds()*guestLineRate)
		p.last = now
		if p.tokens >= 1 {
			p.tokens--
			return nil
		}
		// Waiting for a twentieth of a second's worth at a time, not for each line.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
