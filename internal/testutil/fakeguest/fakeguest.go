// Package fakeguest is a stand-in for envd's reaper in tests of the watchers that rest while the
// guest runs nothing: it says whether envd is alone and fires Activity at the starts a test makes.
// It never starts or reaps a process.
package fakeguest

import "sync"

// Guest is a guest whose process starts the test makes.
type Guest struct {
	mu    sync.Mutex
	act   chan struct{}
	alone bool
}

// New returns a guest that is alone (envd runs no process) or not.
func New(alone bool) *Guest { return &Guest{act: make(chan struct{}), alone: alone} }

// Activity returns a channel closed at the next Start.
func (g *Guest) Activity() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.act
}

// Alone reports whether envd runs no process.
func (g *Guest) Alone() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.alone
}

// Start is a process start: the guest is no longer alone, and Activity fires.
func (g *Guest) Start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.alone = false
	close(g.act)
	g.act = make(chan struct{})
}
