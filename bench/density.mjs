// Density (issue 24): one node filled with idle `base` sandboxes, measured at each step of the way.
//
//   node bench/density.mjs --steps 1,100,250,500 --out F --vmon-pid P --metrics URL
//                          [--samples 20] [--idle-s 20] [--settle-s 10] [--concurrency 4]
//                          [--gap-s 3] [--recheck 1] [--warm-pool 0]
//
// At each step (so many sandboxes live, each having answered one command), with nothing else
// running: host CPU over --idle-s seconds of idleness (all cores, as % of one core), vmon's RSS and
// goroutines, the PSS of every sandbox's runsc processes (from one /proc scan), the host's used
// memory; then --samples each of: Sandbox.create → first commands.run (each killed after it is
// measured, so the count stays at the step), commands.run('true') on a random live sandbox (idle
// since it last ran one: minutes at the big steps), commands.run('true') on a random sandbox
// --gap-s seconds after it ran one (the same thing at every step: an agent's think time), GET
// /sandboxes, GET /sandboxes/{id}, and envd's /health through the ingress (header mode). At the end,
// how long killing every sandbox takes; then (--recheck, default 1) the first step again, to show
// how far the machine drifted meanwhile.
//
// With --warm-pool N (vmon serve's --warm-pool, which bench/density.sh passes on), each create
// sample first waits until the node's warm pool is full again (vmon_warm_pool_ready) and 2 s more,
// so it times the path a create takes on a default node whose pool keeps up; the step records how
// many of the samples the pool served (vmon_warm_pool_creates_total), so a miss cannot pass for
// a warm create.
//
// With --paused N (and --data-dir, vmon's): after that, the paused-sandbox phase: N sandboxes are
// created (each running one command and holding a 1 MiB file it wrote) and paused, CONCURRENCY at
// a time; reported: pause p50/p95 for the first and the last tenth (does a pause slow down as the
// snapshot store fills?), the disk each paused sandbox takes (the paused directory's allocated
// blocks over N), resume → first command p50/p95 on random paused sandboxes with N on disk (each
// paused again after it is measured), and how long killing all the paused ones takes.
//
// Environment: VMON_BENCH_URL, VMON_BENCH_KEY_FILE (bench/lib.sh's start_vmon sets them).
import fs from 'node:fs';
import os from 'node:os';
import { loadSdk, sdkOpts, now, sleep, stats, writeJson, parseArgs, procKb, processesMatching } from './lib.mjs';

const { Sandbox, sdkVersion } = loadSdk();
const args = parseArgs(process.argv.slice(2));
const opts = sdkOpts();
const steps = String(args.steps ?? '1,100,250,500').split(',').map(Number).filter((n) => n > 0);
const SAMPLES = Number(args.samples ?? 20);
const IDLE_S = Number(args['idle-s'] ?? 20);
const SETTLE_S = Number(args['settle-s'] ?? 10);
const CONCURRENCY = Number(args.concurrency ?? 4);
const VMON_PID = Number(args['vmon-pid']);
const TIMEOUT_MS = 6 * 3600_000;
const PAUSED = Number(args.paused ?? 0);
const RECHECK = args.recheck !== '0';
const WARM_POOL = Number(args['warm-pool'] ?? 0);
const WARM_SETTLE_MS = 2000;
if (WARM_POOL > 0 && !args.metrics) throw new Error('--warm-pool needs --metrics');
if (!args.out || !VMON_PID) throw new Error('--out and --vmon-pid are required');

const live = []; // Sandbox objects, in creation order
let stopping = false;
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, async () => {
    stopping = true;
    console.error(`\n${sig}: killing ${live.length} sandbox(es)`);
    await killAll();
    process.exit(130);
  });
}

const pick = () => live[Math.floor(Math.random() * live.length)];
// When each live sandbox last finished a command (ms, performance.now()): a sandbox idle for a
// minute or more answers its next command slower at any count on hosts that reclaim idle pages
// (see reclaimPolicy), so the report gives the idle age of what it sampled.
const lastUsed = new Map();
const used = (s) => lastUsed.set(s.sandboxId, now());
// Agent think time: the matched-idle samples run a command, wait this long, and time the next one,
// so every step times the same thing however many sandboxes are live.
const GAP_S = Number(args['gap-s'] ?? 3);
const say = (m) => process.stderr.write(`  [density] ${m}\n`);

async function createReady() {
  const sbx = await Sandbox.create({ ...opts, timeoutMs: TIMEOUT_MS });
  await sbx.commands.run('true');
  used(sbx);
  return sbx;
}

// Fill to n live with CONCURRENCY creates at a time; returns creates per second.
async function fillTo(n) {
  const t0 = now();
  const before = live.length;
  let failures = 0;
  let inflight = 0;
  const worker = async () => {
    while (!stopping && live.length + inflight < n) {
      inflight++;
      try {
        live.push(await createReady());
      } catch (err) {
        if (++failures > 3) throw new Error(`fill to ${n}: ${err.message}`);
        say(`create failed (${err.message}); retrying`);
      } finally {
        inflight--;
      }
      if (live.length % 25 === 0) say(`${live.length}/${n} live`);
    }
  };
  await Promise.all(Array.from({ length: Math.min(CONCURRENCY, n - before) }, worker));
  return (live.length - before) / ((now() - t0) / 1000);
}

/** Jiffies busy and total over all CPUs (/proc/stat's first line). */
function cpuTimes() {
  const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  const idle = f[3] + f[4]; // idle + iowait
  return { busy: total - idle, total };
}

/** Parent pid of every process: one scan of /proc. */
function parents() {
  const out = new Map();
  for (const ent of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(ent)) continue;
    try {
      const f = fs.readFileSync(`/proc/${ent}/stat`, 'utf8');
      out.set(Number(ent), Number(f.slice(f.lastIndexOf(')') + 2).split(' ')[1]));
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}

/** The sentry a process descends from (systrap forks its stubs from a stub of its own), or
 * undefined. */
function sentryOf(pid, ppids, sentries) {
  for (let p = ppids.get(pid), hops = 0; p != null && hops < 4; p = ppids.get(p), hops++) {
    if (sentries.has(p)) return p;
  }
  return undefined;
}

/** One scan of /proc: runsc processes by sandbox id (the container id is in their argv), with
 * the sentry's systrap stubs under "stubs": its children, one per guest address space, which map
 * the guest's memory and so hold part of its PSS. Their own children are threads cloned with the
 * same address space (CLONE_VM), whose smaps repeat their leader's: counting them would count
 * the same pages again. */
function runscBySandbox(ids) {
  // runsc knows a sandbox by its runtime id: its API id, or for one a warm pool pre-started, the
  // id it booted under, which the node's sandbox-id file in its directory maps to the API id.
  const want = new Map(ids.map((id) => [id, id]));
  if (args['data-dir']) {
    const dir = `${args['data-dir']}/sandboxes`;
    for (const rid of fs.existsSync(dir) ? fs.readdirSync(dir) : []) {
      try {
        const id = fs.readFileSync(`${dir}/${rid}/sandbox-id`, 'utf8').trim();
        if (want.has(id)) want.set(rid, id);
      } catch {
        // not handed out (a pre-started one), or gone meanwhile
      }
    }
  }
  const by = new Map();
  const sentries = new Map();
  for (const { pid, argv } of processesMatching('runsc')) {
    const name = (argv[0] ?? '').split('/').pop();
    if (!name.startsWith('runsc')) continue;
    const rid = argv.slice().reverse().find((a) => want.has(a));
    if (!rid) continue;
    const id = want.get(rid);
    const pss = procKb(`/proc/${pid}/smaps_rollup`, 'Pss');
    if (pss == null) continue;
    if (!by.has(id)) by.set(id, { sentry: 0, gofer: 0, stubs: 0, other: 0 });
    const e = by.get(id);
    if (name === 'runsc-sandbox') {
      e.sentry += pss;
      sentries.set(pid, e);
    } else if (name === 'runsc-gofer') e.gofer += pss;
    else e.other += pss;
  }
  for (const [pid, ppid] of parents()) {
    const e = sentries.get(ppid);
    if (!e) continue;
    e.stubs += procKb(`/proc/${pid}/smaps_rollup`, 'Pss') ?? 0;
  }
  return by;
}

/** KSM's counters while ksmd runs (vmon serve --memory-merge), else null: what merging saves,
 * net of its own bookkeeping, and how far ksmd got. */
function ksmCounters() {
  const read = (name) => {
    try {
      return Number(fs.readFileSync(`/sys/kernel/mm/ksm/${name}`, 'utf8').trim());
    } catch {
      return null;
    }
  };
  if (read('run') !== 1) return null;
  const profit = read('general_profit');
  return {
    profitMiB: profit == null ? null : Math.round((profit / 2 ** 20) * 10) / 10,
    pagesShared: read('pages_shared'),
    pagesSharing: read('pages_sharing'),
    zeroPages: read('ksm_zero_pages'),
    fullScans: read('full_scans'),
  };
}

function memAvailable() {
  return procKb('/proc/meminfo', 'MemAvailable');
}

async function goroutines() {
  if (!args.metrics) return null;
  try {
    const text = await (await fetch(`${args.metrics}/metrics`)).text();
    const m = /^go_goroutines (\d+)/m.exec(text);
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

/** The node's warm pool for base, from its metrics: ready, hits and misses. */
async function warmPool() {
  const text = await (await fetch(`${args.metrics}/metrics`)).text();
  const num = (re) => Number(re.exec(text)?.[1] ?? NaN);
  return {
    ready: num(/^vmon_warm_pool_ready\{template="base"\} (\S+)/m),
    hits: num(/^vmon_warm_pool_creates_total\{result="hit",template="base"\} (\S+)/m),
    misses: num(/^vmon_warm_pool_creates_total\{result="miss",template="base"\} (\S+)/m),
  };
}

/** Waits until the warm pool is full again (a refill is one boot, under a second at 500 live). */
async function warmPoolFull() {
  const deadline = now() + 120_000;
  for (;;) {
    const p = await warmPool();
    if (p.ready >= WARM_POOL) return p;
    if (now() > deadline) throw new Error(`the warm pool did not refill within 120 s (${JSON.stringify(p)})`);
    await sleep(100);
  }
}

async function timed(fn) {
  const t = now();
  await fn();
  return now() - t;
}

async function api(pathname, headers = {}) {
  const res = await fetch(`${opts.apiUrl}${pathname}`, { headers: { 'X-API-Key': opts.apiKey, ...headers } });
  await res.arrayBuffer();
  if (!res.ok && res.status !== 204) throw new Error(`${pathname}: HTTP ${res.status}`);
  return res;
}

async function measureStep(n, baseline) {
  say(`${n} live: settling ${SETTLE_S} s`);
  await sleep(SETTLE_S * 1000);
  const c0 = cpuTimes();
  const p0 = cpuByProcess();
  await sleep(IDLE_S * 1000);
  const c1 = cpuTimes();
  const p1 = cpuByProcess();
  const ncpu = os.cpus().length;
  // Busy share of all CPUs, as a percentage of one core.
  const pctOfCore = (jiffies) => Math.round((jiffies / (c1.total - c0.total)) * ncpu * 1000) / 10;
  const idleCpuPct = pctOfCore(c1.busy - c0.busy);
  // Who used it: processes alive at both ends, by kind.
  const byKind = {};
  for (const [pid, b] of p1) {
    const a = p0.get(pid);
    if (!a || a.kind !== b.kind) continue;
    byKind[b.kind] = (byKind[b.kind] ?? 0) + (b.jiffies - a.jiffies);
  }
  const idleCpuByKind = Object.fromEntries(Object.entries(byKind).filter(([, j]) => j > 0).map(([k, j]) => [k, pctOfCore(j)]));

  const ids = live.map((s) => s.sandboxId);
  const by = runscBySandbox(ids);
  const per = ids.map((id) => by.get(id)).filter(Boolean);
  const mean = (f) => (per.length ? per.reduce((a, e) => a + f(e), 0) / per.length : null);
  const mib = (b) => (b == null ? null : Math.round((b / 2 ** 20) * 10) / 10);
  const usedDelta = baseline - memAvailable();

  const out = {
    live: n,
    idleCpuPctOfOneCore: idleCpuPct,
    idleCpuByKind,
    vmonCpuPctOfOneCore: idleCpuByKind.vmon ?? 0,
    vmonRssMiB: mib(procKb(`/proc/${VMON_PID}/status`, 'VmRSS')),
    goroutines: await goroutines(),
    pssPerSandboxMiB: { sentry: mib(mean((e) => e.sentry)), gofer: mib(mean((e) => e.gofer)), stubs: mib(mean((e) => e.stubs)), total: mib(mean((e) => e.sentry + e.gofer + e.stubs + e.other)), counted: per.length },
    hostUsedPerSandboxMiB: mib(usedDelta / n),
    ksm: ksmCounters(),
  };

  say(`${n} live: latencies (${SAMPLES} samples each)`);
  const createMs = [];
  const pool0 = WARM_POOL > 0 ? await warmPool() : null;
  for (let i = 0; i < SAMPLES; i++) {
    if (WARM_POOL > 0) {
      await warmPoolFull();
      // A create that lands the moment a refill's boot ends shares the cores with what that boot
      // leaves running (its sandbox's start, the previous sample's teardown); creates spaced by an
      // agent's pace find the pool refilled a while ago.
      await sleep(WARM_SETTLE_MS);
    }
    let sbx;
    createMs.push(await timed(async () => {
      sbx = await createReady();
    }));
    await Sandbox.kill(sbx.sandboxId, opts);
  }
  if (pool0) {
    const pool1 = await warmPool();
    out.createWarmPool = { size: WARM_POOL, hits: pool1.hits - pool0.hits, misses: pool1.misses - pool0.misses };
  }
  const execMs = [];
  const idleAgeS = [];
  for (let i = 0; i < SAMPLES; i++) {
    const s = pick();
    idleAgeS.push((now() - (lastUsed.get(s.sandboxId) ?? 0)) / 1000);
    execMs.push(await timed(() => s.commands.run('true')));
    used(s);
  }
  const matchedMs = [];
  for (let i = 0; i < SAMPLES; i++) {
    const s = pick();
    await s.commands.run('true');
    await sleep(GAP_S * 1000);
    matchedMs.push(await timed(() => s.commands.run('true')));
    used(s);
  }
  const listMs = [];
  for (let i = 0; i < SAMPLES; i++) listMs.push(await timed(() => api('/sandboxes')));
  const getMs = [];
  for (let i = 0; i < SAMPLES; i++) getMs.push(await timed(() => api(`/sandboxes/${pick().sandboxId}`)));
  const ingressMs = [];
  for (let i = 0; i < SAMPLES; i++) {
    const s = pick();
    ingressMs.push(await timed(() => api('/health', { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '49983' })));
  }
  Object.assign(out, {
    createToFirstCommandMs: stats(createMs),
    commandsRunMs: stats(execMs),
    commandsRunIdleAgeS: stats(idleAgeS),
    commandsRunAfterGapMs: stats(matchedMs),
    gapS: GAP_S,
    listSandboxesMs: stats(listMs),
    getSandboxMs: stats(getMs),
    ingressMs: stats(ingressMs),
  });
  say(`${n} live: ${JSON.stringify(out)}`);
  return out;
}

/** CPU time (utime + stime, in jiffies, threads included) of every process, with its kind: vmon,
 * runsc-sandbox (a sentry), runsc-gofer, systrap stubs (a sentry's descendants), runsc (other),
 * or other ("kernel threads" are the processes without a command line that are not stubs). */
function cpuByProcess() {
  const out = new Map();
  const sentries = new Set(processesMatching('runsc-sandbox').filter((p) => p.argv[0] === 'runsc-sandbox').map((p) => p.pid));
  const ppids = parents();
  for (const ent of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(ent)) continue;
    try {
      const f = fs.readFileSync(`/proc/${ent}/stat`, 'utf8');
      const comm = f.slice(f.indexOf('(') + 1, f.lastIndexOf(')'));
      const rest = f.slice(f.lastIndexOf(')') + 2).split(' ');
      const argv0 = fs.readFileSync(`/proc/${ent}/cmdline`, 'utf8').split('\0')[0].split('/').pop();
      let kind = 'other';
      if (Number(ent) === VMON_PID) kind = 'vmon';
      else if (argv0 === 'runsc-sandbox' || argv0 === 'runsc-gofer') kind = argv0;
      else if (sentryOf(Number(ent), ppids, sentries) != null) kind = 'systrap stubs';
      else if (argv0.startsWith('runsc') || comm.startsWith('runsc')) kind = 'runsc';
      else if (comm === 'node') kind = 'bench (node)';
      else if (comm === 'ksmd') kind = 'ksmd';
      else if (argv0) kind = `other: ${comm}`;
      else kind = 'kernel threads';
      out.set(ent, { kind, jiffies: Number(rest[11]) + Number(rest[12]) });
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}

async function killAll() {
  const all = live.splice(0);
  const times = [];
  const t0 = now();
  let i = 0;
  const worker = async () => {
    while (i < all.length) {
      const s = all[i++];
      try {
        times.push(await timed(() => Sandbox.kill(s.sandboxId, { ...opts, requestTimeoutMs: 60_000 })));
      } catch (err) {
        say(`kill ${s.sandboxId}: ${err.message}`);
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  return { sandboxes: all.length, seconds: Math.round((now() - t0) / 100) / 10, perKillMs: stats(times) };
}

const result = { sdkVersion, steps: [], concurrency: CONCURRENCY, samples: SAMPLES, idleSeconds: IDLE_S, cpus: os.cpus().length,
  memTotalMiB: Math.round(procKb('/proc/meminfo', 'MemTotal') / 2 ** 20) };
try {
  const baseline = memAvailable();
  for (const n of steps) {
    say(`filling to ${n}`);
    const rate = await fillTo(n);
    const m = await measureStep(n, baseline);
    m.fillCreatesPerSecond = Math.round(rate * 100) / 100;
    result.steps.push(m);
    writeJson(args.out, result);
  }
} finally {
  say(`killing ${live.length}`);
  result.killAll = await killAll();
  writeJson(args.out, result);
}
// The machine drifts (other tenants, the host's reclaim): the first step measured again, now that
// the node has been full, says how much of a difference between steps is the count's.
if (RECHECK && steps.length > 1) {
  try {
    const baseline = memAvailable();
    say(`recheck: filling to ${steps[0]} again`);
    const rate = await fillTo(steps[0]);
    const m = await measureStep(steps[0], baseline);
    m.fillCreatesPerSecond = Math.round(rate * 100) / 100;
    m.recheck = true;
    // Memory freed by the kill-all is still coming back to the host: no baseline to measure from.
    m.hostUsedPerSandboxMiB = null;
    result.recheck = m;
  } finally {
    await killAll();
  }
  writeJson(args.out, result);
}
if (PAUSED > 0) {
  result.paused = await pausedPhase(PAUSED);
  writeJson(args.out, result);
}

/** Allocated bytes of every file under dir. */
function duBytes(dir) {
  let total = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!e.isFile()) continue;
    try {
      total += fs.statSync(`${e.parentPath}/${e.name}`).blocks * 512;
    } catch {
      /* gone meanwhile */
    }
  }
  return total;
}

async function pausedPhase(n) {
  if (!args['data-dir']) throw new Error('--paused needs --data-dir');
  const pausedDir = `${args['data-dir']}/paused`;
  const paused = [];
  const pauseMs = [];
  say(`paused phase: creating and pausing ${n}`);
  let i = 0;
  const worker = async () => {
    while (!stopping && i < n) {
      i++;
      const sbx = await createReady();
      await sbx.commands.run('head -c 1048576 /dev/urandom > /home/user/state.bin');
      pauseMs.push(await timed(() => sbx.pause()));
      paused.push(sbx.sandboxId);
      if (paused.length % 50 === 0) say(`${paused.length}/${n} paused`);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const tenth = Math.max(1, Math.floor(pauseMs.length / 10));
  const out = {
    sandboxes: paused.length,
    pauseFirstTenthMs: stats(pauseMs.slice(0, tenth)),
    pauseLastTenthMs: stats(pauseMs.slice(-tenth)),
    diskPerPausedMiB: Math.round((duBytes(pausedDir) / paused.length / 2 ** 20) * 10) / 10,
    vmonRssMiB: Math.round((procKb(`/proc/${VMON_PID}/status`, 'VmRSS') / 2 ** 20) * 10) / 10,
  };
  const resumeMs = [];
  for (let k = 0; k < SAMPLES; k++) {
    const id = paused[Math.floor(Math.random() * paused.length)];
    resumeMs.push(await timed(async () => {
      const sbx = await Sandbox.connect(id, { ...opts, timeoutMs: TIMEOUT_MS });
      await sbx.commands.run('test -s /home/user/state.bin');
    }));
    const again = await Sandbox.connect(id, { ...opts, timeoutMs: TIMEOUT_MS });
    await again.pause();
  }
  out.resumeToFirstCommandMs = stats(resumeMs);
  say(`killing ${paused.length} paused`);
  const kills = [];
  const t0 = now();
  let j = 0;
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (j < paused.length) {
      const id = paused[j++];
      try {
        kills.push(await timed(() => Sandbox.kill(id, { ...opts, requestTimeoutMs: 60_000 })));
      } catch (err) {
        say(`kill ${id}: ${err.message}`);
      }
    }
  }));
  out.killAll = { seconds: Math.round((now() - t0) / 100) / 10, perKillMs: stats(kills) };
  say(`paused: ${JSON.stringify(out)}`);
  return out;
}
