// Package drivertest provides test doubles for the driver's dependencies: a Node that keeps
// sandboxes in memory and a Clock that only moves when told. It is for tests only and must never be
// linked into vmon's binaries.
package drivertest

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/vibemon/vmon/internal/egress"
	"github.com/vibemon/vmon/internal/errdefs"
	"github.com/vibemon/vmon/internal/node"
	"github.com/vibemon/vmon/internal/store"
)

// Node is an in-memory driver.Node. Set the exported fields before use; they are read under its
// lock.
type Node struct {
	mu      sync.Mutex
	running map[string]node.CreateSpec
	creates []node.CreateSpec
	destroy []string
	updates []EgressUpdate

	// CreateErr, when set, fails every create.
	CreateErr error
	// DestroyErr, when set, fails every destroy.
	DestroyErr error
	// UpdateErr, when set, fails every egress update (the previous policy stays in force).
	UpdateErr error
	// Gate, when set, makes CreateSandbox block until it is closed (or ctx ends). Entered receives
	// the id of each create as it starts waiting.
	Gate    chan struct{}
	Entered chan string
	// Destroyed receives the id of every destroy call (if non-nil, buffered by the caller).
	Destroyed chan string
	// EnvdVersion is reported by created sandboxes; default "0.6.13".
	EnvdVersion string
	// StartedAt is reported by created sandboxes; zero lets the driver use its clock.
	StartedAt time.Time
}

// NewNode returns a Node whose Destroyed channel is buffered for 1000 calls.
func NewNode() *Node {
	return &Node{Destroyed: make(chan string, 1000)}
}

// CreateSandbox records spec and "boots" it.
func (n *Node) CreateSandbox(ctx context.Context, spec node.CreateSpec) (node.Info, error) {
	n.mu.Lock()
	gate, entered, err := n.Gate, n.Entered, n.CreateErr
	n.creates = append(n.creates, spec)
	n.mu.Unlock()
	if entered != nil {
		entered <- spec.ID
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return node.Info{}, ctx.Err()
		}
	}
	if err != nil {
		return node.Info{}, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.running == nil {
		n.running = map[string]node.CreateSpec{}
	}
	n.running[spec.ID] = spec
	v := n.EnvdVersion
	if v == "" {
		v = "0.6.13"
	}
	return node.Info{ID: spec.ID, StartedAt: n.StartedAt, EnvdVersion: v}, nil
}

// DestroySandbox removes id; an unknown id succeeds, as the Node contract requires.
func (n *Node) DestroySandbox(_ context.Context, id string) error {
	n.mu.Lock()
	err := n.DestroyErr
	n.destroy = append(n.destroy, id)
	if err == nil {
		delete(n.running, id)
	}
	ch := n.Destroyed
	n.mu.Unlock()
	if ch != nil {
		select {
		case ch <- id:
		default:
		}
	}
	return err
}

// EgressUpdate is one UpdateEgress call.
type EgressUpdate struct {
	ID     string
	Policy egress.Policy
}

// UpdateEgress replaces a running sandbox's policy (its spec's Egress); an unknown id is NotFound,
// as the driver.Node contract requires.
func (n *Node) UpdateEgress(_ context.Context, id string, p egress.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.updates = append(n.updates, EgressUpdate{ID: id, Policy: p})
	if n.UpdateErr != nil {
		return n.UpdateErr
	}
	spec, ok := n.running[id]
	if !ok {
		return errdefs.NotFound("sandbox %q is not running on this node", id)
	}
	spec.Egress = p
	n.running[id] = spec
	return nil
}

// Updates returns every egress update received, in order.
func (n *Node) Updates() []EgressUpdate {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]EgressUpdate(nil), n.updates...)
}

// Alive reports whether id is running; it fits driver.Recover.
func (n *Node) Alive(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.running[id]
	return ok
}

// Spec returns the create spec of a running sandbox, with the egress policy currently in force.
func (n *Node) Spec(id string) (node.CreateSpec, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.running[id]
	return s, ok
}

// Running returns how many sandboxes run.
func (n *Node) Running() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.running)
}

// Creates returns every create spec received, in order.
func (n *Node) Creates() []node.CreateSpec {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]node.CreateSpec(nil), n.creates...)
}

// Destroys returns every destroyed id, in order.
func (n *Node) Destroys() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.destroy...)
}

// Set runs f under the node's lock, to change the exported fields while the node is in use.
func (n *Node) Set(f func(n *Node)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(n)
}

// Forget drops id as if its runtime died.
func (n *Node) Forget(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.running, id)
}

// NetworkStore is a driver.NetworkStore over a real store that can be made to fail.
type NetworkStore struct {
	Store *store.Store
	// Err, when set, fails every update.
	Err error
}

// SetSandboxNetwork fails with Err if set, else records the update in Store.
func (s *NetworkStore) SetSandboxNetwork(ctx context.Context, id string, network json.RawMessage, allowInternetAccess *bool) error {
	if s.Err != nil {
		return s.Err
	}
	return s.Store.SetSandboxNetwork(ctx, id, network, allowInternetAccess)
}

// ErrBoot is a ready-made create failure.
var ErrBoot = errdefs.Unavailable("boot failed")

// Clock is a manual driver.Clock.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a Clock set to start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// At returns a channel that receives once the clock reaches t.
func (c *Clock) At(t time.Time) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if !t.After(c.now) {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: t, ch: ch})
	return ch
}

// Advance moves the clock forward by d and fires every timer that came due.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	c.waiters = kept
}

// PausingNode is a Node that can also pause and resume sandboxes (driver.Pauser).
type PausingNode struct {
	*Node
	pmu    sync.Mutex
	paused map[string]node.CreateSpec
	memory map[string]bool
	// PauseErr and ResumeErr, when set, fail every pause or resume (the sandbox stays as it was).
	PauseErr, ResumeErr error
	// Resumes records every resume call's spec and memory flag.
	Resumes []ResumeCall
}

// ResumeCall is one ResumeSandbox call.
type ResumeCall struct {
	Spec   node.CreateSpec
	Memory bool
}

// NewPausingNode returns a PausingNode over a NewNode.
func NewPausingNode() *PausingNode {
	return &PausingNode{Node: NewNode(), paused: map[string]node.CreateSpec{}, memory: map[string]bool{}}
}

// PauseSandbox moves a running sandbox to paused.
func (p *PausingNode) PauseSandbox(_ context.Context, id string, memory bool) (node.PauseInfo, error) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if p.PauseErr != nil {
		return node.PauseInfo{}, p.PauseErr
	}
	p.Node.mu.Lock()
	spec, ok := p.Node.running[id]
	delete(p.Node.running, id)
	p.Node.mu.Unlock()
	if !ok {
		return node.PauseInfo{}, errdefs.NotFound("sandbox %q is not running on this node", id)
	}
	p.paused[id], p.memory[id] = spec, memory
	return node.PauseInfo{Memory: memory, Bytes: 1 << 20}, nil
}

// ResumeSandbox moves a paused sandbox back to running.
func (p *PausingNode) ResumeSandbox(_ context.Context, spec node.CreateSpec, memory bool) (node.Info, error) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	p.Resumes = append(p.Resumes, ResumeCall{Spec: spec, Memory: memory})
	if p.ResumeErr != nil {
		return node.Info{}, p.ResumeErr
	}
	if _, ok := p.paused[spec.ID]; !ok {
		return node.Info{}, errdefs.NotFound("paused sandbox %q not found on this node", spec.ID)
	}
	delete(p.paused, spec.ID)
	p.Node.mu.Lock()
	if p.Node.running == nil {
		p.Node.running = map[string]node.CreateSpec{}
	}
	p.Node.running[spec.ID] = spec
	p.Node.mu.Unlock()
	return node.Info{ID: spec.ID, EnvdVersion: "0.6.13"}, nil
}

// DeletePaused forgets a paused sandbox.
func (p *PausingNode) DeletePaused(_ context.Context, id string) error {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	delete(p.paused, id)
	return nil
}

// PutPaused gives the node a paused sandbox it did not pause, as a node of a cluster fetches one
// from the store the nodes share.
func (p *PausingNode) PutPaused(spec node.CreateSpec, memory bool) {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	p.paused[spec.ID], p.memory[spec.ID] = spec, memory
}

// Paused reports whether id is paused here; it fits driver.Recover.
func (p *PausingNode) Paused(id string) bool {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	_, ok := p.paused[id]
	return ok
}
