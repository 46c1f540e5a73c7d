// Package cluster is the driver's view of its nodes: which are in the cluster (from gossip), what
// each can do and has room for (from their Info), and how a call for a sandbox reaches the node
// that holds it. Router implements driver.Node and its optional parts over the nodes' clients, so
// the driver is the same with one node or many: a create goes to the first node placement orders
// that takes it (a node that answers "full" or cannot be reached passes it on), every other call
// to the node that holds the sandbox.
//
// It owns no record: where a sandbox lives comes from the driver's store (Locate), and it keeps
// only the nodes' clients and last reported status.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/placement"
)

// NodeClient is one node as the router calls it (nodeapi.Client).
type NodeClient interface {
	driver.Node
	driver.Pauser
	driver.Snapshotter
	driver.MetricsNode
	driver.DeniedWatcher
	Info(ctx context.Context) (nodeapi.NodeInfo, error)
}

// Tunneler is the optional part of a NodeClient that opens byte streams to a sandbox's ports
// (nodeapi.TunnelDialer), for the driver's edge.
type Tunneler interface {
	Dial(ctx context.Context, id string, port int) (net.Conn, error)
}

var (
	_ driver.Node          = (*Router)(nil)
	_ driver.Pauser        = (*Router)(nil)
	_ driver.Snapshotter   = (*Router)(nil)
	_ driver.MetricsNode   = (*Router)(nil)
	_ driver.DeniedWatcher = (*Router)(nil)
	_ driver.NodeFeatures  = (*Router)(nil)
)

// Router sends each call to the right node.
type Router struct {
	// locate returns the node holding a sandbox, from the driver's records.
	locate func(ctx context.Context, id string) (string, error)

	mu sync.Mutex
	// +checklocks:mu
	nodes map[string]*member
	// placed remembers where this router put a sandbox until its record says so too (between
	// a node's answer and the record's update, a failed create's cleanup needs it). +checklocks:mu
	placed map[string]string
	// +checklocks:mu
	rng *rand.Rand
	// drained are the nodes operators drained: nothing new is placed on them. +checklocks:mu
	drained map[string]bool
	// volumeHome names the node a volume lives on (SetVolumeHome); nil: no volumes.
	volumeHome func(ctx context.Context, id string) (string, error)
}

type member struct {
	client NodeClient
	meta   membership.Meta
	status nodeapi.NodeInfo
	// statusAt is when status was last heard; zero: never (the node counts as unready).
	statusAt time.Time
	// heardAt is when the node last answered, or joined; a failure does not reset it.
	heardAt time.Time
}

// NewRouter routes by locate (the node a sandbox's record names).
func NewRouter(locate func(ctx context.Context, id string) (string, error)) *Router {
	return &Router{locate: locate, nodes: map[string]*member{}, placed: map[string]string{}, drained: map[string]bool{},
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// Upsert adds a node or changes what gossip says of it.
func (r *Router) Upsert(name string, meta membership.Meta, client NodeClient) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.nodes[name]; ok {
		m.meta = meta
		if client != nil {
			m.client = client
		}
		return
	}
	r.nodes[name] = &member{client: client, meta: meta, heardAt: time.Now()}
}

// Remove forgets a node (it left or failed); its sandboxes' calls fail as Unavailable.
func (r *Router) Remove(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.nodes, name)
}

// SetDrained stops (or, with false, resumes) placing new sandboxes on node name.
func (r *Router) SetDrained(name string, drained bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if drained {
		r.drained[name] = true
	} else {
		delete(r.drained, name)
	}
}

// NodeView is one node as the router last heard of it.
type NodeView struct {
	Name   string
	Meta   membership.Meta
	Status nodeapi.NodeInfo
	// StatusAt is when Status was heard; zero: the node has not answered since it joined or
	// since it last failed to.
	StatusAt time.Time
	// HeardAt is when the node last answered (or joined).
	HeardAt time.Time
	Drained bool
}

// Nodes lists the nodes, by name.
func (r *Router) Nodes() []NodeView {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]NodeView, 0, len(r.nodes))
	for name, m := range r.nodes {
		out = append(out, NodeView{Name: name, Meta: m.meta, Status: m.status, StatusAt: m.statusAt, HeardAt: m.heardAt,
			Drained: r.drained[name]})
	}
	slices.SortFunc(out, func(a, b NodeView) int { return cmpString(a.Name, b.Name) })
	return out
}

// NodeFeatures are the features node name advertises.
func (r *Router) NodeFeatures(name string) ([]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.nodes[name]
	if !ok {
		return nil, false
	}
	return slices.Clone(m.meta.Features), true
}

// Client returns node name's client.
func (r *Router) Client(name string) (NodeClient, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.nodes[name]
	if !ok || m.client == nil {
		return nil, false
	}
	return m.client, true
}

// Refresh asks every node for its status; one that does not answer stays listed but is not
// placed on until it does.
func (r *Router) Refresh(ctx context.Context) {
	r.mu.Lock()
	names := make([]string, 0, len(r.nodes))
	clients := make([]NodeClient, 0, len(r.nodes))
	for name, m := range r.nodes {
		names, clients = append(names, name), append(clients, m.client)
	}
	r.mu.Unlock()
	type result struct {
		info nodeapi.NodeInfo
		err  error
	}
	results := make([]result, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			info, err := c.Info(cctx)
			results[i] = result{info, err}
		})
	}
	wg.Wait()
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, name := range names {
		m, ok := r.nodes[name]
		if !ok {
			continue
		}
		if results[i].err != nil {
			m.statusAt = time.Time{}
			continue
		}
		m.status, m.statusAt, m.heardAt = results[i].info, now, now
	}
}

// slotsChanged moves node name's free slots by delta as of a call it answered, so that placement
// between two refreshes neither skips a node whose sandbox just ended nor piles onto one that
// just took its last slot; the next refresh tells the truth again.
func (r *Router) slotsChanged(name string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.nodes[name]; ok && !m.statusAt.IsZero() {
		m.status.FreeSlots = max(0, m.status.FreeSlots+delta)
	}
}

// started records that sandbox id now runs on node name, as info says: later calls for it go
// there, and the node has one slot less.
func (r *Router) started(info node.Info, id, name string) node.Info {
	info.Node = name
	r.mu.Lock()
	r.placed[id] = name
	r.mu.Unlock()
	r.slotsChanged(name, -1)
	return info
}

// Features is the union of the ready nodes' features: what the cluster can enforce at all.
func (r *Router) Features() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.nodes {
		if m.ready() {
			for _, f := range m.meta.Features {
				if !slices.Contains(out, f) {
					out = append(out, f)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func (m *member) ready() bool {
	return m.meta.Role == membership.RoleNode && (m.meta.State == "" || m.meta.State == membership.StateReady) && !m.statusAt.IsZero()
}

// candidates orders the nodes for a sandbox needing features, memory and disk, booting template.
func (r *Router) candidates(spec node.CreateSpec, features []string, pin string) ([]placement.Node, map[string]NodeClient, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ns []placement.Node
	clients := map[string]NodeClient{}
	for name, m := range r.nodes {
		if m.meta.Role != membership.RoleNode || (pin != "" && name != pin) {
			continue
		}
		ns = append(ns, placement.Node{Name: name, Ready: m.ready() && !r.drained[name], Features: m.meta.Features,
			FreeMemoryMB: int(m.status.FreeMemoryMB), FreeSlots: m.status.FreeSlots, FreeDiskMB: int(m.status.FreeDiskMB),
			Templates: m.status.Templates, Load: m.status.Load})
		clients[name] = m.client
	}
	slices.SortFunc(ns, func(a, b placement.Node) int { return cmpString(a.Name, b.Name) })
	order, err := placement.Order(ns, placement.Request{Features: features, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB,
		Template: spec.TemplateID}, r.rng)
	return order, clients, err
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// place boots spec on the first node that takes it; boot is the call to make on a node.
func (r *Router) place(ctx context.Context, spec node.CreateSpec, boot func(NodeClient) (node.Info, error)) (node.Info, error) {
	features := spec.Egress.RequiredFeatures()
	pin, err := r.pinOf(ctx, spec)
	if err != nil {
		return node.Info{}, err
	}
	order, clients, err := r.candidates(spec, features, pin)
	if err != nil {
		return node.Info{}, err
	}
	var lastErr error
	for _, n := range order {
		info, err := boot(clients[n.Name])
		if err == nil {
			return r.started(info, spec.ID, n.Name), nil
		}
		// Full, or gone since gossip last spoke: the next candidate may take it. Anything else
		// (a bad spec, a failed boot) would fail there too.
		if k := errdefs.KindOf(err); k != errdefs.KindResourceExhausted && k != errdefs.KindUnavailable {
			return node.Info{}, err
		}
		lastErr = err
	}
	return node.Info{}, errdefs.WithCode(errdefs.Wrap(errdefs.KindResourceExhausted, lastErr,
		"every node that can run this sandbox is full"), placement.Capacity)
}

// SetVolumeHome tells the router where volumes live: a sandbox that mounts one is placed on that
// node, and resumes there only.
func (r *Router) SetVolumeHome(home func(ctx context.Context, id string) (string, error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.volumeHome = home
}

// pinOf is the node spec's volumes live on ("" when it mounts none). Volumes on different nodes
// cannot be mounted together.
func (r *Router) pinOf(ctx context.Context, spec node.CreateSpec) (string, error) {
	if len(spec.Volumes) == 0 {
		return "", nil
	}
	r.mu.Lock()
	home := r.volumeHome
	r.mu.Unlock()
	if home == nil {
		return "", nil
	}
	pin := ""
	for _, v := range spec.Volumes {
		n, err := home(ctx, v.ID)
		if err != nil {
			return "", err
		}
		if pin != "" && n != pin {
			return "", errdefs.InvalidArgument("the volumes mounted live on different nodes (%s, %s): a sandbox can mount volumes of one node only", pin, n)
		}
		pin = n
	}
	return pin, nil
}

// holder returns the client of the node holding sandbox id.
func (r *Router) holder(ctx context.Context, id string) (NodeClient, error) {
	_, c, err := r.holderName(ctx, id)
	return c, err
}

// holderName returns the name and client of the node holding sandbox id.
func (r *Router) holderName(ctx context.Context, id string) (string, NodeClient, error) {
	r.mu.Lock()
	name, ok := r.placed[id]
	r.mu.Unlock()
	if !ok {
		var err error
		if name, err = r.locate(ctx, id); err != nil {
			return "", nil, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.nodes[name]
	if !ok || m.client == nil {
		return name, nil, errdefs.Unavailable("the node holding sandbox %q (%s) is not in the cluster", id, name)
	}
	return name, m.client, nil
}

func (r *Router) forget(id string) {
	r.mu.Lock()
	delete(r.placed, id)
	r.mu.Unlock()
}

// Dial opens a tunnel to port of sandbox id (agentproto.EnvdPort: its envd) on the node that
// holds it.
func (r *Router) Dial(ctx context.Context, id string, port int) (net.Conn, error) {
	c, err := r.holder(ctx, id)
	if err != nil {
		return nil, err
	}
	t, ok := c.(Tunneler)
	if !ok {
		return nil, errdefs.Unavailable("the node holding sandbox %q opens no tunnels", id)
	}
	return t.Dial(ctx, id, port)
}

func (r *Router) CreateSandbox(ctx context.Context, spec node.CreateSpec) (node.Info, error) {
	return r.place(ctx, spec, func(c NodeClient) (node.Info, error) { return c.CreateSandbox(ctx, spec) })
}

func (r *Router) DestroySandbox(ctx context.Context, id string) error {
	name, c, err := r.holderName(ctx, id)
	if errdefs.KindOf(err) == errdefs.KindNotFound {
		return nil // never placed, or its record is gone: nothing to destroy
	}
	if err != nil {
		return err
	}
	err = c.DestroySandbox(ctx, id)
	if err == nil {
		r.forget(id)
		r.slotsChanged(name, +1)
	}
	return err
}

func (r *Router) UpdateEgress(ctx context.Context, id string, p egress.Policy) error {
	c, err := r.holder(ctx, id)
	if err != nil {
		return err
	}
	return c.UpdateEgress(ctx, id, p)
}

func (r *Router) PauseSandbox(ctx context.Context, id string, memory bool) (node.PauseInfo, error) {
	name, c, err := r.holderName(ctx, id)
	if err != nil {
		return node.PauseInfo{}, err
	}
	info, err := c.PauseSandbox(ctx, id, memory)
	if err == nil {
		r.slotsChanged(name, +1)
	}
	return info, err
}

// ResumeSandbox resumes on the node that paused the sandbox (its copy is there, warm) when that
// node is in the cluster, not drained, and takes it; otherwise on any node placement picks, which
// takes the paused sandbox from the store the nodes share (a node without one answers NotFound,
// and the next is tried).
func (r *Router) ResumeSandbox(ctx context.Context, spec node.CreateSpec, memory bool) (node.Info, error) {
	name, c, herr := r.holderName(ctx, spec.ID)
	if herr != nil && errdefs.KindOf(herr) != errdefs.KindUnavailable {
		return node.Info{}, herr
	}
	onHolder := func() (node.Info, error) {
		info, err := c.ResumeSandbox(ctx, spec, memory)
		if err != nil {
			return info, err
		}
		return r.started(info, spec.ID, name), nil
	}
	if pin, err := r.pinOf(ctx, spec); err != nil {
		return node.Info{}, err
	} else if pin != "" {
		// Its volumes are on its node: it resumes there or not at all.
		if herr != nil {
			return node.Info{}, errdefs.Wrap(errdefs.KindUnavailable, herr, "sandbox %q mounts volumes of node %s, which is not in reach", spec.ID, pin)
		}
		return onHolder()
	}
	drained := herr == nil && r.isDrained(name)
	var holderErr error
	if herr == nil && !drained {
		info, err := onHolder()
		if err == nil {
			return info, nil
		}
		// Only a definite refusal (full) sends it elsewhere: an unanswered call may have resumed
		// it there all the same, and a second node must not run it too. Once gossip takes the
		// holder out, the resume goes elsewhere.
		if errdefs.KindOf(err) != errdefs.KindResourceExhausted {
			return node.Info{}, err
		}
		holderErr = err
	}
	// Elsewhere, a node that has no copy (no shared store, or the pause has not reached it yet)
	// answers NotFound: that must not read as a sandbox whose saved state is gone.
	info, perr := r.place(ctx, spec, func(c NodeClient) (node.Info, error) {
		info, err := c.ResumeSandbox(ctx, spec, memory)
		if errdefs.Is(err, errdefs.KindNotFound) {
			return info, errdefs.Wrap(errdefs.KindUnavailable, err, "no copy of paused sandbox %q on this node", spec.ID)
		}
		return info, err
	})
	if perr == nil {
		if c != nil && info.Node != name {
			// The node that paused it keeps a stale copy: dropped (its copy in the store is
			// removed only if still the one that node pushed). A node out of reach drops its
			// own when it is back (the driver's reconciliation).
			go func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				_ = c.DeletePaused(dctx, spec.ID)
			}()
		}
		return info, nil
	}
	if drained {
		// Nobody else could take it: a drained node still resumes what only it holds.
		if info, err := onHolder(); err == nil {
			return info, nil
		}
	}
	if errdefs.KindOf(holderErr) == errdefs.KindResourceExhausted {
		return node.Info{}, perr
	}
	return node.Info{}, errdefs.Wrap(errdefs.KindUnavailable, perr,
		"sandbox %q cannot be resumed now: the node that paused it cannot take it, and no other node has its saved state", spec.ID)
}

func (r *Router) isDrained(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drained[name]
}

func (r *Router) DeletePaused(ctx context.Context, id string) error {
	c, err := r.holder(ctx, id)
	if errdefs.KindOf(err) == errdefs.KindNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	return c.DeletePaused(ctx, id)
}

func (r *Router) SnapshotSandbox(ctx context.Context, id, snapID string) (node.PauseInfo, error) {
	name, c, err := r.holderName(ctx, id)
	if err != nil {
		return node.PauseInfo{}, err
	}
	info, err := c.SnapshotSandbox(ctx, id, snapID)
	if err != nil {
		return info, err
	}
	// A fork's checkpoint has no record to say where it is.
	r.mu.Lock()
	r.placed[snapID] = name
	r.mu.Unlock()
	return info, nil
}

// snapshotPublisher is the part of a node client that puts a snapshot in the cluster's store
// (nodeapi.Client).
type snapshotPublisher interface {
	PublishSnapshot(ctx context.Context, snapID string) error
}

// CreateFromSnapshot starts the new sandbox where its source is (a warm local copy), unless that
// node is full, drained or gone: then, for a snapshot, the holder puts it in the cluster's store
// and placement picks another node, which fetches it. A fork of a paused sandbox starts on that
// sandbox's node only.
func (r *Router) CreateFromSnapshot(ctx context.Context, spec node.CreateSpec, snapID, pausedID string) (node.Info, error) {
	source := pausedID
	if source == "" {
		source = snapID
	}
	name, c, err := r.holderName(ctx, source)
	var full error
	if err == nil && !r.isDrained(name) {
		info, err := c.CreateFromSnapshot(ctx, spec, snapID, pausedID)
		if err == nil {
			return r.started(info, spec.ID, name), nil
		}
		if pausedID != "" || errdefs.KindOf(err) != errdefs.KindResourceExhausted {
			return node.Info{}, err
		}
		full = err
	} else if err != nil && (pausedID != "" || errdefs.KindOf(err) != errdefs.KindUnavailable) {
		return node.Info{}, fmt.Errorf("find the node of %s: %w", source, err)
	} else if pausedID != "" {
		return node.Info{}, errdefs.Unavailable("the node holding paused sandbox %q is draining", pausedID)
	}
	drained := err == nil && full == nil // the holder is there, drained
	// Another node: it fetches the snapshot from the store, which the holder (when it is still
	// there) puts it in first. One that is gone may have put it there before.
	if p, ok := c.(snapshotPublisher); ok {
		if err := p.PublishSnapshot(ctx, snapID); err != nil {
			switch {
			case full != nil && errors.Is(err, driver.ErrNotImplemented):
				return node.Info{}, full // no store: the snapshot cannot leave its full node
			case drained && errors.Is(err, driver.ErrNotImplemented):
				// No store: a drained holder still starts it, as it still resumes its own.
				info, err := c.CreateFromSnapshot(ctx, spec, snapID, "")
				if err != nil {
					return node.Info{}, err
				}
				return r.started(info, spec.ID, name), nil
			}
			return node.Info{}, fmt.Errorf("share snapshot %s from node %s: %w", snapID, name, err)
		}
	}
	info, err := r.place(ctx, spec, func(nc NodeClient) (node.Info, error) {
		return nc.CreateFromSnapshot(ctx, spec, snapID, "")
	})
	if errdefs.Is(err, errdefs.KindNotFound) {
		// Not on the node placement chose, nor in the store: its node, gone, never shared it.
		// The snapshot's record stands; it is out of reach, not missing.
		return node.Info{}, errdefs.Unavailable("snapshot %q is on node %s, which is out of reach, and not in the store", snapID, name)
	}
	return info, err
}

// DeleteSnapshot deletes a snapshot on its node, in the store, and on every node that fetched
// a copy of it.
func (r *Router) DeleteSnapshot(ctx context.Context, snapID string) error {
	name, c, err := r.holderName(ctx, snapID)
	if err != nil && errdefs.KindOf(err) != errdefs.KindNotFound && errdefs.KindOf(err) != errdefs.KindUnavailable {
		return err
	}
	var holderErr error
	if c != nil {
		holderErr = c.DeleteSnapshot(ctx, snapID)
	}
	r.mu.Lock()
	delete(r.placed, snapID)
	others := make([]NodeClient, 0, len(r.nodes))
	for n, m := range r.nodes {
		if n != name && m.client != nil && m.meta.Role == membership.RoleNode {
			others = append(others, m.client)
		}
	}
	r.mu.Unlock()
	// Copies elsewhere are a cache: one a node misses now stays until the node deletes it.
	for _, o := range others {
		_ = o.DeleteSnapshot(ctx, snapID)
	}
	return holderErr
}

func (r *Router) SandboxMetrics(ctx context.Context, id string) (node.Metrics, error) {
	c, err := r.holder(ctx, id)
	if err != nil {
		return node.Metrics{}, err
	}
	return c.SandboxMetrics(ctx, id)
}

func (r *Router) WatchDenied(id string) ([]node.DeniedEvent, <-chan node.DeniedEvent, func(), error) {
	c, err := r.holder(context.Background(), id)
	if err != nil {
		return nil, nil, nil, err
	}
	return c.WatchDenied(id)
}

// Recorded tells the router what a sandbox's record now says, after a driver sharing the store
// changed it: where this router remembers placing the sandbox gives way to the node the record
// names (another driver may have resumed it elsewhere), and a sandbox whose record is gone or
// killed is forgotten. Sandboxes this router never placed are left to locate.
func (r *Router) Recorded(id, node string, gone bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.placed[id]; !ok {
		return
	}
	switch {
	case gone:
		delete(r.placed, id)
	case node != "":
		r.placed[id] = node
	}
}
