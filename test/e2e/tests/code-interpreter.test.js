// @e2b/code-interpreter (pinned in package-lock.json, unmodified) against a real `vmon serve`:
// the server makes code-interpreter-v1 from its rootfs when it starts (saved started, with a warm
// Python kernel), and runCode talks to the code-execution service on guest port 49999 through
// ingress, in header mode.

import assert from 'node:assert/strict';
import path from 'node:path';
import crypto from 'node:crypto';

const sha256hex = (s) => crypto.createHash('sha256').update(s).digest('hex');
import { describe } from 'node:test';
import { Sandbox } from '@e2b/code-interpreter';
import { TimeoutError } from 'e2b';
import { useServer, killQuietly, waitFor, runNodeChild, E2E_DIR, templateState } from '../lib/harness.js';

// The server (re)builds code-interpreter-v1 in the background at its start when it is missing or
// stale (a start check of the service, then a checkpoint of the sandbox with its kernel warm):
// wait until no build of it is in progress and the template is ready. A build this server
// started that failed fails the suite; older failed builds (servers stopped mid-build by other
// tests) do not matter.
async function templateReady(srv) {
  let last;
  await waitFor(
    async () => {
      last = await templateState(srv, 'code-interpreter-v1');
      if (!last.summary || last.busy) return false;
      const failedNow = last.detail.builds.find((b) => b.status === 'error' && new Date(b.createdAt) >= srv.startedAt);
      if (failedNow) throw new Error(`code-interpreter-v1 failed to build: ${JSON.stringify(last.detail)}`);
      return last.summary.buildStatus === 'ready';
    },
    { timeoutMs: 300_000, intervalMs: 500, what: 'the code-interpreter-v1 template' },
  );
}

describe('code interpreter', () => {
  const srv = useServer({ name: 'code-interpreter' });
  const created = [];
  srv.after(async () => killQuietly(srv.sdkOpts, ...created));

  let sbx;
  srv.before(async () => {
    await templateReady(srv);
    sbx = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000 });
    created.push(sbx);
  });

  // What a failed assertion shows: the execution and the service's log in the sandbox.
  async function diag(exec) {
    const log = await sbx.files.read('/tmp/.vmon-code-interpreter.log').catch((err) => `(no service log: ${err.message})`);
    return `${JSON.stringify(exec)}\nservice log:\n${log.slice(-4000)}`;
  }

  srv.test('state across calls, streams in order with callbacks, the value as text', async () => {
    await sbx.runCode('x = 1');
    const out = [];
    // Flushed, so the kernel publishes each print on its own (it batches what comes within ~0.2 s).
    const exec = await sbx.runCode('import sys\nprint("one", flush=True)\nprint("two", file=sys.stderr, flush=True)\nprint("three", flush=True)\nx + 1', {
      onStdout: (m) => out.push(['out', m.line]),
      onStderr: (m) => out.push(['err', m.line]),
    });
    if (exec.text !== '2') assert.fail(`no value: ${await diag(exec)}`);
    assert.deepEqual(out, [['out', 'one\n'], ['err', 'two\n'], ['out', 'three\n']]);
    assert.deepEqual(exec.logs.stdout, ['one\n', 'three\n']);
    assert.deepEqual(exec.logs.stderr, ['two\n']);
    assert.equal(exec.error, undefined);
    assert.ok(exec.executionCount >= 2, `execution count ${exec.executionCount}`);
  });

  srv.test('a pandas DataFrame (html and text) and a matplotlib plot (png)', async () => {
    const df = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})");
    const r = df.results[0];
    if (!r?.isMainResult) assert.fail(`no DataFrame: ${await diag(df)}`);
    assert.match(r.html, /<table/);
    assert.match(r.text, /a\s+b/);
    const plot = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title("sq")\nplt.show()');
    const png = plot.results.find((x) => x.png);
    assert.ok(png, `no png result: ${JSON.stringify(plot.results.map((x) => x.formats()))}`);
    assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG');
  });

  srv.test('result.data of a DataFrame and result.chart of each kind of matplotlib figure, as on E2B', async () => {
    const df = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1.5, None], 'b': ['x', 'y'], 't': pd.to_datetime(['2024-01-02', None])})");
    if (!df.results[0]?.data) assert.fail(`no data: ${await diag(df)}`);
    assert.deepEqual(df.results[0].data, { a: [1.5, null], b: ['x', 'y'], t: ['2024-01-02T00:00:00', null] });
    assert.match(df.results[0].html, /<table/);

    const chartOf = async (code) => {
      const exec = await sbx.runCode(`import matplotlib.pyplot as plt\nplt.figure()\n${code}\nplt.show()`);
      const r = exec.results.find((x) => x.png);
      if (!r?.chart) assert.fail(`no chart for ${code}: ${await diag(exec)}`);
      assert.ok(r.formats().includes('png'), 'the png travels with the chart');
      return r.chart;
    };
    const line = await chartOf("plt.plot([1, 2, 3], [4, 5, 6], label='up')\nplt.title('T')\nplt.xlabel('Time (s)')\nplt.ylabel('Dist [m]')");
    assert.equal(line.type, 'line');
    assert.equal(line.title, 'T');
    assert.deepEqual([line.x_label, line.x_unit, line.y_unit, line.x_scale], ['Time (s)', 's', 'm', 'linear']);
    assert.deepEqual(line.elements, [{ label: 'up', points: [[1, 4], [2, 5], [3, 6]] }]);
    assert.equal(line.x_ticks.length, line.x_tick_labels.length);

    const scatter = await chartOf("plt.scatter([1, 2], [3, 4], label='pts')");
    assert.equal(scatter.type, 'scatter');
    assert.deepEqual(scatter.elements, [{ label: 'pts', points: [[1, 3], [2, 4]] }]);

    const bar = await chartOf("plt.bar(['A', 'B'], [10, 20], label='Sold')\nplt.xlabel('Authors')");
    assert.equal(bar.type, 'bar');
    assert.equal(bar.x_label, 'Authors');
    assert.deepEqual(bar.elements, [{ label: 'A', value: 10, group: 'Sold' }, { label: 'B', value: 20, group: 'Sold' }]);

    const pie = await chartOf("plt.pie([1, 3], labels=['x', 'y'])");
    assert.equal(pie.type, 'pie');
    assert.deepEqual(pie.elements.map((e) => [e.label, e.angle]), [['x', 90], ['y', 270]]);

    const box = await chartOf("plt.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4, 5, 6]], patch_artist=True, labels=['p', 'q'])");
    assert.equal(box.type, 'box_and_whisker');
    assert.deepEqual(box.elements[0], { label: 'p', min: 1, first_quartile: 2.25, median: 3.5, third_quartile: 4.75, max: 5, outliers: [20] });
    assert.equal(box.elements[1].label, 'q');

    const dates = await chartOf("plt.plot(pd.to_datetime(['2024-01-01', '2024-01-02']), [1, 2])");
    assert.equal(dates.x_scale, 'datetime');
    assert.deepEqual(dates.elements[0].points.map((p) => p[0].slice(0, 10)), ['2024-01-01', '2024-01-02']);

    const both = await chartOf("plt.subplot(1, 2, 1)\nplt.plot([1, 2])\nplt.subplot(1, 2, 2)\nplt.bar([1, 2], [3, 4])\nplt.suptitle('Both')");
    assert.equal(both.type, 'superchart');
    assert.equal(both.title, 'Both');
    assert.deepEqual(both.elements.map((e) => e.type), ['line', 'bar']);

    const img = await sbx.runCode('import numpy as np\nplt.figure()\nplt.imshow(np.zeros((2, 2)))\nplt.show()');
    assert.equal(img.results.find((x) => x.png)?.chart?.type, 'unknown', 'a figure no extractor knows is an unknown chart, its png intact');

    // At most 200,000 points in a chart (and cells in a frame's data): past that, png (and html) only.
    const atLimit = await chartOf('plt.plot(range(200_000))');
    assert.equal(atLimit.elements[0].points.length, 200_000);
    const past = await sbx.runCode('plt.figure()\nplt.plot(range(200_001))\nplt.show()');
    const pastPng = past.results.find((x) => x.png);
    assert.ok(pastPng && pastPng.chart === undefined, `past the limit: ${JSON.stringify(past.results.map((x) => x.formats()))}`);
    const bigFrame = await sbx.runCode('pd.DataFrame({"a": range(200_001)})');
    assert.ok(bigFrame.results[0]?.html && bigFrame.results[0].data === undefined, 'a frame past the limit has no data');
  });

  srv.test('every MIME type the kernel shows arrives under its key', async () => {
    const code = [
      'from IPython.display import display, HTML, Markdown, Latex, JSON, SVG, Javascript, Image',
      'import io, base64, matplotlib.pyplot as plt',
      "display(HTML('<i>h</i>'), Markdown('**m**'), Latex('$y$'), JSON({'k': [1]}))",
      "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1\" height=\"1\"/>'), Javascript('1 + 1'))",
      "buf = io.BytesIO(); plt.figure(); plt.plot([1, 2]); plt.savefig(buf, format='jpeg'); plt.close()",
      "display(Image(data=buf.getvalue(), format='jpeg'))",
      "display({'application/pdf': base64.b64encode(b'%PDF-1.4 x').decode(), 'text/plain': 'pdf'}, raw=True)",
    ].join('\n');
    const exec = await sbx.runCode(code);
    assert.equal(exec.error, undefined, JSON.stringify(exec.error));
    const formats = exec.results.flatMap((r) => r.formats());
    for (const f of ['html', 'markdown', 'latex', 'json', 'svg', 'javascript', 'jpeg', 'pdf']) {
      assert.ok(formats.includes(f), `${f} missing from ${JSON.stringify(formats)}`);
    }
    const byFormat = (f) => exec.results.find((r) => r[f]);
    assert.deepEqual(byFormat('json').json, { k: [1] });
    assert.equal(Buffer.from(byFormat('jpeg').jpeg, 'base64').subarray(0, 2).toString('hex'), 'ffd8');
    assert.equal(Buffer.from(byFormat('pdf').pdf, 'base64').toString().slice(0, 5), '%PDF-');
    assert.match(byFormat('svg').svg, /<svg/);
  });

  srv.test('an exception: name, value and traceback', async () => {
    const exec = await sbx.runCode('def f():\n    raise KeyError("nope")\nf()');
    assert.equal(exec.error.name, 'KeyError');
    assert.equal(exec.error.value, "'nope'");
    assert.match(exec.error.traceback, /KeyError/);
    assert.equal(exec.results.length, 0);
  });

  srv.test('a long cell stopped by its timeoutMs; the kernel keeps its state', async () => {
    await sbx.runCode('kept = 42');
    await assert.rejects(sbx.runCode('import time\ntime.sleep(60)', { timeoutMs: 1500 }), (err) => err instanceof TimeoutError);
    const exec = await sbx.runCode('kept');
    assert.equal(exec.text, '42');
  });

  srv.test('envs apply to one execution only', async () => {
    const code = 'import os\nos.environ.get("VMON_CI", "unset")';
    assert.equal((await sbx.runCode(code, { envs: { VMON_CI: 'yes' } })).text, 'yes');
    assert.equal((await sbx.runCode(code)).text, 'unset');
  });

  // Sandbox.create's envs reach every kernel, including the Python one restored warm from the
  // template's snapshot (started before the sandbox had envs) and contexts made later; an
  // execution's own envs override them for that execution, then they are back (an unset one is
  // unset again), in every language. R with a single variable once leaked it into later cells.
  srv.test('sandbox envs reach every kernel; execution envs override them once, in every language', async () => {
    const withEnvs = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000, envs: { VMON_SBX: 'sbx-value', VMON_OVR: 'sandbox' } });
    created.push(withEnvs);
    const probes = {
      python: 'import os\nprint(os.getenv("VMON_SBX"), os.getenv("VMON_OVR"), os.getenv("VMON_ONCE", "unset"))',
      javascript: 'console.log(process.env.VMON_SBX, process.env.VMON_OVR, process.env.VMON_ONCE ?? "unset")',
      typescript: 'console.log(process.env.VMON_SBX, process.env.VMON_OVR, process.env.VMON_ONCE ?? "unset")',
      r: 'cat(Sys.getenv("VMON_SBX"), Sys.getenv("VMON_OVR"), Sys.getenv("VMON_ONCE", unset = "unset"), "\\n")',
      bash: 'echo "$VMON_SBX $VMON_OVR ${VMON_ONCE-unset}"',
      java: 'System.out.println(System.getenv("VMON_SBX") + " " + System.getenv("VMON_OVR") + " " + java.util.Objects.requireNonNullElse(System.getenv("VMON_ONCE"), "unset"));',
    };
    const out = async (language, code, envs) => {
      const ex = await withEnvs.runCode(code, { language, ...(envs ? { envs } : {}) });
      assert.equal(ex.error, undefined, `${language}: ${JSON.stringify(ex.error)}`);
      return ex.logs.stdout.join('').trim();
    };
    const serviceLog = async () => (await withEnvs.files.read('/tmp/.vmon-code-interpreter.log').catch((err) => err.message)).slice(-3000);
    for (const [language, code] of Object.entries(probes)) {
      const first = await out(language, code);
      if (first !== 'sbx-value sandbox unset') assert.fail(`${language}: sandbox envs: ${first}\nservice log:\n${await serviceLog()}`);
      assert.equal(await out(language, code, { VMON_OVR: 'exec', VMON_ONCE: 'once' }), 'sbx-value exec once', `${language}: execution envs`);
      assert.equal(await out(language, code), 'sbx-value sandbox unset', `${language}: after execution envs`);
    }
    // Java as E2B's service sets them: also system properties, read as a cell's value.
    const prop = 'System.getProperty("VMON_SBX") + " " + System.getProperty("VMON_OVR") + " " + System.getProperty("VMON_ONCE", "unset")';
    const javaProp = async (envs) => (await withEnvs.runCode(prop, { language: 'java', ...(envs ? { envs } : {}) })).results[0]?.text;
    assert.equal(await javaProp({ VMON_OVR: 'exec', VMON_ONCE: 'once' }), 'sbx-value exec once');
    assert.equal(await javaProp(), 'sbx-value sandbox unset', 'java: system properties after execution envs');
    // R with one variable only.
    assert.equal(await out('r', 'cat(Sys.getenv("VMON_ONCE", unset = "unset"))', { VMON_ONCE: 'r-once' }), 'r-once');
    assert.equal(await out('r', 'cat(Sys.getenv("VMON_ONCE", unset = "unset"))'), 'unset', 'R kept a one-variable execution env');
    // A context created later has them too.
    const ctx = await withEnvs.createCodeContext({ language: 'python' });
    const later = await withEnvs.runCode('import os\nos.getenv("VMON_SBX")', { context: ctx });
    assert.equal(later.text, 'sbx-value', JSON.stringify(later));
  });

  srv.test('contexts: create with cwd, list, state of their own, restart, remove', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' });
    assert.equal(ctx.language, 'python');
    assert.equal(ctx.cwd, '/tmp');
    const first = await sbx.runCode('import os\nmine = 1\nos.getcwd()', { context: ctx });
    assert.equal(first.text, '/tmp', JSON.stringify(first));
    assert.equal((await sbx.runCode("'mine' in globals()")).text, 'False');
    const listed = await sbx.listCodeContexts();
    assert.ok(listed.some((c) => c.id === ctx.id), JSON.stringify(listed));
    await sbx.restartCodeContext(ctx);
    assert.equal((await sbx.runCode("'mine' in globals()", { context: ctx })).text, 'False');
    await sbx.removeCodeContext(ctx.id);
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
    await assert.rejects(sbx.runCode('1', { context: ctx }), /not found/i);
    // A context of another language runs that language.
    const jsCtx = await sbx.createCodeContext({ language: 'javascript', cwd: '/home/user' });
    assert.equal(jsCtx.language, 'javascript');
    const js = await sbx.runCode('process.cwd() + " " + typeof window', { context: jsCtx });
    assert.equal(js.text, '/home/user undefined', JSON.stringify(js));
    await sbx.removeCodeContext(jsCtx);
  });

  // As E2B's service: Python and JavaScript contexts exist from the start, contexts are listed
  // in the order they were made, and kernels run as root (E2B starts its service with sudo), so
  // a context may work in /root; new contexts start in /home/user.
  srv.test('contexts as on E2B: python and javascript from the start, creation order, root kernels, cwd /root', async () => {
    const fresh = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000 });
    created.push(fresh);
    const initial = await fresh.listCodeContexts();
    assert.deepEqual(initial.map((c) => [c.language, c.cwd]), [['python', '/home/user'], ['javascript', '/home/user']], JSON.stringify(initial));
    const made = [];
    for (const [language, cwd] of [['python', '/root'], ['bash', '/tmp'], ['python', '/home/user'], ['r', '/root']]) {
      made.push(await fresh.createCodeContext({ language, cwd }));
    }
    const listed = await fresh.listCodeContexts();
    assert.deepEqual(listed.map((c) => c.id), [...initial, ...made].map((c) => c.id), 'contexts are listed in creation order');
    const inRoot = await fresh.runCode('import os\nf"{os.getuid()} {os.getcwd()}"', { context: made[0] });
    assert.equal(inRoot.text, '0 /root', JSON.stringify(inRoot));
    const rRoot = await fresh.runCode('cat(getwd())', { context: made[3] });
    assert.equal(rRoot.logs.stdout.join(''), '/root', JSON.stringify(rRoot));
    assert.equal((await fresh.runCode('import os\nos.getcwd()')).text, '/home/user');
    assert.equal((await fresh.runCode('process.cwd()', { language: 'javascript' })).text, '/home/user');
  });

  // E2B's JavaScript kernel takes ESM imports and returns the value of a cell that ends with a
  // top-level await; what such a cell declares is there for the next one.
  srv.test('javascript and typescript: ESM imports, top-level await with its value, declarations kept', async () => {
    const jsCtx = await sbx.createCodeContext({ language: 'javascript' });
    const imp = await sbx.runCode("import fs from 'fs'\nimport { join } from 'node:path'\nconst made = await fs.promises.mkdtemp(join('/tmp', 'esm-'))\nawait fs.promises.writeFile(join(made, 'f'), 'x'.repeat(5));\n(await fs.promises.stat(join(made, 'f'))).size", { context: jsCtx });
    assert.equal(imp.error, undefined, JSON.stringify(imp.error));
    assert.equal(imp.text, '5', JSON.stringify(imp));
    const later = await sbx.runCode('fs.existsSync(made) + " " + join("a", "b")', { context: jsCtx });
    assert.equal(later.text, 'true a/b', JSON.stringify(later));
    const ts = await sbx.runCode("import { createHash } from 'crypto'\nconst h: string = await Promise.resolve(createHash('sha256').update('vmon').digest('hex'))\nh.slice(0, 8)", { language: 'typescript' });
    assert.equal(ts.error, undefined, JSON.stringify(ts.error));
    assert.equal(ts.text, sha256hex('vmon').slice(0, 8), JSON.stringify(ts));
    await sbx.removeCodeContext(jsCtx);
  });

  // PIL images as on E2B: show(), save(<path>) and an image as the cell's value each give a png.
  srv.test('PIL: Image.show(), Image.save() and an Image value give png results', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python' });
    const shown = await sbx.runCode("from PIL import Image\nim = Image.new('RGB', (4, 4), 'red')\nim.show()\nim.save('/tmp/red.png')\nprint('ok')", { context: ctx });
    assert.equal(shown.error, undefined, JSON.stringify(shown.error));
    assert.deepEqual(shown.logs.stdout, ['ok\n']);
    assert.equal(shown.results.filter((r) => r.png).length, 2, JSON.stringify(shown.results.map((r) => Object.keys(r))));
    const png = Buffer.from(shown.results[0].png, 'base64');
    assert.equal(png.subarray(1, 4).toString(), 'PNG', 'the result is a PNG');
    const value = await sbx.runCode('im', { context: ctx });
    assert.ok(value.results.some((r) => r.isMainResult && r.png), JSON.stringify(value.results));
    assert.equal((await sbx.runCode("import os\nos.path.getsize('/tmp/red.png') > 0", { context: ctx })).text, 'True');
    await sbx.removeCodeContext(ctx);
  });

  // Java as E2B's template runs it (IJava, a JShell kernel): state across cells, output streamed
  // to the callbacks while the cell runs, the last expression's value as IJava shows it
  // (String.valueOf: a String without quotes, nothing for null or a declaration), exceptions
  // with their trace, compile errors.
  srv.test('java: state, streams, value, exceptions and compile errors', async () => {
    const ctx = await sbx.createCodeContext({ language: 'java' });
    assert.equal(ctx.language, 'java');
    const decl = await sbx.runCode('int x = 41;\nString greet(String n) { return "hi " + n; }\nint boom(int d) { return 10 / d; }', { context: ctx });
    if (decl.error) assert.fail(`declarations: ${await diag(decl)}`);
    assert.deepEqual(decl.results, [], 'a declaration has no value');

    const seen = [];
    const began = Date.now();
    const out = await sbx.runCode('System.out.println(greet("java"));\nSystem.err.println("e");\nThread.sleep(1500);\nSystem.out.println("late");\nx + 1', {
      context: ctx,
      onStdout: (m) => seen.push(['out', m.line, Date.now() - began]),
      onStderr: (m) => seen.push(['err', m.line, Date.now() - began]),
    });
    const took = Date.now() - began;
    assert.equal(out.error, undefined, JSON.stringify(out.error));
    assert.deepEqual(seen.map(([s, l]) => [s, l]), [['out', 'hi java\n'], ['err', 'e\n'], ['out', 'late\n']]);
    assert.ok(seen[1][2] <= took - 1000, `stderr reached the callback ${seen[1][2]} ms in, the cell ended at ${took} ms: not streamed`);
    assert.deepEqual([out.logs.stdout, out.logs.stderr, out.text], [['hi java\n', 'late\n'], ['e\n'], '42']);

    assert.equal((await sbx.runCode('greet("there")', { context: ctx })).text, 'hi there', 'a String value as IJava shows it');
    assert.equal((await sbx.runCode('java.util.List.of(\'a\', \'b\')', { context: ctx })).text, '[a, b]');
    assert.deepEqual((await sbx.runCode('(String) null', { context: ctx })).results, [], 'a null value shows nothing');

    const ex = await sbx.runCode('int r = boom(0);', { context: ctx });
    assert.equal(ex.error?.name, 'ArithmeticException', JSON.stringify(ex));
    assert.equal(ex.error.value, '/ by zero');
    assert.match(ex.error.traceback, /^ArithmeticException: \/ by zero\n\tat boom\(/);
    const npe = await sbx.runCode('Object o = null;\no.toString()', { context: ctx });
    assert.equal(npe.error?.name, 'NullPointerException', JSON.stringify(npe));
    assert.match(npe.error.traceback, /NullPointerException/);

    const bad = await sbx.runCode('int y = "no";', { context: ctx });
    assert.equal(bad.error?.name, 'CompilationException', JSON.stringify(bad));
    assert.match(bad.error.value, /incompatible types/);
    assert.match(bad.error.traceback, /int y = "no";/);
    assert.equal((await sbx.runCode('x', { context: ctx })).text, '41', 'state survives errors');
    assert.equal((await sbx.runCode('Runtime.version().feature() >= 17', { language: 'java' })).text, 'true');
    await sbx.removeCodeContext(ctx);
  });

  srv.test('two executions at once in different contexts', async () => {
    const a = await sbx.createCodeContext();
    const b = await sbx.createCodeContext();
    const code = (tag) => `import time\nopen('/tmp/overlap', 'a').write('${tag}+\\n')\ntime.sleep(1)\nopen('/tmp/overlap', 'a').write('${tag}-\\n')`;
    await sbx.runCode('import os\nos.path.exists("/tmp/overlap") and os.remove("/tmp/overlap")');
    await Promise.all([sbx.runCode(code('a'), { context: a }), sbx.runCode(code('b'), { context: b })]);
    const marks = (await sbx.files.read('/tmp/overlap')).trim().split('\n');
    assert.deepEqual(marks.slice(0, 2).map((m) => m.at(-1)), ['+', '+'], `did not overlap: ${marks}`);
  });

  srv.test('languages: python, r, javascript, typescript, bash and java run; others say so clearly', async () => {
    // IRkernel shows a value as display data, not as the cell's result: results[0], not text.
    const r = await sbx.runCode('x <- c(1, 2, 3)\nsum(x)', { language: 'r' });
    assert.equal(r.error, undefined, JSON.stringify(r.error));
    assert.match(r.results[0]?.text ?? '', /\[1\] 6/, JSON.stringify(r));
    assert.match((await sbx.runCode('cat(Sys.getenv("VMON_R"))', { language: 'r', envs: { VMON_R: 'r-env' } })).logs.stdout.join(''), /r-env/);

    await sbx.runCode('let n = 20', { language: 'javascript' });
    const js = await sbx.runCode('console.log("from js"); n + 1', { language: 'js' });
    assert.equal(js.text, '21', JSON.stringify(js));
    assert.deepEqual(js.logs.stdout, ['from js\n']);
    const jsErr = await sbx.runCode('null.x', { language: 'javascript' });
    assert.equal(jsErr.error?.name, 'TypeError', JSON.stringify(jsErr));
    assert.equal((await sbx.runCode('process.env.VMON_JS', { language: 'javascript', envs: { VMON_JS: 'js-env' } })).text, 'js-env');

    const ts = await sbx.runCode('const m: number = 3;\nm * 2', { language: 'typescript' });
    assert.equal(ts.text, '6', JSON.stringify(ts));

    await sbx.runCode('cd /tmp; v=7', { language: 'bash' });
    const sh = await sbx.runCode('echo "$v in $(pwd)"; echo err >&2', { language: 'bash' });
    assert.deepEqual(sh.logs.stdout, ['7 in /tmp\n'], JSON.stringify(sh));
    assert.deepEqual(sh.logs.stderr, ['err\n']);
    assert.equal((await sbx.runCode('false', { language: 'bash' })).error?.name, 'ExitCodeError');

    const java = await sbx.runCode('String s = "from java";\nSystem.out.println(s);\ns.length()', { language: 'java' });
    assert.equal(java.text, '9', JSON.stringify(java));
    assert.deepEqual(java.logs.stdout, ['from java\n']);

    const cobol = await sbx.runCode('1', { language: 'cobol' });
    assert.equal(cobol.error?.name, 'LanguageNotAvailable', JSON.stringify(cobol));
    assert.match(cobol.error.value, /"cobol" is not available .*available: bash, java, javascript, python, r, typescript/);
  });

  srv.test('a killed kernel is reported and the next call gets a fresh one', async () => {
    await sbx.runCode('gone = 1');
    const dead = await sbx.runCode('import os\nos._exit(1)');
    assert.equal(dead.error?.name, 'KernelDied', JSON.stringify(dead.error));
    const next = await sbx.runCode("'gone' in globals(), 1 + 1");
    assert.equal(next.text, '(False, 2)');
  });

  srv.test('a context keeps its state across a memory pause and resume', async () => {
    const own = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000 });
    created.push(own);
    const ctx = await own.createCodeContext({ cwd: '/tmp' });
    await own.runCode('import random\nsecret = random.random()');
    await own.runCode('in_ctx = "kept"', { context: ctx });
    const before = (await own.runCode('secret')).text;
    assert.equal(await own.pause(), true);
    const back = await Sandbox.connect(own.sandboxId, srv.sdkOpts);
    assert.equal((await back.runCode('secret')).text, before, 'the default context lost its state');
    assert.equal((await back.runCode('in_ctx', { context: ctx })).text, 'kept', 'a created context lost its state');
    assert.ok((await back.listCodeContexts()).some((c) => c.id === ctx.id));
  });

  // Issue 22 item 7: now and then the first runCode after a sandbox (restored with warm kernels)
  // or a context was made ended normally but without its value. Each run is a new sandbox and a
  // new context per language; FRESH_KERNEL_RUNS repeats it (a loop outside CI), and every miss is
  // collected with the execution and the service log rather than stopping at the first.
  srv.test('a fresh kernel\'s first result', { timeout: 3_600_000 }, async () => {
    const runs = Number(process.env.FRESH_KERNEL_RUNS ?? 1);
    const misses = [];
    const started = Date.now();
    for (let run = 1; run <= runs; run++) {
      const fresh = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000 });
      created.push(fresh);
      const check = async (what, exec, want) => {
        const got = want.text !== undefined ? exec.text : exec.logs.stdout.join('');
        const expected = want.text ?? want.stdout;
        if (got === expected && exec.error === undefined) return;
        const log = await fresh.files.read('/tmp/.vmon-code-interpreter.log').catch((err) => `(no service log: ${err.message})`);
        misses.push(`run ${run} ${fresh.sandboxId} ${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(expected)}\n` +
          `execution: ${JSON.stringify({ ...exec.toJSON(), executionCount: exec.executionCount })}\nservice log:\n${log.slice(-6000)}`);
        console.log(misses.at(-1));
      };
      // The default contexts first: they come warm from the template's started snapshot.
      await check('python default, value', await fresh.runCode('6 * 7'), { text: '42' });
      await check('python default, stdout', await fresh.runCode('print("py", 6 * 7)'), { stdout: 'py 42\n' });
      await check('javascript default, value', await fresh.runCode('6 * 7', { language: 'javascript' }), { text: '42' });
      await check('javascript default, stdout', await fresh.runCode('console.log("js", 6 * 7)', { language: 'javascript' }), { stdout: 'js 42\n' });
      // Then kernels started in the sandbox itself.
      for (const language of ['python', 'javascript']) {
        const ctx = await fresh.createCodeContext({ language });
        await check(`${language} new context, value`, await fresh.runCode('6 * 7', { context: ctx }), { text: '42' });
        const print = language === 'python' ? 'print("ctx", 6 * 7)' : 'console.log("ctx", 6 * 7)';
        await check(`${language} new context, stdout`, await fresh.runCode(print, { context: ctx }), { stdout: 'ctx 42\n' });
      }
      await fresh.kill();
      created.splice(created.indexOf(fresh), 1);
      if (runs > 1) console.log(`fresh kernel run ${run}/${runs}: ${misses.length} misses so far, ${((Date.now() - started) / 1000).toFixed(0)} s`);
    }
    assert.equal(misses.length, 0, `${misses.length} misses in ${runs} runs:\n${misses.join('\n\n')}`);
  });

  srv.test('running code needs the envd access token, as on E2B (the SDK sends it on /execute)', async () => {
    const post = (headers) =>
      fetch(`${srv.apiUrl}/execute`, {
        method: 'POST',
        headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999', 'Content-Type': 'application/json', ...headers },
        body: JSON.stringify({ code: '1' }),
      });
    let res = await post({});
    assert.equal(res.status, 401, await res.text());
    res = await post({ 'X-Access-Token': 'wrong' });
    assert.equal(res.status, 401, await res.text());
    const contexts = await fetch(`${srv.apiUrl}/contexts`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999' } });
    assert.equal(contexts.status, 200, 'the context endpoints carry no token in the SDK');
  });

  srv.test('allowPublicTraffic: false: the SDK sends the traffic token, others are refused', async () => {
    const priv = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000, network: { allowPublicTraffic: false } });
    created.push(priv);
    assert.equal((await priv.runCode('6 * 7')).text, '42');
    const res = await fetch(`${srv.apiUrl}/execute`, {
      method: 'POST',
      headers: { 'E2b-Sandbox-Id': priv.sandboxId, 'E2b-Sandbox-Port': '49999', 'Content-Type': 'application/json' },
      body: JSON.stringify({ code: '1' }),
    });
    assert.equal(res.status, 403, await res.text());
  });
});

describe('code interpreter over TLS with only E2B_DOMAIN (--tls self-signed)', () => {
  // Port 443: the SDK reaches the service at https://49999-<id>.<domain> without a port.
  // The API speaks TLS with vmon's own CA, which only the child trusts: it waits for the template.
  const srv = useServer({ name: 'code-interpreter-tls', port: 443, tls: true, args: ['--tls', 'self-signed', '--domain', 'localhost'] });

  srv.test('runCode and contexts through https://49999-<id>.localhost', async () => {
    const env = { ...process.env };
    for (const k of Object.keys(env)) if (k.startsWith('E2B_')) delete env[k];
    Object.assign(env, { NODE_EXTRA_CA_CERTS: srv.caPath, E2B_DOMAIN: 'localhost', E2B_API_KEY: srv.apiKey });
    const { code, stdout, stderr } = await runNodeChild(path.join(E2E_DIR, 'lib', 'code-interpreter-tls-client.js'), env, {
      args: ['--dns-result-order=ipv4first'],
    });
    const line = stdout.split('\n').find((l) => l.startsWith('E2E_RESULT='));
    assert.ok(line, `child printed no result (exit ${code})\nstdout:\n${stdout}\nstderr:\n${stderr}`);
    const out = JSON.parse(line.slice('E2E_RESULT='.length));
    const ctx = `\nchild observations: ${JSON.stringify(out, null, 2)}\nchild stderr:\n${stderr.slice(-3000)}`;
    assert.equal(out.error, undefined, `the child failed${ctx}`);
    assert.equal(out.text, '2', ctx);
    assert.deepEqual(out.stdout, ['hi\n'], ctx);
    assert.equal(out.contextCwd, '/tmp', ctx);
    assert.equal(out.killed, true, ctx);
  });
});
