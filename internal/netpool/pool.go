package netpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/firewall"
	"github.com/vibemon/vmon/internal/guestnet"
)

// Config configures a Pool.
type Config struct {
	// Prefix is --net-pool (see ParsePrefix); the zero value is DefaultPrefix.
	Prefix netip.Prefix
	// Target is the ready-pool size, clamped to 0..MaxReady: one link per boot slot
	// (--boot-concurrency) unless --net-ready-links says otherwise. Released links return to the
	// pool while it holds fewer than twice this. 0 turns the pool off: every take builds its link
	// on the request path and every release tears it down (the benchmark's "without" case).
	Target int
	// Kind selects veth (gVisor) or TAP (VM runtimes) host links; the rules are identical.
	Kind Kind
	// VMMUser and VMMGroup own TAP devices (--vmm-user), so a VMM that dropped privileges can
	// open them. 0 is root.
	VMMUser, VMMGroup uint32
	// LinkPrefix names links <prefix><N>, chains <PREFIX>-?<N> and namespaces <prefix>-net-<N>.
	// Default "vmon"; nodes sharing a namespace need different prefixes.
	LinkPrefix string
	// NetNSScope, when set ([a-z0-9]{1,12}), goes into the names of the sandbox namespaces
	// (<prefix>-net-<scope>-<N>): /run/netns is shared by every vmon on the host, including nodes
	// in other network namespaces, and recovery removes the pool namespaces it does not hold.
	NetNSScope string
	// HostNetNS is the namespace the host links and rules live in; "" is the process's own
	// (production). Tests pass a throwaway "node" namespace.
	HostNetNS string
	// Env is the node's always-denied ranges and --egress-internal-allow exemptions.
	Env egress.Env
	// Tools overrides the iptables binaries (zero fields: firewall.DefaultTools).
	Tools firewall.Tools
	// Proxies are what the links' proxy slots redirect to — the transparent egress proxy on
	// ProxyPort, the filtering resolver on DNSPort — and the pool keeps their view of each link's
	// policy in step with the chains.
	Proxies   []Proxy
	ProxyPort uint16
	DNSPort   uint16
	// LogGroup is the NFLOG group refusals are copied to (firewall.Config.LogGroup); 0: none.
	LogGroup uint16
	Log      *slog.Logger
}

// Proxy is the pool's view of what a link's proxy slot redirects to (*egressproxy.Proxy,
// *egressdns.Resolver): which policy judges the flows of which guest address.
type Proxy interface {
	Set(guest, host netip.Addr, p egress.Policy)
	Remove(guest netip.Addr)
}

// LinkID identifies a link across node restarts: what the node records with a sandbox so that
// Recover can hand the link back. It is the lease index.
type LinkID int

// hooks is the part of the firewall a link's egress policy goes through (*firewall.Hooks).
type hooks interface {
	Attach(ctx context.Context, p egress.Policy) error
	Update(ctx context.Context, p egress.Policy) error
	Detach(ctx context.Context) error
}

// Link is one sandbox link: the lease, the host link and (veth) the sandbox network namespace
// holding the configured peer. A sandbox boots straight into NetNSPath.
type Link struct {
	lease        Lease
	name         string
	nsPath       string
	unrestricted bool
	hooks        hooks
}

// ID is what the node records to recover the link after a restart.
func (l *Link) ID() LinkID { return LinkID(l.lease.Index) }

// Lease is the link's address block.
func (l *Link) Lease() Lease { return l.lease }

// Name is the host link's name, vmon<N>.
func (l *Link) Name() string { return l.name }

// NetNSPath is the namespace the runtime must join (runsc: the OCI network namespace path): eth0
// up with only a link-local placeholder address, lo up. "" for TAP links.
func (l *Link) NetNSPath() string { return l.nsPath }

// GuestNet is what the guest configures once booted: the node pushes it to envd over the agent
// channel (guests run no DHCP client).
func (l *Link) GuestNet() guestnet.Config {
	return guestnet.Config{Interface: GuestInterface, Address: l.lease.GuestPrefix(), Gateway: l.lease.Host}
}

// Unrestricted reports a template-build link: no egress hooks.
func (l *Link) Unrestricted() bool { return l.unrestricted }

// system is the OS side of the pool: links, namespaces, rules, conntrack.
type system interface {
	// create makes a ready link for lease: device, namespace and peer, rules with closed
	// policy chains (none when unrestricted). A failure leaves nothing behind.
	create(ctx context.Context, lease Lease, unrestricted bool) (*Link, error)
	// adopt returns the link of lease as a crash left it, without changing it.
	adopt(ctx context.Context, lease Lease) (*Link, error)
	// prepare re-applies the peer's address and routes (runsc removes them when it takes the
	// interface over).
	prepare(ctx context.Context, l *Link) error
	// reset makes a used link ready again: policy chains closed, conntrack entries of its mark
	// flushed, peer prepared.
	reset(ctx context.Context, l *Link) error
	// destroy removes everything of lease index i: rules, device, namespace, conntrack
	// entries. Whatever is already gone is not an error.
	destroy(ctx context.Context, i int) error
	// existing lists the lease indices that have a device or a namespace.
	existing(ctx context.Context) ([]int, error)
	// sweep removes the rules of every link keep rejects.
	sweep(ctx context.Context, keep func(int) bool) error
	// close stops background work; last (no link left) also removes the node-wide rules.
	close(ctx context.Context, last bool) error
}

// Stats is a snapshot of the pool.
type Stats struct {
	Target, Ready, InUse int
	// Misses counts takes that found the ready pool empty and created a link on the request
	// path.
	Misses int
	// Created and Destroyed count links over the pool's life.
	Created, Destroyed int
}

// Pool hands out ready links.
type Pool struct {
	pool    netip.Prefix
	target  int
	sys     system
	proxies []Proxy
	log     *slog.Logger

	mu sync.Mutex
	// +checklocks:mu
	alloc *allocator
	// ready is FIFO: a released link goes to the back, so it is reused as late as possible.
	// +checklocks:mu
	ready []*Link
	// +checklocks:mu
	inUse map[LinkID]*Link
	// +checklocks:mu
	recovered, closed bool
	// +checklocks:mu
	stats Stats
	// releasing counts background releases in flight; releaseDone is closed (and replaced) as
	// each one ends, so a Take that found every lease taken can wait for one.
	// +checklocks:mu
	releasing int
	// +checklocks:mu
	releaseDone chan struct{}
	// returning counts released links being reset on their way back to the ready pool.
	// +checklocks:mu
	returning int

	kick   chan struct{}
	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newPool(cfg Config, sys system) *Pool {
	target := min(max(cfg.Target, 0), MaxReady)
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bg, cancel := context.WithCancel(context.Background())
	return &Pool{
		pool: cfg.Prefix, target: target, sys: sys, proxies: cfg.Proxies, log: log,
		alloc: newAllocator(Leases(cfg.Prefix)), inUse: map[LinkID]*Link{},
		kick: make(chan struct{}, 1), bg: bg, cancel: cancel, releaseDone: make(chan struct{}),
	}
}

func (c Config) withDefaults() (Config, error) {
	if !c.Prefix.IsValid() {
		p, err := ParsePrefix("")
		if err != nil {
			return c, err
		}
		c.Prefix = p
	} else if _, err := ParsePrefix(c.Prefix.String()); err != nil {
		return c, err
	}
	if c.LinkPrefix == "" {
		c.LinkPrefix = firewall.DefaultPrefix
	}
	if c.NetNSScope != "" && !scopeRe.MatchString(c.NetNSScope) {
		return c, errdefs.InvalidArgument("namespace scope %q: want 1-12 of [a-z0-9]", c.NetNSScope)
	}
	if !linkPrefixRe.MatchString(c.LinkPrefix) {
		return c, errdefs.InvalidArgument("link prefix %q: want 1-8 lower-case letters", c.LinkPrefix)
	}
	return c, nil
}

// Recover must run once, after the node recovered its sandboxes and before the first Take:
// the links in held are handed back (keyed by ID), every other link, namespace, rule and
// conntrack entry of this prefix is removed, and the ready pool starts filling in the
// background. A held link that no longer exists is reported in the error and not returned.
func (p *Pool) Recover(ctx context.Context, held []LinkID) (map[LinkID]*Link, error) {
	p.mu.Lock()
	if p.recovered || p.closed {
		p.mu.Unlock()
		return nil, errdefs.Conflict("network pool already recovered or closed")
	}
	p.mu.Unlock()

	var errs []error
	out := map[LinkID]*Link{}
	for _, id := range held {
		lease, err := LeaseAt(p.pool, int(id))
		if err == nil {
			var l *Link
			if l, err = p.sys.adopt(ctx, lease); err == nil {
				out[id] = l
				continue
			}
		}
		errs = append(errs, fmt.Errorf("recover link %d: %w", id, err))
	}
	keep := func(i int) bool { _, ok := out[LinkID(i)]; return ok }
	found, err := p.sys.existing(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, i := range found {
		if !keep(i) {
			p.log.Info("removing sandbox link no sandbox holds", "index", i)
			errs = append(errs, p.sys.destroy(ctx, i))
		}
	}
	// Rules can outlive their device (a crash between removing one and the other).
	errs = append(errs, p.sys.sweep(ctx, keep))

	p.mu.Lock()
	for id, l := range out {
		p.alloc.reserve(int(id))
		p.inUse[id] = l
	}
	p.recovered = true
	p.mu.Unlock()
	p.wg.Go(p.refillLoop)
	p.refill()
	return out, errors.Join(errs...)
}

// Take returns a ready link: no ip or iptables call happens here unless the ready pool is empty
// (counted in Stats.Misses), in which case one is created on the spot. When every lease is taken
// but some are still being released in the background, it waits for one of those.
func (p *Pool) Take(ctx context.Context) (*Link, error) {
	p.mu.Lock()
	for {
		if err := p.usable(); err != nil {
			p.mu.Unlock()
			return nil, err
		}
		if len(p.ready) > 0 {
			l := p.ready[0]
			p.ready = p.ready[1:]
			p.inUse[l.ID()] = l
			p.mu.Unlock()
			p.refill()
			return l, nil
		}
		if p.releasing == 0 || !p.alloc.full() {
			break
		}
		done := p.releaseDone
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-done:
		}
		p.mu.Lock()
	}
	p.stats.Misses++
	p.mu.Unlock()
	defer p.refill()
	return p.createInUse(ctx, false)
}

// TakeUnrestricted returns a fresh link without egress hooks, for template builds (seed: builds
// have unrestricted egress). It is never pooled: Release tears it down.
func (p *Pool) TakeUnrestricted(ctx context.Context) (*Link, error) {
	p.mu.Lock()
	err := p.usable()
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return p.createInUse(ctx, true)
}

// +checklocks:p.mu
func (p *Pool) usable() error {
	switch {
	case p.closed:
		return errdefs.Unavailable("network pool is shut down")
	case !p.recovered:
		return errdefs.Unavailable("network pool is not recovered yet")
	}
	return nil
}

func (p *Pool) createInUse(ctx context.Context, unrestricted bool) (*Link, error) {
	l, err := p.create(ctx, unrestricted)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.inUse[l.ID()] = l
	p.mu.Unlock()
	return l, nil
}

func (p *Pool) create(ctx context.Context, unrestricted bool) (*Link, error) {
	p.mu.Lock()
	i, ok := p.alloc.alloc()
	p.mu.Unlock()
	if !ok {
		return nil, errdefs.ResourceExhausted("no free address in the network pool")
	}
	lease, err := LeaseAt(p.pool, i)
	if err == nil {
		var l *Link
		if l, err = p.sys.create(ctx, lease, unrestricted); err == nil {
			p.mu.Lock()
			p.stats.Created++
			p.mu.Unlock()
			return l, nil
		}
	}
	p.mu.Lock()
	p.alloc.free(i)
	p.mu.Unlock()
	return nil, fmt.Errorf("create sandbox link %d: %w", i, err)
}

// Attach puts a sandbox's egress policy in force on its link (one add-only transaction per
// family). Call it before the sandbox's first instruction; until then the link is closed.
func (p *Pool) Attach(ctx context.Context, l *Link, pol egress.Policy) error {
	if err := checkHooks(l); err != nil {
		return err
	}
	p.proxySet(l, pol)
	return l.hooks.Attach(ctx, pol)
}

// proxySet gives the proxy the policy before the chains redirect anything to it under that
// policy, so a redirected flow never finds the proxy without its guest.
func (p *Pool) proxySet(l *Link, pol egress.Policy) {
	for _, x := range p.proxies {
		x.Set(l.lease.Guest, l.lease.Host, pol)
	}
}

func (p *Pool) proxyRemove(l *Link) {
	for _, x := range p.proxies {
		x.Remove(l.lease.Guest)
	}
}

// Update replaces the policy of an attached link atomically; established TCP connections
// survive.
func (p *Pool) Update(ctx context.Context, l *Link, pol egress.Policy) error {
	if err := checkHooks(l); err != nil {
		return err
	}
	p.proxySet(l, pol)
	return l.hooks.Update(ctx, pol)
}

// Detach closes the link's policy chains (silent DROP). Release does it too.
func (p *Pool) Detach(ctx context.Context, l *Link) error {
	if err := checkHooks(l); err != nil {
		return err
	}
	p.proxyRemove(l)
	return l.hooks.Detach(ctx)
}

func checkHooks(l *Link) error {
	if l == nil || l.hooks == nil {
		return errdefs.InvalidArgument("link has no egress hooks (template build link)")
	}
	return nil
}

// Prepare puts the peer back in its ready state (up, with only the link-local placeholder that
// makes runsc adopt it). runsc removes the addresses it finds when it takes the interface over,
// so call it before restoring a sandbox into a namespace it ran in before. Take always returns
// prepared links.
func (p *Pool) Prepare(ctx context.Context, l *Link) error {
	return p.sys.prepare(ctx, l)
}

// Release takes a link back after its sandbox's runtime exited. While the ready pool holds fewer
// than twice the target the link goes back to it, its policy chains closed and its conntrack
// entries flushed; otherwise it is torn down at once (resetting a link only to delete it would
// cost an iptables transaction for nothing, hundreds of them when a node kills its sandboxes).
// Call it off the request path: it runs iptables and netlink.
func (p *Pool) Release(ctx context.Context, l *Link) error {
	p.mu.Lock()
	if p.inUse[l.ID()] != l {
		p.mu.Unlock()
		return errdefs.NotFound("link %d is not in use", l.ID())
	}
	delete(p.inUse, l.ID())
	keep := !l.unrestricted && !p.closed && len(p.ready)+p.returning < 2*p.target
	if keep {
		p.returning++
	}
	p.mu.Unlock()
	p.proxyRemove(l)

	if keep {
		err := p.sys.reset(ctx, l)
		p.mu.Lock()
		p.returning--
		if err == nil && !p.closed {
			p.ready = append(p.ready, l)
			p.mu.Unlock()
			return nil
		}
		p.mu.Unlock()
		if err != nil {
			p.log.Warn("resetting a released link failed; tearing it down", "link", l.name, "err", err)
		}
	}
	return p.destroy(ctx, l.lease.Index)
}

// releaseTimeout bounds one background release (an iptables-restore, a ctnetlink delete, and
// netlink calls when the link is torn down).
const releaseTimeout = time.Minute

// ReleaseLater is Release off the caller's path (seed: detaching resets the chains to closed in
// the background). The link's sandbox must be gone already: the link stays closed to traffic
// until its reset. Errors are logged; Close waits for releases in flight.
func (p *Pool) ReleaseLater(l *Link) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.logRelease(l, p.Release(context.WithoutCancel(p.bg), l))
		return
	}
	p.releasing++
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(p.bg), releaseTimeout)
		defer cancel()
		p.logRelease(l, p.Release(ctx, l))
		p.mu.Lock()
		p.releasing--
		close(p.releaseDone)
		p.releaseDone = make(chan struct{})
		p.mu.Unlock()
	}()
}

func (p *Pool) logRelease(l *Link, err error) {
	if err != nil {
		p.log.Warn("releasing a sandbox link", "link", l.name, "err", err)
	}
}

// destroy tears a link down and frees its lease; a lease whose teardown failed stays reserved
// until the next start-up removes what is left.
func (p *Pool) destroy(ctx context.Context, i int) error {
	if err := p.sys.destroy(ctx, i); err != nil {
		return fmt.Errorf("tear down sandbox link %d: %w", i, err)
	}
	p.mu.Lock()
	p.alloc.free(i)
	p.stats.Destroyed++
	p.mu.Unlock()
	return nil
}

// Close stops the refill and removes the idle ready links. Links in use stay, with the rules they
// rely on: their sandboxes outlive the node process and Recover hands them back.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	var errs []error
	for _, l := range ready {
		errs = append(errs, p.destroy(ctx, l.lease.Index))
	}
	p.mu.Lock()
	last := len(p.inUse) == 0 && p.alloc.empty()
	p.mu.Unlock()
	errs = append(errs, p.sys.close(ctx, last))
	return errors.Join(errs...)
}

// Stats returns a snapshot of the pool.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Target, s.Ready, s.InUse = p.target, len(p.ready), len(p.inUse)
	return s
}

func (p *Pool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// refillLoop keeps target links ready, creating one at a time in the background, with a backoff
// after failures so a broken host does not spin.
func (p *Pool) refillLoop() {
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-p.bg.Done():
			return
		case <-p.kick:
		}
		for {
			p.mu.Lock()
			need := !p.closed && len(p.ready) < p.target
			p.mu.Unlock()
			if !need || p.bg.Err() != nil {
				break
			}
			l, err := p.create(p.bg, false)
			if err != nil {
				p.log.Warn("pre-creating a sandbox link", "err", err, "retry_in", backoff)
				select {
				case <-p.bg.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
			backoff = 100 * time.Millisecond
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				_ = p.destroy(context.WithoutCancel(p.bg), l.lease.Index)
				return
			}
			p.ready = append(p.ready, l)
			p.mu.Unlock()
		}
	}
}

// readyIDs is for tests.
func (p *Pool) readyIDs() []LinkID {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []LinkID
	for _, l := range p.ready {
		ids = append(ids, l.ID())
	}
	slices.Sort(ids)
	return ids
}
