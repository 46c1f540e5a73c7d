package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vibemon/vmon/internal/agent"
	"github.com/vibemon/vmon/internal/runtime"
)

// Recover adopts the sandboxes that survived a crash of the previous node process and removes
// everything no live sandbox owns: dead sandboxes' directories, mounts and namespaces, and
// runtime containers or namespaces without a directory. It returns the ids that are alive.
func (n *Node) Recover(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(n.opts.DataDir, "sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("read sandboxes dir: %w", err)
	}
	alive := map[string]bool{}
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !idRe.MatchString(id) {
			continue
		}
		if n.adopt(ctx, id) {
			alive[id] = true
			continue
		}
		n.log.Info("removing sandbox whose runtime is gone", "sandbox", id)
		if err := n.DestroySandbox(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("clean up sandbox %s: %w", id, err))
		}
	}
	ids, err := n.opts.Runtime.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list runtime sandboxes: %w", err))
	}
	for _, id := range ids {
		if !alive[id] {
			n.log.Info("removing runtime sandbox no record owns", "sandbox", id)
			errs = append(errs, n.opts.Runtime.Destroy(ctx, id))
		}
	}
	names, err := n.opts.NetNS.List(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list network namespaces: %w", err))
	}
	for _, name := range names {
		id, ok := strings.CutPrefix(name, netnsPrefix)
		if ok && !alive[id] {
			errs = append(errs, n.opts.NetNS.Delete(ctx, name))
		}
	}
	out := make([]string, 0, len(alive))
	for id := range alive {
		out = append(out, id)
	}
	return out, errors.Join(errs...)
}

// adopt re-listens on a live sandbox's agent socket and waits for its envd to redial.
func (n *Node) adopt(ctx context.Context, id string) bool {
	st, err := n.opts.Runtime.Status(ctx, id)
	if err != nil || st != runtime.StatusRunning {
		return false
	}
	dir := n.sandboxDir(id)
	ch, err := agent.Listen(filepath.Join(dir, "agent"), n.log.With("sandbox", id))
	if err != nil {
		n.log.Warn("cannot reopen agent socket", "sandbox", id, "err", err)
		return false
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := ch.WaitConnected(wctx); err != nil {
		n.log.Warn("envd did not reconnect", "sandbox", id, "err", err)
		_ = ch.Close()
		return false
	}
	n.mu.Lock()
	n.sandboxes[id] = &sandbox{id: id, dir: dir, ch: ch}
	n.mu.Unlock()
	n.log.Info("recovered sandbox", "sandbox", id)
	return true
}
