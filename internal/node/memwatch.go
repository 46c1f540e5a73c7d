package node

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
	"github.com/vibemon/vmon/internal/runtime"
)

// The guest's out-of-memory killer (envd's oomkill) must look at the guest's memory often when
// the guest nears its size, and looking costs the sentry a wake-up each time: four a second, for
// every idle sandbox, spend a core on a node of a few hundred. The node watches instead, from the
// host, where nothing in the sandbox wakes, and tells envd when its sandbox comes near its memory
// (it then watches closely again) and when it is far (it then polls only now and then).
//
// Where the kernel signals crossings of a cgroup's memory thresholds (cgroup v1), the node learns
// of one as it happens: a guest claiming memory at a GiB a second goes from near to the host's
// limit in a few hundred milliseconds, less than a poll of the node's plus one of envd's used to
// take. Elsewhere it reads each sandbox's use every memWatchEvery.
const (
	memWatchEvery = 250 * time.Millisecond
	// A sandbox is near once its host cgroup holds half its memory, and far again below 40 %:
	// the host figure counts the runtime's own memory too, so it errs towards near.
	memNearPercent = 50
	memFarPercent  = 40
)

// memoryReader reads a sandbox's host memory use (the gvisor runtime).
type memoryReader interface {
	MemoryUsage(id string) (uint64, error)
}

// memoryEventer signals crossings of a sandbox's memory thresholds (the gvisor runtime on cgroup
// v1); see gvisor.Runtime.MemoryEvents.
type memoryEventer interface {
	MemoryEvents(ctx context.Context, id string, thresholds ...uint64) (<-chan struct{}, error)
}

// What the node last told a sandbox's envd (sandbox.memHint).
const (
	memHintUnsent int32 = iota
	memHintNear
	memHintFar
	// memHintUnsupported: envd answered 404, too old to take hints; it watches closely itself.
	memHintUnsupported
)

// How the node learns of a sandbox's memory (memHintState.follow).
const (
	memFollowNone   int32 = iota // not followed yet: the next tick asks the kernel for signals
	memFollowEvents              // the kernel signals crossings (followMemory)
	memFollowPoll                // no signals to be had: every tick reads its use
)

// memHintState is a sandbox's part of the memory watch.
type memHintState struct {
	told    atomic.Int32
	sending atomic.Bool
	// follow is how the node learns of the sandbox's memory (memFollow*).
	follow atomic.Int32
	// retry: a hint was not delivered, so the next tick checks again even though the kernel will
	// not signal until the next crossing.
	retry atomic.Bool
}

// watchMemory runs until the node closes, when the runtime can read sandboxes' memory. It owns
// the followers it starts, and ends each once its sandbox has left the node.
func (n *Node) watchMemory() {
	mr, ok := n.opts.Runtime.(memoryReader)
	if !ok {
		return
	}
	me, _ := n.opts.Runtime.(memoryEventer)
	followers := map[*sandbox]context.CancelFunc{}
	defer func() {
		for _, cancel := range followers {
			cancel()
		}
	}()
	t := time.NewTicker(memWatchEvery)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		sbs := make(map[*sandbox]bool, len(n.sandboxes))
		for _, sb := range n.sandboxes {
			sbs[sb] = true
		}
		n.mu.Unlock()
		for sb, cancel := range followers {
			if !sbs[sb] || sb.stopping.Load() {
				cancel()
				delete(followers, sb)
			}
		}
		for sb := range sbs {
			if sb.memHint.follow.Load() == memFollowNone && me != nil {
				if cancel := n.followMemory(me, mr, sb); cancel != nil {
					followers[sb] = cancel
				}
			}
			if sb.memHint.follow.Load() == memFollowEvents && !sb.memHint.retry.Load() {
				continue
			}
			n.checkMemory(mr, sb)
		}
	}
}

// followMemory asks the kernel to signal crossings of sb's thresholds and starts checking its
// memory at each. It returns what ends that, or nil when sb is not ready yet or the kernel
// cannot signal (sb is then polled).
func (n *Node) followMemory(me memoryEventer, mr memoryReader, sb *sandbox) context.CancelFunc {
	if sb.ch == nil || sb.memoryMB <= 0 || sb.stopping.Load() {
		return nil
	}
	limit := uint64(sb.memoryMB) << 20
	ctx, cancel := context.WithCancel(n.ctx)
	events, err := me.MemoryEvents(ctx, sb.runtimeID, limit*memNearPercent/100, limit*memFarPercent/100)
	if err != nil {
		cancel()
		if errors.Is(err, runtime.ErrUnsupported) {
			sb.memHint.follow.Store(memFollowPoll)
		} else {
			n.log.Debug("memory thresholds not set; the sandbox's memory is read instead", "sandbox", sb.id, "err", err)
		}
		return nil
	}
	sb.memHint.follow.Store(memFollowEvents)
	go func() {
		// A signal also comes when the sandbox's cgroup goes; if the sandbox is still here (its
		// runtime replaced under it) the next tick follows it anew.
		for range events {
			if !n.checkMemory(mr, sb) {
				sb.memHint.follow.CompareAndSwap(memFollowEvents, memFollowNone)
				cancel()
				return
			}
		}
	}()
	// The first check, at once: what the kernel signals from now on are crossings only.
	n.checkMemory(mr, sb)
	return cancel
}

// checkMemory tells sb's envd whether it is near its memory when that changed. It reports false
// when the sandbox's memory could not be read (paused, stopping or gone: nothing to tell).
func (n *Node) checkMemory(mr memoryReader, sb *sandbox) bool {
	told := sb.memHint.told.Load()
	if sb.ch == nil || sb.memoryMB <= 0 || told == memHintUnsupported || sb.stopping.Load() || sb.memHint.sending.Load() {
		return true
	}
	used, err := mr.MemoryUsage(sb.runtimeID)
	if err != nil {
		return false
	}
	limit := uint64(sb.memoryMB) << 20
	near := used*100 >= limit*memNearPercent
	if told == memHintNear && !near {
		near = used*100 >= limit*memFarPercent
	}
	want := memHintFar
	if near {
		want = memHintNear
	}
	sb.memHint.retry.Store(false)
	if want == told || !sb.memHint.sending.CompareAndSwap(false, true) {
		return true
	}
	go func() {
		status := n.sendMemoryHint(sb, near)
		switch status {
		case http.StatusNoContent:
			sb.memHint.told.Store(want)
		case http.StatusNotFound:
			sb.memHint.told.Store(memHintUnsupported)
		default:
			sb.memHint.retry.Store(true)
		}
		sb.memHint.sending.Store(false)
		if status == http.StatusNoContent {
			// The use may have crossed back while the hint was on its way, and a crossing
			// signalled meanwhile found a send in flight and did nothing.
			n.checkMemory(mr, sb)
		}
	}()
	return true
}

// sendMemoryHint posts the hint to envd and returns the answer's status (0 when none came).
func (n *Node) sendMemoryHint(sb *sandbox, near bool) int {
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	status, err := n.postEnvd(ctx, sb, agentproto.MemoryHintPath, agentproto.MemoryHint{Near: near})
	if err != nil {
		n.log.Debug("memory hint not delivered", "sandbox", sb.id, "err", err)
	}
	return status
}
