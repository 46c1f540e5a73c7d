// Prints bench/stateful.sh's figures (Markdown, for docs/benchmarks.md).
import fs from 'node:fs';
import path from 'node:path';

const dir = process.argv[2];
const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
const meta = read('meta.json');
const r = read('stateful.json');
const ms = (v) => (v == null ? '–' : `${v.toFixed(0)} ms`);
const mib = (b) => (b == null ? '–' : `${(b / 2 ** 20).toFixed(1)} MiB`);
const ratio = (a, b) => (a == null || b == null || b === 0 ? '–' : (a / b).toFixed(2));
// Percentile q of the ratios of each alternating pair (vmon[i] / raw[i]): both sides of a pair ran
// back to back, so drift of the shared machine cancels out of it.
function pairRatio(vmon, raw, q) {
  const rs = vmon.map((v, i) => v / raw[i]).filter(Number.isFinite).sort((a, b) => a - b);
  return rs.length ? rs[Math.min(rs.length - 1, Math.ceil(q * rs.length) - 1)].toFixed(2) : '–';
}
console.log(`vmon stateful benchmark — ${meta.startedAt}, vmon ${meta.git}${meta.gitDirty ? '+dirty' : ''}, ` +
  `kernel ${meta.kernel}, ${meta.cpus} CPUs; e2b SDK ${r.sdkVersion}; ${r.n} alternating pairs per shape\n`);
console.log('| sandbox | step | vmon (SDK) p50 | p95 | raw runsc p50 | p95 | ratio p50 | ratio p95 | pair ratio p50 | p95 |');
console.log('|---|---|---|---|---|---|---|---|---|---|');
for (const [shape, label] of [['idle', 'idle'], ['touched256', '256 MiB touched']]) {
  const s = r.shapes[shape];
  if (!s) continue;
  console.log(`| ${label} | pause (\`sbx.pause()\`) vs \`runsc checkpoint\` | ${ms(s.vmonPause.p50)} | ${ms(s.vmonPause.p95)} | ` +
    `${ms(s.rawCheckpoint.p50)} | ${ms(s.rawCheckpoint.p95)} | ${ratio(s.vmonPause.p50, s.rawCheckpoint.p50)} | ${ratio(s.vmonPause.p95, s.rawCheckpoint.p95)} | ` +
    `${pairRatio(s.samplesMs.vmonPause, s.samplesMs.rawCheckpoint, 0.5)} | ${pairRatio(s.samplesMs.vmonPause, s.samplesMs.rawCheckpoint, 0.95)} |`);
  console.log(`| ${label} | resume (\`Sandbox.connect()\` + first \`commands.run\`) vs \`runsc restore\` + \`exec bash -l -c true\` | ${ms(s.vmonResume.p50)} | ` +
    `${ms(s.vmonResume.p95)} | ${ms(s.rawRestore.p50)} | ${ms(s.rawRestore.p95)} | ${ratio(s.vmonResume.p50, s.rawRestore.p50)} | ${ratio(s.vmonResume.p95, s.rawRestore.p95)} | ` +
    `${pairRatio(s.samplesMs.vmonResume, s.samplesMs.rawRestore, 0.5)} | ${pairRatio(s.samplesMs.vmonResume, s.samplesMs.rawRestore, 0.95)} |`);
}
console.log('\n| sandbox | disk per paused sandbox (mean) | raw checkpoint image (mean) |');
console.log('|---|---|---|');
for (const [shape, label] of [['idle', 'idle'], ['touched256', '256 MiB touched']]) {
  const s = r.shapes[shape];
  if (s) console.log(`| ${label} | ${mib(s.pausedBytes.mean)} | ${mib(s.rawImageBytes.mean)} |`);
}
if (r.fork) {
  console.log('\n| fork (POST /sandboxes/{id}/fork until the answer) | n | p50 | p95 |');
  console.log('|---|---|---|---|');
  for (const c of ['1', '10']) console.log(`| count ${c} | ${r.fork[c].n} | ${ms(r.fork[c].p50)} | ${ms(r.fork[c].p95)} |`);
  if (r.fork.failures.length) console.log(`\n${r.fork.failures.length} fork entries failed: ${JSON.stringify(r.fork.failures.slice(0, 3))}`);
}

if (fs.existsSync(path.join(dir, 'templates.json'))) {
  const t = read('templates.json');
  console.log('\n| `Sandbox.create()` → first `commands.run` | n | p50 | p95 |');
  console.log('|---|---|---|---|');
  console.log(`| start-command template, restored from its started snapshot | ${t.snapshot.n} | ${ms(t.snapshot.p50)} | ${ms(t.snapshot.p95)} |`);
  console.log(`| the same template, start command run per create (\`--template-start-snapshots=false\`) | ${t.perCreate.n} | ${ms(t.perCreate.p50)} | ${ms(t.perCreate.p95)} |`);
  console.log(`| \`base\`, cold (no start command) | ${t.base.n} | ${ms(t.base.p50)} | ${ms(t.base.p95)} |`);
}
