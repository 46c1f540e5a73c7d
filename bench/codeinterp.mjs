// The code interpreter (issue 13, "Benchmark"), through @e2b/code-interpreter (pinned in
// test/e2e) against one vmon serve:
//
//   node bench/codeinterp.mjs --creates N --runs N --plots N --mem N --out F
//   node bench/codeinterp.mjs report DIR        prints the figures (Markdown)
//
//   1. Sandbox.create() → the result of the first runCode('1+1'), then kill, N times;
//   2. runCode('1+1') on one live sandbox, N times (after one unmeasured run);
//   3. a matplotlib plot round trip (plot, show, the png back), N times on one sandbox;
//   4. idle memory: N sandboxes, each after one runCode, 10 s settled: their memory cgroups.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { sdkOpts, now, stats, writeJson, parseArgs, sleep, E2E_DIR, MiB } from './lib.mjs';

const args = parseArgs(process.argv.slice(2));
const log = (s) => process.stderr.write(`  [codeinterp] ${s}\n`);

if (args._[0] === 'report') {
  const dir = args._[1];
  const meta = JSON.parse(fs.readFileSync(path.join(dir, 'meta.json'), 'utf8'));
  const r = JSON.parse(fs.readFileSync(path.join(dir, 'codeinterp.json'), 'utf8'));
  const ms = (v) => `${v.toFixed(0)} ms`;
  console.log(`vmon code-interpreter benchmark — ${meta.startedAt}, vmon ${meta.git}${meta.gitDirty ? '+dirty' : ''}, ` +
    `kernel ${meta.kernel}, ${meta.cpus} CPUs; @e2b/code-interpreter ${r.sdkVersion}\n`);
  console.log('| step | n | p50 | p95 |');
  console.log('|---|---|---|---|');
  console.log(`| \`Sandbox.create()\` → first \`runCode('1+1')\` result | ${r.create.n} | ${ms(r.create.p50)} | ${ms(r.create.p95)} |`);
  console.log(`| \`runCode('1+1')\` on a live sandbox | ${r.run.n} | ${ms(r.run.p50)} | ${ms(r.run.p95)} |`);
  console.log(`| matplotlib plot round trip (png back) | ${r.plot.n} | ${ms(r.plot.p50)} | ${ms(r.plot.p95)} |`);
  console.log(`\nIdle code-interpreter sandbox (after one runCode, 10 s settled), mean of ${r.memory.n}: ` +
    `memory cgroup ${(r.memory.usage / MiB).toFixed(0)} MiB (rss ${(r.memory.rss / MiB).toFixed(0)} MiB, ` +
    `page cache ${(r.memory.cache / MiB).toFixed(0)} MiB).`);
  process.exit(0);
}

const require = createRequire(path.join(E2E_DIR, 'package.json'));
const { Sandbox } = require('@e2b/code-interpreter');
const sdkVersion = JSON.parse(fs.readFileSync(path.join(E2E_DIR, 'node_modules', '@e2b', 'code-interpreter', 'package.json'), 'utf8')).version;
const opts = sdkOpts();
const PLOT = 'import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()';

async function waitTemplate() {
  for (let i = 0; i < 600; i++) {
    const res = await fetch(`${opts.apiUrl}/templates`, { headers: { 'X-API-KEY': opts.apiKey } });
    const t = (await res.json()).find((x) => x.aliases?.includes('code-interpreter-v1'));
    if (t?.buildStatus === 'ready') return;
    if (t?.buildStatus === 'error') throw new Error(`code-interpreter-v1 failed to build: ${JSON.stringify(t)}`);
    await sleep(500);
  }
  throw new Error('code-interpreter-v1 was not ready after 5 minutes');
}

function cgroupMemory(id) {
  const dir = path.join('/sys/fs/cgroup/memory/vmon', id);
  const usage = Number(fs.readFileSync(path.join(dir, 'memory.usage_in_bytes'), 'utf8').trim());
  const stat = Object.fromEntries(fs.readFileSync(path.join(dir, 'memory.stat'), 'utf8').trim().split('\n').map((l) => l.split(' ')));
  return { usage, rss: Number(stat.total_rss ?? stat.rss), cache: Number(stat.total_cache ?? stat.cache) };
}

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;

await waitTemplate();
const out = { sdkVersion };

const creates = [];
for (let i = 0; i <= Number(args.creates ?? 15); i++) {
  const t0 = now();
  const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000 });
  const exec = await sbx.runCode('1+1');
  const dt = now() - t0;
  await sbx.kill();
  if (exec.text !== '2') throw new Error(`runCode('1+1') gave ${JSON.stringify(exec)}`);
  if (i > 0) creates.push(dt); // the first is a warm-up
  log(`create → first result ${i}: ${dt.toFixed(0)} ms`);
}
out.create = { ...stats(creates), samplesMs: creates };

const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000 });
try {
  await sbx.runCode('1+1');
  const runs = [];
  for (let i = 0; i < Number(args.runs ?? 50); i++) {
    const t0 = now();
    const exec = await sbx.runCode('1+1');
    runs.push(now() - t0);
    if (exec.text !== '2') throw new Error(`runCode('1+1') gave ${JSON.stringify(exec)}`);
  }
  out.run = { ...stats(runs), samplesMs: runs };
  log(`runCode p50 ${out.run.p50.toFixed(1)} ms`);
  await sbx.runCode(PLOT); // imports matplotlib once
  const plots = [];
  for (let i = 0; i < Number(args.plots ?? 15); i++) {
    const t0 = now();
    const exec = await sbx.runCode(PLOT);
    plots.push(now() - t0);
    if (!exec.results.some((r) => r.png)) throw new Error(`no png: ${JSON.stringify(exec.error ?? exec.results)}`);
  }
  out.plot = { ...stats(plots), samplesMs: plots };
  log(`plot p50 ${out.plot.p50.toFixed(1)} ms`);
} finally {
  await sbx.kill().catch(() => {});
}

const idle = [];
try {
  for (let i = 0; i < Number(args.mem ?? 3); i++) {
    const s = await Sandbox.create({ ...opts, timeoutMs: 600_000 });
    idle.push(s);
    await s.runCode('1+1');
  }
  await sleep(10_000);
  const samples = idle.map((s) => cgroupMemory(s.sandboxId));
  out.memory = { n: samples.length, usage: mean(samples.map((m) => m.usage)), rss: mean(samples.map((m) => m.rss)),
    cache: mean(samples.map((m) => m.cache)), samples };
} finally {
  await Promise.all(idle.map((s) => s.kill().catch(() => {})));
}
writeJson(args.out, out);
