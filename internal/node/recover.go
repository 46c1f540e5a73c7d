package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/agent"
	"github.com/vibemon/vmon/internal/netpool"
	"github.com/vibemon/vmon/internal/runtime"
	"github.com/vibemon/vmon/internal/snapshot"
)

// RecoveredState is what became of a sandbox a restart found.
type RecoveredState int

const (
	// RecoveredRunning: its runtime was alive and the node adopted it.
	RecoveredRunning RecoveredState = iota
	// RecoveredPaused: a pause (or a snapshot) was under way; the node finished it as a pause.
	RecoveredPaused
	// RecoveredGone: it did not survive and the node removed what was left.
	RecoveredGone
)

// Recovered reports what became of one sandbox a restart found.
type Recovered struct {
	ID    string
	State RecoveredState
	// Memory: a paused sandbox kept its memory and processes.
	Memory bool
	// Resume: the sandbox is paused only because a snapshot or fork of it was interrupted. Nobody
	// asked for it to stop, so its owner resumes it.
	Resume bool
}

// Recovery takes back what a previous node process left: Recover finds the sandboxes at once,
// and Run settles each of them in the background, because that can take a while (an envd to
// redial, a checkpoint the crash left running to finish, a pause's snapshot to write).
type Recovery struct {
	n       *Node
	pending []pendingRecovery
	done    chan struct{}
}

type pendingRecovery struct {
	rid, id string
	// mark is the content of the sandbox's pausing mark; hadMark says there was one.
	mark    string
	hadMark bool
	link    *netpool.Link
	// ch is the agent socket, listened on again as soon as the sandbox was found running, so
	// its envd stops redialling before anything slower happens.
	ch *agent.Channel
}

// IDs are the API ids of the sandboxes Run will settle.
func (r *Recovery) IDs() []string {
	ids := make([]string, len(r.pending))
	for i, p := range r.pending {
		ids[i] = p.id
	}
	return ids
}

// Run settles every sandbox of IDs in the background and calls report once for each, from
// several goroutines. Wait waits for them all.
func (r *Recovery) Run(report func(Recovered)) {
	var wg sync.WaitGroup
	for _, p := range r.pending {
		wg.Add(1)
		r.n.finishWG.Add(1)
		go func() {
			defer wg.Done()
			defer r.n.finishWG.Done()
			report(r.n.recoverOne(r.n.ctx, p))
		}()
	}
	go func() {
		wg.Wait()
		close(r.done)
	}()
}

// Wait waits until Run has settled every sandbox.
func (r *Recovery) Wait(ctx context.Context) error {
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Recover finds the sandboxes that survived a crash of the previous node process and removes
// everything no such sandbox owns: dead sandboxes' directories, mounts and namespaces,
// pre-started sandboxes nobody claimed, runtime containers or namespaces without a directory,
// network links. It waits for nothing the guests do; the Recovery it returns settles the
// survivors (Run).
func (n *Node) Recover(ctx context.Context) (*Recovery, error) {
	entries, err := os.ReadDir(filepath.Join(n.opts.DataDir, "sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("read sandboxes dir: %w", err)
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		found   = map[string]*pendingRecovery{} // by runtime id
		errs    []error
		workers = make(chan struct{}, 16)
	)
	for _, e := range entries {
		rid := e.Name()
		if !e.IsDir() || !idRe.MatchString(rid) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			workers <- struct{}{}
			defer func() { <-workers }()
			if p := n.survivor(ctx, rid); p != nil {
				mu.Lock()
				found[rid] = p
				mu.Unlock()
				return
			}
			n.log.Info("removing sandbox that did not survive", "runtime_id", rid)
			if err := n.teardown(ctx, &sandbox{runtimeID: rid}); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("clean up sandbox %s: %w", rid, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if n.opts.Network != nil {
		errs = append(errs, n.recoverLinks(ctx, found))
	}
	ids, err := n.opts.Runtime.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list runtime sandboxes: %w", err))
	}
	for _, rid := range ids {
		if found[rid] == nil {
			n.log.Info("removing runtime sandbox no directory owns", "runtime_id", rid)
			errs = append(errs, n.opts.Runtime.Destroy(ctx, rid))
		}
	}
	var names []string
	if n.opts.NetNS != nil {
		if names, err = n.opts.NetNS.List(ctx); err != nil {
			errs = append(errs, fmt.Errorf("list network namespaces: %w", err))
		}
	}
	for _, name := range names {
		rid, ok := strings.CutPrefix(name, n.opts.NetNSPrefix)
		// A name that is not prefix+id belongs to another node sharing this host.
		if ok && idRe.MatchString(rid) && found[rid] == nil {
			errs = append(errs, n.opts.NetNS.Delete(ctx, name))
		}
	}
	r := &Recovery{n: n, done: make(chan struct{})}
	for _, p := range found {
		r.pending = append(r.pending, *p)
	}
	// What is left of pauses that never published, but for the survivors': an interrupted pause
	// is finished from its checkpoint.
	if err := snapshot.Sweep(filepath.Join(n.opts.DataDir, "paused"), r.IDs()...); err != nil {
		errs = append(errs, fmt.Errorf("remove unfinished pause snapshots: %w", err))
	}
	return r, errors.Join(errs...)
}

// survivor says whether the sandbox directory rid belongs to a handed-out sandbox that may still
// be there after the restart: its runtime runs, or a pause or snapshot of it was under way.
func (n *Node) survivor(ctx context.Context, rid string) *pendingRecovery {
	dir := n.sandboxDir(rid)
	b, err := os.ReadFile(filepath.Join(dir, sandboxIDFile))
	id := strings.TrimSpace(string(b))
	if err != nil || !idRe.MatchString(id) {
		return nil // pre-started and never claimed, or a create the crash interrupted
	}
	p := &pendingRecovery{rid: rid, id: id}
	if m, err := os.ReadFile(filepath.Join(dir, pausingFile)); err == nil {
		p.mark, p.hadMark = string(m), true
		return p
	}
	if st, err := n.reattach(ctx, rid); err != nil || st != runtime.StatusRunning {
		return nil
	}
	if rec, err := readBootFile(dir); err != nil || rec.Channel != channelDialled {
		return p // adopt hands its envd a control socket
	}
	// Listening at once spares the envd that dials the socket a long redial delay.
	ch, err := agent.Listen(filepath.Join(dir, "agent"), n.log.With("sandbox", id))
	if err != nil {
		n.log.Warn("cannot reopen agent socket", "sandbox", id, "err", err)
		return nil
	}
	p.ch = ch
	return p
}

// reattach says whether the runtime of sandbox rid, started by an earlier node process, still
// runs: from what it left in the sandbox's directory when the runtime can tell from that
// (runtime.Reattacher), by asking the runtime otherwise.
func (n *Node) reattach(ctx context.Context, rid string) (runtime.Status, error) {
	if r, ok := n.opts.Runtime.(runtime.Reattacher); ok {
		return r.Reattach(ctx, rid, n.sandboxDir(rid))
	}
	return n.opts.Runtime.Status(ctx, rid)
}

// recoverLinks hands the survivors their links back (their rules and policy are still in the
// kernel) and lets the pool remove every other link.
func (n *Node) recoverLinks(ctx context.Context, found map[string]*pendingRecovery) error {
	held := map[netpool.LinkID]string{}
	for rid := range found {
		b, err := os.ReadFile(filepath.Join(n.sandboxDir(rid), linkFile))
		v, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || perr != nil {
			continue
		}
		held[netpool.LinkID(v)] = rid
	}
	ids := make([]netpool.LinkID, 0, len(held))
	for id := range held {
		ids = append(ids, id)
	}
	links, err := n.opts.Network.Recover(ctx, ids)
	for id, rid := range held {
		if l, ok := links[id]; ok {
			found[rid].link = l
		}
	}
	if err != nil {
		return fmt.Errorf("recover network links: %w", err)
	}
	return nil
}

// recoverOne settles one survivor: a checkpoint the crash left running is waited for; a sandbox
// whose runtime runs and whose envd redials is adopted with its link and policy; one a pause or
// snapshot had stopped becomes paused (with its memory when the checkpoint completed); anything
// else is removed.
func (n *Node) recoverOne(ctx context.Context, p pendingRecovery) (out Recovered) {
	out = Recovered{ID: p.id, State: RecoveredGone}
	defer func() {
		// Checkpoints the outcome did not use (the sandbox runs on, or one was incomplete).
		if err := snapshot.SweepOne(n.pausedDir(p.id)); err != nil {
			n.log.Warn("remove unfinished pause snapshots", "sandbox", p.id, "err", err)
		}
	}()
	if p.hadMark {
		// A checkpoint outlives the node that asked for it; until it ends the sandbox is
		// neither running nor stopped.
		n.awaitCheckpoints(ctx, p)
	}
	if sb := n.adopt(ctx, p); sb != nil {
		sb.link = p.link
		if n.opts.Network != nil && sb.link == nil {
			n.log.Warn("removing sandbox whose network link is gone", "sandbox", sb.id)
			n.removeRecovered(ctx, sb)
			return out
		}
		if sb.link != nil {
			if err := n.restorePolicy(ctx, sb); err != nil {
				// Without its policy the proxy would refuse the sandbox's domain flows, and
				// the chains may be half-written: not a sandbox to hand back.
				n.log.Warn("removing sandbox whose egress policy cannot be restored", "sandbox", sb.id, "err", err)
				n.removeRecovered(ctx, sb)
				return out
			}
		}
		n.settleAdopted(ctx, sb, p.hadMark)
		n.mu.Lock()
		n.sandboxes[sb.id] = sb
		n.mu.Unlock()
		n.watch(sb)
		n.followGuest(sb)
		n.log.Info("recovered sandbox", "sandbox", sb.id)
		out.State = RecoveredRunning
		return out
	}
	if p.hadMark {
		if memory, ok := n.finishInterruptedPause(ctx, p.rid); ok {
			if p.link != nil {
				n.opts.Network.ReleaseLater(p.link)
			}
			out.State, out.Memory = RecoveredPaused, memory
			// Only a pause the caller asked for stays paused; a snapshot's or fork's source
			// goes on.
			out.Resume = p.mark == markSnapshot
			return out
		}
	}
	n.log.Info("removing sandbox that did not survive", "sandbox", p.id)
	n.removeRecovered(ctx, &sandbox{runtimeID: p.rid, id: p.id, link: p.link})
	return out
}

func (n *Node) removeRecovered(ctx context.Context, sb *sandbox) {
	if err := n.teardown(ctx, sb); err != nil {
		n.log.Warn("clean up sandbox that did not survive", "sandbox", sb.id, "err", err)
	}
}

// awaitCheckpoints waits for the checkpoints of p's unfinished pause or snapshot to end.
func (n *Node) awaitCheckpoints(ctx context.Context, p pendingRecovery) {
	cp, ok := n.opts.Runtime.(runtime.Checkpointer)
	if !ok {
		return
	}
	tmps, _ := filepath.Glob(filepath.Join(n.opts.DataDir, "paused", ".tmp-"+p.id+"-*"))
	for _, t := range tmps {
		if _, err := cp.AwaitCheckpoint(ctx, p.rid, filepath.Join(t, snapshot.CheckpointDir)); err != nil {
			n.log.Warn("wait for an interrupted checkpoint", "sandbox", p.id, "err", err)
		}
	}
}

// adoptWait bounds how long a recovered sandbox whose runtime still runs may take to redial:
// envd redials within half the node's absence (30 s at most) of the socket coming back, and a
// node restarting beside hundreds of guests shares the host's cores with all of them. Its runtime
// is checked every adoptCheck meanwhile, so a sandbox that died is let go then.
var (
	adoptWait  = 2 * time.Minute
	adoptCheck = 15 * time.Second
)

// reconnect hands the running envd of sandbox rid, whose control socket's node end went with the
// previous node process, a new one, and records that a restore of the sandbox must do so again.
func (n *Node) reconnect(ctx context.Context, dir, rid string, rec bootRecord) (*agent.Channel, error) {
	ctl, err := n.handoff(ctx, rid)
	if err != nil {
		return nil, err
	}
	ch, err := agent.Attach(ctl, n.log.With("runtime_id", rid))
	if err != nil {
		return nil, err
	}
	if rec.Channel != channelHandoff {
		rec.Channel = channelHandoff
		if err := writeBootRecordFile(dir, rec); err != nil {
			ch.Close()
			return nil, err
		}
	}
	return ch, nil
}

// adopt reaches the envd of a live, handed-out sandbox again: it hands envd a new control socket
// (reconnect), or listens on the agent socket an envd of older vmon dials (Recover may have done
// so already) and waits for it to redial. It tries until adoptWait is over; a sandbox whose
// runtime stops meanwhile, or whose envd does not answer in time, is not adopted.
func (n *Node) adopt(ctx context.Context, p pendingRecovery) *sandbox {
	dir := n.sandboxDir(p.rid)
	ch := p.ch
	fail := func() *sandbox {
		if ch != nil {
			_ = ch.Close()
		}
		return nil
	}
	// A pause or snapshot the crash interrupted may have stopped it since Recover looked.
	if st, err := n.reattach(ctx, p.rid); err != nil || st != runtime.StatusRunning {
		return fail()
	}
	rec, err := readBootFile(dir)
	if err != nil && ch == nil {
		n.log.Warn("cannot tell how to reach the sandbox's envd", "sandbox", p.id, "err", err)
		return nil
	}
	if ch == nil && rec.Channel == channelDialled {
		if ch, err = agent.Listen(filepath.Join(dir, "agent"), n.log.With("sandbox", p.id)); err != nil {
			n.log.Warn("cannot reopen agent socket", "sandbox", p.id, "err", err)
			return nil
		}
	}
	deadline := time.Now().Add(adoptWait)
	for {
		wctx, cancel := context.WithTimeout(ctx, min(adoptCheck, time.Until(deadline)))
		if ch == nil {
			ch, err = n.reconnect(wctx, dir, p.rid, rec)
		} else {
			err = ch.WaitConnected(wctx)
		}
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || !time.Now().Before(deadline) {
			n.log.Warn("envd did not answer", "sandbox", p.id, "waited", adoptWait, "err", err)
			return fail()
		}
		if ch == nil {
			// A handoff fails at once when envd does not answer: do not spin.
			select {
			case <-ctx.Done():
			case <-time.After(min(adoptCheck, time.Until(deadline))):
			}
		}
		if st, serr := n.reattach(ctx, p.rid); serr != nil || st != runtime.StatusRunning {
			n.log.Warn("sandbox stopped before its envd answered", "sandbox", p.id, "status", st, "err", serr)
			return fail()
		}
	}
	token, _ := os.ReadFile(filepath.Join(dir, accessTokenFile))
	return &sandbox{runtimeID: p.rid, id: p.id, token: string(token), ch: ch, shell: rec.Shell}
}
