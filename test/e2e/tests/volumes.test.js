// Volumes through the official SDK: two sandboxes share a volume; the volume content API reads
// what a sandbox wrote and the reverse; content survives kills, pause/resume and a node restart;
// deleting a mounted volume is refused (409) and paths never leave the volume.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe } from 'node:test';
import { Sandbox, Volume, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b';
import { useServer, killQuietly, apiFetch, runId } from '../lib/harness.js';

describe('volumes', () => {
  const srv = useServer({ name: 'volumes' });
  const RUN = runId('vol').replace(/[^a-z0-9-]/g, '-');
  const created = [];
  const vols = [];
  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
    for (const v of vols) await Volume.destroy(v.volumeId, srv.sdkOpts).catch(() => {});
  });
  // The content API lives on the API's address (E2B_VOLUME_API_URL in header mode).
  const vopts = () => ({ apiUrl: srv.apiUrl });

  async function run(sbx, cmd, user = 'user') {
    return (await sbx.commands.run(cmd, { user })).stdout;
  }

  srv.test('two sandboxes share a volume; the content API sees what they wrote', async () => {
    const vol = await Volume.create(`${RUN}-shared`, srv.sdkOpts);
    vols.push(vol);
    assert.ok(vol.volumeId && vol.token);
    const info = await Volume.getInfo(vol.volumeId, srv.sdkOpts);
    assert.equal(info.name, `${RUN}-shared`);
    assert.ok((await Volume.list(srv.sdkOpts)).some((v) => v.volumeId === vol.volumeId));

    const a = await Sandbox.create({ ...srv.sdkOpts, volumeMounts: { '/mnt/shared': vol }, timeoutMs: 600_000 });
    const b = await Sandbox.create({ ...srv.sdkOpts, volumeMounts: { '/data': vol.name }, timeoutMs: 600_000 });
    created.push(a, b);
    const detail = await a.getInfo();
    assert.deepEqual(detail.volumeMounts, [{ name: vol.name, path: '/mnt/shared' }]);

    await run(a, 'echo from-a > /mnt/shared/a.txt && mkdir -p /mnt/shared/dir/sub && echo deep > /mnt/shared/dir/sub/f');
    assert.equal(await run(b, 'cat /data/a.txt'), 'from-a\n', 'b sees what a wrote');
    await run(b, 'echo from-b > /data/b.txt');
    assert.equal(await run(a, 'cat /mnt/shared/b.txt'), 'from-b\n');

    // The content API: read, list (depth), stat, write, mkdir, chmod, remove.
    assert.equal(await vol.readFile('/a.txt', vopts()), 'from-a\n');
    const top = await vol.list('/', vopts());
    assert.deepEqual(top.map((e) => e.name).sort(), ['a.txt', 'b.txt', 'dir']);
    const deep = await vol.list('/', { ...vopts(), depth: 3 });
    assert.ok(deep.some((e) => e.path === '/dir/sub/f' && e.type === 'file'));
    const st = await vol.getInfo('/a.txt', vopts());
    assert.equal(st.type, 'file');
    assert.equal(st.size, 7);
    assert.ok(st.mtime instanceof Date);
    const w = await vol.writeFile('/api/new.txt', 'from-api', { ...vopts(), force: true, uid: 1000, gid: 1000, mode: 0o640 });
    assert.equal(w.size, 8);
    assert.equal(w.uid, 1000);
    assert.equal(w.mode & 0o777, 0o640);
    assert.equal(await run(a, 'cat /mnt/shared/api/new.txt'), 'from-api', 'a sandbox sees what the API wrote');
    await vol.makeDir('/made/deeper', { ...vopts(), force: true });
    assert.equal(await run(b, 'test -d /data/made/deeper && echo yes'), 'yes\n');
    const upd = await vol.updateMetadata('/a.txt', { mode: 0o600 }, vopts());
    assert.equal(upd.mode & 0o777, 0o600);
    await vol.remove('/dir', vopts());
    assert.equal(await vol.exists('/dir/sub/f', vopts()), false);
    await assert.rejects(vol.readFile('/nope', vopts()), VolumePathNotFoundError);
    await assert.rejects(vol.getInfo('/nope', vopts()), VolumePathNotFoundError);

    // Paths stay inside the volume, whatever a guest planted.
    await run(a, 'ln -s /etc /mnt/shared/escape', 'root');
    await assert.rejects(vol.readFile('/escape/passwd', vopts()));
    await assert.rejects(vol.writeFile('/escape/owned', 'x', vopts()));
    const dotdot = await fetch(`${srv.apiUrl}/volumecontent/${vol.volumeId}/file?path=${encodeURIComponent('/../../../../etc/passwd')}`, {
      headers: { Authorization: `Bearer ${vol.token}` },
    });
    assert.equal(dotdot.status, 404, 'a .. path is resolved inside the volume');
    // The content API takes the volume's token, nothing else.
    for (const auth of [undefined, 'Bearer wrong', `Bearer ${srv.apiKey}`]) {
      const res = await fetch(`${srv.apiUrl}/volumecontent/${vol.volumeId}/file?path=/a.txt`, { headers: auth ? { Authorization: auth } : {} });
      assert.equal(res.status, 401, `auth ${auth}`);
    }

    // Mounted: deleting is refused; it survives the sandboxes, a pause and a node restart.
    const del = await apiFetch(srv, `/volumes/${vol.volumeId}`, { method: 'DELETE' });
    assert.equal(del.status, 409, del.text);
    assert.equal(await a.pause(), true);
    assert.equal((await apiFetch(srv, `/volumes/${vol.volumeId}`, { method: 'DELETE' })).status, 409, 'a paused sandbox mounts it too');
    const back = await Sandbox.connect(a.sandboxId, srv.sdkOpts);
    assert.equal(await run(back, 'cat /mnt/shared/b.txt'), 'from-b\n');
    await back.kill();
    await b.kill();
    await srv.kill9();
    await srv.restart();
    assert.equal(await vol.readFile('/b.txt', vopts()), 'from-b\n', 'content survives kills and a restart');
    const c = await Sandbox.create({ ...srv.sdkOpts, volumeMounts: { '/vol': vol } });
    created.push(c);
    assert.equal(await run(c, 'cat /vol/a.txt'), 'from-a\n');
    await c.kill();
    assert.equal(await Volume.destroy(vol.volumeId, srv.sdkOpts), true);
    assert.equal(await Volume.destroy(vol.volumeId, srv.sdkOpts), false);
    await assert.rejects(Volume.getInfo(vol.volumeId, srv.sdkOpts), VolumeNotFoundError);
    assert.ok(!fs.existsSync(path.join(srv.dataDir, 'volumes', vol.volumeId)), 'a deleted volume left its directory');
  });

  srv.test('invalid volume names and mounts are 400', async () => {
    const bad = await apiFetch(srv, '/volumes', { method: 'POST', body: JSON.stringify({ name: 'has space' }) });
    assert.equal(bad.status, 400);
    const vol = await Volume.create(`${RUN}-v2`, srv.sdkOpts);
    vols.push(vol);
    const dup = await apiFetch(srv, '/volumes', { method: 'POST', body: JSON.stringify({ name: vol.name }) });
    assert.equal(dup.status, 409);
    for (const [mounts, what] of [
      [[{ name: 'no-such-volume', path: '/data' }], 'unknown volume'],
      [[{ name: vol.name, path: 'relative' }], 'relative path'],
      [[{ name: vol.name, path: '/proc/x' }], 'reserved path'],
      [[{ name: vol.name, path: '/' }], 'root'],
      [[{ name: vol.name, path: '/a' }, { name: vol.name, path: '/a/b' }], 'overlapping'],
    ]) {
      const res = await apiFetch(srv, '/v2/sandboxes', { method: 'POST', body: JSON.stringify({ templateID: 'base', volumeMounts: mounts }) });
      assert.equal(res.status, 400, `${what}: ${res.text}`);
    }
  });
});
