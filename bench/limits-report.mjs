// Prints bench/limits.sh's figures: create latency with and without the disk limit (all rounds
// pooled), and the idle cost per sandbox each way.
import fs from 'node:fs';
import path from 'node:path';
import { stats } from './lib.mjs';

const dir = process.argv[2];
const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
const files = fs.readdirSync(dir);
const meta = read('meta.json');
console.log(`vmon limits benchmark — ${meta.startedAt}, vmon ${meta.git}${meta.gitDirty ? '+dirty' : ''}, ` +
  `kernel ${meta.kernel}, ${meta.cpus} CPUs; ${meta.rounds} alternating rounds of ${meta.createsPerRound} creates per mode\n`);
console.log('| mode | n | create→first run p50 | p95 | `Sandbox.create()` p50 | p95 |');
console.log('|---|---|---|---|---|---|');
const mib = (b) => (b == null ? '–' : (b / 2 ** 20).toFixed(1));
for (const disk of ['10240', '0']) {
  const runs = files.filter((f) => f.startsWith('create-') && f.endsWith(`-disk${disk}.json`)).map(read);
  const total = stats(runs.flatMap((r) => r.samplesMs.total));
  const create = stats(runs.flatMap((r) => r.samplesMs.create));
  const label = disk === '0' ? 'no disk limit (`--sandbox-disk-mb 0`)' : `disk limit ${disk} MiB`;
  console.log(`| ${label} | ${total.n} | ${total.p50} ms | ${total.p95} ms | ${create.p50} ms | ${create.p95} ms |`);
}
console.log('\nIdle sandboxes (mean per sandbox)\n');
console.log('| mode | memory cgroup usage MiB | runsc RSS MiB | disk image on host MiB |');
console.log('|---|---|---|---|');
for (const disk of ['10240', '0']) {
  const f = `memory-disk${disk}.json`;
  if (!files.includes(f)) continue;
  const m = read(f);
  console.log(`| ${disk === '0' ? 'no disk limit' : `disk limit ${disk} MiB`} | ${mib(m.cgroupUsage.mean * 1)} | ` +
    `${mib(m.rss.mean)} | ${mib(m.diskImageBytes.mean)} |`);
}

if (files.includes('neighbour.json')) {
  const nb = read('neighbour.json');
  const idle = nb.loads.idle.run;
  console.log(`\nA neighbour's \`commands.run('true')\` while another sandbox runs a load (${nb.n} runs each; ` +
    `loads run ${nb.aggressorSeconds} s under timeout(1))\n`);
  console.log('| beside | p50 | p95 | p50 / idle p50 | p95 / idle p95 | failed | root in the loaded sandbox runs a command after |');
  console.log('|---|---|---|---|---|---|---|');
  for (const [name, e] of Object.entries(nb.loads)) {
    const ratio = (a, b) => (name === 'idle' ? '1' : (a / b).toFixed(2));
    const recovery = e.rootRecoveryMs === undefined ? '' : e.rootRecoveryMs === null ? 'not within the wait' : `${e.rootRecoveryMs} ms`;
    console.log(`| ${name} | ${e.run.p50} ms | ${e.run.p95} ms | ${ratio(e.run.p50, idle.p50)} | ${ratio(e.run.p95, idle.p95)} | ${e.failed} | ${recovery} |`);
  }
}
