// Template benchmark against a running `vmon serve` (started by bench/templates.sh, `--warm-pool 0`):
//
//   node bench/templates.mjs run --dir D [--builds 5] [--creates 20] [--warmup 1] [--skip-cache yes|no]
//       the phases below; writes D/templates.json
//   node bench/templates.mjs report --dir D --summary F [--failed "…"]
//       (after the server stopped) prints the figures table, writes the summary (table included)
//
// 1. Template.build() wall-clock of a 3-step template from `base` (RUN, COPY of a small tree from
//    fileContextPath, ENV):
//      cold      every step new: a fresh nonce in the RUN command and in a file of the copied tree
//                (so the tree is uploaded again too); 0 of 3 steps may come from the cache;
//      skipCache the template of the last cold build again with `skipCache: true` (forced rebuild of
//                every step; the upload is skipped, the files are already on the server);
//      cached    that same template rebuilt unchanged: every step logs `CACHED [n/3]`.
// 2. Sandbox.create(template) → first commands.run('true') done, for `base` and for a template with a
//    start + ready command, alternating, each sandbox killed after it is measured (kill not timed).
// Nothing here asserts a time; a build whose cache use is not the expected one is reported.
//
// Environment: VMON_BENCH_URL (http://127.0.0.1:<port>), VMON_BENCH_KEY_FILE (as bench/run.sh sets).
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { loadSdk, sdkOpts, now, stats, writeJson, parseArgs } from './lib.mjs';

const { Sandbox, Template, sdkVersion } = loadSdk();
const args = parseArgs(process.argv.slice(2));
const opts = args._[0] === 'run' ? sdkOpts() : null;
const N_BUILDS = Number(args.builds ?? 5);
const N_CREATES = Number(args.creates ?? 20);
const WARMUP = Number(args.warmup ?? 1);
const SKIP_CACHE = String(args['skip-cache'] ?? 'yes') !== 'no';
const BUILD_NAME = 'vmonbench-build';
const START_NAME = 'vmonbench-start';
const START_CMD = 'python3 -m http.server 8080';
const READY_CMD = 'curl -sf localhost:8080 >/dev/null';
const BUILD_TIMEOUT_MS = 300_000;
const SANDBOX_TIMEOUT_MS = 900_000;
const MAX_FAILURES = 3;

const live = new Set(); // sandboxes made and not killed yet
async function killQuiet(sbx) {
  try {
    await Sandbox.kill(sbx.sandboxId, { ...opts, requestTimeoutMs: 30_000 });
  } catch (err) {
    console.error(`  kill ${sbx.sandboxId} failed: ${err.message}`);
  }
  live.delete(sbx);
}
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.once(sig, async () => {
    console.error(`\n${sig}: killing ${live.size} sandbox(es)`);
    for (const sbx of [...live]) await killQuiet(sbx);
    process.exit(130);
  });
}

// --- the file context: a small tree (3 directories, 12 files, ≈ 38 KiB) plus a nonce file ----
let ctxDir;
function makeContext() {
  ctxDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-bench-tpl-'));
  process.on('exit', () => fs.rmSync(ctxDir, { recursive: true, force: true }));
  for (const [dir, files] of [['tree', 4], ['tree/src', 4], ['tree/src/lib', 3]]) {
    fs.mkdirSync(path.join(ctxDir, dir), { recursive: true });
    for (let i = 0; i < files; i++) {
      fs.writeFileSync(path.join(ctxDir, dir, `file${i}.txt`), `${dir} ${i}\n`.repeat(200 + 100 * i));
    }
  }
  fs.writeFileSync(path.join(ctxDir, 'tree', 'src', 'run.sh'), '#!/bin/sh\necho bench\n', { mode: 0o755 });
}
const treeFiles = (d) => fs.readdirSync(d, { withFileTypes: true }).reduce(
  (n, e) => n + (e.isDirectory() ? treeFiles(path.join(d, e.name)) : 1), 0);

function buildTemplate(nonce) {
  fs.writeFileSync(path.join(ctxDir, 'tree', 'nonce.txt'), `${nonce}\n`);
  return Template({ fileContextPath: ctxDir })
    .fromTemplate('base')
    .runCmd(`echo ${nonce} > ~/bench-nonce && pip --version > ~/pip-version && seq 1 2000 > ~/bench-seq`)
    .copy('tree', '/home/user/bench-tree')
    .setEnvs({ BENCH_NONCE: nonce, BENCH_MODE: 'template-bench' });
}

const STEP_NAMES = ['RUN', 'COPY', 'ENV'];
const CACHED_RE = /CACHED \[\d+\/\d+\]/;
const STEP_RE = /^\[(\d+)\/(\d+)\] /;
const READY_RE = /ready in ([\d.]+)s \((\d+) of (\d+) steps cached\)/;

/** One Template.build(): wall-clock, its split at "Starting building...", what the log says. */
async function timedBuild(label, nonce, buildOpts = {}) {
  const lines = [];
  let tStart = null;
  let tsFirst = null; // server timestamps: the build's first log line and its "ready in" line
  let tsReady = null;
  const stepTs = []; // [step number, timestamp of its "[i/N]" line, timestamp of the next line]
  const onBuildLogs = (e) => {
    lines.push(`${e.level} ${e.message}`);
    const last = stepTs.at(-1);
    if (last && last[2] == null) last[2] = e.timestamp.getTime();
    const m = STEP_RE.exec(e.message);
    if (m) stepTs.push([Number(m[1]), e.timestamp.getTime(), null]);
    if (tsFirst == null && /^building template /.test(e.message)) tsFirst = e.timestamp.getTime();
    if (READY_RE.test(e.message)) tsReady = e.timestamp.getTime();
    if (e.message === 'Starting building...') tStart = now();
  };
  const t0 = now();
  await Template.build(buildTemplate(nonce), BUILD_NAME, {
    ...opts, ...buildOpts, onBuildLogs, signal: AbortSignal.timeout(BUILD_TIMEOUT_MS),
  });
  const t1 = now();
  const msgs = lines.map((l) => l.replace(/^\w+ /, ''));
  const steps = Math.max(0, ...msgs.map((m) => Number(STEP_RE.exec(m)?.[2] ?? 0)));
  const ready = msgs.map((m) => READY_RE.exec(m)).find(Boolean);
  return {
    label,
    ms: t1 - t0,
    prepMs: tStart == null ? null : tStart - t0, // name request, file hashes, upload link/upload, build request
    waitMs: tStart == null ? null : t1 - tStart, // the build and the SDK's status polling (every 200 ms)
    steps,
    cachedSteps: msgs.filter((m) => CACHED_RE.test(m)).length,
    serverSeconds: ready ? Number(ready[1]) : null, // vmon's own figure, 0.1 s resolution
    serverMs: tsFirst != null && tsReady != null ? tsReady - tsFirst : null, // from the log's timestamps
    stepMs: stepTs.map(([, a, b]) => (b == null ? null : b - a)), // per step, from the log's timestamps
    uploaded: msgs.some((m) => /^Uploaded 'tree'/.test(m)),
    uploadSkipped: msgs.some((m) => /^Skipping upload of 'tree'/.test(m)),
    log: lines,
  };
}

async function phaseBuilds() {
  const expect = { cold: 'none', skipCache: 'none', cached: 'all' };
  const samples = { cold: [], skipCache: [], cached: [] };
  const unexpected = [];
  const one = async (label, nonce, o) => {
    const r = await timedBuild(label, nonce, o);
    const ok = expect[label] === 'all' ? r.steps > 0 && r.cachedSteps === r.steps : r.cachedSteps === 0;
    if (!ok) unexpected.push({ label, cachedSteps: r.cachedSteps, steps: r.steps, log: r.log });
    process.stderr.write(`  [build ${label}] ${r.ms.toFixed(0)} ms (before "Starting building..." ${r.prepMs?.toFixed(0)}, ` +
      `server ${r.serverMs ?? '?'} ms), ${r.cachedSteps}/${r.steps} steps CACHED${r.uploaded ? ', tree uploaded' : ''}${ok ? '' : '  <-- unexpected'}\n`);
    return r;
  };
  const nonce = () => crypto.randomBytes(8).toString('hex');
  for (let i = 0; i < WARMUP; i++) await one('cold', nonce()); // unmeasured: first build of the server
  samples.cold.length = 0;
  unexpected.length = 0;
  let last;
  for (let i = 0; i < N_BUILDS; i++) {
    last = nonce();
    samples.cold.push(await one('cold', last));
  }
  if (SKIP_CACHE) for (let i = 0; i < N_BUILDS; i++) samples.skipCache.push(await one('skipCache', last, { skipCache: true }));
  for (let i = 0; i < N_BUILDS; i++) samples.cached.push(await one('cached', last));

  // The last build is what the template holds now: check the steps really happened.
  const sbx = await Sandbox.create(BUILD_NAME, { ...opts, timeoutMs: 120_000 });
  live.add(sbx);
  let check;
  try {
    const r = await sbx.commands.run('cat ~/bench-nonce; echo "$BENCH_NONCE"; cat ~/bench-tree/nonce.txt; ' +
      'find ~/bench-tree -type f | wc -l; head -c 3 ~/pip-version');
    const want = `${last}\n${last}\n${last}\n${treeFiles(path.join(ctxDir, 'tree'))}\npip`;
    check = { ok: r.stdout === want, stdout: r.stdout, want };
  } finally {
    await killQuiet(sbx);
  }
  if (!check.ok) console.error(`  template check failed: got ${JSON.stringify(check.stdout)}, want ${JSON.stringify(check.want)}`);

  const summarize = (list) => ({
    n: list.length,
    total: stats(list.map((s) => s.ms)),
    prep: stats(list.filter((s) => s.prepMs != null).map((s) => s.prepMs)),
    wait: stats(list.filter((s) => s.waitMs != null).map((s) => s.waitMs)),
    serverSeconds: stats(list.filter((s) => s.serverSeconds != null).map((s) => s.serverSeconds)),
    serverMs: stats(list.filter((s) => s.serverMs != null).map((s) => s.serverMs)),
    stepMs: (list[0]?.stepMs ?? []).map((_, i) => stats(list.map((s) => s.stepMs[i]).filter((v) => v != null))),
    cachedSteps: list.map((s) => `${s.cachedSteps}/${s.steps}`),
    uploads: list.filter((s) => s.uploaded).length,
    samplesMs: list.map((s) => Math.round(s.ms * 10) / 10),
  });
  return {
    template: BUILD_NAME,
    steps: samples.cold[0]?.steps ?? null,
    contextFiles: treeFiles(path.join(ctxDir, 'tree')),
    warmup: WARMUP,
    cold: summarize(samples.cold),
    skipCache: SKIP_CACHE ? summarize(samples.skipCache) : null,
    cached: summarize(samples.cached),
    unexpected: unexpected.map(({ log, ...u }) => ({ ...u, log: log.join('\n') })),
    check,
    sampleLogs: { cold: samples.cold[0]?.log, cached: samples.cached[0]?.log },
  };
}

async function phaseStarts() {
  const t0 = now();
  await Template.build(Template().fromTemplate('base').setStartCmd(START_CMD, READY_CMD), START_NAME, {
    ...opts, signal: AbortSignal.timeout(BUILD_TIMEOUT_MS),
  });
  process.stderr.write(`  [start] template ${START_NAME} built in ${(now() - t0).toFixed(0)} ms (not measured)\n`);

  const kinds = [{ key: 'base', template: 'base' }, { key: 'startCmd', template: START_NAME }];
  const res = Object.fromEntries(kinds.map((k) => [k.key, { total: [], create: [], firstRun: [], failures: [] }]));
  const createOne = async (template) => {
    const sbx = await Sandbox.create(template, { ...opts, timeoutMs: SANDBOX_TIMEOUT_MS });
    live.add(sbx);
    return sbx;
  };
  let serverUp = null;
  const pyImport = [];
  for (let i = 0; i < WARMUP; i++) {
    for (const k of kinds) {
      const sbx = await createOne(k.template);
      try {
        await sbx.commands.run('true');
        if (k.key === 'startCmd' && i === 0) {
          // The start command's server must already answer when create returned.
          const r = await sbx.commands.run(READY_CMD + ' && echo up || echo down');
          serverUp = r.stdout.trim() === 'up';
          // For reading the difference: how long python3 takes to import http.server in a sandbox.
          for (let j = 0; j < 3; j++) {
            const t = await sbx.commands.run(`a=$(date +%s%N); python3 -c 'import http.server'; b=$(date +%s%N); echo $(( (b - a) / 1000000 ))`);
            pyImport.push(Number(t.stdout.trim()));
          }
        }
      } finally {
        await killQuiet(sbx);
      }
    }
  }
  // Alternate the two, so that noise of the shared machine hits both alike.
  for (let i = 0; i < N_CREATES; i++) {
    for (const k of kinds) {
      const r = res[k.key];
      let sbx;
      try {
        const a = now();
        sbx = await createOne(k.template);
        const b = now();
        const out = await sbx.commands.run('true');
        const c = now();
        if (out.exitCode !== 0) throw new Error(`true exited ${out.exitCode}`);
        r.total.push(c - a);
        r.create.push(b - a);
        r.firstRun.push(c - b);
        process.stderr.write(`  [${k.key}] ${i + 1}/${N_CREATES}: ${(c - a).toFixed(1)} ms (create ${(b - a).toFixed(1)}, run ${(c - b).toFixed(1)})\n`);
      } catch (err) {
        r.failures.push(err.message);
        console.error(`  [${k.key}] ${i + 1}/${N_CREATES} failed: ${err.message}`);
        if (r.failures.length > MAX_FAILURES) throw new Error(`more than ${MAX_FAILURES} failed creates; giving up`);
      } finally {
        if (sbx) await killQuiet(sbx);
      }
    }
  }
  const out = { startTemplate: START_NAME, startCmd: START_CMD, readyCmd: READY_CMD, n: N_CREATES, warmup: WARMUP, serverUpAfterCreate: serverUp,
    pythonImportHttpServerMs: stats(pyImport) };
  for (const k of kinds) {
    const r = res[k.key];
    out[k.key] = { template: k.template, failures: r.failures, samplesMs: { total: r.total, create: r.create, firstRun: r.firstRun },
      total: stats(r.total), create: stats(r.create), firstRun: stats(r.firstRun) };
  }
  const d = (q) => (out.base.total[q] == null || out.startCmd.total[q] == null ? null
    : Math.round((out.startCmd.total[q] - out.base.total[q]) * 10) / 10);
  out.differenceMs = { p50: d('p50'), p95: d('p95') };
  return out;
}

// --- run, report -------------------------------------------------------------------------
async function run() {
  makeContext();
  const failed = [];
  let builds = null;
  let starts = null;
  try {
    builds = await phaseBuilds();
  } catch (err) {
    console.error(`builds: ${err.stack || err}`);
    failed.push('builds');
  }
  try {
    starts = await phaseStarts();
  } catch (err) {
    console.error(`starts: ${err.stack || err}`);
    failed.push('starts');
  }
  for (const sbx of [...live]) await killQuiet(sbx);
  writeJson(path.join(args.dir, 'templates.json'), { failed, builds, starts });
  return failed.length ? 1 : 0;
}

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
  const data = read('templates.json') ?? {};
  const { builds = null, starts = null } = data;
  const failed = [...(data.failed ?? []),
    ...String(args.failed === true ? '' : (args.failed ?? '')).split(/\s+/).filter(Boolean)];
  let leftovers = 0;
  try {
    leftovers = fs.readFileSync(path.join(dir, 'leftovers.txt'), 'utf8').split('\n').filter(Boolean).map(Number).reduce((a, b) => a + b, 0);
  } catch {
    /* none */
  }
  const ms = (v) => (v == null ? '–' : v.toFixed(1));
  const uniq = (a) => [...new Set(a)].join(', ');
  const lines = [];
  lines.push(`vmon template benchmark — ${meta.startedAt ?? '?'}`);
  lines.push(`host: ${meta.cpuModel ?? '?'}, ${meta.cpus ?? '?'} CPUs, ${meta.memTotalMiB ?? '?'} MiB RAM, kernel ${meta.kernel ?? '?'}; ` +
    `runsc ${meta.runsc ?? '?'}; vmon ${meta.git ?? '?'}${meta.gitDirty ? ' + uncommitted changes' : ''} (binary sha256 ${meta.vmonSha256 ?? '?'}); ` +
    `e2b SDK ${sdkVersion} on node ${process.version}; vmon serve --warm-pool 0`);
  lines.push(`command: ${meta.command ?? 'sudo bash bench/templates.sh'}`);
  lines.push('');
  if (builds) {
    lines.push(`Template.build() of a ${builds.steps}-step template from \`base\` (RUN, COPY of a ${builds.contextFiles}-file tree, ENV), ms; ` +
      'server-side = vmon\'s log timestamps from "building template" to "ready in"');
    lines.push('');
    lines.push('| build | n | min | p50 | max | steps CACHED | server-side, p50 | notes |');
    lines.push('|---|---|---|---|---|---|---|---|');
    const brow = (what, s, note) =>
      lines.push(`| ${what} | ${s.n} | ${ms(s.total.min)} | ${ms(s.total.p50)} | ${ms(s.total.max)} | ${uniq(s.cachedSteps)} | ${ms(s.serverMs.p50)} | ${note} |`);
    const sub = (what, st) => lines.push(`| ${what} | ${st.n} | ${ms(st.min)} | ${ms(st.p50)} | ${ms(st.max)} | | | |`);
    const steps = (s) => s.stepMs.forEach((st, i) => sub(`… step ${i + 1} (${STEP_NAMES[i] ?? '?'}), server-side`, st));
    brow('cold: fresh nonce in RUN and in the tree', builds.cold, `${builds.warmup} unmeasured cold build first; tree uploaded in ${builds.cold.uploads}/${builds.cold.n}`);
    sub('… of which before "Starting building..." (request, hashes, upload)', builds.cold.prep);
    steps(builds.cold);
    if (builds.skipCache) brow('`skipCache: true`, same template', builds.skipCache, `upload skipped in ${builds.skipCache.n - builds.skipCache.uploads}/${builds.skipCache.n}`);
    if (builds.skipCache) steps(builds.skipCache);
    brow('cached: same template rebuilt', builds.cached, 'SDK polls the build status every 200 ms');
    sub('… of which before "Starting building..."', builds.cached.prep);
    if (builds.unexpected.length) lines.push(`\n${builds.unexpected.length} build(s) with unexpected cache use: ` +
      builds.unexpected.map((u) => `${u.label} ${u.cachedSteps}/${u.steps}`).join(', '));
    lines.push(`\ncheck of the last build in a sandbox (nonce in file, env and tree; pip ran): ${builds.check?.ok ? 'ok' : 'FAILED'}`);
  } else lines.push('Template builds: FAILED');
  lines.push('');
  if (starts) {
    lines.push(`\`Sandbox.create(template)\` → first \`commands.run('true')\` done, ms (${starts.n} sequential each, alternating, ` +
      `${starts.warmup} unmeasured warm-up each; kill not timed; both cold boots, no warm pool)`);
    lines.push('');
    lines.push('| template | n | min | p50 | p95 | max | notes |');
    lines.push('|---|---|---|---|---|---|---|');
    const srow = (what, s, note = '') => lines.push(`| ${what} | ${s.n} | ${ms(s.min)} | ${ms(s.p50)} | ${ms(s.p95)} | ${ms(s.max)} | ${note} |`);
    for (const [key, what] of [['base', '`base`'], ['startCmd', `\`${START_NAME}\`: base + start \`${START_CMD}\`, ready \`${READY_CMD}\``]]) {
      const k = starts[key];
      srow(what, k.total, k.failures.length ? `${k.failures.length} failed` : '');
      srow('… of which `Sandbox.create()` returns', k.create);
      srow("… of which the first `commands.run('true')`", k.firstRun);
    }
    lines.push('');
    lines.push(`start-command template − base: p50 ${ms(starts.differenceMs.p50)} ms, p95 ${ms(starts.differenceMs.p95)} ms; ` +
      `server answered right after create: ${starts.serverUpAfterCreate ? 'yes' : 'NO'}; ` +
      `\`python3 -c 'import http.server'\` in a sandbox: p50 ${ms(starts.pythonImportHttpServerMs?.p50)} ms (n ${starts.pythonImportHttpServerMs?.n ?? 0})`);
  } else lines.push('Sandbox create from a start-command template: FAILED');
  if (leftovers) lines.push(`\nnote: ${leftovers} sandbox(es) were still running in the bench data dir after \`vmon serve\` stopped (removed by the script)`);
  if (failed.length) lines.push(`\nFAILED phases: ${failed.join(', ')}`);
  lines.push(`\nper-run data: ${dir}; summary: ${args.summary}`);

  const strip = (o) => {
    if (!o) return o;
    const { samplesMs, ...rest } = o;
    return rest;
  };
  writeJson(args.summary, {
    meta,
    outDir: dir,
    failed,
    leftoversAfterStop: leftovers,
    builds: builds && { ...builds, sampleLogs: undefined },
    starts: starts && { ...starts, base: strip(starts.base), startCmd: strip(starts.startCmd) },
    samples: {
      builds: builds && { cold: builds.cold.samplesMs, skipCache: builds.skipCache?.samplesMs ?? null, cached: builds.cached.samplesMs },
      starts: starts && { base: starts.base.samplesMs, startCmd: starts.startCmd.samplesMs },
    },
    table: lines.join('\n'),
  });
    console.log(lines.join('\n'));
  return failed.length || builds?.unexpected.length || builds?.check?.ok === false ? 1 : 0;
}

const cmds = { run, report };
if (!cmds[args._[0]]) {
  console.error('usage: node bench/templates.mjs run|report --dir D [--summary F] [--failed "…"] [--builds 5] [--creates 20] …');
  process.exit(2);
}
process.exit(await cmds[args._[0]]());
