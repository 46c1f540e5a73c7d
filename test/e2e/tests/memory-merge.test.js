// Memory merging (vmon serve --memory-merge): the sandboxes' sentries and gofers (a sandbox on a
// root image has none) are marked for the kernel's same-page merging (KSM), ksmd runs, it really
// merges their pages, and the sandboxes work the same afterwards. KSM's switches are host-wide:
// the test puts back the ones it and vmon changed.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { describe } from 'node:test';
import { Sandbox } from 'e2b';
import { useServer, runId, killQuietly, pgrep, runtimeIdOf, waitFor, onRootImage } from '../lib/harness.js';

const KSM = '/sys/kernel/mm/ksm';
const ksmGet = (name) => fs.readFileSync(`${KSM}/${name}`, 'utf8').trim();
const ksmSet = (name, v) => fs.writeFileSync(`${KSM}/${name}`, String(v));

function ksmStat(pid) {
  const out = {};
  for (const line of fs.readFileSync(`/proc/${pid}/ksm_stat`, 'utf8').split('\n')) {
    const [k, v] = line.split(/:?\s+/);
    if (k) out[k] = v;
  }
  return out;
}

/** The sentry and gofer of sandbox `id` on the node with data dir `dir`. */
async function runscProcesses(dir, id) {
  const rid = runtimeIdOf(dir, id);
  const procs = {};
  for (const pid of await pgrep(rid)) {
    let argv0;
    try {
      argv0 = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0];
    } catch {
      continue; // gone meanwhile
    }
    if (argv0 === 'runsc-sandbox' || argv0 === 'runsc-gofer') procs[argv0] = pid;
  }
  return procs;
}

describe('memory merging (--memory-merge)', () => {
  // Set before the server starts it, put back after the server stopped.
  const saved = Object.fromEntries(['run', 'pages_to_scan', 'sleep_millisecs'].map((n) => [n, ksmGet(n)]));
  ksmSet('run', 0);
  const srv = useServer({ name: 'memory-merge', args: ['--memory-merge', '--warm-pool', '0'] });
  const RUN = runId('memmerge');
  const created = [];

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
    for (const [n, v] of Object.entries(saved)) ksmSet(n, v);
  });

  srv.test('sentries and gofers are marked, ksmd runs and merges their pages, sandboxes work', async () => {
    assert.equal(ksmGet('run'), '1', 'vmon started ksmd');
    // A quick pace, so the merge shows within the test (put back afterwards).
    ksmSet('sleep_millisecs', 10);
    ksmSet('pages_to_scan', 5000);
    const sbs = await Promise.all([0, 1].map(() => Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } })));
    created.push(...sbs);

    const procs = [];
    for (const s of sbs) {
      const p = await runscProcesses(srv.dataDir, s.sandboxId);
      // A sandbox on a root image (the default) has no gofer; one on an overlay has one.
      const onImage = onRootImage(srv.dataDir, runtimeIdOf(srv.dataDir, s.sandboxId));
      assert.ok(p['runsc-sandbox'] && Boolean(p['runsc-gofer']) === !onImage,
        `runsc processes of ${s.sandboxId} (on a root image: ${onImage}): ${JSON.stringify(p)}`);
      for (const [name, pid] of Object.entries(p)) {
        assert.equal(ksmStat(pid).ksm_merge_any, 'yes', `${name} of ${s.sandboxId} is marked`);
        procs.push(pid);
      }
    }
    // Every sentry and gofer gets pages merged: with each other, or as pages of zeros.
    await waitFor(() => procs.every((pid) => {
      const st = ksmStat(pid);
      return Number(st.ksm_merging_pages) + Number(st.ksm_zero_pages ?? 0) > 0;
    }), { timeoutMs: 90_000, intervalMs: 500, what: 'pages of every sentry and gofer merged' });

    for (const [i, s] of sbs.entries()) {
      const r = await s.commands.run(`echo merged-${i} && head -c 1048576 /dev/urandom | sha256sum | wc -c`);
      assert.equal(r.stdout, `merged-${i}\n68\n`);
      await s.files.write('/tmp/x', `data ${i}`);
      assert.equal(await s.files.read('/tmp/x'), `data ${i}`);
    }
  });
});
