package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
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

// followGuest copies envd's events about sb into the guest log until sb stops being handed out
// (sb.follow is cancelled) or the node closes. An envd without the events endpoint (an older
// build in a snapshot) ends it quietly.
func (n *Node) followGuest(sb *sandbox) {
	if n.opts.GuestLog == nil || sb.ch == nil || sb.id == "" {
		return
	}
	ctx, cancel := context.WithCancel(n.ctx)
	if old := sb.follow.Swap(&cancel); old != nil {
		(*old)()
	}
	go func() {
		defer cancel()
		wait := followRetryMin
		for ctx.Err() == nil {
			read, err := n.followOnce(ctx, sb)
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

// stopFollowing ends sb's follower (pause, snapshot teardown, destroy).
func (sb *sandbox) stopFollowing() {
	if c := sb.follow.Swap(nil); c != nil {
		(*c)()
	}
}

var errNoEvents = errors.New("envd has no events endpoint")

// followOnce reads one events stream until it breaks; read says whether it delivered anything.
func (n *Node) followOnce(ctx context.Context, sb *sandbox) (read bool, err error) {
	boot, seq := n.opts.GuestLog.GuestCursor(sb.id)
	q := url.Values{"after": {strconv.FormatUint(seq, 10)}, "boot": {boot}}
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
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	lines := make(chan agentproto.GuestEvent, followBatch)
	decErr := make(chan error, 1)
	go func() {
		defer close(lines)
		for {
			var ev agentproto.GuestEvent
			if err := dec.Decode(&ev); err != nil {
				decErr <- err
				return
			}
			lines <- ev
		}
	}()
	// Events come in bursts (a process's start, then its end): what is already decoded goes in
	// one call, so the cursor is written once per burst.
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
			if e.Sandbox == sb.id {
				mine = append(mine, e)
			}
		}
		n.opts.GuestLog.GuestEvents(sb.id, boot, batch[len(batch)-1].Seq, mine)
		read = true
	}
	return read, <-decErr
}
