package node

import (
	"context"
	"slices"
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
