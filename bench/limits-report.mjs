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
