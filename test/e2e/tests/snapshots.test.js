// Snapshots and forks through the official SDK: a snapshot keeps the source running and holds its
// memory and files as they were at that instant; sandboxes created from it (by id or by name)
// and forks are independent of each other and of the source; listing filters and pages; capacity
// and unknown sources answer as E2B does; `kill -9` of the node in the middle of a snapshot or a
// fork leaves the source running or paused and nothing that no record owns.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe } from 'node:test';
import { Sandbox, SandboxNotFoundError } from 'e2b';
import { useServer, killQuietly, sleep, waitFor, apiFetch, pgrep, listAll, getInfoRecovered } from '../lib/harness.js';

// Unique per run: snapshot names are unique, and the test data dir outlives a run.
const NAME = `e2e-snap-${process.pid}`;
// Written through a rename: a read never sees the file truncated and empty.
const COUNTER = 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv -f /tmp/count.new /tmp/count; sleep 0.05; done';
const HOLDER = `python3 -c "
import os, time
secret = os.urandom(8).hex()
while True:
    open('/tmp/py.tmp', 'w').write('%d %s' % (os.getpid(), secret))
    os.replace('/tmp/py.tmp', '/tmp/py')
    time.sleep(0.05)
"`;

async function run(sbx, cmd) {
  return (await sbx.commands.run(cmd, { user: 'root' })).stdout.trim();
}

describe('snapshots and forks', () => {
  const srv = useServer({ name: 'snapshots', args: ['--sandbox-disk-mb', '512'] });
  const created = [];
  srv.after(async () => killQuietly(srv.sdkOpts, ...created));
  const track = (...s) => {
    created.push(...s);
    return s[0];
  };

  async function source() {
    const sbx = track(await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000 }));
    await sbx.commands.run(COUNTER, { background: true });
    await sbx.commands.run(HOLDER, { background: true });
    await sbx.files.write('/home/user/state.txt', 'at snapshot');
    // The holder's first write comes once python has started, which a busy machine delays.
    await waitFor(async () => (await sbx.commands.run('test -s /tmp/py', { user: 'root' }).catch((e) => e)).exitCode === 0,
      { timeoutMs: 30_000, intervalMs: 200, what: 'the memory holder to write /tmp/py' });
    await sleep(300);
    return sbx;
  }

  const dirs = (sub) => {
    const d = path.join(srv.dataDir, sub);
    return fs.existsSync(d) ? fs.readdirSync(d) : [];
  };
  // The test data dir outlives a run: snapshots recorded by an earlier one stay listed and on disk.
  let earlier = new Set();
  srv.before(async () => {
    earlier = new Set(dirs('snapshots'));
  });
  const newDirs = (sub) => dirs(sub).filter((d) => !earlier.has(d));

  srv.test('snapshot: the source goes on; new sandboxes start from the snapshot, by id or by name', async () => {
    const src = await source();
    const [pyPid, secret] = (await run(src, 'cat /tmp/py')).split(' ');
    const snap = await src.createSnapshot({ name: NAME });
    assert.match(snap.snapshotId, /^[a-z0-9]+:default$/);
    assert.deepEqual(snap.names, [NAME]);
    // The source keeps running, with its processes.
    const c1 = Number(await run(src, 'cat /tmp/count'));
    await sleep(200);
    assert.ok(Number(await run(src, 'cat /tmp/count')) > c1, 'the source stopped counting after its snapshot');
    assert.equal((await run(src, 'cat /tmp/py')).split(' ')[0], pyPid);
    await src.files.write('/home/user/state.txt', 'after snapshot');

    const made = [];
    for (const ref of [snap.snapshotId, NAME, snap.snapshotId]) {
      const sbx = track(await Sandbox.create(ref, { ...srv.sdkOpts, timeoutMs: 600_000 }));
      made.push(sbx);
      assert.equal(await sbx.files.read('/home/user/state.txt'), 'at snapshot', `created from ${ref}`);
      const [pid2, secret2] = (await run(sbx, 'cat /tmp/py')).split(' ');
      assert.equal(pid2, pyPid, 'the python process is the restored one');
      assert.equal(secret2, secret, 'with the memory it had at the snapshot');
      const c = Number(await run(sbx, 'cat /tmp/count'));
      await sleep(200);
      assert.ok(Number(await run(sbx, 'cat /tmp/count')) > c, 'the restored counter goes on');
      await sbx.files.write('/home/user/mine.txt', sbx.sandboxId);
    }
    for (const sbx of made) {
      assert.equal(await sbx.files.read('/home/user/mine.txt'), sbx.sandboxId, 'writes of one sandbox reached another');
      assert.notEqual(sbx.sandboxId, src.sandboxId);
    }
    assert.equal(await src.files.read('/home/user/state.txt'), 'after snapshot');
    assert.equal(await run(src, 'ls /home/user/mine.txt 2>/dev/null || echo none'), 'none');

    // Listing: by sandbox, by name, paged.
    const snap2 = await src.createSnapshot();
    assert.deepEqual(snap2.names, []);
    const bySandbox = await Sandbox.listSnapshots({ ...srv.sdkOpts, sandboxId: src.sandboxId }).nextItems();
    assert.deepEqual(bySandbox.map((s) => s.snapshotId).sort(), [snap.snapshotId, snap2.snapshotId].sort());
    const byName = await Sandbox.listSnapshots({ ...srv.sdkOpts, name: NAME }).nextItems();
    assert.deepEqual(byName.map((s) => s.snapshotId), [snap.snapshotId]);
    const pager = Sandbox.listSnapshots({ ...srv.sdkOpts, sandboxId: src.sandboxId, limit: 1 });
    const pages = [];
    while (pager.hasNext) pages.push(...(await pager.nextItems()));
    assert.equal(pages.length, 2, 'two pages of one');
    assert.equal(new Set(pages.map((p) => p.snapshotId)).size, 2);
    const dup = await apiFetch(srv, `/sandboxes/${src.sandboxId}/snapshots`, { method: 'POST', body: JSON.stringify({ name: NAME }) });
    assert.equal(dup.status, 409, 'a taken name');
    const bad = await apiFetch(srv, `/sandboxes/${src.sandboxId}/snapshots`, { method: 'POST', body: '{"name":"Not A Name!"}' });
    assert.equal(bad.status, 400);

    // Snapshots outlive their sandbox; deletion is final.
    await src.kill();
    const late = track(await Sandbox.create(NAME, { ...srv.sdkOpts, timeoutMs: 600_000 }));
    assert.equal(await late.files.read('/home/user/state.txt'), 'at snapshot');
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, srv.sdkOpts), true);
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, srv.sdkOpts), false);
    assert.equal(await Sandbox.deleteSnapshot(snap2.snapshotId, srv.sdkOpts), true);
    assert.deepEqual(newDirs('snapshots'), [], 'deleted snapshots left files');
    await assert.rejects(Sandbox.create(NAME, srv.sdkOpts), /not found/);
    await assert.rejects(Sandbox.createSnapshot('nosuchsandbox0000000', srv.sdkOpts), SandboxNotFoundError);
  });

  srv.test('fork x3: independent sandboxes with the source memory at fork time', async () => {
    const snapshotsBefore = new Set(dirs('snapshots'));
    const src = await source();
    const [pyPid, secret] = (await run(src, 'cat /tmp/py')).split(' ');
    const res = await apiFetch(srv, `/sandboxes/${src.sandboxId}/fork`, { method: 'POST', body: '{"count":3,"timeout":600}' });
    assert.equal(res.status, 201, res.text);
    assert.equal(res.json.length, 3);
    const forks = [];
    for (const entry of res.json) {
      assert.ok(entry.sandbox, `fork entry without a sandbox: ${JSON.stringify(entry)}`);
      assert.ok(entry.sandbox.envdAccessToken, 'a fork has its own access token');
      const sbx = track(await Sandbox.connect(entry.sandbox.sandboxID, srv.sdkOpts));
      forks.push(sbx);
      const [pid2, secret2] = (await run(sbx, 'cat /tmp/py')).split(' ');
      assert.deepEqual([pid2, secret2], [pyPid, secret], 'a fork carries the source memory');
      await sbx.files.write('/home/user/fork.txt', sbx.sandboxId);
    }
    assert.equal(new Set(forks.map((f) => f.sandboxId)).size, 3);
    const tokens = new Set(res.json.map((e) => e.sandbox.envdAccessToken));
    assert.equal(tokens.size, 3, 'forks share an access token');
    for (const f of forks) assert.equal(await f.files.read('/home/user/fork.txt'), f.sandboxId);
    assert.equal(await run(src, 'ls /home/user/fork.txt 2>/dev/null || echo none'), 'none', 'a fork wrote into its source');
    const addrs = await Promise.all([src, ...forks].map((s) => run(s, "ip -o -4 addr show dev eth0 | awk '{print $4}'")));
    assert.equal(new Set(addrs).size, 4, `forks share a lease: ${addrs}`);
    // A fork is a sandbox like any other: listed, paused, resumed.
    const listed = await listAll(srv.sdkOpts);
    for (const f of forks) assert.ok(listed.some((s) => s.sandboxId === f.sandboxId));
    assert.equal(await forks[0].pause(), true);
    const back = await Sandbox.connect(forks[0].sandboxId, srv.sdkOpts);
    assert.equal(await back.files.read('/home/user/fork.txt'), forks[0].sandboxId);
    // The fork's own checkpoint is gone once the forks started.
    assert.deepEqual(dirs('snapshots').filter((d) => !snapshotsBefore.has(d)), []);

    // A paused source forks from its saved state and stays paused.
    assert.equal(await src.pause(), true);
    const res2 = await apiFetch(srv, `/sandboxes/${src.sandboxId}/fork`, { method: 'POST', body: '{}' });
    assert.equal(res2.status, 201, res2.text);
    const pf = track(await Sandbox.connect(res2.json[0].sandbox.sandboxID, srv.sdkOpts));
    assert.equal(await pf.files.read('/home/user/state.txt'), 'at snapshot');
    assert.equal((await Sandbox.getInfo(src.sandboxId, srv.sdkOpts)).state, 'paused');

    await src.kill();
    const gone = await apiFetch(srv, `/sandboxes/${src.sandboxId}/fork`, { method: 'POST', body: '{}' });
    assert.equal(gone.status, 404, 'fork of a killed sandbox');
    const unknown = await apiFetch(srv, '/sandboxes/nosuchsandbox0000000/fork', { method: 'POST', body: '{}' });
    assert.equal(unknown.status, 404);
    for (const count of [0, 101, -1]) {
      const r = await apiFetch(srv, `/sandboxes/${forks[1].sandboxId}/fork`, { method: 'POST', body: JSON.stringify({ count }) });
      assert.equal(r.status, 400, `count ${count}`);
    }
  });

  async function listAllSnapshots() {
    const p = Sandbox.listSnapshots(srv.sdkOpts);
    const out = [];
    while (p.hasNext) out.push(...(await p.nextItems()));
    return out;
  }

  srv.test('kill -9 of the node during a snapshot or a fork leaves the source running or paused and no orphans', async () => {
    for (const [op, delayMs] of [['snapshot', 0], ['snapshot', 80], ['snapshot', 200], ['fork', 100], ['fork', 400]]) {
      const src = await source();
      const call =
        op === 'snapshot'
          ? apiFetch(srv, `/sandboxes/${src.sandboxId}/snapshots`, { method: 'POST', body: '{}' })
          : apiFetch(srv, `/sandboxes/${src.sandboxId}/fork`, { method: 'POST', body: '{"count":2}' });
      call.catch(() => {});
      await sleep(delayMs);
      await srv.kill9();
      await srv.restart();
      const state = (await getInfoRecovered(src.sandboxId, srv.sdkOpts)).state;
      // Nobody asked for a pause: the source runs as before (a checkpoint the crash interrupted
      // is finished and the source resumed from it).
      assert.equal(state, 'running', `${op} +${delayMs} ms: source ${state}`);
      const back = await Sandbox.connect(src.sandboxId, srv.sdkOpts);
      assert.equal(await back.files.read('/home/user/state.txt'), 'at snapshot');
      // Every snapshot on disk is a listed one; no unfinished directories.
      const listed = (await listAllSnapshots()).map((s) => s.snapshotId.replace(/:default$/, ''));
      assert.deepEqual(dirs('snapshots').sort(), listed.sort(), `${op} +${delayMs} ms: snapshots no record owns`);
      assert.deepEqual(dirs('paused').filter((n) => n.startsWith('.tmp-')), []);
      for (const id of listed) if (!earlier.has(id)) await Sandbox.deleteSnapshot(id, srv.sdkOpts);
      // Every runtime on the node belongs to a live sandbox.
      const live = new Set((await listAll(srv.sdkOpts)).map((s) => s.sandboxId));
      for (const d of dirs('sandboxes')) {
        const idFile = path.join(srv.dataDir, 'sandboxes', d, 'sandbox-id');
        if (fs.existsSync(idFile)) assert.ok(live.has(fs.readFileSync(idFile, 'utf8').trim()), `sandbox dir ${d} no record owns`);
      }
      await killQuietly(srv.sdkOpts, ...(await listAll(srv.sdkOpts)).map((s) => s.sandboxId));
    }
  });
});

describe('fork beyond capacity', () => {
  const srv = useServer({ name: 'fork-capacity', args: ['--max-sandboxes', '3'] });
  const created = [];
  srv.after(async () => killQuietly(srv.sdkOpts, ...created));

  srv.test('forks past --max-sandboxes are per-entry errors and leave nothing behind', async () => {
    const src = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000 });
    created.push(src);
    await src.files.write('/home/user/x.txt', 'x');
    const res = await apiFetch(srv, `/sandboxes/${src.sandboxId}/fork`, { method: 'POST', body: '{"count":4}' });
    assert.equal(res.status, 201, res.text);
    const ok = res.json.filter((e) => e.sandbox);
    const failed = res.json.filter((e) => e.error);
    assert.equal(ok.length, 2, JSON.stringify(res.json));
    assert.equal(failed.length, 2);
    for (const e of failed) {
      assert.equal(e.error.code, 429);
      assert.match(e.error.message, /capacity/);
    }
    created.push(...ok.map((e) => e.sandbox.sandboxID));
    for (const e of ok) {
      const f = await Sandbox.connect(e.sandbox.sandboxID, srv.sdkOpts);
      assert.equal(await f.files.read('/home/user/x.txt'), 'x');
    }
    const listed = await listAll(srv.sdkOpts);
    assert.equal(listed.length, 3, 'records of failed forks were left');
    const dirsNow = fs.readdirSync(path.join(srv.dataDir, 'sandboxes')).filter((d) => fs.existsSync(path.join(srv.dataDir, 'sandboxes', d, 'sandbox-id')));
    assert.equal(dirsNow.length, 3, `sandbox directories: ${dirsNow}`);
    assert.deepEqual(fs.readdirSync(path.join(srv.dataDir, 'snapshots')), []);
    assert.ok((await pgrep(`runsc.*--root=${srv.dataDir}/runsc`)).length > 0);
  });
});
