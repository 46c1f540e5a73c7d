package node

import (
	"context"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/runtime"
)

// OnStopped sets who hears about handed-out sandboxes whose runtime stopped on its own (the
// guest's init exited, the host killed it, it ran out of memory). Events from before the call
// are delivered at once, so a sandbox that died between recovery and the driver's start is not
// missed. fn runs on its own goroutine and must destroy the sandbox (DestroySandbox).
func (n *Node) OnStopped(fn func(id string, exit runtime.Exit)) {
	n.mu.Lock()
	n.onStopped = fn
	pending := n.pendingStops
	n.pendingStops = nil
	n.mu.Unlock()
	for _, ev := range pending {
		go fn(ev.id, ev.exit)
	}
}

// watch waits in the background for sb's runtime to stop. An exit the node did not cause stops
// the agent channel at once (requests fail instead of waiting for a session that will never
// come) and is reported: to the driver for a handed-out sandbox, to the warm pool for a
// pre-started one. A booting or build sandbox's owner sees the stopped channel and tears it down.
func (n *Node) watch(sb *sandbox) {
	go func() {
		exit, err := n.opts.Runtime.Wait(n.ctx, sb.runtimeID)
		if sb.stopping.Load() || n.ctx.Err() != nil {
			return
		}
		if err != nil {
			// Without a watch the sandbox's death would go unnoticed until a request times out;
			// confirm with the runtime's status now and then instead.
			n.log.Warn("cannot watch sandbox runtime; polling its status", "runtime_id", sb.runtimeID, "err", err)
			exit = n.pollUntilStopped(sb)
			if sb.stopping.Load() || n.ctx.Err() != nil {
				return
			}
		}
		sb.ch.Stop(errdefs.NotFound("the sandbox stopped (%s)", exit))
		n.stopped(sb, exit)
	}()
}

// pollUntilStopped checks the runtime's status every second until it no longer runs.
func (n *Node) pollUntilStopped(sb *sandbox) runtime.Exit {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return runtime.Exit{Reason: runtime.ExitUnknown, Code: -1}
		case <-t.C:
		}
		if sb.stopping.Load() {
			return runtime.Exit{Reason: runtime.ExitUnknown, Code: -1}
		}
		st, err := n.opts.Runtime.Status(n.ctx, sb.runtimeID)
		if err == nil && st != runtime.StatusRunning {
			return runtime.Exit{Reason: runtime.ExitUnknown, Code: -1}
		}
	}
}

// stopped routes the news that sb's runtime ended on its own.
func (n *Node) stopped(sb *sandbox, exit runtime.Exit) {
	n.mu.Lock()
	handedOut := sb.id != "" && n.sandboxes[sb.id] == sb
	var fn func(string, runtime.Exit)
	if handedOut {
		fn = n.onStopped
		if fn == nil {
			n.pendingStops = append(n.pendingStops, stopEvent{id: sb.id, exit: exit})
		}
	}
	n.mu.Unlock()
	switch {
	case handedOut:
		n.log.Warn("sandbox stopped on its own", "sandbox", sb.id, "runtime_id", sb.runtimeID, "reason", exit.String())
		if fn != nil {
			fn(sb.id, exit)
		}
	case n.pool.remove(sb):
		n.log.Warn("pre-started sandbox stopped; replacing it", "runtime_id", sb.runtimeID, "reason", exit.String())
		_ = n.teardown(context.Background(), sb)
		n.pool.signal()
	default:
		// Booting, being handed out, or a template build's: its owner sees the stopped channel.
		n.log.Info("sandbox stopped before it was handed out", "runtime_id", sb.runtimeID, "reason", exit.String())
	}
}
