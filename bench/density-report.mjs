// Prints bench/density.sh's figures (Markdown, for docs/benchmarks.md).
import fs from 'node:fs';
import path from 'node:path';

const dir = process.argv[2];
const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
const meta = read('meta.json');
const r = read('density.json');
const ms = (s) => (s?.p50 == null ? '–' : `${s.p50.toFixed(0)} / ${s.p95.toFixed(0)}`);
const v = (x, unit = '') => (x == null ? '–' : `${x}${unit}`);
console.log(`vmon density benchmark — ${meta.startedAt}, vmon ${meta.git}${meta.gitDirty ? '+dirty' : ''}, ` +
  `kernel ${meta.kernel}, ${r.cpus} CPUs, ${r.memTotalMiB} MiB; e2b SDK ${r.sdkVersion}; ${r.samples} samples per figure, ` +
  `fill ${r.concurrency} creates at a time, idle CPU over ${r.idleSeconds} s\n`);
console.log('Latencies are p50 / p95 in ms.' + (meta.reclaim ? ` Host memory reclaim: ${meta.reclaim}.` : '') +
  (meta.serveArgs ? ` vmon serve ${meta.serveArgs}.` : '') + (meta.ksm && /memory-merge/.test(meta.serveArgs ?? '') ? ` ksmd's pace: ${meta.ksm.replace(/run=\d+ /, '')}.` : '') + '\n');
// With a warm pool each create sample waited for the pool to refill; the cell says how many the
// pool served, so a boot (a miss) cannot pass for a warm create.
const warm = Number(meta.warmPool ?? 0);
const createHead = warm > 0 ? `create → first command (warm pool of ${warm}: served by it / samples)` : 'create → first command';
const servedBy = (s) => (s.createWarmPool ? ` (${s.createWarmPool.hits}/${s.createWarmPool.hits + s.createWarmPool.misses})` : '');
console.log('| live | ' + createHead + ' | `commands.run`, random sandbox (its idle age p50) | `commands.run` after a ' + (r.steps[0]?.gapS ?? '–') + ' s gap | `GET /sandboxes` | `GET /sandboxes/{id}` | ingress (envd /health) | idle host CPU (% of one core) | vmon CPU | vmon RSS | goroutines | PSS per sandbox (sentry + gofer + stubs) | host memory per sandbox | fill rate |');
console.log('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
for (const s of [...r.steps, ...(r.recheck ? [r.recheck] : [])]) {
  const p = s.pssPerSandboxMiB;
  const age = s.commandsRunIdleAgeS?.p50 == null ? '' : ` (${s.commandsRunIdleAgeS.p50.toFixed(0)} s)`;
  console.log(`| ${s.live}${s.recheck ? ' (again, at the end)' : ''} | ${ms(s.createToFirstCommandMs)}${servedBy(s)} | ${ms(s.commandsRunMs)}${age} | ${ms(s.commandsRunAfterGapMs)} | ${ms(s.listSandboxesMs)} | ${ms(s.getSandboxMs)} | ` +
    `${ms(s.ingressMs)} | ${v(s.idleCpuPctOfOneCore, ' %')} | ${v(s.vmonCpuPctOfOneCore, ' %')} | ${v(s.vmonRssMiB, ' MiB')} | ${v(s.goroutines)} | ` +
    `${v(p.total, ' MiB')} (${v(p.sentry)} + ${v(p.gofer)} + ${v(p.stubs)}) | ${v(s.hostUsedPerSandboxMiB, ' MiB')} | ${v(s.fillCreatesPerSecond, '/s')} |`);
}
// Idle CPU of vmon's own processes: what the sandboxes cost, without the machine's other daemons.
// ksmd runs for vmon serve --memory-merge, so its CPU is the sandboxes' too.
const ownKinds = new Set(['vmon', 'runsc-sandbox', 'runsc-gofer', 'runsc', 'systrap stubs', 'ksmd']);
const own = (s) => Object.entries(s.idleCpuByKind ?? {}).filter(([k]) => ownKinds.has(k)).reduce((a, [, p]) => a + p, 0);
const first = r.steps[0];
const last = r.steps[r.steps.length - 1];
if (first && last && first !== last) {
  const q = (a, b) => (a == null || b == null ? '–' : (a / b).toFixed(2));
  console.log(`\nAt ${last.live} live vs ${first.live}: create p50 ${q(last.createToFirstCommandMs.p50, first.createToFirstCommandMs.p50)}×, ` +
    `commands.run p50 ${q(last.commandsRunMs.p50, first.commandsRunMs.p50)}× on a random sandbox, ` +
    `${q(last.commandsRunAfterGapMs?.p50, first.commandsRunAfterGapMs?.p50)}× after a ${last.gapS ?? '–'} s gap; idle host CPU per 100 sandboxes ` +
    `${last.idleCpuPctOfOneCore == null ? '–' : ((last.idleCpuPctOfOneCore / last.live) * 100).toFixed(1)} % of one core, ` +
    `${((own(last) / last.live) * 100).toFixed(1)} % of it vmon's own (vmon, sentries, gofers, stubs).`);
}
console.log('\nIdle host CPU by process kind (% of one core):\n');
for (const s of r.steps) {
  const kinds = Object.entries(s.idleCpuByKind ?? {}).sort((a, b) => b[1] - a[1]).map(([k, p]) => `${k} ${p} %`).join(', ');
  console.log(`- ${s.live} live: ${kinds || '–'}`);
}
const merged = r.steps.filter((s) => s.ksm);
if (merged.length) {
  console.log('\nMemory merging (KSM) at each step:\n');
  for (const s of merged) {
    const k = s.ksm;
    console.log(`- ${s.live} live: ${v(k.profitMiB, ' MiB')} saved in all (${v(k.profitMiB == null ? null : Math.round((k.profitMiB / s.live) * 10) / 10, ' MiB')} a sandbox), ` +
      `${v(k.pagesSharing)} pages sharing ${v(k.pagesShared)}, ${v(k.zeroPages)} pages of zeros, after ${v(k.fullScans)} full scans`);
  }
}
if (r.killAll) {
  console.log(`\nKilling all ${r.killAll.sandboxes}: ${r.killAll.seconds} s (${r.concurrency} at a time; per kill p50 / p95 ${ms(r.killAll.perKillMs)} ms).`);
}
if (r.paused) {
  const p = r.paused;
  console.log(`\nPaused: ${p.sandboxes} sandboxes paused (each with a 1 MiB file it wrote), ${p.diskPerPausedMiB} MiB of disk each; ` +
    `pause p50 / p95 ${ms(p.pauseFirstTenthMs)} ms for the first tenth, ${ms(p.pauseLastTenthMs)} ms for the last; ` +
    `resume → first command with all of them on disk ${ms(p.resumeToFirstCommandMs)} ms; vmon RSS ${p.vmonRssMiB} MiB; ` +
    `killing all of them ${p.killAll.seconds} s (per kill ${ms(p.killAll.perKillMs)} ms).`);
}
