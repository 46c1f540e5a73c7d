package fleet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/cluster"
	"github.com/vibemon/vmon/internal/driver"
	"github.com/vibemon/vmon/internal/driver/drivertest"
	"github.com/vibemon/vmon/internal/membership"
	"github.com/vibemon/vmon/internal/nodeapi"
	"github.com/vibemon/vmon/internal/store"
)

type holdingNode struct {
	*drivertest.PausingNode
}

func (holdingNode) ListSandboxes(context.Context) (nodeapi.Holdings, error) {
	return nodeapi.Holdings{Running: []string{"held"}}, nil
}

// fake records every call the fleet makes.
type fake struct {
	mu     sync.Mutex
	calls  []string
	states map[string]string
	drain  map[string]string
	paused []string
}

func (f *fake) add(c string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}

func (f *fake) seen(c string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.calls, c)
}

func (f *fake) UpsertNode(_ context.Context, n store.Node) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states[n.Name] = n.State
	return nil
}

func (f *fake) SetNodeState(_ context.Context, name, state string, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states[name] = state
	return nil
}

func (f *fake) ListNodes(context.Context) ([]store.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Node
	for name, d := range f.drain {
		out = append(out, store.Node{Name: name, Drain: d})
	}
	return out, nil
}

func (f *fake) NodeOut(node string) { f.add("out " + node) }

func (f *fake) NodeBack(_ context.Context, node string, held driver.Holdings, _ driver.Cleaner) error {
	running := held.Running
	f.add("back " + node + " " + running[0])
	return nil
}

func (f *fake) NodeLost(_ context.Context, node string) error { f.add("lost " + node); return nil }

func (f *fake) RunningOn(context.Context, string) ([]string, error) { return []string{"s1", "s2"}, nil }

func (f *fake) Pause(_ context.Context, id string, _ bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused = append(f.paused, id)
	return nil
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOutBackLostAndDrain(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(nodeapi.NewServer(holdingNode{drivertest.NewPausingNode()}, func() nodeapi.Status {
		return nodeapi.Status{Features: []string{"net-tap"}, FreeSlots: 5}
	}).Handler())
	ts := httptest.NewServer(mux)
	defer ts.Close()
	rec := &fake{states: map[string]string{}, drain: map[string]string{}}
	router := cluster.NewRouter(func(context.Context, string) (string, error) { return "", nil })
	f := New(Options{Router: router, Records: rec, Sandboxes: rec, Grace: 200 * time.Millisecond, Every: 20 * time.Millisecond,
		Connect: func(string, string) cluster.NodeClient { return nodeapi.NewClient(ts.Client(), ts.URL) }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.Run(ctx)
	alive := membership.Member{Name: "node-a", Gossip: "10.0.0.2:7946", Alive: true,
		Meta: membership.Meta{Role: membership.RoleNode, RPC: "10.0.0.2:3001", State: membership.StateReady, Features: []string{"net-tap"}}}
	f.Event(alive, membership.Joined)
	waitUntil(t, "a joined node reconciled", func() bool { return rec.seen("back node-a held") })
	waitUntil(t, "its record", func() bool { rec.mu.Lock(); defer rec.mu.Unlock(); return rec.states["node-a"] == store.NodeReady })

	// Out, and back within the grace period: its sandboxes are not ended.
	dead := alive
	dead.Alive = false
	f.Event(dead, membership.Left)
	if !rec.seen("out node-a") || rec.states["node-a"] != store.NodeLost {
		t.Fatalf("a failed node: calls %v, state %q", rec.calls, rec.states["node-a"])
	}
	rec.mu.Lock()
	rec.calls = nil
	rec.mu.Unlock()
	f.Event(alive, membership.Joined)
	waitUntil(t, "the node back reconciled", func() bool { return rec.seen("back node-a held") })
	time.Sleep(400 * time.Millisecond)
	if rec.seen("lost node-a") {
		t.Fatal("a node back within the grace period had its sandboxes ended")
	}

	// Out for longer than the grace period: they are ended.
	f.Event(dead, membership.Left)
	waitUntil(t, "the lost node's sandboxes ended", func() bool { return rec.seen("lost node-a") })

	// A drain with pause, once the node is back: nothing new placed there, its sandboxes paused.
	f.Event(alive, membership.Joined)
	rec.mu.Lock()
	rec.drain["node-a"] = store.DrainPause
	rec.mu.Unlock()
	waitUntil(t, "the drained node's sandboxes paused", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return slices.Contains(rec.paused, "s1") && slices.Contains(rec.paused, "s2") && rec.states["node-a"] == store.NodeDraining
	})
	for _, v := range router.Nodes() {
		if v.Name == "node-a" && !v.Drained {
			t.Fatal("the router still places on a drained node")
		}
	}
}

// A node gossip still calls alive that stops answering the driver (a partition between the two
// only) is put out of reach after a few missed looks, and reconciled once it answers again.
func TestUnansweringNode(t *testing.T) {
	var cut atomic.Bool
	mux := http.NewServeMux()
	mux.Handle(nodeapi.NewServer(holdingNode{drivertest.NewPausingNode()}, func() nodeapi.Status {
		return nodeapi.Status{Features: []string{"net-tap"}, FreeSlots: 5}
	}).Handler())
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cut.Load() {
			// As a dropped packet would: no answer.
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
		}
		mux.ServeHTTP(w, r)
	}))
	defer ts.Close()
	rec := &fake{states: map[string]string{}, drain: map[string]string{}}
	router := cluster.NewRouter(func(context.Context, string) (string, error) { return "", nil })
	f := New(Options{Router: router, Records: rec, Sandboxes: rec, Grace: time.Hour, Every: 20 * time.Millisecond,
		Connect: func(string, string) cluster.NodeClient { return nodeapi.NewClient(ts.Client(), ts.URL) }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.Run(ctx)
	f.Event(membership.Member{Name: "node-a", Gossip: "10.0.0.2:7946", Alive: true,
		Meta: membership.Meta{Role: membership.RoleNode, RPC: "10.0.0.2:3001", State: membership.StateReady}}, membership.Joined)
	waitUntil(t, "the node reconciled", func() bool { return rec.seen("back node-a held") })
	rec.mu.Lock()
	rec.calls = nil
	rec.mu.Unlock()

	cut.Store(true)
	waitUntil(t, "the unanswering node out of reach", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return slices.Contains(rec.calls, "out node-a") && rec.states["node-a"] == store.NodeLost
	})
	if rec.seen("back node-a held") {
		t.Fatal("reconciled while it does not answer")
	}
	cut.Store(false)
	waitUntil(t, "the node reconciled once it answers", func() bool { return rec.seen("back node-a held") })
	waitUntil(t, "its record ready again", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.states["node-a"] == store.NodeReady
	})
	if rec.seen("lost node-a") {
		t.Fatal("a node away shorter than the grace period had its sandboxes ended")
	}
}
