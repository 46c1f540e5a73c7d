package node

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/vibemon/vmon/internal/agentproto"
)

// The guest's out-of-memory killer (envd's oomkill) must look at the guest's memory often when
// the guest nears its size, and looking costs the sentry a wake-up each time: four a second, for
// every idle sandbox, spend a core on a node of a few hundred. The node watches instead, from the
// host, where reading a sandbox's memory cgroup costs microseconds and wakes nothing, and tells
// envd when its sandbox comes near its memory (it then watches closely again) and when it is far
// (it then polls only now and then).
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

// What the node last told a sandbox's envd (sandbox.memHint).
const (
	memHintUnsent int32 = iota
	memHintNear
	memHintFar
	// memHintUnsupported: envd answered 404, too old to take hints; it watches closely itself.
	memHintUnsupported
)

// memHintState is a sandbox's part of the memory watch.
type memHintState struct {
	told    atomic.Int32
	sending atomic.Bool
}

// watchMemory runs until the node closes, when the runtime can read sandboxes' memory.
func (n *Node) watchMemory() {
	mr, ok := n.opts.Runtime.(memoryReader)
	if !ok {
		return
	}
	t := time.NewTicker(memWatchEvery)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		sbs := make([]*sandbox, 0, len(n.sandboxes))
		for _, sb := range n.sandboxes {
			sbs = append(sbs, sb)
		}
		n.mu.Unlock()
		for _, sb := range sbs {
			n.checkMemory(mr, sb)
		}
	}
}

// checkMemory tells sb's envd whether it is near its memory when that changed.
func (n *Node) checkMemory(mr memoryReader, sb *sandbox) {
	told := sb.memHint.told.Load()
	if sb.ch == nil || sb.memoryMB <= 0 || told == memHintUnsupported || sb.stopping.Load() || sb.memHint.sending.Load() {
		return
	}
	used, err := mr.MemoryUsage(sb.runtimeID)
	if err != nil {
		return // paused, stopping or gone: nothing to tell
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
	if want == told {
		return
	}
	sb.memHint.sending.Store(true)
	go func() {
		defer sb.memHint.sending.Store(false)
		switch status := n.sendMemoryHint(sb, near); status {
		case http.StatusNoContent:
			sb.memHint.told.Store(want)
		case http.StatusNotFound:
			sb.memHint.told.Store(memHintUnsupported)
		}
	}()
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
