// Reads the per-phase JSON files bench/run.sh wrote into --dir, prints the figures table
// (Markdown, for docs/benchmarks.md) and writes the JSON summary to --summary.
//   node bench/report.mjs --dir /tmp/vmon-bench-… --summary /tmp/vmon-bench-summary.json [--failed "…"]
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs, writeJson, MiB } from './lib.mjs';

const args = parseArgs(process.argv.slice(2));
const dir = args.dir;
const read = (f) => {
  try {
    return JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
  } catch {
    return null;
  }
};
const meta = read('meta.json') ?? {};
const cold = read('sdk-cold.json');
const rt = read('runtime.json');
const warm = read('sdk-warm.json');
const exec = read('exec.json');
const mem = read('memory.json');
const vmonRss = read('vmon-rss.json');
const pairs = read('pairs.json');
const failed = String(args.failed === true ? '' : (args.failed ?? '')).split(/\s+/).filter(Boolean);
let leftovers = 0;
try {
  leftovers = fs.readFileSync(path.join(dir, 'leftovers.txt'), 'utf8').split('\n').filter(Boolean).map(Number).reduce((a, b) => a + b, 0);
} catch {
  /* none */
}

const ms = (v) => (v == null ? '–' : `${v.toFixed(1)}`);
const mib = (v) => (v == null ? '–' : `${(v / MiB).toFixed(1)}`);
const ratio = (a, b) => (a == null || b == null || b === 0 ? null : Math.round((a / b) * 100) / 100);

const rows = [];
const row = (num, what, s, note = '') =>
  rows.push(`| ${num} | ${what} | ${s ? s.n : '–'} | ${ms(s?.min)} | ${ms(s?.p50)} | ${ms(s?.p95)} | ${ms(s?.max)} | ${note} |`);
const skipped = (num, what, why) => rows.push(`| ${num} | ${what} | – | – | – | – | – | ${why} |`);

const coldFlag = meta.warmPoolFlag ? '`--warm-pool 0`' : 'no `--warm-pool` flag in this build (default serve flags)';
if (cold) {
  row(1, `SDK \`Sandbox.create()\` → first \`commands.run('true')\` done, cold (${coldFlag})`, cold.total,
    `${cold.n} sequential, 1 unmeasured warm-up; kill not timed${cold.failures.length ? `; ${cold.failures.length} failed` : ''}`);
  row('', '… of which `Sandbox.create()` returns', cold.create);
  row('', '… of which the first `commands.run(\'true\')`', cold.firstRun);
} else skipped(1, 'SDK create → first run, cold', failed.includes('1-sdk-cold') ? 'FAILED' : 'not run');
if (rt) {
  row(2, 'runsc `run --detach` + `exec <id> true` (same rootfs, flags and config shape; overlay + netns ready)', rt.run,
    `${rt.n} sequential, 1 unmeasured warm-up; init \`sleep infinity\``);
  row('', '… of which `runsc run --detach`', rt.boot);
  row('', '… of which `runsc exec <id> true`', rt.exec);
  row('', 'overlay mount + `ip netns add` + lo up + config.json (not in the line above)', rt.setup);
  row('', 'all of it: setup + run + exec', rt.full);
} else skipped(2, 'runsc run + exec', failed.includes('2-runtime') ? 'FAILED' : 'not run');
if (warm) {
  row(3, `SDK create → first run, warm (\`--warm-pool ${meta.warmPool}\`)`, warm.total,
    `${warm.n} sequential, ${warm.gapMs / 1000} s pause between creates so the pool refills`);
  row('', '… of which `Sandbox.create()` returns', warm.create);
  row('', '… of which the first `commands.run(\'true\')`', warm.firstRun);
} else if (meta.warmPoolFlag === false) {
  skipped(3, 'SDK create → first run, warm pool', '`vmon serve` has no `--warm-pool` flag in this build: skipped');
} else skipped(3, 'SDK create → first run, warm pool', failed.includes('3-sdk-warm') ? 'FAILED' : 'not run');
if (exec) row(4, "`commands.run('true')` on one live sandbox", exec.run, '1 unmeasured warm-up run');
else skipped(4, "commands.run('true') on a live sandbox", failed.includes('4-exec') ? 'FAILED' : 'not run');

const ratios = {
  p50: ratio(cold?.total.p50, rt?.run.p50),
  p95: ratio(cold?.total.p95, rt?.run.p95),
  p50VsFull: ratio(cold?.total.p50, rt?.full.p50),
  p95VsFull: ratio(cold?.total.p95, rt?.full.p95),
};
const mark = (r, target) => (r == null ? '' : r <= target ? ' ✓' : ' ✗');

const lines = [];
lines.push(`vmon benchmark — ${meta.startedAt ?? '?'}`);
lines.push(`host: ${meta.cpuModel ?? '?'}, ${meta.cpus ?? '?'} CPUs, ${meta.memTotalMiB ?? '?'} MiB RAM, kernel ${meta.kernel ?? '?'}, no KVM; ` +
  `runsc ${meta.runsc ?? '?'} (--platform=systrap); vmon ${meta.git ?? '?'}${meta.gitDirty ? ' + uncommitted changes' : ''} (binary sha256 ${meta.vmonSha256 ?? '?'}); ` +
  `e2b SDK ${cold?.sdkVersion ?? exec?.sdkVersion ?? '?'} on node ${meta.node ?? '?'}`);
lines.push(`command: ${meta.command ?? 'sudo bash bench/run.sh'}`);
lines.push('');
lines.push('Latency in ms (percentiles: nearest rank)');
lines.push('');
lines.push('| # | what | n | min | p50 | p95 | max | notes |');
lines.push('|---|---|---|---|---|---|---|---|');
lines.push(...rows);
lines.push('');
lines.push('Ratios (target ≤ 1.2 cold; warm p50 target ≤ 50 ms)');
lines.push('');
lines.push('| ratio | p50 | p95 |');
lines.push('|---|---|---|');
lines.push(`| SDK create→first run (1) / runsc run+exec (2) | ${ratios.p50 ?? '–'}${mark(ratios.p50, 1.2)} | ${ratios.p95 ?? '–'}${mark(ratios.p95, 1.2)} |`);
lines.push(`| SDK create→first run (1) / runsc incl. overlay+netns setup (2, all) | ${ratios.p50VsFull ?? '–'}${mark(ratios.p50VsFull, 1.2)} | ${ratios.p95VsFull ?? '–'}${mark(ratios.p95VsFull, 1.2)} |`);
if (warm) lines.push(`| warm p50 (3) vs 50 ms target | ${ms(warm.total.p50)} ms${warm.total.p50 <= 50 ? ' ✓' : ' ✗'} | |`);

if (mem) {
  const m = (a) => `${mib(a.mean)} | ${mib(a.total)}`;
  lines.push('');
  lines.push(`Idle memory, ${mem.n} sandboxes running (measured ${mem.settleMs / 1000} s after the last one answered \`true\`), MiB`);
  lines.push('');
  lines.push('| what | per sandbox (mean) | total |');
  lines.push('|---|---|---|');
  lines.push(`| PSS of runsc-sandbox (sentry) + runsc-gofer | ${m(mem.pss)} |`);
  lines.push(`| … sentry PSS | ${m(mem.sentryPss)} |`);
  lines.push(`| … gofer PSS | ${m(mem.goferPss)} |`);
  lines.push(`| RSS of runsc-sandbox + runsc-gofer (shared pages counted in each) | ${m(mem.rss)} |`);
  lines.push(`| … sentry RSS | ${m(mem.sentryRss)} |`);
  lines.push(`| … gofer RSS | ${m(mem.goferRss)} |`);
  if (mem.cgroupUsage.count) {
    lines.push(`| memory cgroup \`memory.usage_in_bytes\` (/sys/fs/cgroup/memory/${mem.cgroupParent}/<id>, ${mem.cgroupUsage.count} found) | ${m(mem.cgroupUsage)} |`);
    lines.push(`| … of which \`rss\` (memory.stat total_rss) | ${m(mem.cgroupRss)} |`);
    lines.push(`| … of which \`cache\` (memory.stat total_cache, incl. the sentry's guest memory file) | ${m(mem.cgroupCache)} |`);
  } else {
    lines.push(`| memory cgroup usage | no /sys/fs/cgroup/memory/${mem.cgroupParent}/<id> found | |`);
  }
  if (mem.sandboxesWithoutProcs.length) lines.push(`(no runsc process found for ${mem.sandboxesWithoutProcs.length} sandbox(es))`);
} else {
  lines.push('');
  lines.push(`Idle memory: ${failed.includes('5-memory') ? 'FAILED' : 'not run'}`);
}
if (pairs) {
  lines.push('\nAlternating pairs (phase 2b: vmon and raw runsc take turns, iteration by iteration, in one run):\n');
  lines.push('| measurement | n | vmon p50 | p95 | runsc p50 | p95 | ratio p50 | ratio p95 |');
  lines.push('|---|---|---|---|---|---|---|---|');
  const pr = (what, p) =>
    lines.push(`| ${what} | ${p.vmon.n} | ${ms(p.vmon.p50)} | ${ms(p.vmon.p95)} | ${ms(p.raw.p50)} | ${ms(p.raw.p95)} | ` +
      `${ratio(p.vmon.p50, p.raw.p50) ?? '–'} | ${ratio(p.vmon.p95, p.raw.p95) ?? '–'} |`);
  pr('create → first run (SDK) vs `runsc run --detach` + `exec true`', pairs.create);
  pr('`commands.run(\'true\')` vs `runsc exec <id> true`', pairs.exec);
}
if (vmonRss?.vmonServeRssBytes) lines.push(`\nvmon serve RSS after phases 1, 2, 4, 5: ${mib(vmonRss.vmonServeRssBytes)} MiB`);
if (leftovers) lines.push(`\nnote: ${leftovers} sandbox(es) were still running in the bench data dir after \`vmon serve\` stopped (removed by the script)`);
try {
  const inc = fs.readFileSync(path.join(dir, 'incidents.txt'), 'utf8').trim();
  if (inc) lines.push(`\nincidents:\n${inc}`);
} catch {
  /* none */
}
if (failed.length) lines.push(`\nFAILED phases: ${failed.join(', ')}`);
lines.push(`\nper-phase data: ${dir}; summary: ${args.summary}`);

const strip = (o) => {
  if (!o) return o;
  const { samplesMs, perSandbox, ...rest } = o;
  return rest;
};
writeJson(args.summary, {
  meta,
  outDir: dir,
  failed,
  leftoversAfterStop: leftovers,
  sdkColdCreateToFirstRunMs: strip(cold),
  runtimeRunscMs: strip(rt),
  ratios: { ...ratios, target: 1.2 },
  alternatingPairs: pairs ? {
    create: { vmon: strip(pairs.create.vmon), raw: strip(pairs.create.raw) },
    exec: { vmon: strip(pairs.exec.vmon), raw: strip(pairs.exec.raw) },
  } : null,
  sdkWarmCreateToFirstRunMs: warm ? strip(warm) : meta.warmPoolFlag === false ? 'skipped: no --warm-pool flag' : null,
  sdkExecMs: strip(exec),
  idleMemoryBytes: strip(mem),
  vmonServeRssBytes: vmonRss?.vmonServeRssBytes ?? null,
  samples: {
    sdkCold: cold?.samplesMs ?? null,
    runtime: rt?.samplesMs ?? null,
    sdkWarm: warm?.samplesMs ?? null,
    sdkExec: exec?.samplesMs ?? null,
  },
  memoryPerSandbox: mem?.perSandbox ?? null,
  table: lines.join('\n'),
});
console.log(lines.join('\n'));
