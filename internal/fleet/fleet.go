// Package fleet is a cluster driver's care of its nodes over time: it turns what gossip says of
// them (joined, failed, left, back) and what they report (room, templates) into the router's view,
// the nodes' records, and the driver's handling of their sandboxes (out of reach at once, ended
// after a grace period, reconciled when a node is back), and it carries out operators' drains.
//
// It never talks to a node except through the router's clients, and never changes a sandbox's
// record itself: that is the driver's.
package fleet

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/cluster"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/store"
)

// Records keeps the nodes' records (store.Store).
type Records interface {
	UpsertNode(ctx context.Context, n store.Node) error
	SetNodeState(ctx context.Context, name, state string, at time.Time) error
	ListNodes(ctx context.Context) ([]store.Node, error)
}

// Sandboxes is the driver's handling of a node's sandboxes (driver.Driver).
type Sandboxes interface {
	NodeOut(node string)
	NodeBack(ctx context.Context, node string, held driver.Holdings, c driver.Cleaner) error
	NodeLost(ctx context.Context, node string) error
	RunningOn(ctx context.Context, node string) ([]string, error)
	Pause(ctx context.Context, id string, memory bool) error
}

// Options configure a Fleet.
type Options struct {
	Router    *cluster.Router
	Records   Records
	Sandboxes Sandboxes
	// Connect makes the client of a node serving at rpc.
	Connect func(name, rpc string) cluster.NodeClient
	// Grace is how long a node may stay out of reach before its running sandboxes are ended.
	Grace time.Duration
	// Every is how often nodes are asked for their room and drains are carried out.
	Every time.Duration
	Log   *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Fleet follows the nodes; Event takes gossip's news, Run the periodic work.
type Fleet struct {
	o Options

	mu sync.Mutex
	// rpc is the address each node's client dials. +checklocks:mu
	rpc map[string]string
	// away holds the nodes out of reach, with the timer that ends their sandboxes. +checklocks:mu
	away map[string]*time.Timer
	// gossip is each node's gossip address, for its record. +checklocks:mu
	gossip map[string]string
	// pausing holds the nodes a drain with pause is emptying. +checklocks:mu
	pausing map[string]bool
	// unanswering holds the nodes gossip says are alive but that do not answer the driver (a
	// partition between the two only): out of reach as if they had failed. +checklocks:mu
	unanswering map[string]bool
}

// New returns a fleet over o.
func New(o Options) *Fleet {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Every <= 0 {
		o.Every = 2 * time.Second
	}
	return &Fleet{o: o, rpc: map[string]string{}, away: map[string]*time.Timer{}, gossip: map[string]string{},
		pausing: map[string]bool{}, unanswering: map[string]bool{}}
}

// Event takes gossip's news of a member (membership.Options.OnEvent).
func (f *Fleet) Event(m membership.Member, kind membership.EventKind) {
	if m.Meta.Role != membership.RoleNode {
		return
	}
	ctx := context.Background()
	f.o.Log.Info("node "+kind.String(), "node", m.Name, "rpc", m.Meta.RPC, "state", m.Meta.State, "features", m.Meta.Features, "left", m.Left)
	if kind == membership.Left || !m.Alive {
		f.out(ctx, m)
		return
	}
	f.mu.Lock()
	same := f.rpc[m.Name] == m.Meta.RPC
	f.rpc[m.Name], f.gossip[m.Name] = m.Meta.RPC, m.Gossip
	timer, wasAway := f.away[m.Name]
	delete(f.away, m.Name)
	delete(f.unanswering, m.Name)
	f.mu.Unlock()
	var client cluster.NodeClient
	if !same {
		client = f.o.Connect(m.Name, m.Meta.RPC)
	}
	f.o.Router.Upsert(m.Name, m.Meta, client)
	if wasAway {
		timer.Stop()
	}
	// A node the driver has never seen out of reach may still hold sandboxes the records disagree
	// with (a driver restart while it was away): every join reconciles.
	if kind == membership.Joined || wasAway {
		go f.back(ctx, m.Name)
	}
	go f.o.Router.Refresh(ctx)
}

// out handles a node that failed or left: its traffic fails at once, and its running sandboxes
// end if it is not back within the grace period.
func (f *Fleet) out(ctx context.Context, m membership.Member) {
	f.o.Router.Remove(m.Name)
	state := store.NodeLost
	if m.Left {
		state = store.NodeLeft
	}
	f.mu.Lock()
	delete(f.rpc, m.Name)
	delete(f.unanswering, m.Name)
	f.mu.Unlock()
	f.markAway(ctx, m.Name, state)
}

// markAway puts a node out of reach: its traffic fails at once, and its running sandboxes end if
// it is not back within the grace period.
func (f *Fleet) markAway(ctx context.Context, name, state string) {
	f.o.Sandboxes.NodeOut(name)
	if err := f.o.Records.SetNodeState(ctx, name, state, f.o.Now()); err != nil {
		f.o.Log.Warn("record a node out of reach", "node", name, "err", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.away[name]; ok {
		return
	}
	f.away[name] = time.AfterFunc(f.o.Grace, func() {
		f.mu.Lock()
		_, still := f.away[name]
		f.mu.Unlock()
		if !still {
			return
		}
		if err := f.o.Sandboxes.NodeLost(context.Background(), name); err != nil {
			f.o.Log.Error("end the sandboxes of a lost node", "node", name, "err", err)
		}
	})
}

// back reconciles the records with what a node that (re)joined holds, retrying while it cannot
// say (it is still recovering what it found at its start) and as long as it stays in the cluster.
func (f *Fleet) back(ctx context.Context, name string) {
	wait := time.Second
	for {
		c, ok := f.o.Router.Client(name)
		if !ok {
			return
		}
		l, ok := c.(interface {
			ListSandboxes(ctx context.Context) (nodeapi.Holdings, error)
		})
		if !ok {
			return
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		h, err := l.ListSandboxes(lctx)
		if err == nil {
			err = f.o.Sandboxes.NodeBack(lctx, name, driver.Holdings{Running: h.Running, Paused: h.Paused}, c)
			if err == nil {
				cancel()
				return
			}
			f.o.Log.Error("reconcile a node that is back; trying again", "node", name, "err", err)
		} else {
			f.o.Log.Warn("a node that joined cannot list its sandboxes yet", "node", name, "err", err)
		}
		cancel()
		// Its traffic stays failing meanwhile: a node whose holdings are not reconciled is not
		// served blind.
		f.o.Sandboxes.NodeOut(name)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// Run refreshes the nodes' room and records and carries out drains until ctx ends.
func (f *Fleet) Run(ctx context.Context) {
	t := time.NewTicker(f.o.Every)
	defer t.Stop()
	for {
		f.tick(ctx)
		select {
		case <-ctx.Done():
			f.mu.Lock()
			for _, timer := range f.away {
				timer.Stop()
			}
			f.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

func (f *Fleet) tick(ctx context.Context) {
	f.o.Router.Refresh(ctx)
	drains := map[string]string{}
	if recs, err := f.o.Records.ListNodes(ctx); err == nil {
		for _, r := range recs {
			drains[r.Name] = r.Drain
		}
	}
	now := f.o.Now()
	for _, v := range f.o.Router.Nodes() {
		if f.answering(ctx, v, now) {
			continue
		}
		drain := drains[v.Name]
		f.o.Router.SetDrained(v.Name, drain != store.DrainNone || v.Meta.State == membership.StateDraining)
		state := store.NodeReady
		if drain != store.DrainNone || v.Meta.State == membership.StateDraining {
			state = store.NodeDraining
		}
		f.mu.Lock()
		gossip := f.gossip[v.Name]
		f.mu.Unlock()
		rec := store.Node{Name: v.Name, RPC: v.Meta.RPC, Gossip: gossip, State: state, Features: v.Meta.Features,
			Templates: v.Status.Templates, FreeSlots: v.Status.FreeSlots, FreeMemoryMB: v.Status.FreeMemoryMB,
			FreeDiskMB: v.Status.FreeDiskMB, Load: v.Status.Load, SeenAt: now, Since: now}
		if v.StatusAt.IsZero() {
			rec.SeenAt = now.Add(-f.o.Every)
		}
		if err := f.o.Records.UpsertNode(ctx, rec); err != nil {
			f.o.Log.Warn("record a node", "node", v.Name, "err", err)
		}
		// A node that drains itself (it is stopping) is emptied as a drain with pause is.
		if drain == store.DrainPause || v.Meta.State == membership.StateDraining {
			f.pauseAll(ctx, v.Name)
		}
	}
}

// unanswered is how long a node gossip calls alive may fail to answer the driver before it counts
// as out of reach.
func (f *Fleet) unanswered() time.Duration { return 3 * f.o.Every }

// answering follows a node's answers to the driver, and reports whether it is skipped for now: one
// that stopped answering (a partition between it and the driver, which gossip through other
// members does not see) is put out of reach; one that answers again is reconciled and back.
func (f *Fleet) answering(ctx context.Context, v cluster.NodeView, now time.Time) (skip bool) {
	f.mu.Lock()
	was := f.unanswering[v.Name]
	f.mu.Unlock()
	switch {
	case !was && now.Sub(v.HeardAt) > f.unanswered():
		f.o.Log.Warn("node alive in gossip does not answer the driver", "node", v.Name, "since", v.HeardAt)
		f.mu.Lock()
		f.unanswering[v.Name] = true
		f.mu.Unlock()
		f.markAway(ctx, v.Name, store.NodeLost)
		return true
	case was && !v.StatusAt.IsZero():
		f.mu.Lock()
		delete(f.unanswering, v.Name)
		timer, ok := f.away[v.Name]
		delete(f.away, v.Name)
		f.mu.Unlock()
		if ok {
			timer.Stop()
		}
		f.o.Log.Info("node answers the driver again", "node", v.Name)
		go f.back(context.WithoutCancel(ctx), v.Name)
		return false
	}
	return was
}

// pauseAll pauses the running sandboxes of a node being drained, one at a time, in the
// background; they resume wherever placement puts them next.
func (f *Fleet) pauseAll(ctx context.Context, name string) {
	f.mu.Lock()
	if f.pausing[name] {
		f.mu.Unlock()
		return
	}
	f.pausing[name] = true
	f.mu.Unlock()
	go func() {
		defer func() {
			f.mu.Lock()
			delete(f.pausing, name)
			f.mu.Unlock()
		}()
		ids, err := f.o.Sandboxes.RunningOn(ctx, name)
		if err != nil {
			f.o.Log.Warn("list a drained node's sandboxes", "node", name, "err", err)
			return
		}
		for _, id := range ids {
			if err := f.o.Sandboxes.Pause(ctx, id, true); err != nil {
				f.o.Log.Warn("pause a sandbox of a drained node", "node", name, "sandbox", id, "err", err)
				continue
			}
			f.o.Log.Info("paused a sandbox of a drained node", "node", name, "sandbox", id)
		}
	}()
}
