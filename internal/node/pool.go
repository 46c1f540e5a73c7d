package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"
)

// WarmSpec asks the node to keep Size pre-started sandboxes of one template shape. Creates of that
// shape then only bind the sandbox to its id and deliver /init, skipping the boot.
type WarmSpec struct {
	TemplateID string
	CPUs       int
	MemoryMB   int
	DiskMB     int
	Size       int
}

// pool keeps pre-started sandboxes and refills them in the background, one boot at a time so
// refills never crowd out the boots clients are waiting for.
type pool struct {
	n     *Node
	specs []WarmSpec
	kick  chan struct{}

	mu sync.Mutex
	// +checklocks:mu
	ready map[int][]*sandbox
	// hits and misses count, per spec, the creates of its shape that found a pre-started sandbox
	// and those that found none and booted.
	// +checklocks:mu
	hits, misses map[int]int64
	// +checklocks:mu
	cancel context.CancelFunc
	done   chan struct{}
}

func newPool(n *Node, specs []WarmSpec) *pool {
	return &pool{n: n, specs: specs, kick: make(chan struct{}, 1), ready: map[int][]*sandbox{},
		hits: map[int]int64{}, misses: map[int]int64{}}
}

// StartWarmPool starts filling the warm pool. Call it after Recover, which discards the
// pre-started sandboxes of a previous process.
func (n *Node) StartWarmPool() {
	p := n.pool
	ctx, cancel := context.WithCancel(context.Background())
	p.mu.Lock()
	p.cancel = cancel
	p.done = make(chan struct{})
	p.mu.Unlock()
	go p.loop(ctx)
	p.signal()
}

func (p *pool) signal() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *pool) loop(ctx context.Context) {
	defer close(p.done)
	for {
		backoff := p.fill(ctx)
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-p.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// fill boots sandboxes until every spec has its size, and says when to look again.
func (p *pool) fill(ctx context.Context) time.Duration {
	for i, ws := range p.specs {
		for {
			p.mu.Lock()
			have := len(p.ready[i])
			p.mu.Unlock()
			if have >= ws.Size || ctx.Err() != nil {
				break
			}
			sb, err := p.n.bootWarm(ctx, ws)
			if err != nil {
				if ctx.Err() == nil {
					p.n.log.Warn("warm pool boot failed", "template", ws.TemplateID, "err", err)
				}
				return 5 * time.Second
			}
			if err := p.n.warmUp(ctx, sb); err != nil {
				// A sandbox that cannot run a shell would fail its client; replace it.
				p.n.log.Warn("warm pool sandbox failed its warm-up", "template", ws.TemplateID, "err", err)
				_ = p.n.teardown(context.WithoutCancel(ctx), sb)
				return 5 * time.Second
			}
			p.mu.Lock()
			if p.cancel == nil { // closed meanwhile
				p.mu.Unlock()
				_ = p.n.teardown(context.Background(), sb)
				return time.Hour
			}
			p.ready[i] = append(p.ready[i], sb)
			p.mu.Unlock()
		}
	}
	// Pre-started sandboxes can die (e.g. the host OOM killer); look again now and then.
	return time.Minute
}

// take hands out a pre-started sandbox of spec's shape, or nil.
func (p *pool) take(spec CreateSpec) *sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, ws := range p.specs {
		if ws.TemplateID != spec.TemplateID || ws.CPUs != spec.CPUs || ws.MemoryMB != spec.MemoryMB || ws.DiskMB != spec.DiskMB {
			continue
		}
		if q := p.ready[i]; len(q) > 0 {
			sb := q[0]
			p.ready[i] = q[1:]
			p.hits[i]++
			p.signal()
			return sb
		}
		p.misses[i]++
		return nil
	}
	return nil
}

// WarmPoolStats is one warm pool spec's state: how many pre-started sandboxes it keeps and has
// ready, and how the creates of its shape fared.
type WarmPoolStats struct {
	TemplateID string
	Size       int
	Ready      int
	// Hits are creates handed a pre-started sandbox; Misses found the pool empty and booted one.
	Hits, Misses int64
}

// WarmPool reports each warm pool spec's state. A run of misses means creates come faster than
// the pool refills (one boot at a time), and those creates pay for a boot.
func (n *Node) WarmPool() []WarmPoolStats {
	p := n.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]WarmPoolStats, 0, len(p.specs))
	for i, ws := range p.specs {
		out = append(out, WarmPoolStats{TemplateID: ws.TemplateID, Size: ws.Size, Ready: len(p.ready[i]), Hits: p.hits[i], Misses: p.misses[i]})
	}
	return out
}

// remove takes sb out of the pool; it reports whether sb was there.
func (p *pool) remove(sb *sandbox) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, q := range p.ready {
		for j, s := range q {
			if s == sb {
				p.ready[i] = append(q[:j:j], q[j+1:]...)
				return true
			}
		}
	}
	return false
}

// close stops refilling and destroys what nobody claimed.
func (p *pool) close(ctx context.Context) error {
	p.mu.Lock()
	cancel, done := p.cancel, p.done
	p.cancel = nil
	var all []*sandbox
	for i, q := range p.ready {
		all = append(all, q...)
		delete(p.ready, i)
	}
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	var errs []error
	for _, sb := range all {
		errs = append(errs, p.n.teardown(ctx, sb))
	}
	return errors.Join(errs...)
}

// bootWarm boots one pre-started sandbox of ws's template; its link stays closed until handed out.
func (n *Node) bootWarm(ctx context.Context, ws WarmSpec) (*sandbox, error) {
	img, err := n.opts.Templates.Image(ctx, ws.TemplateID, "")
	if err != nil {
		return nil, err
	}
	return n.boot(ctx, bootSpec{runtimeID: newRuntimeID(), templateID: ws.TemplateID, lowers: img.Lowers,
		cpus: ws.CPUs, memoryMB: ws.MemoryMB, diskMB: ws.DiskMB})
}

// newRuntimeID names a pre-started sandbox; like sandbox ids it is [a-z0-9]{20}, with a "w" first
// so operators can tell warm sandboxes apart in runsc and /run/netns listings.
func newRuntimeID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	b[0] = 'w'
	return string(b)
}

// warmUp runs one login shell in a pre-started sandbox before it joins the pool. The first process
// of a gVisor sandbox pays for loading bash, libc and the profile files into the sentry's caches;
// doing it here keeps that cost off the client's first command. Before /init, envd has no token
// and runs processes as root, which is enough to fill the caches.
func (n *Node) warmUp(ctx context.Context, sb *sandbox) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	exit, err := runGuest(ctx, sb.ch, "", guestCmd{Shell: sb.guestShell(), Script: "true"}, nil)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if exit != 0 {
		return fmt.Errorf("warm-up exited with %d", exit)
	}
	return nil
}
