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

// Recover adopts the sandboxes that survived a crash of the previous node process and removes
// everything no live sandbox owns: dead sandboxes' directories, mounts and namespaces,
// pre-started sandboxes nobody claimed, and runtime containers or namespaces without a directory.
// It returns the API ids of the sandboxes that are alive.
func (n *Node) Recover(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(n.opts.DataDir, "sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("read sandboxes dir: %w", err)
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		adopted = map[string]*sandbox{} // by runtime id
		errs    []error
	)
	// Adopting waits for each envd to redial; do it in parallel so many sandboxes don't add up.
	for _, e := range entries {
		rid := e.Name()
		if !e.IsDir() || !idRe.MatchString(rid) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sb := n.adopt(ctx, rid); sb != nil {
				n.settleAdopted(sb)
				mu.Lock()
				adopted[rid] = sb
				mu.Unlock()
				return
			}
			if n.finishInterruptedPause(ctx, rid) {
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
	// What is left of pauses that never published, now that interrupted ones are finished.
	if err := snapshot.Sweep(filepath.Join(n.opts.DataDir, "paused")); err != nil {
		errs = append(errs, fmt.Errorf("remove unfinished pause snapshots: %w", err))
	}
	if n.opts.Network != nil {
		errs = append(errs, n.recoverLinks(ctx, adopted))
	}
	aliveRID := map[string]bool{}
	var aliveIDs []string
	for rid, sb := range adopted {
		aliveRID[rid] = true
		aliveIDs = append(aliveIDs, sb.id)
		n.mu.Lock()
		n.sandboxes[sb.id] = sb
		n.mu.Unlock()
		n.watch(sb)
		n.log.Info("recovered sandbox", "sandbox", sb.id)
	}
	ids, err := n.opts.Runtime.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list runtime sandboxes: %w", err))
	}
	for _, rid := range ids {
		if !aliveRID[rid] {
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
		if ok && idRe.MatchString(rid) && !aliveRID[rid] {
			errs = append(errs, n.opts.NetNS.Delete(ctx, name))
		}
	}
	return aliveIDs, errors.Join(errs...)
}

// recoverLinks hands the adopted sandboxes their links back (their rules and policy survived in
// the kernel) and lets the pool remove every other link. A sandbox whose link is gone has no
// uplink and no enforceable policy, so it is torn down instead of recovered.
func (n *Node) recoverLinks(ctx context.Context, adopted map[string]*sandbox) error {
	held := map[netpool.LinkID]string{}
	for rid := range adopted {
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
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("recover network links: %w", err))
	}
	for id, rid := range held {
		if l, ok := links[id]; ok {
			adopted[rid].link = l
		}
	}
	for rid, sb := range adopted {
		if sb.link == nil {
			n.log.Warn("removing sandbox whose network link is gone", "sandbox", sb.id)
			errs = append(errs, n.teardown(ctx, sb))
			delete(adopted, rid)
			continue
		}
		if err := n.restorePolicy(ctx, sb); err != nil {
			// Without its policy the proxy would refuse the sandbox's domain flows, and the
			// chains may be half-written: not a sandbox to hand back.
			n.log.Warn("removing sandbox whose egress policy cannot be restored", "sandbox", sb.id, "err", err)
			errs = append(errs, n.teardown(ctx, sb))
			delete(adopted, rid)
		}
	}
	return errors.Join(errs...)
}

// adopt re-listens on a live, handed-out sandbox's agent socket and waits for its envd to redial.
func (n *Node) adopt(ctx context.Context, rid string) *sandbox {
	dir := n.sandboxDir(rid)
	b, err := os.ReadFile(filepath.Join(dir, sandboxIDFile))
	id := strings.TrimSpace(string(b))
	if err != nil || !idRe.MatchString(id) {
		return nil // pre-started and never claimed, or a create the crash interrupted
	}
	st, err := n.opts.Runtime.Status(ctx, rid)
	if err != nil || st != runtime.StatusRunning {
		return nil
	}
	ch, err := agent.Listen(filepath.Join(dir, "agent"), n.log.With("sandbox", id))
	if err != nil {
		n.log.Warn("cannot reopen agent socket", "sandbox", id, "err", err)
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := ch.WaitConnected(wctx); err != nil {
		n.log.Warn("envd did not reconnect", "sandbox", id, "err", err)
		_ = ch.Close()
		return nil
	}
	token, _ := os.ReadFile(filepath.Join(dir, accessTokenFile))
	return &sandbox{runtimeID: rid, id: id, token: string(token), ch: ch}
}
