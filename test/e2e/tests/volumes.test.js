// Volumes through the official SDK: two sandboxes share a volume; the volume content API reads
// what a sandbox wrote and the reverse; content survives kills, pause/resume and a node restart;
// deleting a mounted volume is refused (409) and paths never leave the volume. A volume is a
// filesystem of its size (ENOSPC past it, df shows it, the host's disk holds at most that much),
// and what a guest leaves in it (a setuid root program, a device node) means nothing on the host.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
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
    assert.ok(!fs.existsSync(path.join(srv.dataDir, 'volumes', `${vol.volumeId}.img`)), 'a deleted volume left its image');
  });

  // What vmon sees at a host path: vmon serve may run in a mount namespace of its own, so host
  // paths are taken through its /proc/<pid>/root.
  const seenByVmon = (p) => `/proc/${srv.proc.pid}/root${p}`;

  srv.test('a volume has its size: ENOSPC past it, df shows it, the host holds at most that much', async () => {
    const name = `${RUN}-sized`;
    const res = await apiFetch(srv, '/volumes', { method: 'POST', body: JSON.stringify({ name, sizeMB: 96 }) });
    assert.equal(res.status, 201, res.text);
    vols.push({ volumeId: res.json.volumeID });
    assert.equal(res.json.sizeMB, 96);
    const vol = await Volume.connect(res.json.volumeID, srv.sdkOpts);
    const got = await apiFetch(srv, `/volumes/${vol.volumeId}`);
    assert.equal(got.json.sizeMB, 96, got.text);
    assert.equal((await Volume.getInfo(vol.volumeId, srv.sdkOpts)).name, name, 'the SDK reads a volume with a size');

    const sbx = await Sandbox.create({ ...srv.sdkOpts, volumeMounts: { '/mnt/sized': vol }, timeoutMs: 600_000 });
    created.push(sbx);
    const dfMB = Number((await run(sbx, 'df -B1M --output=size /mnt/sized | tail -n 1')).trim());
    assert.ok(dfMB > 64 && dfMB <= 96, `df shows ${dfMB} MiB at the mount, want the volume's 96`);

    const dd = await run(sbx, 'dd if=/dev/urandom of=/mnt/sized/big bs=1M count=200 2>&1; echo "rc=$?"');
    assert.match(dd, /No space left on device/, dd);
    assert.match(dd, /rc=1/, dd);
    const img = path.join(srv.dataDir, 'volumes', `${vol.volumeId}.img`);
    const held = fs.statSync(img).blocks * 512;
    assert.ok(held <= 97 << 20, `the volume's image holds ${held} bytes of the host's disk, more than its 96 MiB`);
    await run(sbx, 'rm /mnt/sized/big');
    assert.equal(await run(sbx, 'echo fits > /mnt/sized/small && cat /mnt/sized/small'), 'fits\n', 'freed space is usable again');

    // A snapshot's sandboxes and a fork mount the same sized filesystem.
    const snap = await sbx.createSnapshot();
    const fromSnap = await Sandbox.create(snap.snapshotId, { ...srv.sdkOpts, timeoutMs: 600_000 });
    created.push(fromSnap);
    const fork = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}/fork`, { method: 'POST', body: '{"count":1,"timeout":600}' });
    assert.equal(fork.status, 201, fork.text);
    const forked = await Sandbox.connect(fork.json[0].sandbox.sandboxID, srv.sdkOpts);
    created.push(forked);
    await run(fromSnap, 'echo from-snapshot > /mnt/sized/snap');
    for (const other of [fromSnap, forked, sbx]) {
      assert.equal(await run(other, 'cat /mnt/sized/small /mnt/sized/snap'), 'fits\nfrom-snapshot\n');
      assert.equal(Number((await run(other, 'df -B1M --output=size /mnt/sized | tail -n 1')).trim()), dfMB);
    }
    for (const s2 of [fromSnap, forked]) await s2.kill();
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, srv.sdkOpts), true);
  });

  srv.test('what a guest leaves in a volume is neither setuid nor a device on the host', async () => {
    const vol = await Volume.create(`${RUN}-nosuid`, srv.sdkOpts);
    vols.push(vol);
    const sbx = await Sandbox.create({ ...srv.sdkOpts, volumeMounts: { '/mnt/v': vol }, timeoutMs: 600_000 });
    created.push(sbx);
    const dir = path.join(srv.dataDir, 'volumes', vol.volumeId);

    // The host mount is nosuid,nodev.
    const mountinfo = fs.readFileSync(`/proc/${srv.proc.pid}/mountinfo`, 'utf8').split('\n');
    const line = mountinfo.find((l) => l.split(' ')[4] === dir);
    assert.ok(line, `no mount at ${dir} in vmon's mount table`);
    const opts = line.split(' ')[5].split(',');
    assert.ok(opts.includes('nosuid') && opts.includes('nodev'), `${dir} is mounted ${opts}`);

    // So is every mount holding what a sandbox writes: its root (overlay) and its disk.
    const sandboxMounts = mountinfo.filter((l) => l.split(' ')[4]?.startsWith(path.join(srv.dataDir, 'sandboxes') + '/'));
    const written = sandboxMounts.filter((l) => / - (overlay|ext4) /.test(l));
    assert.ok(written.length >= 2, `sandbox mounts:\n${sandboxMounts.join('\n')}`);
    for (const l of written) {
      const o = l.split(' ')[5].split(',');
      assert.ok(o.includes('nosuid') && o.includes('nodev'), `a sandbox mount is not nosuid,nodev: ${l}`);
    }

    // Guest root makes a setuid root program of the host's id(1) in the volume.
    await vol.writeFile('/id', fs.readFileSync('/usr/bin/id'), vopts());
    const mode = await run(sbx, 'chown root:root /mnt/v/id && chmod 4755 /mnt/v/id && stat -c %a /mnt/v/id', 'root');
    assert.equal(mode, '4755\n');
    assert.equal((await vol.getInfo('/id', vopts())).mode & 0o4000, 0o4000, 'the setuid bit reaches the host');
    // Run as uid 65534 on the host, in vmon's mount namespace (the kernel honours setuid only on
    // mounts of the caller's own), through a descriptor so the data dir's modes do not matter.
    const fd = fs.openSync(seenByVmon(path.join(dir, 'id')), 'r');
    try {
      const setpriv = ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', '/proc/self/fd/3', '-u'];
      const r = spawnSync('nsenter', [`--mount=/proc/${srv.proc.pid}/ns/mnt`, '--', ...setpriv], {
        stdio: ['ignore', 'pipe', 'pipe', fd],
        encoding: 'utf8',
      });
      assert.equal(r.status, 0, r.stderr);
      assert.equal(r.stdout.trim(), '65534', 'the setuid root program ran as root on the host');
    } finally {
      fs.closeSync(fd);
    }

    // Inside the guest the sentry decides setuid, not the host mount: a setuid root program
    // written to the sandbox's own disk (its root) still elevates, as sudo does.
    const inGuest = await run(sbx, 'cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id && echo ok', 'root');
    assert.equal(inGuest, 'ok\n');
    assert.equal(await run(sbx, '/usr/local/bin/suid-id -u'), '0\n', 'a setuid root program on the guest root does not elevate in the guest');
    assert.equal(await run(sbx, 'sudo -n whoami'), 'root\n');

    // A device node in the volume cannot be opened on the host.
    const node = seenByVmon(path.join(dir, 'null'));
    const mk = spawnSync('mknod', [node, 'c', '1', '3'], { encoding: 'utf8' });
    assert.equal(mk.status, 0, mk.stderr);
    assert.throws(() => fs.closeSync(fs.openSync(node, 'r')), { code: 'EACCES' }, 'a device node in the volume opened on the host');
    fs.unlinkSync(node);

    // A FIFO (or socket) the guest makes in the volume lives in its sandbox's kernel only
    // (gVisor keeps them there): the volume's filesystem, and so the content API, has no such
    // path. One that is on the volume's filesystem is refused, never waited on.
    assert.equal(await run(sbx, 'mkfifo /mnt/v/pipe && stat -c %F /mnt/v/pipe'), 'fifo\n');
    assert.ok(!fs.existsSync(seenByVmon(path.join(dir, 'pipe'))), "a guest's FIFO reached the volume's filesystem");
    await assert.rejects(vol.readFile('/pipe', vopts()), VolumePathNotFoundError);
    const hostFifo = spawnSync('mkfifo', [seenByVmon(path.join(dir, 'hostpipe'))], { encoding: 'utf8' });
    assert.equal(hostFifo.status, 0, hostFifo.stderr);
    const res = await apiFetch(srv, `/volumecontent/${vol.volumeId}/file?path=${encodeURIComponent('/hostpipe')}`, { key: null, headers: { Authorization: `Bearer ${vol.token}` } });
    assert.equal(res.status, 400, res.text);
    assert.match(res.text, /not a regular file/);
    fs.unlinkSync(seenByVmon(path.join(dir, 'hostpipe')));
  });

  srv.test('bad volume sizes are 400', async () => {
    for (const sizeMB of [0, -5, 10, 1.5, 'big', 1e9, 200_000]) {
      const res = await apiFetch(srv, '/volumes', { method: 'POST', body: JSON.stringify({ name: `${RUN}-bad`, sizeMB }) });
      if (res.json?.volumeID) vols.push({ volumeId: res.json.volumeID });
      assert.equal(res.status, 400, `sizeMB ${sizeMB}: ${res.text}`);
      assert.equal(res.json.code, 400);
      assert.equal(typeof res.json.message, 'string');
    }
    assert.equal((await Volume.list(srv.sdkOpts)).some((v) => v.name === `${RUN}-bad`), false, 'a refused create left a volume');
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
