// Capacity: with --max-sandboxes 2 a third create is refused quickly with
// 429/503 and a clear message, and the slots come back after kills.

import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Sandbox, RateLimitError, ServiceBusyError } from 'e2b';
import { useServer, runId, listAll, killQuietly, apiFetch } from '../lib/harness.js';

// Hooks live inside describe(): Node 20 does not await root-level hooks in order.
describe('capacity (--max-sandboxes 2)', () => {
  const srv = useServer({ name: 'capacity', args: ['--max-sandboxes', '2'] });
  const RUN = runId('capacity');
  const created = [];

  srv.before(async () => {
    // Slots taken by sandboxes some earlier, crashed run left in the shared data
    // dir would make this test meaningless: start from an empty node.
    await srv.killAllSandboxes();
    assert.deepEqual(await listAll(srv.sdkOpts), [], 'the node starts empty');
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
  });

  function isCapacityError(err) {
    assert.ok(
      err instanceof RateLimitError || err instanceof ServiceBusyError,
      `expected RateLimitError or ServiceBusyError, got ${err?.name}: ${err?.message}`,
    );
    assert.match(err.message, /capacity|limit|maximum|max|busy|too many|full/i, `a clear message: ${err.message}`);
    return true;
  }

  srv.test('the third sandbox over --max-sandboxes 2 is refused with 429/503', async () => {
    const [a, b] = await Promise.all([
      Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, n: '1' } }),
      Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, n: '2' } }),
    ]);
    created.push(a, b);

    const t0 = Date.now();
    await assert.rejects(Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, n: '3' } }), isCapacityError);
    assert.ok(Date.now() - t0 < 65_000, 'refused, not hung');

    // Raw: status 429 or 503 with E2B's JSON error body.
    const res = await apiFetch(srv, '/v2/sandboxes', { method: 'POST', body: JSON.stringify({ templateID: 'base' }) });
    assert.ok(res.status === 429 || res.status === 503, `status ${res.status} ${res.text}`);
    assert.equal(res.json?.code, res.status, `JSON error body: ${res.text}`);
    assert.ok(res.json.message, 'message');

    const listed = await listAll(srv.sdkOpts);
    assert.deepEqual(listed.map((s) => s.sandboxId).sort(), [a.sandboxId, b.sandboxId].sort(), 'refused creates leave nothing');

    // The two that exist are fine.
    assert.equal((await a.commands.run('echo a')).stdout, 'a\n');
    assert.equal((await b.commands.run('echo b')).stdout, 'b\n');
  });

  srv.test('concurrent creates never exceed the limit', async () => {
    for (const s of created.splice(0)) await Sandbox.kill(s.sandboxId, srv.sdkOpts);
    const results = await Promise.allSettled(
      [1, 2, 3, 4].map((n) => Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, burst: String(n) } })),
    );
    const ok = results.filter((r) => r.status === 'fulfilled').map((r) => r.value);
    created.push(...ok);
    const failed = results.filter((r) => r.status === 'rejected').map((r) => r.reason);
    assert.equal(ok.length, 2, `exactly 2 of 4 concurrent creates succeed (errors: ${failed.map((e) => e.message)})`);
    for (const err of failed) isCapacityError(err);
    assert.equal((await listAll(srv.sdkOpts)).length, 2);
  });

  srv.test('killing frees the slots; nothing is left behind', async () => {
    for (const s of created.splice(0)) assert.equal(await Sandbox.kill(s.sandboxId, srv.sdkOpts), true);
    assert.deepEqual(await listAll(srv.sdkOpts), []);
    const again = await Promise.all([
      Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, again: '1' } }),
      Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN, again: '2' } }),
    ]);
    created.push(...again);
    for (const s of again) assert.equal(await s.kill(), true);
    created.splice(0);
    assert.deepEqual(await listAll(srv.sdkOpts), []);
  });
});
