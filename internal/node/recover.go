package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/agent"
	"github.com/vibemon/vmon/internal/runtime"
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
		mu       sync.Mutex
		wg       sync.WaitGroup
		aliveRID = map[string]bool{}
		aliveIDs []string
		errs     []error
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
			id, ok := n.adopt(ctx, rid)
			if ok {
				mu.Lock()
				aliveRID[rid] = true
				aliveIDs = append(aliveIDs, id)
				mu.Unlock()
				return
			}
			n.log.Info("removing sandbox that did not survive", "runtime_id", rid)
			if err := n.teardown(ctx, rid, nil); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("clean up sandbox %s: %w", rid, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
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
	names, err := n.opts.NetNS.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list network namespaces: %w", err))
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

// adopt re-listens on a live, handed-out sandbox's agent socket and waits for its envd to redial.
func (n *Node) adopt(ctx context.Context, rid string) (string, bool) {
	dir := n.sandboxDir(rid)
	b, err := os.ReadFile(filepath.Join(dir, sandboxIDFile))
	id := strings.TrimSpace(string(b))
	if err != nil || !idRe.MatchString(id) {
		return "", false // pre-started and never claimed, or a create the crash interrupted
	}
	st, err := n.opts.Runtime.Status(ctx, rid)
	if err != nil || st != runtime.StatusRunning {
		return "", false
	}
	ch, err := agent.Listen(filepath.Join(dir, "agent"), n.log.With("sandbox", id))
	if err != nil {
		n.log.Warn("cannot reopen agent socket", "sandbox", id, "err", err)
		return "", false
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := ch.WaitConnected(wctx); err != nil {
		n.log.Warn("envd did not reconnect", "sandbox", id, "err", err)
		_ = ch.Close()
		return "", false
	}
	n.mu.Lock()
	token, _ := os.ReadFile(filepath.Join(dir, accessTokenFile))
	n.sandboxes[id] = &sandbox{runtimeID: rid, id: id, token: string(token), ch: ch}
	n.mu.Unlock()
	n.log.Info("recovered sandbox", "sandbox", id)
	return id, true
}
