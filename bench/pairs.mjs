// The main create and exec figures as alternating pairs (issue 11): each SDK operation against
// its raw runsc counterpart on the same rootfs, config shape, flags and init (bench/runtime.mjs),
// which side goes first alternating iteration by iteration, so the shared machine's noise falls
// on both sides alike.
//
//   node bench/pairs.mjs --n 30 --out F --data-dir D --template-config F [--runsc R]
//
//   create: Sandbox.create() + first commands.run('true')  vs  runsc run --detach + exec true
//           (the raw side's overlay, netns and config are prepared untimed, as vmon's warm
//           pieces are: links from the pool, formatted disk images);
//   exec:   commands.run('true') on a live sandbox           vs  runsc exec <id> true.
import fs from 'node:fs';
import path from 'node:path';
import { loadSdk, sdkOpts, now, stats, writeJson, parseArgs } from './lib.mjs';
import { setup, bootAndExec, teardown, runsc, prepareRoot, cleanupRoot, paths } from './runtime.mjs';

const args = parseArgs(process.argv.slice(2));
const n = Number(args.n ?? 30);
const { Sandbox, sdkVersion } = loadSdk();
const opts = sdkOpts();
const log = (s) => process.stderr.write(`  [pairs] ${s}\n`);
const envd = JSON.parse(fs.readFileSync(args['template-config'], 'utf8')).config.process.args;

async function createPairs() {
  const out = { vmon: [], raw: [] };
  const vmonSide = async () => {
    const t0 = now();
    const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000 });
    await sbx.commands.run('true');
    const dt = now() - t0;
    await sbx.kill().catch(() => {});
    return dt;
  };
  const rawSide = async (i) => {
    const id = `vbench-${process.pid}-c${i}`;
    const it = { id, dir: path.join(paths.workRoot, id), netns: id, init: envd };
    try {
      await setup(it);
      const t0 = now();
      await bootAndExec(it);
      return now() - t0;
    } finally {
      await teardown(it);
    }
  };
  await vmonSide();
  await rawSide('warmup');
  for (let i = 0; i < n; i++) {
    if (i % 2 === 0) {
      out.vmon.push(await vmonSide());
      out.raw.push(await rawSide(i));
    } else {
      out.raw.push(await rawSide(i));
      out.vmon.push(await vmonSide());
    }
    log(`create ${i + 1}/${n}: vmon ${out.vmon.at(-1).toFixed(0)} ms, raw ${out.raw.at(-1).toFixed(0)} ms`);
  }
  return out;
}

async function execPairs() {
  const out = { vmon: [], raw: [] };
  const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000 });
  const id = `vbench-${process.pid}-exec`;
  const it = { id, dir: path.join(paths.workRoot, id), netns: id, init: envd };
  try {
    await setup(it);
    await bootAndExec(it);
    const vmonSide = async () => {
      const t0 = now();
      await sbx.commands.run('true');
      return now() - t0;
    };
    const rawSide = async () => {
      const t0 = now();
      const r = await runsc('exec', [id, 'true'], { timeoutMs: 60_000 });
      if (r.code !== 0) throw new Error(`runsc exec: ${r.stderr.trim()}`);
      return now() - t0;
    };
    await vmonSide();
    await rawSide();
    for (let i = 0; i < n; i++) {
      if (i % 2 === 0) {
        out.vmon.push(await vmonSide());
        out.raw.push(await rawSide());
      } else {
        out.raw.push(await rawSide());
        out.vmon.push(await vmonSide());
      }
    }
    log(`exec: vmon p50 ${stats(out.vmon).p50} ms, raw p50 ${stats(out.raw).p50} ms`);
  } finally {
    await sbx.kill().catch(() => {});
    await teardown(it).catch((err) => log(`teardown: ${err.message}`));
  }
  return out;
}

async function main() {
  prepareRoot();
  try {
    const create = await createPairs();
    const exec = await execPairs();
    const side = (s) => ({ samplesMs: s, ...stats(s) });
    writeJson(args.out, {
      phase: 'pairs', n, sdkVersion,
      create: { vmon: side(create.vmon), raw: side(create.raw) },
      exec: { vmon: side(exec.vmon), raw: side(exec.raw) },
    });
  } finally {
    await cleanupRoot();
  }
}

try {
  await main();
} catch (err) {
  console.error(`pairs: ${err.stack || err}`);
  process.exit(1);
}
