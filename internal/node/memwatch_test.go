package node

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// The node tells envd whether its sandbox is near its memory from the host's figure: far at
// first, near from half of it, far again only below 40 %; an envd too old for hints is asked
// once and then left to watch closely itself.
func TestMemoryHints(t *testing.T) {
	e := newEnv(t)
	n := e.node(t, nil)
	ctx := context.Background()
	e.rt.setMem("abc", 100)
	e.rt.mu.Lock()
	e.rt.oldEnvd["old"] = true
	e.rt.mu.Unlock()
	e.rt.setMem("old", 100)
	for _, id := range []string{"abc", "old"} {
		if _, err := n.CreateSandbox(ctx, spec(id)); err != nil { // 512 MiB
			t.Fatal(err)
		}
	}
	want := func(hints ...bool) {
		t.Helper()
		waitFor(t, "hints "+formatHints(hints), func() bool { return slices.Equal(e.rt.hintsOf("abc"), hints) })
	}
	want(false)
	e.rt.setMem("abc", 300)
	want(false, true)
	e.rt.setMem("abc", 230) // between 40 % and half: still near
	time.Sleep(4 * memWatchEvery)
	want(false, true)
	e.rt.setMem("abc", 150)
	want(false, true, false)

	// The old envd answered 404 once: it is not asked again, whatever its memory does.
	sb := func() *sandbox {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.sandboxes["old"]
	}()
	waitFor(t, "the old envd marked as taking no hints", func() bool { return sb.memHint.told.Load() == memHintUnsupported })
	e.rt.setMem("old", 400)
	time.Sleep(4 * memWatchEvery)
	if got := e.rt.hintsOf("old"); len(got) != 0 {
		t.Fatalf("an old envd recorded hints %v", got)
	}
}

func formatHints(h []bool) string {
	out := ""
	for _, near := range h {
		if near {
			out += "near "
		} else {
			out += "far "
		}
	}
	return out
}

// signallingRuntime signals crossings of memory thresholds as the gvisor runtime does on cgroup
// v1, when the test says one happened.
type signallingRuntime struct {
	*fakeRuntime
	mu         sync.Mutex
	thresholds map[string][]uint64
	signal     map[string]chan struct{}
	ended      map[string]bool
}

func (r *signallingRuntime) MemoryEvents(ctx context.Context, id string, thresholds ...uint64) (<-chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, out := make(chan struct{}), make(chan struct{}, 1)
	r.thresholds[id], r.signal[id] = thresholds, in
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				r.mu.Lock()
				r.ended[id] = true
				r.mu.Unlock()
				return
			case <-in:
				out <- struct{}{}
			}
		}
	}()
	return out, nil
}

func (r *signallingRuntime) cross(t *testing.T, id string) {
	t.Helper()
	r.mu.Lock()
	ch := r.signal[id]
	r.mu.Unlock()
	select {
	case ch <- struct{}{}:
	case <-time.After(5 * time.Second):
		t.Fatalf("nobody follows %s's memory", id)
	}
}

// Where the kernel signals crossings, the node checks a sandbox's memory at each one and leaves
// it alone otherwise: a guest filling fast is told near when it crosses half its memory, not at
// the next tick, and no tick reads the memory of a sandbox the kernel watches. A sandbox that
// leaves the node leaves no follower behind.
func TestMemoryHintsFollowTheKernelsSignals(t *testing.T) {
	e := newEnv(t)
	rt := &signallingRuntime{fakeRuntime: e.rt, thresholds: map[string][]uint64{}, signal: map[string]chan struct{}{}, ended: map[string]bool{}}
	e.wrap = rt
	n := e.node(t, nil)
	ctx := context.Background()
	e.rt.setMem("abc", 100)
	if _, err := n.CreateSandbox(ctx, spec("abc")); err != nil { // 512 MiB
		t.Fatal(err)
	}
	want := func(hints ...bool) {
		t.Helper()
		waitFor(t, "hints "+formatHints(hints), func() bool { return slices.Equal(e.rt.hintsOf("abc"), hints) })
	}
	want(false) // the first check, as soon as the node follows it
	rt.mu.Lock()
	got := rt.thresholds["abc"]
	rt.mu.Unlock()
	if !slices.Equal(got, []uint64{256 << 20, 512 << 20 * 40 / 100}) {
		t.Fatalf("thresholds %v, want half and 40 %% of 512 MiB", got)
	}
	e.rt.setMem("abc", 300)
	time.Sleep(4 * memWatchEvery)
	want(false) // no signal, no look
	rt.cross(t, "abc")
	want(false, true)
	e.rt.setMem("abc", 150)
	rt.cross(t, "abc")
	want(false, true, false)

	if err := n.DestroySandbox(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the follower of a killed sandbox to end", func() bool {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return rt.ended["abc"]
	})
}
