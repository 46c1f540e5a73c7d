// Several drivers on PostgreSQL vs one on SQLite (issue 21's benchmark), run by bench/drivers.sh
// inside a network namespace of its own. Three clusters, one after the other, each a driver
// setup with the same two nodes (test/e2e/lib/cluster.js: nodes in namespaces of their own on a
// bridge, --warm-pool 0):
//   sqlite-1  one driver, its records in SQLite (the default)
//   pg-1      one driver on PostgreSQL (Debian's server, started for the run)
//   pg-2      two drivers on that database, creates sent to them in turn (as a load balancer would)
// For each: sequential Sandbox.create() (each sandbox killed before the next, kill not timed),
// then CREATORS concurrent creators sharing BURST creates; p50/p95 of a create as the client sees
// it. The database's share of a create is read from the drivers' /metrics
// (vmon_database_queries_total, vmon_database_query_seconds_total) over the sequential creates,
// less what the drivers ask it while idle (node status every 2 s) over as long.
// Figures only: nothing here fails on a time.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadSdk, now, sleep, stats, writeJson } from './lib.mjs';
import { scrapeMetrics, startCluster, stopCluster } from '../test/e2e/lib/cluster.js';

const { Sandbox } = loadSdk();
const N = Number(process.env.BENCH_DRV_CREATES || 30);
const CREATORS = Number(process.env.BENCH_DRV_CREATORS || 4);
const BURST = Number(process.env.BENCH_DRV_BURST || 24);
const OUT = process.env.VMON_BENCH_DRV_OUT || fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-bench-drivers-'));
const METRICS_PORT = 19480;

const NODES = [
  { name: 'node-a', ip: '10.99.0.2', base: true, args: ['--max-sandboxes', '8'] },
  { name: 'node-b', ip: '10.99.0.3', args: ['--max-sandboxes', '8'] },
];

const SETUPS = [
  { label: 'sqlite-1', drivers: 1 },
  { label: 'pg-1', drivers: 1, database: 'postgres' },
  { label: 'pg-2', drivers: 2 },
];

async function dbUse(c) {
  let queries = 0;
  let seconds = 0;
  for (let i = 0; i < c.drivers.length; i++) {
    const m = await scrapeMetrics(`http://127.0.0.1:${METRICS_PORT + i}/metrics`);
    for (const [k, v] of Object.entries(m)) {
      if (k.startsWith('vmon_database_queries_total{')) queries += v;
      if (k.startsWith('vmon_database_query_seconds_total{')) seconds += v;
    }
  }
  return { queries, seconds, at: now() };
}

const diff = (a, b) => ({ queries: b.queries - a.queries, seconds: b.seconds - a.seconds, ms: b.at - a.at });

async function runSetup(setup) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), `vmon-bench-${setup.label}-`));
  const c = await startCluster(root, {
    nodes: NODES, drivers: setup.drivers, database: setup.database,
    driverArgsOf: (i) => ['--metrics-listen', `127.0.0.1:${METRICS_PORT + i}`],
  });
  try {
    let turn = 0;
    const next = () => c.drivers[turn++ % c.drivers.length].sdkOpts;
    // Warm up (and wait until both nodes serve): a few creates, until one works on each.
    for (let i = 0, ok = 0; ok < 4; i++) {
      try {
        const s = await Sandbox.create(next());
        await s.kill();
        ok++;
      } catch (err) {
        if (i > 60) throw err;
        await sleep(2000);
      }
    }
    // What the drivers ask the database while nothing happens, over 10 s.
    const idle0 = await dbUse(c);
    await sleep(10_000);
    const idle = diff(idle0, await dbUse(c));

    const seq = [];
    let inCreates = { queries: 0, seconds: 0, ms: 0 };
    for (let i = 0; i < N; i++) {
      const before = await dbUse(c);
      const t = now();
      const s = await Sandbox.create(next());
      seq.push(now() - t);
      const d = diff(before, await dbUse(c));
      inCreates = { queries: inCreates.queries + d.queries, seconds: inCreates.seconds + d.seconds, ms: inCreates.ms + d.ms };
      await s.kill();
    }
    const idleRate = { queries: idle.queries / idle.ms, seconds: idle.seconds / idle.ms };
    const perCreate = {
      queries: (inCreates.queries - idleRate.queries * inCreates.ms) / N,
      ms: (1000 * (inCreates.seconds - idleRate.seconds * inCreates.ms)) / N,
    };

    const burst = [];
    let left = BURST;
    await Promise.all(Array.from({ length: CREATORS }, async () => {
      while (left > 0) {
        left--;
        const opts = next();
        const t = now();
        const s = await Sandbox.create(opts);
        burst.push(now() - t);
        await s.kill();
      }
    }));
    return { label: setup.label, drivers: setup.drivers, sequential: stats(seq), burst: stats(burst), perCreate, idle };
  } finally {
    for (const d of c.drivers) await d.killAllSandboxes().catch(() => {});
    await stopCluster(c);
  }
}

const results = [];
for (const s of SETUPS) {
  console.error(`bench/drivers: ${s.label}`);
  results.push(await runSetup(s));
  writeJson(path.join(OUT, 'drivers.json'), results);
}
const base = results[0];
const r2 = (x) => (x == null ? '–' : x.toFixed(2));
const lines = [
  `Create → sandbox usable, as the client sees it (ms); ${N} sequential, then ${BURST} by ${CREATORS} concurrent creators. Ratios against one driver on SQLite.`,
  '',
  '| setup | seq p50 | seq p95 | burst p50 | burst p95 | seq p50 × | burst p50 × | burst p95 × | statements per create | database ms per create |',
  '|---|---|---|---|---|---|---|---|---|---|',
  ...results.map((r) => `| ${r.label} | ${r.sequential.p50} | ${r.sequential.p95} | ${r.burst.p50} | ${r.burst.p95} | ` +
    `${r2(r.sequential.p50 / base.sequential.p50)} | ${r2(r.burst.p50 / base.burst.p50)} | ${r2(r.burst.p95 / base.burst.p95)} | ` +
    `${r.perCreate.queries.toFixed(1)} | ${r.perCreate.ms.toFixed(2)} |`),
];
console.log(lines.join('\n'));
console.error(`bench/drivers: results in ${path.join(OUT, 'drivers.json')}`);
