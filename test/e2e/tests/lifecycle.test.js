// Sandbox lifecycle through the SDK: create, getInfo, list (filters, paging),
// connect, setTimeout + expiry, kill, envs and metadata.

import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Sandbox, SandboxNotFoundError } from 'e2b';
import { useServer, runId, listAll, killQuietly, sleep } from '../lib/harness.js';

// Hooks live inside describe(): Node 20 does not await root-level hooks in order.
describe('sandbox lifecycle', () => {
  const srv = useServer({ name: 'lifecycle' });
  const RUN = runId('lifecycle');

  /** The main sandbox, reused by the tests that don't destroy it. */
  let main;
  /** Sandboxes for the list/paging tests. */
  let pages = [];
  let startedBefore;
  const created = [];

  function semverAtLeast(v, min) {
    const a = v.split(/[.-]/).map(Number);
    const b = min.split('.').map(Number);
    for (let i = 0; i < 3; i++) {
      if ((a[i] || 0) !== b[i]) return (a[i] || 0) > b[i];
    }
    return true;
  }

  srv.before(async () => {
    startedBefore = new Date(Date.now() - 2000);
    main = await Sandbox.create({
      ...srv.sdkOpts,
      metadata: { run: RUN, role: 'main', idx: '10' },
      envs: { SBX_ENV: 'from-sandbox', SHARED: 'sandbox-level' },
    });
    created.push(main);
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
  });

  srv.test('create returns a usable sandbox with a well-formed id', async () => {
    assert.match(main.sandboxId, /^[a-z0-9]+$/, 'sandbox ids must be lowercase alphanumerics (no "-")');
    const r = await main.commands.run('echo hi && whoami');
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'hi\nuser\n');
    assert.equal(r.stderr, '');
    assert.equal(await main.isRunning(), true);
  });

  srv.test('getInfo describes the sandbox (template, metadata, state, default 300 s timeout)', async () => {
    const info = await main.getInfo();
    assert.equal(info.sandboxId, main.sandboxId);
    assert.ok(info.templateId === 'base' || info.name === 'base', `template should be base: ${JSON.stringify(info)}`);
    assert.deepEqual(info.metadata, { run: RUN, role: 'main', idx: '10' });
    assert.equal(info.state, 'running');
    assert.ok(info.startedAt instanceof Date && !Number.isNaN(info.startedAt.getTime()), 'startedAt is a date');
    assert.ok(info.startedAt >= startedBefore && info.startedAt <= new Date(Date.now() + 2000), `startedAt ${info.startedAt.toISOString()} is now-ish`);
    const ttl = (info.endAt - info.startedAt) / 1000;
    assert.ok(Math.abs(ttl - 300) <= 5, `default timeout should be 300 s, endAt - startedAt = ${ttl} s`);
    assert.ok(info.cpuCount >= 1, `cpuCount ${info.cpuCount}`);
    assert.ok(info.memoryMB >= 128, `memoryMB ${info.memoryMB}`);
    assert.ok(semverAtLeast(info.envdVersion, '0.6.4'), `envdVersion ${info.envdVersion} >= 0.6.4`);

    const same = await Sandbox.getInfo(main.sandboxId, srv.sdkOpts);
    assert.equal(same.sandboxId, main.sandboxId);
    assert.deepEqual(same.metadata, info.metadata);
  });

  srv.test('getMetrics samples the sandbox (limits of base, memory in use)', async () => {
    const metrics = await main.getMetrics();
    assert.ok(Array.isArray(metrics) && metrics.length >= 1, `metrics: ${JSON.stringify(metrics)}`);
    const m = metrics.at(-1);
    assert.equal(m.cpuCount, 2, 'base has 2 vCPUs');
    assert.ok(m.memTotal > 400 * 2 ** 20 && m.memTotal <= 512 * 2 ** 20, `memTotal ≈ 512 MiB, got ${m.memTotal}`);
    assert.ok(m.memUsed > 0 && m.memUsed < m.memTotal, `memUsed ${m.memUsed}`);
    assert.ok(m.diskTotal > 0 && m.diskUsed > 0, `disk ${m.diskUsed}/${m.diskTotal}`);
    assert.ok(m.timestamp instanceof Date || typeof m.timestamp === 'string', 'timestamp');
  });

  srv.test('an explicit timeoutMs sets endAt', async () => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 120_000, metadata: { run: RUN, role: 'ttl' } });
    created.push(sbx);
    const info = await sbx.getInfo();
    const ttl = (info.endAt - info.startedAt) / 1000;
    assert.ok(Math.abs(ttl - 120) <= 5, `timeoutMs 120000 → endAt - startedAt = ${ttl} s`);
    assert.equal(await sbx.kill(), true);
  });

  srv.test('sandbox envs are seen by every command; per-command envs override and do not leak', async () => {
    let r = await main.commands.run('echo "$SBX_ENV|$SHARED"');
    assert.equal(r.stdout, 'from-sandbox|sandbox-level\n');
    r = await main.commands.run('echo "$SBX_ENV|$SHARED|$ONLY_HERE"', { envs: { SHARED: 'command-level', ONLY_HERE: 'x' } });
    assert.equal(r.stdout, 'from-sandbox|command-level|x\n');
    r = await main.commands.run('echo "$SHARED|${ONLY_HERE:-unset}"');
    assert.equal(r.stdout, 'sandbox-level|unset\n', 'per-command envs must not leak into later commands');
    r = await main.commands.run('echo "$SBX_ENV"', { user: 'root' });
    assert.equal(r.stdout, 'from-sandbox\n', 'sandbox envs apply to root commands too');
  });

  srv.test('list: metadata filter is exact, state and template filters work', async () => {
    pages = [];
    for (const idx of ['1', '2', '3']) {
      const md = { run: RUN, group: 'page', idx };
      if (idx === '1') md['a b'] = 'c&d=e'; // needs the SDK's double encoding to be undone correctly
      const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: md });
      created.push(sbx);
      pages.push(sbx);
    }
    const pageIds = pages.map((s) => s.sandboxId).sort();

    const all = await listAll(srv.sdkOpts, { metadata: { run: RUN } });
    const allIds = all.map((s) => s.sandboxId);
    assert.ok(allIds.includes(main.sandboxId), 'main sandbox listed');
    for (const id of pageIds) assert.ok(allIds.includes(id), `${id} listed`);
    assert.equal(all.length, 4, `exactly main + 3 page sandboxes are running for this run: ${allIds}`);

    const group = await listAll(srv.sdkOpts, { metadata: { run: RUN, group: 'page' } });
    assert.deepEqual(group.map((s) => s.sandboxId).sort(), pageIds);

    // Exact, not prefix: main has idx "10", page 1 has idx "1".
    const one = await listAll(srv.sdkOpts, { metadata: { run: RUN, idx: '1' } });
    assert.deepEqual(one.map((s) => s.sandboxId), [pages[0].sandboxId]);
    assert.deepEqual(one[0].metadata, { run: RUN, group: 'page', idx: '1', 'a b': 'c&d=e' });

    const special = await listAll(srv.sdkOpts, { metadata: { run: RUN, 'a b': 'c&d=e' } });
    assert.deepEqual(special.map((s) => s.sandboxId), [pages[0].sandboxId]);

    const none = await listAll(srv.sdkOpts, { metadata: { run: RUN, group: 'pag' } });
    assert.deepEqual(none, [], 'a value prefix must not match');

    const running = await listAll(srv.sdkOpts, { metadata: { run: RUN }, state: ['running'] });
    assert.equal(running.length, 4);
    for (const s of running) assert.equal(s.state, 'running');

    const paused = await listAll(srv.sdkOpts, { metadata: { run: RUN }, state: ['paused'] });
    assert.deepEqual(paused, [], 'no sandbox of this run is paused');

    const byTemplate = await listAll(srv.sdkOpts, { metadata: { run: RUN }, template: 'base' });
    assert.equal(byTemplate.length, 4, 'template filter by name');
    const byOther = await listAll(srv.sdkOpts, { metadata: { run: RUN }, template: 'no-such-template-e2e' });
    assert.deepEqual(byOther, []);

    const listed = one[0];
    assert.equal(listed.state, 'running');
    assert.ok(listed.startedAt instanceof Date && listed.endAt > listed.startedAt);
    assert.ok(listed.cpuCount >= 1 && listed.memoryMB >= 128);
    assert.ok(listed.templateId === 'base' || listed.name === 'base');
  });

  srv.test('list: paging with limit', async () => {
    assert.equal(pages.length, 3, 'needs the sandboxes of the previous test');
    const pageIds = pages.map((s) => s.sandboxId).sort();
    const p = Sandbox.list({ ...srv.sdkOpts, limit: 2, query: { metadata: { run: RUN, group: 'page' } } });
    assert.equal(p.hasNext, true, 'a new paginator has a first page');
    const first = await p.nextItems();
    assert.equal(first.length, 2, 'first page holds `limit` items');
    assert.equal(p.hasNext, true, 'more items remain after the first page');
    const second = await p.nextItems();
    assert.equal(second.length, 1, 'second page holds the rest');
    assert.equal(p.hasNext, false, 'no third page');
    const ids = [...first, ...second].map((s) => s.sandboxId);
    assert.equal(new Set(ids).size, 3, `no duplicates across pages: ${ids}`);
    assert.deepEqual(ids.sort(), pageIds);

    // Order is by start time; asc and desc are each other's reverse.
    const asc = await listAll({ ...srv.sdkOpts, order: 'asc' }, { metadata: { run: RUN, group: 'page' } });
    const desc = await listAll({ ...srv.sdkOpts, order: 'desc' }, { metadata: { run: RUN, group: 'page' } });
    assert.deepEqual(asc.map((s) => s.sandboxId), pages.map((s) => s.sandboxId), 'asc = creation order');
    assert.deepEqual(desc.map((s) => s.sandboxId), pages.map((s) => s.sandboxId).reverse(), 'desc = reverse creation order');
  });

  srv.test('connect to a running sandbox gives a usable handle on the same sandbox', async () => {
    await main.files.write('/home/user/connect-marker.txt', `marker-${RUN}`);
    const again = await Sandbox.connect(main.sandboxId, srv.sdkOpts);
    assert.equal(again.sandboxId, main.sandboxId);
    const r = await again.commands.run('cat /home/user/connect-marker.txt');
    assert.equal(r.stdout, `marker-${RUN}`);
    assert.equal(await again.isRunning(), true);
    // connect on the instance too
    const inst = await main.connect();
    assert.equal((await inst.commands.run('echo $SBX_ENV')).stdout, 'from-sandbox\n');
  });

  srv.test('setTimeout(5000) makes the sandbox expire', async () => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, role: 'expire' } });
    created.push(sbx);
    assert.equal(await sbx.isRunning(), true);
    const t0 = Date.now();
    await sbx.setTimeout(5000);
    const info = await sbx.getInfo();
    const left = (info.endAt.getTime() - t0) / 1000;
    assert.ok(left > 2 && left <= 7, `endAt should be ~5 s from now, is ${left} s`);
    await sleep(8000);
    assert.equal(await sbx.isRunning(), false, 'sandbox must be gone 8 s after a 5 s timeout');
    await assert.rejects(sbx.getInfo(), SandboxNotFoundError);
    await assert.rejects(Sandbox.connect(sbx.sandboxId, srv.sdkOpts), SandboxNotFoundError);
    const listed = await listAll(srv.sdkOpts, { metadata: { run: RUN, role: 'expire' } });
    assert.deepEqual(listed, [], 'an expired sandbox is not listed');
    assert.equal(await Sandbox.kill(sbx.sandboxId, srv.sdkOpts), false, 'killing an expired sandbox reports false');
  });

  srv.test('kill → true, kill again → false, connect/getInfo after kill → SandboxNotFoundError', async () => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, role: 'kill' } });
    created.push(sbx);
    assert.equal(await sbx.kill(), true);
    assert.equal(await sbx.kill(), false);
    assert.equal(await Sandbox.kill(sbx.sandboxId, srv.sdkOpts), false);
    assert.equal(await sbx.isRunning(), false);
    await assert.rejects(Sandbox.connect(sbx.sandboxId, srv.sdkOpts), SandboxNotFoundError);
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, srv.sdkOpts), SandboxNotFoundError);
    await assert.rejects(sbx.commands.run('echo should-not-run'), SandboxNotFoundError);
    const listed = await listAll(srv.sdkOpts, { metadata: { run: RUN, role: 'kill' } });
    assert.deepEqual(listed, []);
  });

  srv.test('killing the page sandboxes leaves only main listed', async () => {
    for (const s of pages) assert.equal(await Sandbox.kill(s.sandboxId, srv.sdkOpts), true);
    const left = await listAll(srv.sdkOpts, { metadata: { run: RUN } });
    assert.deepEqual(left.map((s) => s.sandboxId), [main.sandboxId]);
    // and main is unaffected
    assert.equal((await main.commands.run('echo still-here')).stdout, 'still-here\n');
  });
});
