// SDK-side benchmark phases against a running `vmon serve` (started by bench/run.sh):
//
//   node bench/sdk.mjs create  --n 30 --out F [--gap-ms 0] [--warmup 1] [--initial-wait-ms 0]
//                              [--label L] [--capture-config F --data-dir D]
//       Sandbox.create() → first commands.run('true') done, n sequential creates; each sandbox is
//       killed after it is measured (kill time not counted).
//   node bench/sdk.mjs exec    --n 100 --out F
//       commands.run('true') on one live sandbox (after one unmeasured warm-up run).
//   node bench/sdk.mjs memory  --n 20 --settle-ms 10000 --out F [--cgroup-parent vmon] [--data-dir D]
//       n sandboxes running idle: RSS/PSS of their runsc processes and their memory cgroups, and
//       (with --data-dir) the host disk their disk images take.
//   node bench/sdk.mjs neighbour --n 30 --aggressor-s 40 --out F
//       commands.run('true') latency of one sandbox while it is alone, while another sandbox runs an
//       unprivileged fork bomb, and while another runs a CPU burner (one spinning process per vCPU
//       and one more); and how long after the fork bomb's `timeout` ended root in that sandbox
//       first runs a command (up to --recover-s, default 120).
//   node bench/sdk.mjs cleanup
//       kill every sandbox the server lists.
//
// Environment: VMON_BENCH_URL (http://127.0.0.1:<port>), VMON_BENCH_KEY_FILE.
import fs from 'node:fs';
import path from 'node:path';
import { loadSdk, sdkOpts, now, sleep, stats, writeJson, parseArgs, processesMatching, procKb } from './lib.mjs';

const { Sandbox, sdkVersion } = loadSdk();
const args = parseArgs(process.argv.slice(2));
const cmd = args._[0];
const opts = sdkOpts();
// Long enough that no sandbox expires mid-phase; every phase kills what it made.
const SANDBOX_TIMEOUT_MS = 900_000;
const MAX_FAILURES = 3;

const live = new Set(); // sandboxes this process made and has not killed yet

async function killQuiet(sbx) {
  try {
    await Sandbox.kill(sbx.sandboxId, { ...opts, requestTimeoutMs: 30_000 });
  } catch (err) {
    console.error(`  kill ${sbx.sandboxId} failed: ${err.message}`);
  }
  live.delete(sbx);
}

async function killAllLive() {
  for (const sbx of [...live]) await killQuiet(sbx);
}

// On an interrupt, kill what this phase made before exiting.
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, async () => {
    console.error(`\n${sig}: killing ${live.size} sandbox(es) of this phase`);
    await killAllLive();
    process.exit(130);
  });
}

async function createOne() {
  const sbx = await Sandbox.create({ ...opts, timeoutMs: SANDBOX_TIMEOUT_MS });
  live.add(sbx);
  return sbx;
}

async function phaseCreate() {
  const n = Number(args.n ?? 30);
  const gapMs = Number(args['gap-ms'] ?? 0);
  const warmup = Number(args.warmup ?? 1);
  const initialWaitMs = Number(args['initial-wait-ms'] ?? 0);
  const label = args.label ?? 'cold';
  if (initialWaitMs) await sleep(initialWaitMs);

  for (let i = 0; i < warmup; i++) {
    const sbx = await createOne();
    await sbx.commands.run('true');
    if (i === 0 && args['capture-config']) {
      // The OCI config vmon wrote for this sandbox: bench/runtime.mjs copies its shape.
      const src = path.join(args['data-dir'], 'sandboxes', sbx.sandboxId, 'config.json');
      try {
        const cfg = JSON.parse(fs.readFileSync(src, 'utf8'));
        writeJson(args['capture-config'], { sandboxId: sbx.sandboxId, dataDir: args['data-dir'], config: cfg });
      } catch (err) {
        console.error(`  could not capture ${src}: ${err.message}`);
      }
    }
    await killQuiet(sbx);
    if (gapMs) await sleep(gapMs);
  }

  const total = [];
  const create = [];
  const firstRun = [];
  const failures = [];
  for (let i = 0; i < n; i++) {
    if (i > 0 && gapMs) await sleep(gapMs);
    let sbx;
    try {
      const t0 = now();
      sbx = await createOne();
      const t1 = now();
      const r = await sbx.commands.run('true');
      const t2 = now();
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
      total.push(t2 - t0);
      create.push(t1 - t0);
      firstRun.push(t2 - t1);
      process.stderr.write(`  [${label}] ${i + 1}/${n}: ${(t2 - t0).toFixed(1)} ms (create ${(t1 - t0).toFixed(1)}, run ${(t2 - t1).toFixed(1)})\n`);
    } catch (err) {
      failures.push(err.message);
      console.error(`  [${label}] ${i + 1}/${n} failed: ${err.message}`);
      if (failures.length > MAX_FAILURES) throw new Error(`more than ${MAX_FAILURES} failed creates; giving up`);
    } finally {
      if (sbx) await killQuiet(sbx);
    }
  }
  writeJson(args.out, {
    phase: 'sdk-create',
    label,
    sdkVersion,
    n,
    warmup,
    gapMs,
    initialWaitMs,
    failures,
    samplesMs: { total, create, firstRun },
    total: stats(total),
    create: stats(create),
    firstRun: stats(firstRun),
  });
}

async function phaseExec() {
  const n = Number(args.n ?? 100);
  const sbx = await createOne();
  try {
    await sbx.commands.run('true'); // warm-up, not measured
    const samples = [];
    for (let i = 0; i < n; i++) {
      const t0 = now();
      const r = await sbx.commands.run('true');
      samples.push(now() - t0);
      if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
    }
    writeJson(args.out, { phase: 'sdk-exec', sdkVersion, n, warmup: 1, samplesMs: samples, run: stats(samples) });
  } finally {
    await killQuiet(sbx);
  }
}

// aggressors are the loads phaseNeighbour runs beside the measured sandbox, as user, bounded by
// timeout(1) (which signals its whole process group when the time is up: `wait` keeps the shell,
// and so the group, alive until then).
const aggressors = {
  forkBomb: (secs) => `timeout ${secs} bash -c ':(){ :|:& };:; wait' 2>/dev/null; true`,
  cpuBurner: (secs) => `timeout ${secs} bash -c 'for i in $(seq $(( $(nproc) + 1 ))); do (while :; do :; done) & done; wait'; true`,
};

async function latencies(sbx, n) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const t0 = now();
    try {
      await sbx.commands.run('true', { timeoutMs: 60_000 });
      out.push(now() - t0);
    } catch {
      out.push(null); // failed: counted apart, not as a latency
    }
  }
  return out;
}

async function phaseNeighbour() {
  const n = Number(args.n ?? 30);
  const secs = Number(args['aggressor-s'] ?? 40);
  const recoverS = Number(args['recover-s'] ?? 120);
  const neighbour = await createOne();
  const result = { phase: 'sdk-neighbour', sdkVersion, n, aggressorSeconds: secs, loads: {} };
  try {
    await neighbour.commands.run('true');
    const idle = await latencies(neighbour, n);
    result.loads.idle = { run: stats(idle.filter((v) => v != null)), failed: idle.filter((v) => v == null).length };
    for (const [name, command] of Object.entries(aggressors)) {
      const aggressor = await createOne();
      try {
        const began = now();
        const load = aggressor.commands.run(command(secs), { timeoutMs: (secs + 120) * 1000 }).catch((err) => err);
        await sleep(3000); // let the load build up
        const samples = await latencies(neighbour, n);
        const ok = samples.filter((v) => v != null);
        const entry = { run: stats(ok), failed: samples.length - ok.length };
        await load;
        const ended = now();
        entry.loadSeconds = (ended - began) / 1000;
        if (name === 'forkBomb') {
          // Root in the bombed sandbox: time until its first command succeeds.
          entry.rootRecoveryMs = null;
          while (now() - ended < recoverS * 1000) {
            try {
              await aggressor.commands.run('true', { user: 'root', timeoutMs: 10_000 });
              entry.rootRecoveryMs = Math.round(now() - ended);
              break;
            } catch {
              await sleep(500);
            }
          }
        }
        result.loads[name] = entry;
      } finally {
        await killQuiet(aggressor);
      }
    }
    writeJson(args.out, result);
  } finally {
    await killQuiet(neighbour);
  }
}

function readCgroupMemory(parent, id) {
  const dir = path.join('/sys/fs/cgroup/memory', parent, id);
  try {
    const usage = Number(fs.readFileSync(path.join(dir, 'memory.usage_in_bytes'), 'utf8').trim());
    const stat = {};
    for (const line of fs.readFileSync(path.join(dir, 'memory.stat'), 'utf8').split('\n')) {
      const [k, v] = line.split(' ');
      if (k) stat[k] = Number(v);
    }
    return {
      dir,
      usage,
      rss: stat.total_rss ?? stat.rss ?? null,
      cache: stat.total_cache ?? stat.cache ?? null,
      shmem: stat.total_shmem ?? stat.shmem ?? null,
      inactiveFile: stat.total_inactive_file ?? stat.inactive_file ?? null,
    };
  } catch {
    return null;
  }
}

function processMemory(id) {
  const procs = [];
  for (const p of processesMatching(id)) {
    const name = path.basename(p.argv[0]);
    if (!name.startsWith('runsc')) continue;
    const rss = procKb(`/proc/${p.pid}/status`, 'VmRSS');
    const pss = procKb(`/proc/${p.pid}/smaps_rollup`, 'Pss');
    if (rss == null) continue; // exited meanwhile, or a zombie
    procs.push({ pid: p.pid, name, rss, pss });
  }
  return procs;
}

// The host disk a sandbox's disk image takes (its allocated blocks), or null without a disk limit.
function diskImageBytes(dataDir, id) {
  if (!dataDir) return null;
  try {
    return fs.statSync(path.join(dataDir, 'sandboxes', id, 'disk.img')).blocks * 512;
  } catch {
    return null;
  }
}

async function phaseMemory() {
  const n = Number(args.n ?? 20);
  const settleMs = Number(args['settle-ms'] ?? 10_000);
  const cgParent = args['cgroup-parent'] ?? 'vmon';
  const sandboxes = [];
  try {
    for (let i = 0; i < n; i++) {
      const sbx = await createOne();
      await sbx.commands.run('true'); // it answers: really up
      sandboxes.push(sbx);
      process.stderr.write(`  [memory] started ${i + 1}/${n}: ${sbx.sandboxId}\n`);
    }
    process.stderr.write(`  [memory] ${n} running, waiting ${settleMs / 1000} s\n`);
    await sleep(settleMs);
    const per = sandboxes.map((sbx) => {
      const procs = processMemory(sbx.sandboxId);
      const sum = (name, field) =>
        procs.filter((p) => !name || p.name === name).reduce((a, p) => a + (p[field] ?? 0), 0);
      return {
        id: sbx.sandboxId,
        procs,
        sentryRss: sum('runsc-sandbox', 'rss'),
        sentryPss: sum('runsc-sandbox', 'pss'),
        goferRss: sum('runsc-gofer', 'rss'),
        goferPss: sum('runsc-gofer', 'pss'),
        otherRunsc: procs.filter((p) => p.name !== 'runsc-sandbox' && p.name !== 'runsc-gofer').map((p) => p.name),
        rss: sum(null, 'rss'),
        pss: sum(null, 'pss'),
        cgroup: readCgroupMemory(cgParent, sbx.sandboxId),
        diskImageBytes: diskImageBytes(args['data-dir'], sbx.sandboxId),
      };
    });
    const agg = (f) => {
      const vals = per.map(f).filter((v) => v != null);
      const total = vals.reduce((a, b) => a + b, 0);
      return { count: vals.length, total, mean: vals.length ? total / vals.length : null };
    };
    writeJson(args.out, {
      phase: 'memory',
      n,
      settleMs,
      cgroupParent: cgParent,
      perSandbox: per,
      sentryRss: agg((s) => s.sentryRss),
      sentryPss: agg((s) => s.sentryPss),
      goferRss: agg((s) => s.goferRss),
      goferPss: agg((s) => s.goferPss),
      rss: agg((s) => s.rss),
      pss: agg((s) => s.pss),
      cgroupUsage: agg((s) => s.cgroup?.usage ?? null),
      cgroupRss: agg((s) => s.cgroup?.rss ?? null),
      cgroupCache: agg((s) => s.cgroup?.cache ?? null),
      diskImageBytes: agg((s) => s.diskImageBytes),
      sandboxesWithoutProcs: per.filter((s) => s.procs.length === 0).map((s) => s.id),
    });
  } finally {
    await killAllLive();
  }
}

async function phaseCleanup() {
  const ids = [];
  const p = Sandbox.list({ ...opts, requestTimeoutMs: 10_000 });
  for (let page = 0; p.hasNext && page < 100; page++) for (const s of await p.nextItems()) ids.push(s.sandboxId);
  let killed = 0;
  for (const id of ids) {
    try {
      if (await Sandbox.kill(id, { ...opts, requestTimeoutMs: 30_000 })) killed++;
    } catch (err) {
      console.error(`  kill ${id} failed: ${err.message}`);
    }
  }
  if (ids.length) console.error(`  cleanup: killed ${killed}/${ids.length} listed sandbox(es)`);
}

const phases = { create: phaseCreate, exec: phaseExec, memory: phaseMemory, neighbour: phaseNeighbour, cleanup: phaseCleanup };
if (!phases[cmd]) {
  console.error(`usage: node bench/sdk.mjs create|exec|memory|neighbour|cleanup [--n N] [--out file] …`);
  process.exit(2);
}
try {
  await phases[cmd]();
} catch (err) {
  console.error(`sdk ${cmd}: ${err.stack || err}`);
  await killAllLive();
  process.exit(1);
}
