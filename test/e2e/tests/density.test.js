// Density regression guard (bench/density.sh is the benchmark): one node holding 50 idle sandboxes
// answers creates and commands about as fast as it does holding one. The bound is loose on purpose
// (3× the p50 at one live sandbox, plus 50 ms for timer noise on a shared machine): it catches
// work that grows with the number of sandboxes (a scan per request, a global lock on a hot path,
// per-sandbox polling), not a few percent. A restart of the full node then hands every sandbox back.
import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Sandbox } from 'e2b';
import { useServer, runId, listAll, killQuietly, getInfoRecovered } from '../lib/harness.js';

const LIVE = 50;
const SAMPLES = 7;

function p50(values) {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.ceil(0.5 * s.length) - 1];
}

describe(`density (${LIVE} idle sandboxes on one node)`, () => {
  const srv = useServer({ name: 'density', args: ['--max-sandboxes', String(LIVE + 4), '--warm-pool', '0'] });
  const RUN = runId('density');
  const live = [];
  const opts = (extra = {}) => ({ ...srv.sdkOpts, timeoutMs: 900_000, metadata: { run: RUN }, ...extra });

  srv.before(async () => {
    await srv.killAllSandboxes();
    assert.deepEqual(await listAll(srv.sdkOpts), [], 'the node starts empty');
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...live);
  });

  /** p50 of create → first command (each killed once measured) and of commands.run on live ones. */
  async function measure() {
    const creates = [];
    for (let i = 0; i < SAMPLES; i++) {
      const t = performance.now();
      const s = await Sandbox.create(opts());
      await s.commands.run('true');
      creates.push(performance.now() - t);
      await s.kill();
    }
    const runs = [];
    for (let i = 0; i < SAMPLES; i++) {
      const s = live[Math.floor(Math.random() * live.length)];
      const t = performance.now();
      const r = await s.commands.run('echo ok');
      runs.push(performance.now() - t);
      assert.equal(r.stdout, 'ok\n');
    }
    return { create: p50(creates), run: p50(runs) };
  }

  srv.test(`create and commands.run at ${LIVE} live stay within 3× of at 1`, async () => {
    live.push(await Sandbox.create(opts()));
    await live[0].commands.run('true');
    const one = await measure();

    // Four creates at a time, each answering a command before it counts.
    let inflight = 0;
    const worker = async () => {
      while (live.length + inflight < LIVE) {
        inflight++;
        try {
          const s = await Sandbox.create(opts());
          live.push(s);
          await s.commands.run('true');
        } finally {
          inflight--;
        }
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
    assert.equal((await listAll(srv.sdkOpts)).filter((s) => s.metadata?.run === RUN).length, LIVE);

    const many = await measure();
    const bound = (x) => 3 * x + 50;
    const report = `at 1: create ${one.create.toFixed(0)} ms, run ${one.run.toFixed(0)} ms; ` +
      `at ${LIVE}: create ${many.create.toFixed(0)} ms, run ${many.run.toFixed(0)} ms`;
    console.log(`# density: ${report}`);
    assert.ok(many.create <= bound(one.create), `create p50 grew past 3×: ${report}`);
    assert.ok(many.run <= bound(one.run), `commands.run p50 grew past 3×: ${report}`);
  });

  // A restart of a full node must hand every sandbox back: each guest redials the node's agent
  // socket on its own schedule, and the node once asked runsc about every sandbox, one process
  // each, before it listened again, then gave each envd 15 s; at 500 live that lost most of them.
  srv.test(`a restart with ${LIVE} live sandboxes hands every one of them back`, async () => {
    assert.equal(live.length, LIVE, 'the previous test filled the node');
    const t = performance.now();
    await srv.restart();
    const serving = performance.now() - t;
    for (const s of live) {
      const info = await getInfoRecovered(s.sandboxId, srv.sdkOpts, 180_000);
      assert.equal(info.state, 'running', `${s.sandboxId} is running after the restart`);
    }
    const recovered = performance.now() - t;
    await Promise.all(
      [0, 1, 2, 3].map(async (w) => {
        for (let i = w; i < live.length; i += 4) {
          const r = await live[i].commands.run(`echo ${i}`);
          assert.equal(r.stdout, `${i}\n`, `sandbox ${live[i].sandboxId} runs commands after the restart`);
        }
      }),
    );
    const running = (await listAll(srv.sdkOpts)).filter((s) => s.metadata?.run === RUN);
    assert.equal(running.length, LIVE, 'no sandbox was lost');
    console.log(`# density: restart with ${LIVE} live: serving after ${serving.toFixed(0)} ms, ` +
      `all recovered after ${recovered.toFixed(0)} ms, all answered after ${(performance.now() - t).toFixed(0)} ms`);
  });
});
