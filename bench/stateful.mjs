// Stateful sandboxes (issue 11, "Benchmark"), with every ratio measured as alternating pairs in
// one run so the shared machine's noise falls on both sides alike:
//
//   node bench/stateful.mjs --n 15 --out F --data-dir D [--template-config F] [--runsc R]
//
//   1. pause, then resume (connect + first commands.run('true')) through the SDK, alternating
//      iteration by iteration with raw `runsc checkpoint` (its delete untimed), then `runsc restore` +
//      `runsc exec --user 1000:1000 bash -l -c true` (what commands.run('true') runs in the guest)
//      of a sandbox on the same rootfs, config shape, flags and init (envd;
//      bench/runtime.mjs); the pause is timed until the SDK call returns, which vmon answers once
//      the sandbox stopped with its memory saved (the runtime's removal and the snapshot's
//      writing follow, untimed, as the raw side's delete is);
//      for an idle sandbox and for one holding 256 MiB of touched memory;
//   2. disk used per paused sandbox (the snapshot directory's allocated blocks), both shapes;
//   3. fork of 1 and of 10 (POST /sandboxes/{id}/fork until the entries are back), alternating;
//   4. (`templates`) create → first commands.run of a template with a start command restored from
//      its started snapshot, the same template built with --template-start-snapshots=false (its
//      start command run per create, as before issue 11), and base cold, rotating the order.
//
//   node bench/stateful.mjs build --name N --variant V       builds the start-command template
//   node bench/stateful.mjs templates --n 15 --snap N1 --cold N2 --out F
import fs from 'node:fs';
import path from 'node:path';
import { loadSdk, sdkOpts, now, stats, writeJson, parseArgs, run } from './lib.mjs';
import { setup, bootAndExec, teardown, runsc, prepareRoot, cleanupRoot, paths } from './runtime.mjs';

const args = parseArgs(process.argv.slice(2));
const n = Number(args.n ?? 15);
const dataDir = path.resolve(args['data-dir'] ?? '/var/lib/vmon-bench');
const { Sandbox, Template, sdkVersion } = loadSdk();
const opts = sdkOpts();

// 256 MiB of memory the process writes to (every page touched), then holds.
const TOUCH = "python3 -c \"import time; b = bytearray(256 << 20); b[::4096] = b'\\x01' * len(b[::4096]); open('/tmp/touched', 'w').write('1'); time.sleep(1e9)\"";

const log = (s) => process.stderr.write(`  [stateful] ${s}\n`);

// vmon's init for the raw side, from the config bench/stateful.sh captured off a vmon sandbox.
function envdInit() {
  if (!args['template-config']) throw new Error('--template-config (a captured vmon config) is required');
  return JSON.parse(fs.readFileSync(args['template-config'], 'utf8')).config.process.args;
}

async function allocatedBytes(dir) {
  const r = await run('du', ['-s', '--block-size=1', dir]);
  return r.code === 0 ? Number(r.stdout.split(/\s/)[0]) : null;
}

async function waitTouched(check) {
  for (let i = 0; i < 600; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the 256 MiB toucher never finished');
}

/** One shape (idle or 256 MiB): n alternating pairs of vmon pause/resume and raw checkpoint/restore. */
async function pairs(shape) {
  const touch = shape === 'touched256';
  const sbx = await Sandbox.create({ ...opts, timeoutMs: 3_600_000 });
  const id = `vbench-${process.pid}-${shape}`;
  // The raw sandbox runs what a vmon sandbox runs: envd as init, connected to a host socket as
  // to vmon's agent channel, a veth link with an address (runtime.mjs vmonShape), plus the
  // toucher; processes started by runsc exec would not survive a restore.
  const envd = envdInit();
  const init = touch ? ['/bin/sh', '-c', `${TOUCH} & exec ${envd.join(' ')}`] : envd;
  const it = { id, dir: path.join(paths.workRoot, id), netns: id, init, vmonShape: true };
  const out = { vmonPause: [], vmonResume: [], rawCheckpoint: [], rawRestore: [], pausedBytes: [], rawImageBytes: [] };
  try {
    if (touch) {
      await sbx.commands.run(TOUCH, { background: true });
      await waitTouched(async () => (await sbx.commands.run('cat /tmp/touched 2>/dev/null || true')).stdout === '1');
    }
    await setup(it);
    await bootAndExec(it);
    if (touch) await waitTouched(() => fs.existsSync(path.join(it.dir, 'root', 'tmp', 'touched')));
    const vmonSide = async () => {
      const t0 = now();
      await sbx.pause();
      const t1 = now();
      // The snapshot is written after pause answers; its size is read once it is whole.
      const dir = path.join(dataDir, 'paused', sbx.sandboxId);
      for (let w = 0; w < 600 && !fs.existsSync(path.join(dir, 'meta.json')); w++) await new Promise((r) => setTimeout(r, 50));
      out.pausedBytes.push(await allocatedBytes(dir));
      const t2 = now();
      const back = await Sandbox.connect(sbx.sandboxId, { ...opts, timeoutMs: 3_600_000 });
      await back.commands.run('true');
      out.vmonPause.push(t1 - t0);
      out.vmonResume.push(now() - t2);
    };
    const rawSide = async (i) => {
      const img = path.join(it.dir, `ckpt-${i}`);
      const t0 = now();
      let r = await runsc('checkpoint', [`--image-path=${img}`, '--compression=none', id], { timeoutMs: 120_000 });
      if (r.code !== 0) throw new Error(`runsc checkpoint: ${r.stderr.trim()}`);
      // Stopped and saved: the pause has happened. The delete a restore under the same id needs
      // is not timed, as vmon's happens after its answer.
      const t1 = now();
      r = await runsc('delete', ['--force', id], { timeoutMs: 60_000 });
      if (r.code !== 0) throw new Error(`runsc delete: ${r.stderr.trim()}`);
      out.rawImageBytes.push(await allocatedBytes(img));
      const t2 = now();
      const consoleFd = fs.openSync(path.join(it.dir, 'console.log'), 'a', 0o600);
      try {
        r = await runsc('restore', ['--detach', '--bundle', it.dir, '--pid-file', path.join(it.dir, 'sandbox.pid'), `--image-path=${img}`, id], {
          stdio: ['ignore', consoleFd, consoleFd],
          detached: true,
          timeoutMs: 120_000,
        });
      } finally {
        fs.closeSync(consoleFd);
      }
      if (r.code !== 0) throw new Error(`runsc restore exited ${r.code}: ${fs.readFileSync(path.join(it.dir, 'console.log'), 'utf8').slice(-600)}`);
      // The guest program commands.run('true') runs: bash -l -c, as the template's user.
      r = await runsc('exec', ['--user', '1000:1000', id, '/bin/bash', '-l', '-c', 'true'], { timeoutMs: 60_000 });
      if (r.code !== 0) throw new Error(`runsc exec bash -l -c true after restore: ${r.stderr.trim()}`);
      out.rawCheckpoint.push(t1 - t0);
      out.rawRestore.push(now() - t2);
      fs.rmSync(img, { recursive: true, force: true });
    };
    // One unmeasured round of each side, then n pairs in alternating order.
    await vmonSide();
    await rawSide('warmup');
    for (const k of Object.keys(out)) out[k] = [];
    for (let i = 0; i < n; i++) {
      if (i % 2 === 0) {
        await vmonSide();
        await rawSide(i);
      } else {
        await rawSide(i);
        await vmonSide();
      }
      log(`${shape} ${i + 1}/${n}: vmon pause ${out.vmonPause.at(-1).toFixed(0)} resume ${out.vmonResume.at(-1).toFixed(0)} ms; ` +
        `raw checkpoint ${out.rawCheckpoint.at(-1).toFixed(0)} restore ${out.rawRestore.at(-1).toFixed(0)} ms`);
    }
  } finally {
    await sbx.kill().catch(() => {});
    await teardown(it).catch((err) => log(`teardown: ${err.message}`));
  }
  return out;
}

async function forks(counts) {
  const src = await Sandbox.create({ ...opts, timeoutMs: 3_600_000 });
  const out = Object.fromEntries(counts.map((c) => [c, []]));
  const failures = [];
  try {
    const once = async (count, measure) => {
      const t0 = now();
      const res = await fetch(`${opts.apiUrl}/sandboxes/${src.sandboxId}/fork`, {
        method: 'POST',
        headers: { 'X-API-KEY': opts.apiKey, 'Content-Type': 'application/json' },
        body: JSON.stringify({ count, timeout: 600 }),
      });
      const body = await res.json();
      const dt = now() - t0;
      if (res.status !== 201) throw new Error(`fork ${count}: ${res.status} ${JSON.stringify(body)}`);
      for (const e of body) {
        if (e.error) failures.push(e.error);
        else await Sandbox.kill(e.sandbox.sandboxID, opts).catch(() => {});
      }
      if (measure) out[count].push(dt);
    };
    for (const c of counts) await once(c, false);
    const rounds = Math.max(3, Math.ceil(n / 3));
    for (let i = 0; i < rounds; i++) {
      const order = i % 2 === 0 ? counts : [...counts].reverse();
      for (const c of order) await once(c, true);
      log(`fork round ${i + 1}/${rounds}: ${counts.map((c) => `${c}: ${out[c].at(-1).toFixed(0)} ms`).join(', ')}`);
    }
  } finally {
    await src.kill().catch(() => {});
  }
  return { samplesMs: out, failures };
}

async function main() {
  prepareRoot();
  const result = { phase: 'stateful', n, sdkVersion, shapes: {} };
  try {
    for (const shape of ['idle', 'touched256']) {
      const s = await pairs(shape);
      result.shapes[shape] = {
        samplesMs: { vmonPause: s.vmonPause, vmonResume: s.vmonResume, rawCheckpoint: s.rawCheckpoint, rawRestore: s.rawRestore },
        vmonPause: stats(s.vmonPause),
        vmonResume: stats(s.vmonResume),
        rawCheckpoint: stats(s.rawCheckpoint),
        rawRestore: stats(s.rawRestore),
        pausedBytes: stats(s.pausedBytes),
        rawImageBytes: stats(s.rawImageBytes),
      };
    }
    const f = await forks([1, 10]);
    result.fork = { 1: stats(f.samplesMs[1]), 10: stats(f.samplesMs[10]), samplesMs: f.samplesMs, failures: f.failures };
  } finally {
    await cleanupRoot();
  }
  writeJson(args.out, result);
}

// A web server as start command, ready once it answers (what a Dockerfile CMD often is).
// variant makes the two builds' content (so their build cache entries) differ.
async function buildStartTemplate(name, variant) {
  const t = Template()
    .fromTemplate('base')
    .runCmd(`mkdir -p /srv/www && echo ${variant} > /srv/www/index.html`, { user: 'root' })
    .setWorkdir('/srv/www')
    .setStartCmd('python3 -m http.server 8080', 'curl -sf http://localhost:8080/ > /dev/null');
  await Template.build(t, name, { ...opts });
}

async function templates() {
  const names = { snapshot: args.snap, perCreate: args.cold, base: 'base' };
  const samples = Object.fromEntries(Object.keys(names).map((k) => [k, []]));
  const once = async (kind) => {
    const t0 = now();
    const sbx = await Sandbox.create(names[kind], { ...opts, timeoutMs: 600_000 });
    await sbx.commands.run('true');
    const dt = now() - t0;
    await sbx.kill().catch(() => {});
    return dt;
  };
  for (const k of Object.keys(names)) await once(k); // one unmeasured round
  const kinds = Object.keys(names);
  for (let i = 0; i < n; i++) {
    const order = kinds.map((_, j) => kinds[(i + j) % kinds.length]);
    for (const k of order) samples[k].push(await once(k));
    log(`templates ${i + 1}/${n}: ${kinds.map((k) => `${k} ${samples[k].at(-1).toFixed(0)} ms`).join(', ')}`);
  }
  writeJson(args.out, {
    phase: 'templates', n, names, samplesMs: samples,
    ...Object.fromEntries(kinds.map((k) => [k, stats(samples[k])])),
  });
}

try {
  const mode = args._[0] ?? 'stateful';
  if (mode === 'build') await buildStartTemplate(args.name, args.variant ?? args.name);
  else if (mode === 'templates') await templates();
  else await main();
} catch (err) {
  console.error(`stateful: ${err.stack || err}`);
  process.exit(1);
}
