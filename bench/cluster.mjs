// Cluster benchmark phases against a running `vmon serve` (--role all, or a --role driver with its
// nodes), started by bench/cluster.sh; each phase writes D/<phase>-<label>.json:
//
//   node bench/cluster.mjs ready --dir D
//       retries a create (→ run → kill) until one works, for 120 s at most
//   node bench/cluster.mjs creates --dir D --label L [--n 20] [--warmup 1]
//       sequential Sandbox.create() → first commands.run('true') done (kill not timed)
//   node bench/cluster.mjs exec --dir D --label L [--n 200] [--warmup 5]
//       commands.run('true') on one live sandbox
//   node bench/cluster.mjs burst --dir D --label L [--n 24] [--creators 4]
//       `creators` workers share n create → run('true') → kill cycles; creates per second is
//       n / the wall-clock of them all (kills included: they free the slot the next one takes)
//   node bench/cluster.mjs resume --dir D --vmon BIN --driver-dir DD [--n 5]
//       a sandbox with 200 MiB of /dev/shm written, paused with its memory, then
//       Sandbox.connect() → first commands.run('true') done, alternating: on the node that
//       paused it, and on another one (the holder drained with `vmon node drain` first)
//   node bench/cluster.mjs report --dir D --summary F [--failed "…"]
//       prints the Markdown tables, writes the summary (tables included)
// Nothing here asserts a time; a resume that lands on the wrong node or loses the written data
// fails the phase.
//
// Environment: VMON_BENCH_URL (http://127.0.0.1:<port>), VMON_BENCH_KEY_FILE (bench/lib.sh).
import fs from 'node:fs';
import path from 'node:path';
import { loadSdk, sdkOpts, now, sleep, stats, writeJson, parseArgs, runOk } from './lib.mjs';

const { Sandbox, sdkVersion } = loadSdk();
const args = parseArgs(process.argv.slice(2));
const cmd = args._[0];
const opts = cmd === 'report' ? null : sdkOpts();
const N = Number(args.n ?? 0);
const LABEL = String(args.label ?? '');
const SANDBOX_TIMEOUT_MS = 900_000;
const MAX_FAILURES = 3;
const log = (s) => process.stderr.write(`  [${cmd}${LABEL ? ` ${LABEL}` : ''}] ${s}\n`);

const live = new Set(); // sandbox ids made and not killed yet
async function killQuiet(id) {
  try {
    await Sandbox.kill(id, { ...opts, requestTimeoutMs: 60_000 });
  } catch (err) {
    console.error(`  kill ${id} failed: ${err.message}`);
  }
  live.delete(id);
}
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, async () => {
    for (const id of [...live]) await killQuiet(id);
    process.exit(130);
  });
}
async function create() {
  const sbx = await Sandbox.create({ ...opts, timeoutMs: SANDBOX_TIMEOUT_MS });
  live.add(sbx.sandboxId);
  return sbx;
}

/** One create → first run('true'); { total, create, firstRun } ms. The sandbox is killed after. */
async function cycle() {
  let sbx;
  try {
    const a = now();
    sbx = await create();
    const b = now();
    const r = await sbx.commands.run('true');
    const c = now();
    if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}`);
    return { total: c - a, create: b - a, firstRun: c - b };
  } finally {
    if (sbx) await killQuiet(sbx.sandboxId);
  }
}

async function phaseCreates() {
  const samples = [];
  const failures = [];
  for (let i = 0; i < Number(args.warmup ?? 1); i++) await cycle();
  for (let i = 0; i < N; i++) {
    try {
      const s = await cycle();
      samples.push(s);
      log(`${i + 1}/${N}: ${s.total.toFixed(1)} ms (create ${s.create.toFixed(1)}, run ${s.firstRun.toFixed(1)})`);
    } catch (err) {
      failures.push(err.message);
      log(`${i + 1}/${N} failed: ${err.message}`);
      if (failures.length > MAX_FAILURES) throw new Error('too many failed creates');
    }
  }
  return {
    n: N, failures, total: stats(samples.map((s) => s.total)), create: stats(samples.map((s) => s.create)),
    firstRun: stats(samples.map((s) => s.firstRun)), samplesMs: samples.map((s) => Math.round(s.total * 10) / 10),
  };
}

async function phaseExec() {
  const sbx = await create();
  try {
    for (let i = 0; i < Number(args.warmup ?? 5); i++) await sbx.commands.run('true');
    const samples = [];
    for (let i = 0; i < N; i++) {
      const a = now();
      await sbx.commands.run('true');
      samples.push(now() - a);
    }
    const st = stats(samples);
    log(`p50 ${st.p50} ms, p95 ${st.p95} ms over ${N}`);
    return { n: N, run: st };
  } finally {
    await killQuiet(sbx.sandboxId);
  }
}

async function phaseBurst() {
  const creators = Number(args.creators ?? 4);
  // One unmeasured round, so that every creator's first create is not a cold path of the server.
  await Promise.all(Array.from({ length: creators }, () => cycle()));
  const samples = [];
  const failures = [];
  let next = 0;
  const t0 = now();
  await Promise.all(Array.from({ length: creators }, async () => {
    while (next < N) {
      next++;
      try {
        samples.push(await cycle());
      } catch (err) {
        failures.push(err.message);
        log(`failed: ${err.message}`);
        if (failures.length > MAX_FAILURES) throw new Error('too many failed creates');
      }
    }
  }));
  const wallMs = now() - t0;
  const perSecond = Math.round((samples.length / (wallMs / 1000)) * 100) / 100;
  const total = stats(samples.map((s) => s.total));
  log(`${samples.length} creates by ${creators} creators in ${wallMs.toFixed(0)} ms: ${perSecond}/s; p50 ${total.p50} ms, p95 ${total.p95} ms`);
  return { n: N, creators, failures, wallMs: Math.round(wallMs), perSecond, total, create: stats(samples.map((s) => s.create)) };
}

// --- resume ----------------------------------------------------------------------------------
const vmonJSON = async (...a) => (await runOk(args.vmon, [...a, '--json', '--data-dir', args['driver-dir']]))
  .stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
const holderOf = async (id) => (await vmonJSON('sandbox', 'ls')).find((r) => r.sandboxId === id)?.node;
const nodeState = async (name) => (await vmonJSON('node', 'ls')).find((n) => n.name === name)?.state;
async function waitNodeState(name, state) {
  for (let i = 0; i < 600; i++) {
    if ((await nodeState(name)) === state) return;
    await sleep(100);
  }
  throw new Error(`node ${name} not ${state} after 60 s`);
}
const TOUCH_MIB = 200;

async function oneResume(kind) {
  const sbx = await create();
  let id = sbx.sandboxId;
  let drained = null;
  try {
    const w = await sbx.commands.run(`head -c ${TOUCH_MIB}M /dev/urandom > /dev/shm/x && md5sum < /dev/shm/x && ` +
      "awk '/^MemTotal:/ {print $2}' /proc/meminfo", { timeoutMs: 120_000 });
    const [sum, memKb] = w.stdout.trim().split('\n');
    const from = await holderOf(id);
    const a = now();
    if (!(await sbx.pause())) throw new Error('pause answered false');
    const pauseMs = now() - a;
    if (kind === 'other') {
      await runOk(args.vmon, ['node', 'drain', from, '--data-dir', args['driver-dir']]);
      drained = from;
      await waitNodeState(from, 'draining');
    }
    const b = now();
    const back = await Sandbox.connect(id, { ...opts, timeoutMs: SANDBOX_TIMEOUT_MS });
    await back.commands.run('true');
    const resumeMs = now() - b;
    id = back.sandboxId;
    const to = await holderOf(id);
    const after = (await back.commands.run('md5sum < /dev/shm/x', { timeoutMs: 120_000 })).stdout.trim();
    if (after !== sum) throw new Error(`/dev/shm/x changed across the resume (${sum} → ${after})`);
    if (kind === 'same' ? to !== from : to === from) throw new Error(`${kind}: paused on ${from}, resumed on ${to}`);
    log(`${kind}: ${from} → ${to}: pause ${pauseMs.toFixed(0)} ms, connect → run('true') ${resumeMs.toFixed(0)} ms`);
    return { pauseMs, resumeMs, from, to, guestMemTotalKiB: Number(memKb) };
  } finally {
    if (drained) {
      await runOk(args.vmon, ['node', 'drain', drained, '--undo', '--data-dir', args['driver-dir']]).catch((e) => log(e.message));
      await waitNodeState(drained, 'ready').catch((e) => log(e.message));
    }
    await killQuiet(id);
  }
}

async function phaseResume() {
  const res = { same: [], other: [] };
  for (let i = 0; i < N; i++) {
    // Alternating, each kind first every other round, so the shared machine's noise hits both.
    for (const kind of i % 2 ? ['other', 'same'] : ['same', 'other']) res[kind].push(await oneResume(kind));
  }
  const sum = (l) => ({
    n: l.length, resume: stats(l.map((s) => s.resumeMs)), pause: stats(l.map((s) => s.pauseMs)),
    moves: l.map((s) => `${s.from}→${s.to}`), guestMemTotalKiB: l[0]?.guestMemTotalKiB ?? null,
  });
  return { touchMiB: TOUCH_MIB, same: sum(res.same), other: sum(res.other) };
}

// --- report ----------------------------------------------------------------------------------
function report() {
  const dir = args.dir;
  const read = (f) => {
    try {
      return JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
    } catch {
      return null;
    }
  };
  const meta = read('meta.json') ?? {};
  const c = { all: read('creates-all.json'), node1: read('creates-node1.json'), node3: read('creates-node3.json') };
  const e = { all: read('exec-all.json'), node1: read('exec-node1.json') };
  const b = { node1: read('burst-node1.json'), node3: read('burst-node3.json') };
  const rs = read('resume.json');
  let goBench = '';
  try {
    goBench = fs.readFileSync(path.join(dir, 'go-bench.txt'), 'utf8');
  } catch {
    /* not run */
  }
  const failed = String(args.failed === true ? '' : (args.failed ?? '')).split(/\s+/).filter(Boolean);
  let leftovers = 0;
  try {
    leftovers = fs.readFileSync(path.join(dir, 'leftovers.txt'), 'utf8').split('\n').filter(Boolean).map(Number).reduce((x, y) => x + y, 0);
  } catch {
    /* none */
  }
  const ms = (v) => (v == null ? '–' : v.toFixed(1));
  const ratio = (x, y) => (x == null || y == null || y === 0 ? '–' : `${(x / y).toFixed(2)}×`);
  const pct = (x, y) => (x == null || y == null || y === 0 ? '–' : `${x >= y ? '+' : ''}${(((x - y) / y) * 100).toFixed(0)} %`);
  const L = [];
  L.push(`vmon cluster benchmark — ${meta.startedAt ?? '?'}`);
  L.push(`host: ${meta.cpuModel ?? '?'}, ${meta.cpus ?? '?'} CPUs, ${meta.memTotalMiB ?? '?'} MiB RAM, kernel ${meta.kernel ?? '?'}; ` +
    `vmon ${meta.git ?? '?'}${meta.gitDirty ? ' + uncommitted changes' : ''} (binary sha256 ${meta.vmonSha256 ?? '?'}); ` +
    `e2b SDK ${sdkVersion} on node ${process.version}; every member --warm-pool 0; all members on this one host`);
  L.push('');
  L.push("1. `Sandbox.create()` → first `commands.run('true')` done, ms (kill not timed); creates/s: " +
    `${b.node1?.creators ?? '?'} concurrent creators sharing ${b.node1?.n ?? '?'} create → run → kill cycles, one unmeasured round first`);
  L.push('');
  L.push('| | driver + 1 node | driver + 3 nodes | 3 nodes / 1 node |');
  L.push('|---|---|---|---|');
  const row = (what, x, y) => L.push(`| ${what} | ${ms(x)} | ${ms(y)} | ${ratio(y, x)} |`);
  row(`sequential p50 (n ${c.node1?.total.n ?? 0} / ${c.node3?.total.n ?? 0})`, c.node1?.total.p50, c.node3?.total.p50);
  row('sequential p95', c.node1?.total.p95, c.node3?.total.p95);
  row('concurrent p50', b.node1?.total.p50, b.node3?.total.p50);
  row('concurrent p95', b.node1?.total.p95, b.node3?.total.p95);
  L.push(`| creates per second | ${b.node1?.perSecond ?? '–'} | ${b.node3?.perSecond ?? '–'} | ${ratio(b.node3?.perSecond, b.node1?.perSecond)} |`);
  L.push('');
  L.push("2. The driver's extra hop: one `vmon serve --role all` vs driver → one node, ms");
  L.push('');
  L.push('| | `--role all` | driver → node | driver / all |');
  L.push('|---|---|---|---|');
  const hop = (what, x, y) => L.push(`| ${what} | ${ms(x)} | ${ms(y)} | ${ratio(y, x)} (${pct(y, x)}) |`);
  hop(`\`commands.run('true')\` p50 (n ${e.all?.run.n ?? 0} / ${e.node1?.run.n ?? 0})`, e.all?.run.p50, e.node1?.run.p50);
  hop("`commands.run('true')` p95", e.all?.run.p95, e.node1?.run.p95);
  hop(`create → first run p50 (n ${c.all?.total.n ?? 0} / ${c.node1?.total.n ?? 0})`, c.all?.total.p50, c.node1?.total.p50);
  hop('create → first run p95', c.all?.total.p95, c.node1?.total.p95);
  hop('… of which `Sandbox.create()` p50', c.all?.create.p50, c.node1?.create.p50);
  L.push('');
  if (rs) {
    const mem = rs.same.guestMemTotalKiB ? `${Math.round(rs.same.guestMemTotalKiB / 1024)} MiB MemTotal in the guest` : '';
    L.push(`3. Resume of a paused \`base\` sandbox (template memory 512 MiB, ${mem}; ${rs.touchMiB} MiB of /dev/urandom in /dev/shm), ` +
      "`Sandbox.connect()` → first `commands.run('true')` done, ms, 3 nodes; another node: its holder drained first; " +
      'pause = `sbx.pause()` until it answers (the snapshot is in the store by then)');
    L.push('');
    L.push('| | same node | another node | another / same |');
    L.push('|---|---|---|---|');
    const rrow = (what, x, y) => L.push(`| ${what} | ${ms(x)} | ${ms(y)} | ${ratio(y, x)} |`);
    rrow(`resume p50 (n ${rs.same.n} / ${rs.other.n})`, rs.same.resume.p50, rs.other.resume.p50);
    rrow('resume max', rs.same.resume.max, rs.other.resume.max);
    rrow('pause p50', rs.same.pause.p50, rs.other.pause.p50);
    L.push('');
    L.push(`moves: same ${rs.same.moves.join(', ')}; another ${rs.other.moves.join(', ')}`);
  } else L.push('3. Resume: FAILED');
  L.push('');
  const benches = goBench.split('\n').filter((l) => /^Benchmark/.test(l));
  if (benches.length) {
    L.push('4. Placement with 1,000 sandboxes recorded (Go benchmarks, run by the script before any vmon starts)');
    L.push('');
    L.push('| benchmark | ns/op | B/op | allocs/op |');
    L.push('|---|---|---|---|');
    for (const l of benches) {
      const m = /^(\S+)\s+\d+\s+([\d.]+) ns\/op(?:\s+(\d+) B\/op\s+(\d+) allocs\/op)?/.exec(l);
      if (m) L.push(`| ${m[1]} | ${Number(m[2]).toLocaleString('en-US')} | ${m[3] ?? '–'} | ${m[4] ?? '–'} |`);
    }
  } else L.push('4. Go benchmarks: not run');
  if (leftovers) L.push(`\nnote: ${leftovers} sandbox(es) were still running in the bench data dirs at the end (removed by the script)`);
  if (failed.length) L.push(`\nFAILED: ${failed.join(', ')}`);
  L.push(`\nper-run data: ${dir}; summary: ${args.summary}`);
  writeJson(args.summary, { meta, outDir: dir, failed, leftovers, creates: c, exec: e, burst: b, resume: rs, goBench: benches, table: L.join('\n') });
  console.log(L.join('\n'));
  return failed.length ? 1 : 0;
}

/** Until a create through the driver works: the driver records base from the store. */
async function phaseReady() {
  const t0 = now();
  for (;;) {
    try {
      await cycle();
      log(`a create works after ${(now() - t0).toFixed(0)} ms`);
      return;
    } catch (err) {
      if (now() - t0 > 120_000) throw err;
      await sleep(500);
    }
  }
}

const phases = { ready: phaseReady, creates: phaseCreates, exec: phaseExec, burst: phaseBurst, resume: phaseResume };
if (cmd === 'report') process.exit(report());
if (!phases[cmd]) {
  console.error('usage: node bench/cluster.mjs ready|creates|exec|burst|resume|report --dir D …');
  process.exit(2);
}
try {
  const out = await phases[cmd]();
  if (out) writeJson(path.join(args.dir, `${cmd}${LABEL ? `-${LABEL}` : ''}.json`), out);
} catch (err) {
  console.error(`${cmd} ${LABEL}: ${err.stack || err}`);
  for (const id of [...live]) await killQuiet(id);
  process.exit(1);
}
