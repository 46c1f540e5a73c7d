package firewall

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
)

// runner applies and reads rules of one family; the Linux one runs iptables-restore/-save in the
// configured namespace.
type runner interface {
	restore(ctx context.Context, f family, script string) error
	save(ctx context.Context, f family) (string, error)
}

// Firewall installs and removes link rules in one namespace. It is safe for concurrent use;
// operations on one link are serialised by its Hooks.
type Firewall struct {
	names     names
	env       egress.Env
	proxyPort uint16
	dnsPort   uint16
	logGroup  uint16
	run       runner
	log       *slog.Logger

	// globalMu serialises EnsureGlobal and RemoveGlobal; globalDone skips EnsureGlobal after
	// the first success.
	globalMu sync.Mutex
	// +checklocks:globalMu
	globalDone bool

	// slotMu guards slots, the shared slot chains known to exist per family (slots.go): creating
	// one takes it for writing, an attach that jumps to one holds it for reading.
	slotMu sync.RWMutex
	// +checklocks:slotMu
	slots [len(families)]map[string]bool
	// slotRefs counts, per shared chain, the links whose slot chain jumps to it.
	// +checklocks:slotMu
	slotRefs  [len(families)]map[string]int
	gcPending atomic.Bool
	gcWG      sync.WaitGroup

	// links batches the per-link transactions of each family (batch.go).
	links [len(families)]*batcher
	// removing coalesces link removals (batch.go).
	removing remover

	// bg runs compactions; Close cancels it and waits.
	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a firewall for cfg. It touches nothing until a method is called.
func New(cfg Config) (*Firewall, error) {
	n, err := newNames(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	run, err := newRunner(cfg.NetNS, cfg.Tools.withDefaults())
	if err != nil {
		return nil, err
	}
	fw := newFirewall(n, cfg.Env, run, log)
	fw.proxyPort, fw.dnsPort, fw.logGroup = cfg.ProxyPort, cfg.DNSPort, cfg.LogGroup
	return fw, nil
}

func newFirewall(n names, env egress.Env, run runner, log *slog.Logger) *Firewall {
	bg, cancel := context.WithCancel(context.Background())
	fw := &Firewall{names: n, env: env, run: run, log: log, bg: bg, cancel: cancel}
	for _, f := range families {
		fw.links[f] = &batcher{run: run, f: f}
	}
	fw.removing.fw = fw
	return fw
}

func (t Tools) withDefaults() Tools {
	d := DefaultTools
	if t.Restore4 != "" {
		d.Restore4 = t.Restore4
	}
	if t.Restore6 != "" {
		d.Restore6 = t.Restore6
	}
	if t.Save4 != "" {
		d.Save4 = t.Save4
	}
	if t.Save6 != "" {
		d.Save6 = t.Save6
	}
	return d
}

// Close stops background compactions and waits for a running one. Rules stay in place.
func (fw *Firewall) Close() {
	fw.cancel()
	fw.wg.Wait()
	fw.gcWG.Wait()
}

func (fw *Firewall) slot() slot {
	return slot{proxyPort: fw.proxyPort, dnsPort: fw.dnsPort, env: fw.env}
}

// Iface is the name of link index i's host link (vmon<N>).
func (fw *Firewall) Iface(i int) string { return fw.names.iface(i) }

// OwnIface reports whether name is one of this firewall's links, and its index.
func (fw *Firewall) OwnIface(name string) (int, bool) { return fw.names.ownIface(name) }

// perFamily runs fn for IPv4 and IPv6 concurrently: the two families are separate tables and
// separate processes, so a transaction costs one iptables-restore, not two.
func perFamily(fn func(f family) error) error {
	var errs [len(families)]error
	var wg sync.WaitGroup
	for i, f := range families {
		wg.Go(func() { errs[i] = fn(f) })
	}
	wg.Wait()
	return errors.Join(errs[:]...)
}

// EnsureGlobal (re)writes the node-wide rules every link relies on (return traffic, no inbound
// connections, host isolation, the always-denied chain for this node's Env), in one transaction
// per family that replaces whatever version of them exists. Install and Attach call it the first
// time; start-up may call it explicitly.
func (fw *Firewall) EnsureGlobal(ctx context.Context) error {
	fw.globalMu.Lock()
	defer fw.globalMu.Unlock()
	if fw.globalDone {
		return nil
	}
	err := perFamily(func(f family) error {
		out, err := fw.run.save(ctx, f)
		if err != nil {
			return err
		}
		saved := parseSave(out)
		fw.knownSlots(f, saved)
		return fw.run.restore(ctx, f, renderGlobal(fw.names, f, globalDeletes(fw.names, saved),
			hasChain(saved, "filter", fw.names.deniedChain()), hasChain(saved, "filter", fw.names.logChain()),
			fw.slot(), fw.logGroup))
	})
	if err != nil {
		return fmt.Errorf("install node-wide link rules: %w", err)
	}
	fw.globalDone = true
	return nil
}

// RemoveGlobal deletes the node-wide rules and chain; call it when no link is left. Rules already
// gone are not an error.
func (fw *Firewall) RemoveGlobal(ctx context.Context) error {
	fw.globalMu.Lock()
	defer fw.globalMu.Unlock()
	fw.globalDone = false
	err := perFamily(func(f family) error {
		out, err := fw.run.save(ctx, f)
		if err != nil {
			return err
		}
		saved := parseSave(out)
		dels := globalDeletes(fw.names, saved)
		// The DENIED chain goes only once no link chain can still jump to it; with links left
		// (a caller that did not remove them first) the kernel would refuse the whole commit.
		dropDenied := hasChain(saved, "filter", fw.names.deniedChain()) && !hasOwnChain(fw.names, saved, "filter")
		var slots, pols []string
		if !hasOwnChain(fw.names, saved, "nat") {
			slots = unusedSlots(fw.names, saved, "nat")
		}
		if !hasOwnChain(fw.names, saved, "filter") {
			pols = unusedSlots(fw.names, saved, "filter")
		}
		if len(dels) == 0 && !dropDenied && len(slots) == 0 && len(pols) == 0 {
			return nil
		}
		var s script
		s.begin("filter")
		for _, d := range dels {
			s.line("%s", d)
		}
		// Shared policy chains jump to DENIED: they go first, in the same transaction.
		for _, c := range pols {
			s.line("-F %s", c)
		}
		for _, c := range pols {
			s.line("-X %s", c)
		}
		if dropDenied {
			s.line("-F %s", fw.names.deniedChain())
			s.line("-X %s", fw.names.deniedChain())
			// The log chain goes with DENIED, which (like the guards) jumps to it.
			if hasChain(saved, "filter", fw.names.logChain()) {
				s.line("-F %s", fw.names.logChain())
				s.line("-X %s", fw.names.logChain())
			}
		}
		if len(slots) > 0 {
			s.begin("nat")
			for _, c := range slots {
				s.line("-F %s", c)
			}
			for _, c := range slots {
				s.line("-X %s", c)
			}
		}
		fw.slotMu.Lock()
		fw.slots[f], fw.slotRefs[f] = nil, nil
		fw.slotMu.Unlock()
		return fw.run.restore(ctx, f, s.String())
	})
	if err != nil {
		return fmt.Errorf("remove node-wide link rules: %w", err)
	}
	return nil
}

// Install adds everything link l carries from creation: guard, refusal, host isolation, mark,
// NAT, and (unless l.Unrestricted) the closed policy chain and the proxy slot. On failure
// whatever was installed is removed again.
func (fw *Firewall) Install(ctx context.Context, l Link) (*Hooks, error) {
	if err := validateLink(l); err != nil {
		return nil, err
	}
	if err := fw.EnsureGlobal(ctx); err != nil {
		return nil, err
	}
	err := perFamily(func(f family) error {
		return fw.run.restore(ctx, f, renderInstall(fw.names, l, f, fw.logGroup))
	})
	if err != nil {
		if rerr := fw.remove(context.WithoutCancel(ctx), func(i int) bool { return i == l.Index }); rerr != nil {
			fw.log.Warn("rolling back partial link rules", "link", l.Index, "err", rerr)
		}
		return nil, fmt.Errorf("install rules of %s: %w", l, err)
	}
	return &Hooks{fw: fw, link: l, state: closed}, nil
}

// Adopt returns the hooks of a link installed before a restart, without touching the kernel.
// Its policy chain is in an unknown state: the next Attach or Update replaces it. A link must
// have one Hooks at a time: they serialise its transactions.
func (fw *Firewall) Adopt(l Link) (*Hooks, error) {
	if err := validateLink(l); err != nil {
		return nil, err
	}
	return &Hooks{fw: fw, link: l, state: unknown}, nil
}

// Sweep removes the rules and chains of every link keep rejects, as found in the kernel; it is
// what start-up runs to drop what a crash left behind. It returns the indices it removed rules
// of.
func (fw *Firewall) Sweep(ctx context.Context, keep func(index int) bool) ([]int, error) {
	var mu sync.Mutex
	var all []int
	err := perFamily(func(f family) error {
		removed, err := fw.removeFamily(ctx, f, func(i int) bool { return !keep(i) })
		mu.Lock()
		all = append(all, removed...)
		mu.Unlock()
		if err != nil {
			return err
		}
		return fw.migrateFamily(ctx, f, keep)
	})
	slices.Sort(all)
	return slices.Compact(all), err
}

// Remove deletes every rule and chain of link index i as found in the kernel, for a link
// without Hooks (an orphan after a crash). Rules already gone are not an error.
func (fw *Firewall) Remove(ctx context.Context, i int) error {
	if err := fw.removing.remove(ctx, i); err != nil {
		return fmt.Errorf("remove rules of link %d: %w", i, err)
	}
	return nil
}

func (fw *Firewall) remove(ctx context.Context, match func(int) bool) error {
	return perFamily(func(f family) error {
		_, err := fw.removeFamily(ctx, f, match)
		return err
	})
}

func (fw *Firewall) removeFamily(ctx context.Context, f family, match func(int) bool) ([]int, error) {
	out, err := fw.run.save(ctx, f)
	if err != nil {
		return nil, err
	}
	s, removed := renderRemove(fw.names, parseSave(out), match)
	if s == "" {
		return nil, nil
	}
	if err := fw.run.restore(ctx, f, s); err != nil {
		return nil, fmt.Errorf("remove %s rules of links %v: %w", f, removed, err)
	}
	return removed, nil
}

// dropSlots releases the link's references on the shared chains of family index i not in keep,
// after a transaction removed its jumps to them.
//
// +checklocks:h.mu
func (h *Hooks) dropSlots(i int, f family, keep map[string]bool) {
	for name := range h.slotsIn[i] {
		if !keep[name] {
			delete(h.slotsIn[i], name)
			h.fw.refSlots(f, name, -1)
		}
	}
}

// migrateFamily brings the kept links' rules of an older vmon up to date (renderMigrate).
func (fw *Firewall) migrateFamily(ctx context.Context, f family, keep func(int) bool) error {
	out, err := fw.run.save(ctx, f)
	if err != nil {
		return err
	}
	s := renderMigrate(fw.names, parseSave(out), keep)
	if s == "" {
		return nil
	}
	if err := fw.run.restore(ctx, f, s); err != nil {
		return fmt.Errorf("update %s proxy jumps of kept links: %w", f, err)
	}
	return nil
}

type hookState int

const (
	closed   hookState = iota // the policy chain is a single DROP
	attached                  // the chain is block + DROP (dirty: more blocks shadowed below)
	unknown                   // adopted after a restart, or a transaction failed half-way
	removed
)

// Hooks is the egress hook set of one installed link: its policy chains in both families.
type Hooks struct {
	fw   *Firewall
	link Link

	mu sync.Mutex
	// +checklocks:mu
	state hookState
	// block holds the live policy rules per family, for compaction.
	// +checklocks:mu
	block [len(families)][]string
	// proxy holds the live rules of the proxy slot per family (nil: the chain is empty).
	// +checklocks:mu
	proxy [len(families)][]string
	// slotsIn are the shared chains the link's slot chain jumps to now, live or shadowed, per
	// family: what it holds a reference on.
	// +checklocks:mu
	slotsIn [len(families)]map[string]bool
	// dirty means shadowed blocks sit below the live one.
	// +checklocks:mu
	dirty bool
	// gen counts changes so a queued compaction only runs for the block it was queued for.
	// +checklocks:mu
	gen uint64
}

// Link returns the link the hooks belong to.
func (h *Hooks) Link() Link { return h.link }

// Attach puts policy p in force for new flows: one add-only transaction per family that
// inserts the rendered policy above the closed DROP (or above a previous policy).
func (h *Hooks) Attach(ctx context.Context, p egress.Policy) error {
	return h.apply(ctx, p)
}

// Update replaces the policy of an attached link, atomically: the new block is inserted on top
// of the old one, which it shadows completely (every block ends in a verdict), so no packet
// ever sees a mix or a gap. Established TCP connections survive; UDP and ICMP follow the new
// policy from their next packet. The shadowed block is compacted away in the background.
func (h *Hooks) Update(ctx context.Context, p egress.Policy) error {
	return h.apply(ctx, p)
}

func (h *Hooks) apply(ctx context.Context, p egress.Policy) error {
	// Every block jumps to the node-wide DENIED chain. Install made it, but a link adopted after
	// a restart may be attached before any Install runs; after the first success this is free.
	if err := h.fw.EnsureGlobal(ctx); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	// The policy and slot blocks live in chains shared by every link with the same policy; the
	// link's own chains only jump there (slots.go).
	var blocks, proxy [len(families)][]string
	var defs [len(families)][]sharedDef
	for i, f := range families {
		pol := policyRules(h.fw.names, h.link, f, p, h.fw.env)
		polName := h.fw.names.policyChain(pol)
		defs[i] = append(defs[i], sharedDef{polName, pol})
		blocks[i] = linkPolicyRules(polName)
		if shared := proxyRules(h.link, f, p, h.fw.slot()); shared != nil {
			name := h.fw.names.slotChain(shared)
			defs[i] = append(defs[i], sharedDef{name, shared})
			proxy[i] = linkSlotRules(h.link, f, name)
			continue
		}
		if h.state != unknown && h.proxy[i] == nil {
			continue // the slot is empty and stays empty
		}
		proxy[i] = []string{"-j RETURN"} // shadows what the slot held
	}
	if err := h.fw.holdSlots(ctx, defs); err != nil {
		return fmt.Errorf("attach egress policy to %s: %w", h.link, err)
	}
	err := perFamily(func(f family) error {
		return h.fw.links[f].restore(ctx, renderAttach(h.fw.names, h.link, blocks[f], proxy[f]))
	})
	h.fw.slotMu.RUnlock()
	h.gen++
	if err != nil {
		// One family may have applied: the chain content is unknown until the next Detach
		// rewrites it.
		h.state, h.dirty = unknown, true
		return fmt.Errorf("attach egress policy to %s: %w", h.link, err)
	}
	if h.state != closed {
		h.dirty = true
	}
	for i := range proxy {
		if proxy[i] != nil && h.proxy[i] != nil {
			h.dirty = true
		}
	}
	h.state, h.block, h.proxy = attached, blocks, proxy
	for i, f := range families {
		for _, d := range defs[i] {
			if h.slotsIn[i][d.name] {
				continue
			}
			if h.slotsIn[i] == nil {
				h.slotsIn[i] = map[string]bool{}
			}
			h.slotsIn[i][d.name] = true
			h.fw.refSlots(f, d.name, 1)
		}
	}
	if h.dirty {
		h.compactLater(h.gen)
	}
	return nil
}

// Detach closes the policy chains again (a single DROP), in one transaction per family. Flows
// the guest still sends are dropped silently from then on.
func (h *Hooks) Detach(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.usable(); err != nil {
		return err
	}
	h.gen++
	flushProxy := h.state == unknown
	for i := range h.proxy {
		flushProxy = flushProxy || h.proxy[i] != nil
	}
	err := perFamily(func(f family) error {
		return h.fw.links[f].restore(ctx, renderReplace(h.fw.names, h.link, nil, flushProxy, nil))
	})
	if err != nil {
		h.state, h.dirty = unknown, true
		return fmt.Errorf("close egress chains of %s: %w", h.link, err)
	}
	h.state, h.dirty = closed, false
	h.block, h.proxy = [len(families)][]string{}, [len(families)][]string{}
	for i, f := range families {
		h.dropSlots(i, f, nil)
	}
	return nil
}

// Remove deletes every rule and chain of the link. Rules already gone are not an error.
func (h *Hooks) Remove(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gen++
	if err := h.fw.removing.remove(ctx, h.link.Index); err != nil {
		return fmt.Errorf("remove rules of %s: %w", h.link, err)
	}
	h.state = removed
	for i, f := range families {
		h.dropSlots(i, f, nil)
	}
	return nil
}

// +checklocks:h.mu
func (h *Hooks) usable() error {
	if h.link.Unrestricted {
		return errdefs.InvalidArgument("link %d has no egress hooks (template build link)", h.link.Index)
	}
	if h.state == removed {
		return errdefs.NotFound("link %d was removed", h.link.Index)
	}
	return nil
}

// compactLater rewrites the chain as the live block + DROP off the request path. The rewrite
// deletes rules, which costs an RCU grace period on nf_tables; nobody waits for it.
//
// +checklocks:h.mu
func (h *Hooks) compactLater(gen uint64) {
	if h.fw.bg.Err() != nil {
		return
	}
	h.fw.wg.Go(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.gen != gen || h.state != attached || !h.dirty {
			return // superseded: a later update queued its own, or a detach rewrote the chain
		}
		err := perFamily(func(f family) error {
			return h.fw.links[f].restore(h.fw.bg, renderReplace(h.fw.names, h.link, h.block[f], h.proxy[f] != nil, h.proxy[f]))
		})
		if err != nil {
			h.fw.log.Warn("compacting egress chain", "link", h.link.Index, "err", err)
			return
		}
		h.dirty = false
		// Only the live blocks' shared chains are jumped to now.
		for i, f := range families {
			live := map[string]bool{}
			for _, r := range append(slices.Clone(h.block[i]), h.proxy[i]...) {
				if name, ok := strings.CutPrefix(r, "-j "); ok && h.fw.names.isSlotChain(name) {
					live[name] = true
				}
			}
			h.dropSlots(i, f, live)
		}
	})
}
