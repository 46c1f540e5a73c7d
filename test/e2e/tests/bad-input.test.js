// Bad input: malformed JSON, wrong types, missing/wrong/revoked keys, unknown
// templates and sandboxes, timeouts above the maximum, envd calls on a killed
// sandbox. None of them may leave a sandbox behind.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe } from 'node:test';
import {
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  AuthenticationError,
  TimeoutError,
} from 'e2b';
import { useServer, runId, listAll, killQuietly, apiFetch, runVmon, waitFor } from '../lib/harness.js';

// Hooks live inside describe(): Node 20 does not await root-level hooks in order.
describe('bad input', () => {
  // A small maximum so that "above the maximum" is cheap to express.
  const srv = useServer({ name: 'bad-input', args: ['--max-sandbox-timeout', '1h'] });
  const RUN = runId('bad-input');
  let baseline;
  let victim; // a sandbox used for the timeout endpoint and then killed
  let victimKilled; // its id, once the envd-after-kill test got through

  srv.before(async () => {
    baseline = (await listAll(srv.sdkOpts)).map((s) => s.sandboxId).sort();
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, victim);
  });

  /** E2B's error body: {"code": <status>, "message": "<text>"}. */
  function assertE2bError(res, status, what) {
    assert.equal(res.status, status, `${what}: HTTP ${res.status} ${res.text}`);
    assert.ok(res.json && typeof res.json === 'object', `${what}: JSON body, got ${JSON.stringify(res.text)}`);
    assert.equal(res.json.code, status, `${what}: body.code`);
    assert.equal(typeof res.json.message, 'string', `${what}: body.message`);
    assert.ok(res.json.message.length > 0, `${what}: non-empty message`);
    assert.match(res.headers.get('content-type') || '', /application\/json/, `${what}: content-type`);
  }

  async function assertNoNewSandboxes(what) {
    const now = (await listAll(srv.sdkOpts)).map((s) => s.sandboxId).sort();
    const extra = now.filter((id) => !baseline.includes(id) && id !== victim?.sandboxId);
    assert.deepEqual(extra, [], `${what} left sandboxes behind`);
  }

  srv.test('the admin key is in <data-dir>/api-key, E2B-shaped, mode 0600', async () => {
    const file = path.join(srv.dataDir, 'api-key');
    assert.equal(fs.statSync(file).mode & 0o777, 0o600);
    assert.match(srv.apiKey, /^e2b_[0-9a-f]{40}$/);
    const res = await apiFetch(srv, '/v2/sandboxes');
    assert.equal(res.status, 200, `the admin key works: ${res.text}`);
    assert.ok(Array.isArray(res.json), 'list answers a JSON array');
  });

  srv.test('malformed JSON → 400', async () => {
    for (const [method, path] of [
      ['POST', '/v2/sandboxes'],
      ['POST', '/sandboxes'],
    ]) {
      for (const body of ['{"templateID": "base",', 'not json at all', '']) {
        const res = await apiFetch(srv, path, { method, body });
        assertE2bError(res, 400, `${method} ${path} with body ${JSON.stringify(body)}`);
      }
    }
    await assertNoNewSandboxes('malformed JSON');
  });

  srv.test('wrong types → 400', async () => {
    const bodies = [
      { templateID: 'base', timeout: 'x' },
      { templateID: 'base', timeout: 1.5e3 + 0.5 },
      { templateID: 5 },
      { templateID: ['base'] },
      { templateID: 'base', metadata: 'not-an-object' },
      { templateID: 'base', metadata: { a: 1 } },
      { templateID: 'base', envVars: { A: true } },
      ['base'],
    ];
    for (const b of bodies) {
      const res = await apiFetch(srv, '/v2/sandboxes', { method: 'POST', body: JSON.stringify(b) });
      assertE2bError(res, 400, `create with ${JSON.stringify(b)}`);
    }
    const res = await apiFetch(srv, '/v2/sandboxes?limit=abc');
    assertE2bError(res, 400, 'list with limit=abc');
    await assertNoNewSandboxes('wrong types');
  });

  srv.test('missing or wrong API key → 401', async () => {
    const fakeKey = `e2b_${'0'.repeat(40)}`;
    for (const key of [null, '', fakeKey, 'garbage']) {
      for (const [method, path, body] of [
        ['GET', '/v2/sandboxes'],
        ['POST', '/v2/sandboxes', JSON.stringify({ templateID: 'base' })],
        ['GET', '/sandboxes/nonexistingsandbox'],
        ['DELETE', '/sandboxes/nonexistingsandbox'],
      ]) {
        const res = await apiFetch(srv, path, { method, body, key });
        assertE2bError(res, 401, `${method} ${path} with key ${JSON.stringify(key)}`);
      }
    }
    const wrong = { ...srv.sdkOpts, apiKey: fakeKey };
    await assert.rejects(Sandbox.create(wrong), AuthenticationError);
    await assert.rejects(Sandbox.list(wrong).nextItems(), AuthenticationError);
    await assert.rejects(Sandbox.getInfo('nonexistingsandbox', wrong), AuthenticationError);
    await assertNoNewSandboxes('unauthenticated creates');
  });

  srv.test('a revoked key → 401, other keys unaffected', async () => {
    const name = `e2e-revoke-${process.pid}`;
    const { stdout } = await runVmon(['keys', 'create', '--data-dir', srv.dataDir, '--name', name]);
    const key = stdout.trim().split('\n').pop().trim();
    assert.match(key, /^e2b_[0-9a-f]{40}$/, `vmon keys create prints the key on its last line: ${stdout}`);
    assert.notEqual(key, srv.apiKey);

    let res = await apiFetch(srv, '/v2/sandboxes', { key });
    assert.equal(res.status, 200, `the new key works before revocation: ${res.status} ${res.text}`);
    assert.ok(Array.isArray(res.json));

    const listed = await runVmon(['keys', 'list', '--data-dir', srv.dataDir]);
    assert.match(listed.stdout, new RegExp(name), 'keys list shows the new key by name');
    assert.doesNotMatch(listed.stdout, new RegExp(key.slice(4)), 'keys list never prints a full key');

    await runVmon(['keys', 'revoke', '--data-dir', srv.dataDir, key]);
    await waitFor(async () => (await apiFetch(srv, '/v2/sandboxes', { key })).status === 401, {
      timeoutMs: 5000,
      what: 'the revoked key to be refused',
    });
    res = await apiFetch(srv, '/v2/sandboxes', { key });
    assertE2bError(res, 401, 'revoked key');
    await assert.rejects(Sandbox.create({ ...srv.sdkOpts, apiKey: key }), AuthenticationError);

    res = await apiFetch(srv, '/v2/sandboxes');
    assert.equal(res.status, 200, 'the admin key still works');
    await assertNoNewSandboxes('revoked key');
  });

  srv.test('unknown template → 404', async () => {
    await assert.rejects(Sandbox.create('no-such-template-e2e', srv.sdkOpts), (err) => {
      assert.ok(err instanceof SandboxError, `${err?.name}: ${err?.message}`);
      assert.equal(err.statusCode, 404, err.message);
      return true;
    });
    const res = await apiFetch(srv, '/v2/sandboxes', {
      method: 'POST',
      body: JSON.stringify({ templateID: 'no-such-template-e2e' }),
    });
    assertE2bError(res, 404, 'create from an unknown template');
    await assertNoNewSandboxes('unknown template');
  });

  srv.test('unknown sandbox → not found everywhere', async () => {
    const id = 'nonexistingsandbox';
    await assert.rejects(Sandbox.getInfo(id, srv.sdkOpts), SandboxNotFoundError);
    assert.equal(await Sandbox.kill(id, srv.sdkOpts), false);
    await assert.rejects(Sandbox.connect(id, srv.sdkOpts), SandboxNotFoundError);
    await assert.rejects(Sandbox.setTimeout(id, 30_000, srv.sdkOpts), SandboxNotFoundError);
    for (const [method, path, body] of [
      ['GET', `/sandboxes/${id}`],
      ['DELETE', `/sandboxes/${id}`],
      ['POST', `/sandboxes/${id}/timeout`, JSON.stringify({ timeout: 30 })],
      ['POST', `/v2/sandboxes/${id}/connect`, JSON.stringify({ timeout: 30 })],
    ]) {
      assertE2bError(await apiFetch(srv, path, { method, body }), 404, `${method} ${path}`);
    }
    await assertNoNewSandboxes('unknown sandbox');
  });

  srv.test('timeout above the maximum → 400', async () => {
    await assert.rejects(Sandbox.create({ ...srv.sdkOpts, timeoutMs: 2 * 3600_000, metadata: { run: RUN } }), (err) => {
      assert.ok(err instanceof SandboxError, `${err?.name}: ${err?.message}`);
      assert.equal(err.statusCode, 400, err.message);
      return true;
    });
    const res = await apiFetch(srv, '/v2/sandboxes', {
      method: 'POST',
      body: JSON.stringify({ templateID: 'base', timeout: 3601 }),
    });
    assertE2bError(res, 400, 'create with timeout 3601 s over a 1 h maximum');
    await assertNoNewSandboxes('timeout above the maximum');

    // Exactly the maximum is fine.
    victim = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 3600_000, metadata: { run: RUN } });
    const info = await victim.getInfo();
    const ttl = (info.endAt - info.startedAt) / 1000;
    assert.ok(Math.abs(ttl - 3600) <= 5, `timeout = maximum accepted, ttl ${ttl}`);

    await assert.rejects(victim.setTimeout(2 * 3600_000), (err) => {
      assert.ok(err instanceof SandboxError, `${err?.name}: ${err?.message}`);
      assert.equal(err.statusCode, 400, err.message);
      return true;
    });
    const after1 = await victim.getInfo();
    assert.equal(after1.endAt.getTime(), info.endAt.getTime(), 'a refused setTimeout changes nothing');
  });

  srv.test('malformed JSON and wrong types on sandbox endpoints → 400', async () => {
    assert.ok(victim, 'needs the sandbox from the previous test');
    const id = victim.sandboxId;
    for (const [path, body] of [
      [`/sandboxes/${id}/timeout`, '{"timeout":'],
      [`/sandboxes/${id}/timeout`, JSON.stringify({ timeout: 'x' })],
      [`/v2/sandboxes/${id}/connect`, '{'],
      [`/v2/sandboxes/${id}/connect`, JSON.stringify({ timeout: 'x' })],
    ]) {
      assertE2bError(await apiFetch(srv, path, { method: 'POST', body }), 400, `POST ${path} ${body}`);
    }
    assert.equal(await victim.isRunning(), true, 'bad requests do not hurt the sandbox');
  });

  srv.test('envd calls on a killed sandbox fail with not-found errors', async () => {
    assert.ok(victim, 'needs the sandbox from the previous test');
    await victim.files.write('/home/user/x.txt', 'x');
    assert.equal(await victim.kill(), true);
    await assert.rejects(victim.commands.run('echo nope'), SandboxNotFoundError);
    await assert.rejects(victim.files.read('/home/user/x.txt'), (err) => {
      assert.ok(err instanceof TimeoutError || err instanceof SandboxNotFoundError, `${err?.name}: ${err?.message}`);
      return true;
    });
    await assert.rejects(victim.files.write('/home/user/y.txt', 'y'));
    await assert.rejects(victim.commands.list());
    assert.equal(await victim.isRunning(), false);

    // What the SDK sees underneath: the edge's 502 for a sandbox it does not know.
    const res = await fetch(`${srv.apiUrl}/health`, {
      headers: { 'E2b-Sandbox-Id': victim.sandboxId, 'E2b-Sandbox-Port': '49983' },
    });
    assert.equal(res.status, 502);
    assert.deepEqual(await res.json(), {
      sandboxId: victim.sandboxId,
      message: 'The sandbox was not found',
      code: 502,
    });
    victimKilled = victim.sandboxId;
    victim = undefined;
  });

  srv.test('nothing was left behind', async () => {
    assert.ok(victimKilled, 'the tests above created and killed a sandbox');
    const info = await Sandbox.getInfo(victimKilled, srv.sdkOpts).catch((err) => err);
    assert.ok(info instanceof SandboxNotFoundError, 'the killed sandbox stays gone');
    await assertNoNewSandboxes('the bad-input suite');
    const mine = await listAll(srv.sdkOpts, { metadata: { run: RUN } });
    assert.deepEqual(mine, []);
    assert.deepEqual((await listAll(srv.sdkOpts)).map((s) => s.sandboxId).sort(), baseline);
  });
});
