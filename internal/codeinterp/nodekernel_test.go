package codeinterp

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

// TestJavaScript drives the Node.js runner through the HTTP service: state, console output in
// order, the value, errors, top-level await, envs, interrupts of a busy loop and of a pending
// promise, and a process that exits.
func TestJavaScript(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is required (the e2e suite needs it too)")
	}
	ts := serveLanguage(t, "javascript", Node(node, "javascript"))
	ctx := context.Background()
	js := func(code string, extra ...map[string]any) []map[string]any {
		return executeOK(t, ts, "js", code, extra...)
	}
	js("let x = 41")
	lines := js("console.log('a'); console.error('b'); x + 1")
	var order []string
	for _, l := range lines {
		order = append(order, l["type"].(string))
	}
	if strings.Join(order, " ") != "stdout stderr result number_of_executions end_of_execution" || mainText(lines) != "42" || lines[0]["text"] != "a\n" {
		t.Fatalf("stream %v", lines)
	}
	if m := mainText(js("({a: [1, 2], s: 'x'})")); m != "{ a: [ 1, 2 ], s: 'x' }" {
		t.Fatalf("object value %q", m)
	}
	errs := ofType(js("null.f()"), "error")
	if len(errs) != 1 || errs[0]["name"] != "TypeError" || !strings.Contains(errs[0]["traceback"].(string), "TypeError") {
		t.Fatalf("error %v", errs)
	}
	if m := mainText(js("await new Promise((r) => setTimeout(() => r(7), 10))")); m != "7" {
		t.Fatalf("top-level await: the awaited value is the cell's, got %q", m)
	}
	// Declarations of a cell with top-level await are there for later cells, as at the top level.
	js("const aw = await Promise.resolve(3); let [p, q] = [1, 2]; function twice(n) { return 2 * n }\nclass K { k() { return 'k' } }")
	if m := mainText(js("`${aw} ${p} ${q} ${twice(aw)} ${new K().k()}`")); m != "3 1 2 6 k" {
		t.Fatalf("declarations after an await cell: %q", m)
	}
	// ESM imports of Node built-ins (default, named, namespace, node: prefix) and of a package in
	// the context's node_modules, kept for later cells.
	dir := t.TempDir()
	pkg := filepath.Join(dir, "node_modules", "vmon-esm-pkg")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"package.json": `{"name": "vmon-esm-pkg", "type": "module", "exports": "./index.js"}`,
		"index.js":     "export const greet = (n) => `hi ${n}`; export default 42;",
	} {
		if err := os.WriteFile(filepath.Join(pkg, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	js("process.chdir(" + strconv.Quote(dir) + ")")
	if m := mainText(js("import path from 'path'\nimport { join } from 'node:path'\nimport * as os from 'os'\nimport answer, { greet } from 'vmon-esm-pkg'\njoin('a', 'b') + ' ' + path.sep + ' ' + typeof os.cpus + ' ' + answer + ' ' + greet('x')")); m != "a/b / function 42 hi x" {
		t.Fatalf("imports: %q", m)
	}
	if m := mainText(js("greet('again')")); m != "hi again" {
		t.Fatalf("an import for later cells: %q", m)
	}
	if m := mainText(js("const v = await Promise.resolve(5); return v * 2")); m != "10" {
		t.Fatalf("top-level await with return gave %q", m)
	}
	if m := mainText(js("Promise.resolve('resolved')")); m != "resolved" {
		t.Fatalf("a promise value is awaited (a string shows without its quotes): %q", m)
	}
	if m := mainText(js("process.env.VMON_JS", map[string]any{"env_vars": map[string]string{"VMON_JS": "on"}})); m != "on" {
		t.Fatalf("env var %q", m)
	}
	if m := mainText(js("process.env.VMON_JS ?? 'unset'")); m != "unset" {
		t.Fatalf("env var leaked: %q", m)
	}
	// A cell's own SIGINT listener counts the signals the runner got: a waiting cell is
	// interrupted in band, without one (a signal at the wrong moment kills a Node runner).
	js("globalThis.sigints = 0; process.on('SIGINT', () => sigints++); undefined")
	for _, code := range []string{"while (true) {}", "await new Promise(() => {})"} {
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		execute(t, tctx, ts, map[string]any{"code": code, "language": "javascript"})
		cancel()
		if m := mainText(js("x")); m != "41" {
			t.Fatalf("after interrupting %q: x = %q", code, m)
		}
	}
	if m := mainText(js("sigints")); m != "0" {
		t.Fatalf("a waiting cell was interrupted by a signal: %s SIGINTs reached the runner's listeners", m)
	}
	if errs := ofType(js("process.exit(3)"), "error"); len(errs) != 1 || errs[0]["name"] != "KernelDied" {
		t.Fatalf("exit: %v", errs)
	}
	if m := mainText(js("typeof x")); m != "undefined" {
		t.Fatalf("after the runner died: %q", m)
	}
}

// TestBash: shell state across cells, both streams, a failing cell, envs, an interrupted sleep
// that leaves the shell, and exit.
func TestBash(t *testing.T) {
	ts := serveLanguage(t, "bash", Bash("/bin/bash"))
	ctx := context.Background()
	sh := func(code string, extra ...map[string]any) ([]map[string]any, string, string) {
		lines := executeOK(t, ts, "bash", code, extra...)
		return lines, streamText(lines, "stdout"), streamText(lines, "stderr")
	}
	sh("x=41; cd /tmp; f() { echo \"f:$1\"; }")
	if _, out, errOut := sh("echo $((x + 1)); pwd; f a; echo oops >&2; printf 'no newline'"); out != "42\n/tmp\nf:a\nno newline" || errOut != "oops\n" {
		t.Fatalf("out %q err %q", out, errOut)
	}
	if lines, _, _ := sh("false"); len(ofType(lines, "error")) != 1 {
		t.Fatalf("a failing cell: %v", lines)
	}
	if _, out, _ := sh("echo \"$VMON_SH\"", map[string]any{"env_vars": map[string]string{"VMON_SH": "it's on"}}); out != "it's on\n" {
		t.Fatalf("env var: %q", out)
	}
	if _, out, _ := sh("echo \"${VMON_SH-unset}\""); out != "unset\n" {
		t.Fatalf("env var leaked: %q", out)
	}
	if lines, out, _ := sh("echo ran", map[string]any{"env_vars": map[string]string{"A;touch /tmp/pwned": "x"}}); out != "" || len(ofType(lines, "error")) != 1 {
		t.Fatalf("an env var name that is shell code: out %q, %v", out, lines)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	execute(t, tctx, ts, map[string]any{"code": "sleep 60; echo never", "language": "bash"})
	cancel()
	if _, out, _ := sh("echo $x"); out != "41\n" {
		t.Fatalf("after an interrupt: %q", out)
	}
	if lines, _, _ := sh("exit 2"); len(ofType(lines, "error")) != 1 || ofType(lines, "error")[0]["name"] != "KernelDied" {
		t.Fatalf("exit: %v", lines)
	}
	if _, out, _ := sh("echo ${x-gone}"); out != "gone\n" {
		t.Fatalf("after exit: %q", out)
	}
}

// Whatever a cell throws arrives as an error with string fields, and a cell that writes the
// runner's own "ready" event does not bring the service down.
func TestJavaScriptOddThrowsAndForgedEvents(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is required (the e2e suite needs it too)")
	}
	ts := serveLanguage(t, "javascript", Node(node, "javascript"))
	for code, want := range map[string][2]string{
		"throw {name: 42, message: 'boom'}":                    {"42", "boom"},
		"throw {name: 'E', message: {toString() { throw 1 }}}": {"E", "{ toString: [Function: toString] }"},
		"throw 7": {"Error", "7"},
		"throw Object.assign(new TypeError('t'), {stack: undefined})": {"TypeError", "t"},
	} {
		errs := ofType(executeOK(t, ts, "js", code), "error")
		if len(errs) != 1 || errs[0]["name"] != want[0] || errs[0]["value"] != want[1] {
			t.Errorf("%s: errors %v, want name %q value %q", code, errs, want[0], want[1])
		}
	}
	executeOK(t, ts, "js", `require('fs').writeSync(3, '{"type":"ready"}\n')`)
	if got := mainText(executeOK(t, ts, "js", "1 + 1")); got != "2" {
		t.Fatalf("after a forged ready event: %q", got)
	}
}

// JavaScript contexts started at the same time share the runtime dir, where each start puts the
// runner script: none may find it half written.
func TestNodeConcurrentStarts(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is required (the e2e suite needs it too)")
	}
	rt := t.TempDir()
	errs := make(chan error, 6)
	for range cap(errs) {
		go func() {
			k, err := startNode(context.Background(), node, "javascript", jupyter.Spec{Dir: rt, RuntimeDir: rt})
			if err != nil {
				errs <- err
				return
			}
			defer k.Shutdown()
			var out strings.Builder
			rep, err := k.Execute(context.Background(), "console.log(6 * 7)", false, func(o jupyter.Output) { out.WriteString(o.Text) })
			if err == nil && (rep.Status != "ok" || out.String() != "42\n") {
				err = fmt.Errorf("status %s, output %q", rep.Status, out.String())
			}
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(rt, ".node-runner-*")); len(left) != 0 {
		t.Errorf("temporary runner copies left: %v", left)
	}
}

// A bash kernel is returned only once an interrupt ends a cell rather than the shell: interrupted
// at once (a client that left while its kernel started), it still runs the next cell.
func TestBashInterruptRightAfterStart(t *testing.T) {
	for i := range 20 {
		k, err := startBash(context.Background(), "/bin/bash", jupyter.Spec{Dir: t.TempDir(), RuntimeDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if err := k.(*bashKernel).Interrupt(); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		rep, err := k.Execute(context.Background(), "echo alive", false, func(o jupyter.Output) { out.WriteString(o.Text) })
		k.Shutdown()
		if err != nil || rep.Status != "ok" || out.String() != "alive\n" {
			t.Fatalf("start %d: interrupted right after start, the next cell got %q, %+v, %v", i, out.String(), rep, err)
		}
	}
}

// A bash that cannot start (its working directory is gone) leaves nothing in the runtime dir.
func TestBashStartFailureCleansUp(t *testing.T) {
	rt := t.TempDir()
	if _, err := startBash(context.Background(), "/bin/bash", jupyter.Spec{Dir: filepath.Join(rt, "gone"), RuntimeDir: rt}); err == nil {
		t.Fatal("bash started in a directory that does not exist")
	}
	if left, _ := os.ReadDir(rt); len(left) != 0 {
		t.Fatalf("a failed start left %v in the runtime dir", left)
	}
}

// serveLanguage serves a Server running only lang.
func serveLanguage(t *testing.T, name string, lang Language) *httptest.Server {
	t.Helper()
	s := New(Options{Languages: map[string]Language{name: lang}, Cwd: t.TempDir(), RuntimeDir: t.TempDir()})
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); s.Close() })
	return ts
}

// executeOK runs code in language lang (extra merged into the request body) and wants a 200.
func executeOK(t *testing.T, ts *httptest.Server, lang, code string, extra ...map[string]any) []map[string]any {
	t.Helper()
	body := map[string]any{"code": code, "language": lang}
	for _, e := range extra {
		for k, v := range e {
			body[k] = v
		}
	}
	lines, st := execute(t, context.Background(), ts, body)
	if st != 200 {
		t.Fatalf("%q: status %d %v", code, st, lines)
	}
	return lines
}

// TestJava: JShell state across cells, both streams, the last expression's value as IJava shows
// it, an exception with its name and trace, a compile error, envs for one execution (in the
// environment and as system properties, as E2B sets them), an interrupted loop that leaves the
// context, and Options.StartTimeout-sized startup.
func TestJava(t *testing.T) {
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatal("a JDK is required (scripts/install-deps.sh installs openjdk-17-jdk-headless)")
	}
	ts := serveLanguage(t, "java", Java(java))
	ctx := context.Background()
	jv := func(code string, extra ...map[string]any) []map[string]any {
		return executeOK(t, ts, "java", code, extra...)
	}
	jv("int x = 41;\nString greet(String n) { return \"hi \" + n; }")
	lines := jv("System.out.println(\"a\"); System.err.println(\"b\"); x + 1")
	var order []string
	for _, l := range lines {
		order = append(order, l["type"].(string))
	}
	if strings.Join(order, " ") != "stdout stderr result number_of_executions end_of_execution" || mainText(lines) != "42" || lines[0]["text"] != "a\n" {
		t.Fatalf("stream %v", lines)
	}
	if m := mainText(jv("greet(\"java\")")); m != "hi java" {
		t.Fatalf("method from an earlier cell: %q", m)
	}
	// As IJava: String.valueOf of the last expression; none for null, an assignment or a
	// declaration; only the last snippet's counts.
	for code, want := range map[string]string{
		"'c'": "c", "\"a\\\\b\\n\"": "a\\b\n", "new int[0].length": "0", "java.util.List.of(\"p\", \"q\")": "[p, q]",
		"x": "41", "x + 1; 7": "7",
	} {
		if m := mainText(jv(code)); m != want {
			t.Errorf("value of %s: %q, want %q", code, m, want)
		}
	}
	for _, code := range []string{"(String) null", "int z = 3;", "x = 41", "x + 1; int w = 0;", "System.out.print(\"\")"} {
		if r := ofType(jv(code), "result"); len(r) != 0 {
			t.Errorf("%s has a value: %v", code, r)
		}
	}
	// A toString that throws is the cell's error.
	errs := ofType(jv("new Object() { public String toString() { throw new IllegalStateException(\"no show\"); } }"), "error")
	if len(errs) != 1 || errs[0]["name"] != "IllegalStateException" || errs[0]["value"] != "no show" {
		t.Fatalf("a toString that throws: %v", errs)
	}
	errs = ofType(jv("int[] a = new int[1];\na[3]"), "error")
	if len(errs) != 1 || errs[0]["name"] != "ArrayIndexOutOfBoundsException" || !strings.Contains(errs[0]["traceback"].(string), "ArrayIndexOutOfBoundsException") {
		t.Fatalf("exception %v", errs)
	}
	errs = ofType(jv("int y = \"no\";"), "error")
	if len(errs) != 1 || errs[0]["name"] != "CompilationException" || !strings.Contains(errs[0]["value"].(string), "incompatible types") {
		t.Fatalf("compile error %v", errs)
	}
	if errs := ofType(jv("for (int i = 0; i < 3; i++) {"), "error"); len(errs) != 1 || errs[0]["name"] != "IncompleteSourceException" {
		t.Fatalf("incomplete input %v", errs)
	}
	jv(`System.setProperty("VMON_PROP", "mine");`)
	probe := `System.getenv("VMON_JAVA") + " " + System.getProperty("VMON_JAVA") + " " + System.getProperty("VMON_PROP")`
	if m := mainText(jv(probe, map[string]any{"env_vars": map[string]string{"VMON_JAVA": "on", "VMON_PROP": "exec"}})); m != "on on exec" {
		t.Fatalf("env var %q", m)
	}
	if m := mainText(jv(probe)); m != "null null mine" {
		t.Fatalf("after the execution's env vars: %q", m)
	}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	execute(t, tctx, ts, map[string]any{"code": "while (true) { x = x; }", "language": "java"})
	cancel()
	if m := mainText(jv("x")); m != "41" {
		t.Fatalf("after interrupting a loop: x = %q", m)
	}
	// The value's toString runs where an interrupt stops it too.
	tctx, cancel = context.WithTimeout(ctx, 2*time.Second)
	execute(t, tctx, ts, map[string]any{"code": "new Object() { public String toString() { while (true) { x = x; } } }", "language": "java"})
	cancel()
	if m := mainText(jv("x")); m != "41" {
		t.Fatalf("after interrupting a toString: x = %q", m)
	}
}
