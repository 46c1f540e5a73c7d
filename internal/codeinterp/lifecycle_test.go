package codeinterp

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

// createContext makes a context of lang in cwd and returns its id.
func createContext(t *testing.T, ts *httptest.Server, lang, cwd string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"language": lang, "cwd": cwd})
	resp, err := http.Post(ts.URL+"/contexts", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != 200 {
		t.Fatalf("create a %s context: %d %v", lang, resp.StatusCode, err)
	}
	return c.ID
}

func errorNames(lines []map[string]any) []any {
	var names []any
	for _, e := range ofType(lines, "error") {
		names = append(names, e["name"])
	}
	return names
}

// A context whose kernel could not be brought back (its directory went with it) says why on each
// execution, and gets a kernel again once it can start one.
func TestContextWithoutKernelStartsOneAgain(t *testing.T) {
	ts := serveLanguage(t, "bash", Bash("/bin/bash"))
	dir := filepath.Join(t.TempDir(), "work")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	id := createContext(t, ts, "bash", dir)
	ctx := context.Background()
	lines, _ := execute(t, ctx, ts, map[string]any{"code": `rm -rf "$PWD"; exit 1`, "context_id": id})
	if names := errorNames(lines); len(names) != 1 || names[0] != "KernelDied" {
		t.Fatalf("the cell that exits: %v", lines)
	}
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "echo hi", "context_id": id})
	if errs := ofType(lines, "error"); len(errs) != 1 || errs[0]["name"] != "ContextError" || !strings.Contains(errs[0]["value"].(string), "does not exist") {
		t.Fatalf("with its directory gone: %v", lines)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "echo hi", "context_id": id})
	if got := streamText(lines, "stdout"); got != "hi\n" {
		t.Fatalf("with its directory back: %q (%v)", got, lines)
	}
}

// trackedKernel records its Shutdown.
type trackedKernel struct {
	kernel
	shut *atomic.Bool
}

func (k trackedKernel) Shutdown() { k.shut.Store(true); k.kernel.Shutdown() }

// A context removed while its kernel restarts leaves no kernel running when the restart ends.
func TestRemoveDuringRestart(t *testing.T) {
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	var mu sync.Mutex
	var started []*atomic.Bool
	lang := Bash("/bin/bash")
	start := lang.Start
	lang.Start = func(ctx context.Context, spec jupyter.Spec) (kernel, error) {
		mu.Lock()
		n := len(started)
		shut := new(atomic.Bool)
		started = append(started, shut)
		mu.Unlock()
		if n > 0 { // the restart waits until the context is gone
			entered <- struct{}{}
			<-gate
		}
		k, err := start(ctx, spec)
		if err != nil {
			return nil, err
		}
		return trackedKernel{k, shut}, nil
	}
	ts := serveLanguage(t, "bash", lang)
	id := createContext(t, ts, "bash", t.TempDir())

	b, _ := json.Marshal(map[string]any{"code": "exit 1", "context_id": id})
	resp, err := http.Post(ts.URL+"/execute", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-entered // the kernel died and its restart has begun
	req, _ := http.NewRequest("DELETE", ts.URL+"/contexts/"+id, nil)
	dresp, err := http.DefaultClient.Do(req)
	if err != nil || dresp.StatusCode != 200 {
		t.Fatalf("delete during the restart: %v %v", dresp, err)
	}
	dresp.Body.Close()
	close(gate)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() { // the execution ends once the restart has
	}
	mu.Lock()
	defer mu.Unlock()
	if len(started) != 2 {
		t.Fatalf("%d kernel starts, want 2", len(started))
	}
	for i, shut := range started {
		if !shut.Load() {
			t.Errorf("kernel %d still runs after its context was removed", i)
		}
	}
}

// A kernel that ignores an interrupt (Node.js spinning after a top-level await, outside the vm's
// SIGINT handling) is replaced once the grace runs out, and the context serves again.
func TestStuckKernelIsReplaced(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is required (the e2e suite needs it too)")
	}
	ts := serveLanguage(t, "javascript", Node(node, "javascript"))
	id := createContext(t, ts, "javascript", t.TempDir())
	executeOK(t, ts, "js", "globalThis.kept = 1", map[string]any{"context_id": id, "language": nil})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	execute(t, ctx, ts, map[string]any{"code": "await 0; while (true) {}", "context_id": id})
	cancel()
	lines := executeOK(t, ts, "js", "typeof kept", map[string]any{"context_id": id, "language": nil})
	if got := mainText(lines); got != "undefined" {
		t.Fatalf("after the stuck kernel: %q (%v), want a fresh kernel", got, lines)
	}
}

// Output a background job writes between cells goes nowhere (it used to fill a buffer and stall
// the shell's readers); the next cell sees only its own output, and an exit is still reported.
func TestBashBetweenCells(t *testing.T) {
	ts := serveLanguage(t, "bash", Bash("/bin/bash"))
	id := createContext(t, ts, "bash", t.TempDir())
	ctx := context.Background()
	done := filepath.Join(t.TempDir(), "done")
	execute(t, ctx, ts, map[string]any{"code": "(for i in $(seq 2000); do echo $i; done; touch " + done + ") &", "context_id": id})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(done); err == nil {
			break
		}
	}
	lines, _ := execute(t, ctx, ts, map[string]any{"code": "echo ok", "context_id": id})
	if got := streamText(lines, "stdout"); got != "ok\n" {
		t.Fatalf("the next cell's output (%d bytes): %.200q", len(got), got)
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lines, _ = execute(t, tctx, ts, map[string]any{"code": "exit 3", "context_id": id})
	if names := errorNames(lines); len(names) != 1 || names[0] != "KernelDied" {
		t.Fatalf("exit after background output: %v", lines)
	}
}

// A background job's line read while a cell waited for its last marker, but queued only after
// the cell ended, belongs to that cell's time and never shows in the next cell (the race
// TestBashBetweenCells hit under load, made certain here).
func TestBashLateChunkOfEarlierCell(t *testing.T) {
	ctx := context.Background()
	kern, err := startBash(ctx, "/bin/bash", jupyter.Spec{RuntimeDir: t.TempDir(), Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	k := kern.(*bashKernel)
	t.Cleanup(k.Shutdown)
	if _, err := k.Execute(ctx, "true", false, func(jupyter.Output) {}); err != nil {
		t.Fatal(err)
	}
	k.out <- bashChunk{stream: "stdout", text: "1\n", cell: int64(k.seq)}
	var got string
	if _, err := k.Execute(ctx, "echo ok", false, func(o jupyter.Output) { got += o.Text }); err != nil {
		t.Fatal(err)
	}
	if got != "ok\n" {
		t.Fatalf("the next cell's output: %q, want only its own", got)
	}
}

// A shell that exits while a job it started still holds its output is reported dead (after
// exec's WaitDelay), not taken for a cell that never ends.
func TestBashExitWithBackgroundJob(t *testing.T) {
	ts := serveLanguage(t, "bash", Bash("/bin/bash"))
	id := createContext(t, ts, "bash", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	execute(t, ctx, ts, map[string]any{"code": "sleep 300 &", "context_id": id})
	lines, _ := execute(t, ctx, ts, map[string]any{"code": "exit 3", "context_id": id})
	if names := errorNames(lines); len(names) != 1 || names[0] != "KernelDied" {
		t.Fatalf("exit with a background job: %v", lines)
	}
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "echo back", "context_id": id})
	if got := streamText(lines, "stdout"); got != "back\n" {
		t.Fatalf("after the restart: %q (%v)", got, lines)
	}
}

// A Node.js runner that spins outside any cell (in a timer) never reads a large cell from its
// stdin: once the client leaves, it is replaced like a runner deaf to interrupts, and the next
// execution runs (it used to wait for the stuck write forever).
func TestNodeBusyRunnerTakesNoCell(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is required (the e2e suite needs it too)")
	}
	grace := jupyter.InterruptGrace
	jupyter.InterruptGrace = 500 * time.Millisecond
	t.Cleanup(func() { jupyter.InterruptGrace = grace })
	ts := serveLanguage(t, "javascript", Node(node, "javascript"))
	id := createContext(t, ts, "javascript", t.TempDir())
	spinning := filepath.Join(t.TempDir(), "spinning")
	executeOK(t, ts, "js", "setTimeout(() => { require('fs').writeFileSync("+lit(spinning)+", ''); for (;;) {} }, 0); 0",
		map[string]any{"context_id": id, "language": nil})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(spinning); err == nil {
			break
		}
	}
	big := "// " + strings.Repeat("x", 256<<10) + "\n1"
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	execute(t, ctx, ts, map[string]any{"code": big, "context_id": id})
	cancel()
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lines, _ := execute(t, ctx, ts, map[string]any{"code": "1 + 1", "context_id": id})
	if got := mainText(lines); got != "2" {
		t.Fatalf("after a runner that took no cell: %q (%v)", got, lines)
	}
}
