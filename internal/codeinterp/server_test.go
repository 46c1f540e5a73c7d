package codeinterp

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/codeinterp/jupyter"
)

// python is Debian's interpreter, with python3-ipykernel (scripts/install-deps.sh installs it; a
// python3 earlier on PATH may lack it).
const python = "/usr/bin/python3"

func newServer(t *testing.T) (*Server, *httptest.Server) {
	t.Helper()
	if err := exec.Command(python, "-c", "import ipykernel").Run(); err != nil {
		t.Fatalf("%s with ipykernel is required (scripts/install-deps.sh installs python3-ipykernel): %v", python, err)
	}
	home := t.TempDir()
	s := New(Options{Languages: map[string]Language{"python": Python(python)}, Cwd: home, RuntimeDir: t.TempDir()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); s.Close() })
	return s, ts
}

// execute posts body to /execute and returns the lines of the stream, decoded.
func execute(t *testing.T, ctx context.Context, ts *httptest.Server, body map[string]any) ([]map[string]any, int) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/execute", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		return []map[string]any{{"body": string(msg)}}, resp.StatusCode
	}
	var lines []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	return lines, resp.StatusCode
}

func ofType(lines []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

// streamText is everything a stream ("stdout" or "stderr") carried.
func streamText(lines []map[string]any, stream string) string {
	s := ""
	for _, l := range ofType(lines, stream) {
		s += l["text"].(string)
	}
	return s
}

func mainText(lines []map[string]any) string {
	for _, l := range ofType(lines, "result") {
		if l["is_main_result"] == true {
			s, _ := l["text"].(string)
			return s
		}
	}
	return ""
}

func TestExecuteStream(t *testing.T) {
	_, ts := newServer(t)
	ctx := context.Background()
	if lines, _ := execute(t, ctx, ts, map[string]any{"code": "x = 1"}); len(ofType(lines, "error")) != 0 {
		t.Fatalf("x = 1: %v", lines)
	}
	lines, _ := execute(t, ctx, ts, map[string]any{"code": "import sys\nprint('a')\nprint('b', file=sys.stderr)\nx + 1"})
	var order []string
	for _, l := range lines {
		order = append(order, l["type"].(string))
	}
	want := "number_of_executions stdout stderr result end_of_execution"
	if strings.Join(order, " ") != want || mainText(lines) != "2" || lines[1]["text"] != "a\n" || lines[2]["text"] != "b\n" {
		t.Fatalf("stream %v, want %s with a, b and 2", lines, want)
	}
	if lines[0]["execution_count"] != float64(2) {
		t.Fatalf("execution count %v", lines[0])
	}

	// Rich results: every MIME type under its short key, others in extra; a str loses its quotes.
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "from IPython.display import display, HTML, Markdown, Latex, JSON, SVG\n" +
		"display(HTML('<b>h</b>'), Markdown('*m*'), Latex('$x$'), JSON({'k': 1}))\n" +
		"display({'application/vnd.custom': 'c', 'text/plain': 'p'}, raw=True)\n'quoted'"})
	res := ofType(lines, "result")
	if len(res) != 6 {
		t.Fatalf("results %v", res)
	}
	if res[0]["html"] != "<b>h</b>" || res[1]["markdown"] != "*m*" || res[2]["latex"] != "$x$" || res[0]["is_main_result"] != false {
		t.Fatalf("display results %v", res[:3])
	}
	if j, ok := res[3]["json"].(map[string]any); !ok || j["k"] != float64(1) {
		t.Fatalf("json result %v", res[3])
	}
	if extra, ok := res[4]["extra"].(map[string]any); !ok || extra["application/vnd.custom"] != "c" {
		t.Fatalf("custom MIME type %v", res[4])
	}
	if mainText(lines) != "quoted" {
		t.Fatalf("main result %v", res[5])
	}

	// An exception: name, value, traceback; the stream still ends normally.
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "raise ValueError('bad')"})
	errs := ofType(lines, "error")
	if len(errs) != 1 || errs[0]["name"] != "ValueError" || errs[0]["value"] != "bad" || !strings.Contains(errs[0]["traceback"].(string), "ValueError") {
		t.Fatalf("error %v", lines)
	}
	if lines[len(lines)-1]["type"] != "end_of_execution" {
		t.Fatalf("stream did not end with end_of_execution: %v", lines)
	}
}

func TestEnvVarsAndBadRequests(t *testing.T) {
	_, ts := newServer(t)
	ctx := context.Background()
	code := "import os\nprint(os.environ.get('VMON_T', 'unset'), end='')"
	stdout := func(lines []map[string]any) string { return streamText(lines, "stdout") }
	if lines, _ := execute(t, ctx, ts, map[string]any{"code": code, "env_vars": map[string]string{"VMON_T": "it's \"set\"\n\\"}}); stdout(lines) != "it's \"set\"\n\\" {
		t.Fatalf("with env_vars: %v", lines)
	}
	if lines, _ := execute(t, ctx, ts, map[string]any{"code": code}); stdout(lines) != "unset" {
		t.Fatalf("env_vars leaked into the next execution: %v", lines)
	}

	if lines, st := execute(t, ctx, ts, map[string]any{"code": "1", "context_id": "x", "language": "python"}); st != 400 {
		t.Fatalf("context and language: %d %v", st, lines)
	}
	if lines, st := execute(t, ctx, ts, map[string]any{"code": "1", "context_id": "nope"}); st != 404 || lines[0]["body"] != "Context nope not found\n" {
		t.Fatalf("unknown context: %d %v", st, lines)
	}
	if _, st := execute(t, ctx, ts, map[string]any{"language": "python"}); st != 400 {
		t.Fatalf("no code: %d", st)
	}
	lines, _ := execute(t, ctx, ts, map[string]any{"code": "1", "language": "Java"})
	errs := ofType(lines, "error")
	if len(errs) != 1 || errs[0]["name"] != "LanguageNotAvailable" || !strings.Contains(errs[0]["value"].(string), "available: python") {
		t.Fatalf("unknown language: %v", lines)
	}
	// Language names are normalized: " PYTHON " is the default Python context.
	if lines, _ := execute(t, ctx, ts, map[string]any{"code": "x = 5\nx", "language": " PYTHON "}); mainText(lines) != "5" {
		t.Fatalf("normalized language: %v", lines)
	}
}

func TestContexts(t *testing.T) {
	_, ts := newServer(t)
	ctx := context.Background()
	post := func(path, body string) (int, string) {
		resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	dir := t.TempDir()
	st, body := post("/contexts", `{"cwd":`+lit(dir)+`}`)
	var c struct{ ID, Language, Cwd string }
	if err := json.Unmarshal([]byte(body), &c); st != 200 || err != nil || c.Language != "python" || c.Cwd != dir {
		t.Fatalf("create: %d %s", st, body)
	}
	lines, _ := execute(t, ctx, ts, map[string]any{"code": "import os\nv = 'ctx'\nos.getcwd()", "context_id": c.ID})
	if mainText(lines) != dir {
		t.Fatalf("cwd in context: %v", lines)
	}
	// State is per context.
	if lines, _ := execute(t, ctx, ts, map[string]any{"code": "'v' in globals()"}); mainText(lines) != "False" {
		t.Fatalf("default context sees the other's variable: %v", lines)
	}
	if st, body := post("/contexts", `{"cwd":"/no/such/dir"}`); st != 500 || !strings.Contains(body, "/no/such/dir") {
		t.Fatalf("bad cwd: %d %s", st, body)
	}
	if st, body := post("/contexts", `{"language":"cobol"}`); st != 404 || !strings.Contains(body, "not available") {
		t.Fatalf("unknown language: %d %s", st, body)
	}

	resp, err := http.Get(ts.URL + "/contexts")
	if err != nil {
		t.Fatal(err)
	}
	var list []struct{ ID, Language, Cwd string }
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list) != 2 {
		t.Fatalf("list %v, want the default and the new context", list)
	}

	// Restart keeps the id and the directory, drops the state.
	if st, body := post("/contexts/"+c.ID+"/restart", ""); st != 200 {
		t.Fatalf("restart: %d %s", st, body)
	}
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "import os\n('v' in globals(), os.getcwd())", "context_id": c.ID})
	if mainText(lines) != "(False, '"+dir+"')" {
		t.Fatalf("after restart: %v", lines)
	}
	if st, _ := post("/contexts/nope/restart", ""); st != 404 {
		t.Fatalf("restart unknown: %d", st)
	}

	del := func(id string) int {
		req, _ := http.NewRequest("DELETE", ts.URL+"/contexts/"+id, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := del(c.ID); st != 200 {
		t.Fatalf("delete: %d", st)
	}
	if st := del(c.ID); st != 404 {
		t.Fatalf("delete again: %d", st)
	}
	if _, st := execute(t, ctx, ts, map[string]any{"code": "1", "context_id": c.ID}); st != 404 {
		t.Fatalf("execute in a deleted context: %d", st)
	}
}

// TestInterruptAndDeath: a client that gives up interrupts the run and the kernel keeps its
// state; a kernel that exits is reported in the stream and the next call gets a fresh one; two
// contexts run at the same time.
func TestInterruptAndDeath(t *testing.T) {
	s, ts := newServer(t)
	ctx := context.Background()
	execute(t, ctx, ts, map[string]any{"code": "kept = 7"})
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	began := time.Now()
	b, _ := json.Marshal(map[string]any{"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"})
	req, _ := http.NewRequestWithContext(tctx, "POST", ts.URL+"/execute", strings.NewReader(string(b)))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	cancel()
	lines, _ := execute(t, ctx, ts, map[string]any{"code": "kept"})
	if mainText(lines) != "7" {
		t.Fatalf("state after an interrupted run: %v", lines)
	}
	if time.Since(began) > 30*time.Second {
		t.Fatalf("the interrupted sleep(60) held the context for %v", time.Since(began))
	}

	// Two contexts at once: each sleeps 1 s; together they take far less than 2 s... measured
	// only as overlap (both started before either finished), never as a wall-clock bound.
	c, err := s.newContext(ctx, "python", s.opts.Cwd)
	if err != nil {
		t.Fatal(err)
	}
	marks := filepath.Join(t.TempDir(), "marks")
	code := "import time\nopen(" + lit(marks) + ", 'a').write('start\\n')\ntime.sleep(1)\nopen(" + lit(marks) + ", 'a').write('end\\n')"
	var wg sync.WaitGroup
	for _, body := range []map[string]any{{"code": code}, {"code": code, "context_id": c.ID}} {
		wg.Add(1)
		go func() { defer wg.Done(); execute(t, ctx, ts, body) }()
	}
	wg.Wait()
	got, _ := os.ReadFile(marks)
	if string(got) != "start\nstart\nend\nend\n" {
		t.Fatalf("two contexts did not run at the same time: %q", got)
	}

	lines, _ = execute(t, ctx, ts, map[string]any{"code": "import os\nos._exit(1)"})
	errs := ofType(lines, "error")
	if len(errs) != 1 || errs[0]["name"] != "KernelDied" {
		t.Fatalf("kernel death: %v", lines)
	}
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "'kept' in globals(), 1 + 1"})
	if mainText(lines) != "(False, 2)" {
		t.Fatalf("after the kernel died: %v", lines)
	}
}

func TestHealth(t *testing.T) {
	s := New(Options{Languages: map[string]Language{"python": Python(python)}, Cwd: t.TempDir(), RuntimeDir: t.TempDir()})
	ts := httptest.NewServer(s)
	defer ts.Close()
	defer s.Close()
	resp, err := http.Get(ts.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("health before start: %d", resp.StatusCode)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err = http.Get(ts.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != `"OK"` {
		t.Fatalf("health: %d %s", resp.StatusCode, b)
	}
}

// A client that leaves while its language's default kernel is starting does not stop that start:
// the next execution finds the kernel ready instead of starting another.
func TestDefaultKernelStartOutlivesItsClient(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	var mu sync.Mutex
	starts := 0
	slow := Bash(bash)
	start := slow.Start
	slow.Start = func(ctx context.Context, spec jupyter.Spec) (kernel, error) {
		mu.Lock()
		starts++
		mu.Unlock()
		entered <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return start(ctx, spec)
	}
	s := New(Options{Languages: map[string]Language{"bash": slow}, Cwd: t.TempDir(), RuntimeDir: t.TempDir()})
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); s.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"code": "echo first", "language": "bash"})
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/execute", strings.NewReader(string(b)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	cancel() // the client leaves while the kernel starts
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	close(gate)
	// The start goes on without its client; the context appears once it is done.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		s.mu.Lock()
		ready := s.defaults["bash"] != nil
		s.mu.Unlock()
		if ready {
			break
		}
	}

	lines, _ := execute(t, context.Background(), ts, map[string]any{"code": "echo second", "language": "bash"})
	if got := streamText(lines, "stdout"); got != "second\n" {
		t.Fatalf("stdout %q (%v)", got, lines)
	}
	mu.Lock()
	defer mu.Unlock()
	if starts != 1 {
		t.Fatalf("the bash kernel was started %d times, want once", starts)
	}
}

// Every Python kernel starts with the formatters behind E2B's data and chart results, defined
// outside the user's namespace and without a history entry. (The e2e suite checks them with real
// pandas and matplotlib, which the host need not have: a class named like pandas' DataFrame
// stands in here.)
func TestPythonDisplayFormatters(t *testing.T) {
	_, ts := newServer(t)
	ctx := context.Background()
	lines, _ := execute(t, ctx, ts, map[string]any{"code": "f = get_ipython().display_formatter.formatters\n" +
		"print('e2b/data' in f, 'e2b/chart' in f, [n for n in globals() if n.startswith('_') and 'Formatter' in n or n in ('_plain', '_shell')])"})
	if got := streamText(lines, "stdout"); got != "True True []\n" {
		t.Fatalf("formatters registered, namespace clean: %q (%v)", got, lines)
	}
	if lines[0]["execution_count"] != float64(1) {
		t.Fatalf("the startup code counted as an execution: %v", lines[0])
	}
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "class DataFrame:\n" +
		"    __module__ = 'pandas.core.frame'\n" +
		"    columns = ['a', 1]\n" +
		"    size = 4\n" +
		"    def __getitem__(self, c):\n" +
		"        vals = [1.5, float('nan')] if c == 'a' else ['x', None]\n" +
		"        return type('Col', (), {'tolist': lambda _: vals})()\n" +
		"    def __repr__(self):\n" +
		"        return 'frame'\n" +
		"DataFrame()"})
	res := ofType(lines, "result")
	if len(res) != 1 || res[0]["text"] != "frame" {
		t.Fatalf("result %v", lines)
	}
	b, _ := json.Marshal(res[0]["data"])
	if string(b) != `{"1":["x",null],"a":[1.5,null]}` {
		t.Fatalf("data %s, want the columns as lists with NaN as null", b)
	}
	// A frame at the limit has its data; one past it gets its usual results only.
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "big = DataFrame()\nbig.size = 200_000\nbig"})
	if res := ofType(lines, "result"); len(res) != 1 || res[0]["data"] == nil {
		t.Fatalf("a frame of 200,000 cells: %v", lines)
	}
	lines, _ = execute(t, ctx, ts, map[string]any{"code": "big.size = 200_001\nbig"})
	if res := ofType(lines, "result"); len(res) != 1 || res[0]["text"] != "frame" || res[0]["data"] != nil {
		t.Fatalf("a frame of 200,001 cells: %v", lines)
	}
}

// The sandbox's variables (envd's /envs, read with the execution's access token) reach every
// kernel once, before its first execution; an execution's own env_vars override them for that
// execution only.
func TestSandboxEnvReachesKernels(t *testing.T) {
	if err := exec.Command(python, "-c", "import ipykernel").Run(); err != nil {
		t.Fatalf("%s with ipykernel is required: %v", python, err)
	}
	var mu sync.Mutex
	var tokens []string
	s := New(Options{
		Languages: map[string]Language{"python": Python(python), "bash": Bash("/bin/bash")},
		Cwd:       t.TempDir(), RuntimeDir: t.TempDir(),
		SandboxEnv: func(_ context.Context, token string) (map[string]string, error) {
			mu.Lock()
			tokens = append(tokens, token)
			mu.Unlock()
			return map[string]string{"SBX": "from sandbox", "OVR": "sandbox", "bad-name": "x"}, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); s.Close() })
	run := func(body map[string]any) string {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/execute", strings.NewReader(string(b)))
		req.Header.Set("X-Access-Token", "tok-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var lines []map[string]any
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var m map[string]any
			_ = json.Unmarshal(sc.Bytes(), &m)
			lines = append(lines, m)
		}
		if errs := ofType(lines, "error"); len(errs) > 0 {
			t.Fatalf("execution failed: %v", errs)
		}
		return streamText(lines, "stdout")
	}
	py := `import os; print(os.getenv("SBX"), os.getenv("OVR"), os.getenv("ONLY"))`
	if got := run(map[string]any{"code": py}); got != "from sandbox sandbox None\n" {
		t.Fatalf("python, first execution: %q", got)
	}
	if got := run(map[string]any{"code": py, "env_vars": map[string]string{"OVR": "exec", "ONLY": "once"}}); got != "from sandbox exec once\n" {
		t.Fatalf("python with env_vars: %q", got)
	}
	if got := run(map[string]any{"code": py}); got != "from sandbox sandbox None\n" {
		t.Fatalf("python after env_vars: %q", got)
	}
	sh := `echo "$SBX|$OVR|${ONLY-unset}"`
	if got := run(map[string]any{"code": sh, "language": "bash", "env_vars": map[string]string{"OVR": "exec", "ONLY": "once"}}); got != "from sandbox|exec|once\n" {
		t.Fatalf("bash with env_vars: %q", got)
	}
	if got := run(map[string]any{"code": sh, "language": "bash"}); got != "from sandbox|sandbox|unset\n" {
		t.Fatalf("bash after env_vars: %q", got)
	}
	mu.Lock()
	n := len(tokens)
	for _, tok := range tokens {
		if tok != "tok-1" {
			t.Errorf("envd was asked with token %q", tok)
		}
	}
	mu.Unlock()
	if n != 2 {
		t.Fatalf("envd was asked %d times for 2 kernels", n)
	}
}

// PIL images as on E2B: Image.show() and Image.save(<path>) display the image, also when PIL is
// first imported in the same cell, and no viewer program runs. A stand-in PIL package in the
// kernel's directory has the classes and methods the patch touches.
func TestPythonPILShowAndSaveDisplay(t *testing.T) {
	s, ts := newServer(t)
	pil := filepath.Join(s.opts.Cwd, "PIL")
	if err := os.MkdirAll(pil, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"__init__.py": "",
		"Image.py": "class Image:\n" +
			"    def _repr_png_(self):\n        return b'\\x89PNG fake'\n" +
			"    def show(self, title=None):\n        raise RuntimeError('a viewer ran')\n" +
			"    def save(self, fp, format=None, **params):\n        open(fp, 'w').write('saved')\n",
		"ImageShow.py": "def show(image, title=None, **options):\n    raise RuntimeError('a viewer ran')\n",
	} {
		if err := os.WriteFile(filepath.Join(pil, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	saved := filepath.Join(t.TempDir(), "out.png")
	lines, _ := execute(t, context.Background(), ts, map[string]any{"code": "from PIL import Image, ImageShow\n" +
		"img = Image.Image()\nimg.show()\nimg.save(" + strconv.Quote(saved) + ")\nImageShow.show(img)\nprint('done')"})
	if errs := ofType(lines, "error"); len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	res := ofType(lines, "result")
	if len(res) != 3 {
		t.Fatalf("want 3 displayed images (show, save, ImageShow.show), got %v", lines)
	}
	for _, r := range res {
		if r["png"] == nil || r["is_main_result"] != false {
			t.Fatalf("display result %v", r)
		}
	}
	if b, err := os.ReadFile(saved); err != nil || string(b) != "saved" {
		t.Fatalf("save still saves: %q %v", b, err)
	}
}

// TestInterruptedWithoutReplySaysSo: an execution interrupted because the service saw its client
// leave, which the kernel ends without a reply of its own (ipykernel caught the interrupt after
// the cell), ends with an error line rather than as a cell that had no value: a proxy may have
// told the service its client left while that client still reads (issue 22 item 7). The kernel
// keeps its state.
func TestInterruptedWithoutReplySaysSo(t *testing.T) {
	_, ts := newServer(t)
	execute(t, context.Background(), ts, map[string]any{"code": "kept = 7"})
	// The cell holds ipykernel's output thread for 2 s and prints: the interrupt, 0.5 s in, finds
	// ipykernel flushing that output before its reply. The handler is called directly: what it
	// writes after its request's context ended is what a client still reading would get.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	b, _ := json.Marshal(map[string]any{"code": "import sys, time\nsys.stdout.pub_thread.schedule(lambda: time.sleep(2))\nprint('printed')"})
	req := httptest.NewRequestWithContext(ctx, "POST", "/execute", strings.NewReader(string(b)))
	rec := httptest.NewRecorder()
	ts.Config.Handler.ServeHTTP(rec, req)
	var types []string
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(rec.Body.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		lines, types = append(lines, m), append(types, m["type"].(string))
	}
	if streamText(lines, "stdout") != "printed\n" || types[len(types)-1] != "end_of_execution" {
		t.Fatalf("lines %v", lines)
	}
	errs := ofType(lines, "error")
	if len(errs) != 1 || errs[0]["name"] != "ExecutionInterrupted" {
		t.Fatalf("want one ExecutionInterrupted error, got %v", lines)
	}
	if after, _ := execute(t, context.Background(), ts, map[string]any{"code": "kept"}); mainText(after) != "7" {
		t.Fatalf("state after the interrupt: %v", after)
	}
}
