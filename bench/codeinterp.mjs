// The code interpreter (issue 13, "Benchmark"), through @e2b/code-interpreter (pinned in
// test/e2e) against one vmon serve:
//
//   node bench/codeinterp.mjs --creates N --runs N --plots N --mem N --envs N --langs a,b --out F
//   node bench/codeinterp.mjs report DIR        prints the figures (Markdown)
//
//   1. per language: Sandbox.create() → the result of the first runCode in that language (a cell
//      worth 2), then kill, N times after one unmeasured round; each round also creates a
//      sandbox with --envs environment variables, so the first runCode of each (the one that
//      gives a kernel the sandbox's envs) is timed with and without them;
//   2. per language: runCode of that cell on one live sandbox, N times (after one unmeasured run);
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
  const pair = (st) => `${ms(st.p50)} / ${ms(st.p95)}`;
  console.log(`vmon code-interpreter benchmark — ${meta.startedAt}, vmon ${meta.git}${meta.gitDirty ? '+dirty' : ''}, ` +
    `kernel ${meta.kernel}, ${meta.cpus} CPUs; @e2b/code-interpreter ${r.sdkVersion}\n`);
  console.log('| language | cell | n | `Sandbox.create()` → first `runCode` result, p50 / p95 | n | `runCode` on a live sandbox, p50 / p95 |');
  console.log('|---|---|---|---|---|---|');
  for (const [lang, l] of Object.entries(r.languages)) {
    console.log(`| ${lang} | \`${l.cell}\` | ${l.create.n} | ${pair(l.create)} | ${l.run.n} | ${pair(l.run)} |`);
  }
  console.log(`\nmatplotlib plot round trip (png back), n ${r.plot.n}: ${pair(r.plot)}.`);
  console.log(`\nThe first \`runCode\` of a fresh sandbox (it gives the kernel the sandbox's envs), without envs and with ${r.envCount}:\n`);
  console.log('| language | n | no envs, p50 / p95 | with envs, p50 / p95 | difference of the p50s |');
  console.log('|---|---|---|---|---|');
  for (const [lang, l] of Object.entries(r.languages)) {
    console.log(`| ${lang} | ${l.firstRun.n} | ${pair(l.firstRun)} | ${pair(l.firstRunEnvs)} | ${(l.firstRunEnvs.p50 - l.firstRun.p50).toFixed(0)} ms |`);
  }
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

// A cell worth 2 in each language, how its answer arrives, and code showing one variable.
const CELLS = {
  python: { cell: '1+1', got: (e) => e.text, probe: (k) => `import os\nos.environ[${JSON.stringify(k)}]` },
  javascript: { cell: '1+1', got: (e) => e.text, probe: (k) => `process.env.${k}` },
  typescript: { cell: '(1 as number) + 1', got: (e) => e.text, probe: (k) => `process.env.${k}` },
  r: { cell: '1+1', got: (e) => e.results[0]?.text?.replace(/^\[1\] /, ''), probe: (k) => `Sys.getenv(${JSON.stringify(k)})` },
  bash: { cell: 'echo $((1+1))', got: (e) => e.logs.stdout.join('').trim(), probe: (k) => `echo "$${k}"` },
  java: { cell: '1+1', got: (e) => e.text, probe: (k) => `System.getenv(${JSON.stringify(k)})` },
};
const langs = String(args.langs ?? Object.keys(CELLS).join(',')).split(',');
for (const l of langs) if (!CELLS[l]) throw new Error(`no cell for language ${l}`);

// What Sandbox.create({ envs }) passes: names and values about as long as a real agent's.
const ENVS = Object.fromEntries(Array.from({ length: Number(args.envs ?? 20) }, (_, i) =>
  [`VMON_BENCH_ENV_${String(i).padStart(2, '0')}`, `value-${i}-${'x'.repeat(24)}`]));

async function runChecked(sbx, lang, code = CELLS[lang].cell) {
  const exec = await sbx.runCode(code, { language: lang });
  if (exec.error || CELLS[lang].got(exec) !== '2') throw new Error(`${lang}: ${code} gave ${JSON.stringify(exec)}`);
}

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

out.envCount = Object.keys(ENVS).length;
out.languages = {};
for (const lang of langs) {
  const creates = [];
  const first = [];
  const firstEnvs = [];
  for (let i = 0; i <= Number(args.creates ?? 15); i++) {
    for (const withEnvs of [false, true]) {
      const t0 = now();
      const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000, ...(withEnvs ? { envs: ENVS } : {}) });
      const t1 = now();
      try {
        await runChecked(sbx, lang);
        const t2 = now();
        if (i === 0 && withEnvs) {
          // Once: the envs did reach the kernel.
          const k = Object.keys(ENVS).at(-1);
          const probe = await sbx.runCode(CELLS[lang].probe(k), { language: lang });
          if (!JSON.stringify(probe).includes(ENVS[k])) throw new Error(`${lang}: ${k} did not reach the kernel: ${JSON.stringify(probe)}`);
        }
        if (i === 0) continue; // the first round is a warm-up
        (withEnvs ? firstEnvs : first).push(t2 - t1);
        if (!withEnvs) creates.push(t2 - t0);
      } finally {
        await sbx.kill().catch(() => {});
      }
    }
  }
  out.languages[lang] = { cell: CELLS[lang].cell, create: { ...stats(creates), samplesMs: creates },
    firstRun: { ...stats(first), samplesMs: first }, firstRunEnvs: { ...stats(firstEnvs), samplesMs: firstEnvs } };
  log(`${lang}: create → first result p50 ${out.languages[lang].create.p50} ms; first runCode p50 ` +
    `${out.languages[lang].firstRun.p50} ms, with ${out.envCount} envs ${out.languages[lang].firstRunEnvs.p50} ms`);
}

const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000 });
try {
  for (const lang of langs) {
    await runChecked(sbx, lang);
    const runs = [];
    for (let i = 0; i < Number(args.runs ?? 50); i++) {
      const t0 = now();
      await runChecked(sbx, lang);
      runs.push(now() - t0);
    }
    out.languages[lang].run = { ...stats(runs), samplesMs: runs };
    log(`${lang}: runCode p50 ${out.languages[lang].run.p50.toFixed(1)} ms`);
  }
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
