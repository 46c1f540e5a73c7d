// Root images (vmon serve --root-images): a sandbox boots from a read-only EROFS image of its
// template with envd inside, so it runs with no gofer and no mount on the host. Its writes live in
// its runtime, bounded by the disk size, and survive pause and resume (a files-only pause keeps
// memory too, and a missing image is built again for the resume), snapshots and forks, and a node
// restart. A template with a start command is saved started on its image, and its sandboxes are
// restored from that snapshot without an overlay. A sandbox with a volume still boots from an
// overlay.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { describe } from 'node:test';
import { Sandbox, Template, Volume } from 'e2b';
import { useServer, runId, killQuietly, pgrep, runtimeIdOf, waitFor, getInfoRecovered, vmonMountinfo, apiFetch, bootRecordOf } from '../lib/harness.js';

const DISK_MB = 64;

/** argv[0] of the runsc processes of sandbox `id` (runsc-sandbox, runsc-gofer). */
async function runscNames(dir, id) {
  const names = [];
  for (const pid of await pgrep(runtimeIdOf(dir, id))) {
    try {
      names.push(fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0]);
    } catch {
      // gone meanwhile
    }
  }
  return names.filter((n) => n.startsWith('runsc-')).sort();
}

describe('root images (--root-images)', () => {
  const srv = useServer({ name: 'root-images', args: ['--root-images', '--warm-pool', '0', '--sandbox-disk-mb', String(DISK_MB)] });
  const RUN = runId('rootimg');
  const created = [];
  const vols = [];
  const create = async (opts = {}, template = undefined) => {
    const o = { ...srv.sdkOpts, metadata: { run: RUN }, timeoutMs: 600_000, ...opts };
    const s = template ? await Sandbox.create(template, o) : await Sandbox.create(o);
    created.push(s);
    return s;
  };
  const run = async (s, cmd) => (await s.commands.run(cmd)).stdout.trim();
  const imageDir = () => path.join(srv.dataDir, 'root-images');
  const bootRecord = (id) => bootRecordOf(srv.dataDir, runtimeIdOf(srv.dataDir, id));
  // The boot record names the image the runtime booted from.
  const onImage = (id) => Boolean(bootRecord(id).runtime.RootImage);
  const imageRecords = () => (fs.existsSync(imageDir()) ? fs.readdirSync(imageDir()) : [])
    .filter((f) => f.endsWith('.json'))
    .map((f) => { try { return JSON.parse(fs.readFileSync(path.join(imageDir(), f), 'utf8')); } catch { return {}; } });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
    for (const v of vols) await Volume.destroy(v.volumeId, srv.sdkOpts).catch(() => {});
    // The data dir is shared between runs: remove this run's templates.
    const listed = await apiFetch(srv, '/templates');
    for (const t of listed.json ?? []) {
      if (t.aliases.some((a) => a.startsWith(RUN.toLowerCase()))) {
        await apiFetch(srv, `/templates/${t.templateID}`, { method: 'DELETE' });
      }
    }
  });

  srv.test('the template image is built in the background and sandboxes run from it without a gofer', async () => {
    // serve starts building the current templates' images; creates meanwhile use an overlay.
    // Which image is current (its layers and envd build) is in any sandbox's boot record; a data
    // directory may hold older ones.
    const first = bootRecord((await create()).sandboxId);
    const want = { envd: path.join(srv.dataDir, first.envd), lowers: first.lowers.map((l) => path.join(srv.dataDir, l)) };
    await waitFor(() => imageRecords().some((r) => r.envd === want.envd && JSON.stringify(r.lowers) === JSON.stringify(want.lowers)), {
      timeoutMs: 180_000, intervalMs: 500, what: 'the base template root image',
    });
    const s = await create();
    assert.ok(onImage(s.sandboxId), 'the sandbox did not boot from the root image');
    assert.deepEqual(await runscNames(srv.dataDir, s.sandboxId), ['runsc-sandbox'], 'runsc processes of a sandbox on a root image');
    const rid = runtimeIdOf(srv.dataDir, s.sandboxId);
    assert.ok(!vmonMountinfo(srv.dataDir).includes(path.join(srv.dataDir, 'sandboxes', rid)), 'a sandbox on a root image has a host mount');

    // envd and the code-execution service come from the image; the template's files are there.
    assert.equal(await run(s, 'ls /opt/vmon/bin | sort | tr "\\n" " "'), 'envd vmon-code-interpreter');
    assert.equal(await run(s, 'id -un; test -x /bin/bash && echo bash'), 'user\nbash');
    assert.match(await run(s, 'stat -c %a /tmp'), /^1777$/);

    // The disk: its size is the bound, and writes past it fail with ENOSPC; the guest goes on.
    const df = (await run(s, 'df -k / | tail -1')).split(/\s+/);
    assert.equal(Number(df[1]), DISK_MB * 1024, `df / in the guest: ${df.join(' ')}`);
    const full = await s.commands.run(`dd if=/dev/zero of=/home/user/big bs=1M count=${DISK_MB + 16}`).catch((e) => e);
    assert.notEqual(full.exitCode, 0);
    assert.match(full.stderr, /No space left on device/);
    await s.commands.run('rm /home/user/big');
    await s.files.write('/home/user/after-full.txt', 'written after the disk was full');
    assert.equal(await s.files.read('/home/user/after-full.txt'), 'written after the disk was full');
  });

  srv.test('pause and resume keep files and processes; a files-only pause keeps memory too; a missing image is rebuilt', async () => {
    const s = await create();
    assert.ok(onImage(s.sandboxId));
    await s.files.write('/home/user/kept.txt', 'kept');
    const sum = await run(s, 'head -c 2000000 /dev/urandom > /tmp/rand && md5sum /tmp/rand');
    const { pid } = await s.commands.run('sleep 3600', { background: true });

    for (const keepMemory of [true, false]) {
      assert.equal(await s.pause({ keepMemory }), true, `pause keepMemory:${keepMemory}`);
      await waitFor(() => fs.existsSync(path.join(srv.dataDir, 'paused', s.sandboxId, 'meta.json')), {
        timeoutMs: 60_000, what: 'the paused sandbox snapshot',
      });
      const meta = JSON.parse(fs.readFileSync(path.join(srv.dataDir, 'paused', s.sandboxId, 'meta.json'), 'utf8'));
      assert.equal(meta.memory, true, `a pause with keepMemory:${keepMemory} of a sandbox on a root image keeps memory`);
      assert.match(meta.rootImage, /^root-images\/[0-9a-f]+\.erofs$/);
      assert.match(meta.rootImageDigest, /^sha256:[0-9a-f]{64}$/);
      const layer = path.join(srv.dataDir, 'paused', s.sandboxId, 'layer');
      assert.deepEqual(fs.existsSync(layer) ? fs.readdirSync(layer) : [], [], 'files beside the checkpoint of a sandbox on a root image');
      const record = path.join(srv.dataDir, meta.rootImage.replace(/\.erofs$/, '.json'));
      if (!keepMemory) {
        // As on a node the paused sandbox moved to: its image is not there, and the resume
        // builds it again, byte for byte the one the checkpoint was taken on.
        fs.rmSync(record);
        fs.rmSync(path.join(srv.dataDir, meta.rootImage));
      }

      const back = await Sandbox.connect(s.sandboxId, srv.sdkOpts);
      assert.equal(JSON.parse(fs.readFileSync(record, 'utf8')).digest, meta.rootImageDigest, 'the image the sandbox resumed on');
      assert.ok(onImage(s.sandboxId), 'the resumed sandbox is on its root image');
      assert.deepEqual(await runscNames(srv.dataDir, s.sandboxId), ['runsc-sandbox']);
      assert.equal(await run(back, 'md5sum /tmp/rand'), sum, `files after a pause with keepMemory:${keepMemory}`);
      assert.equal(await back.files.read('/home/user/kept.txt'), 'kept');
      assert.equal(await run(back, `kill -0 ${pid} && echo alive`), 'alive', 'the background process survived');
    }
  });

  srv.test('a snapshot keeps the source running and its forks get its files', async () => {
    const src = await create();
    await src.files.write('/home/user/state.txt', 'at snapshot');
    const snap = await src.createSnapshot();
    await src.files.write('/home/user/state.txt', 'after snapshot');
    const meta = JSON.parse(fs.readFileSync(path.join(srv.dataDir, 'snapshots', snap.snapshotId.split(':')[0], 'meta.json'), 'utf8'));
    assert.match(meta.rootImage ?? '', /^root-images\//, 'the snapshot records its root image');

    const forks = [];
    for (let i = 0; i < 2; i++) {
      const f = await Sandbox.create(snap.snapshotId, { ...srv.sdkOpts, timeoutMs: 600_000 });
      created.push(f);
      forks.push(f);
      assert.ok(onImage(f.sandboxId), 'a fork of a snapshot on a root image is on it too');
      assert.equal(await f.files.read('/home/user/state.txt'), 'at snapshot');
      await f.files.write('/home/user/mine.txt', f.sandboxId);
    }
    for (const f of forks) assert.equal(await f.files.read('/home/user/mine.txt'), f.sandboxId, 'forks share writes');
    assert.equal(await src.files.read('/home/user/state.txt'), 'after snapshot');
    await Sandbox.deleteSnapshot(snap.snapshotId, srv.sdkOpts);
  });

  srv.test('a node restart hands running sandboxes on root images back with their files', async () => {
    const s = await create();
    await s.files.write('/home/user/survives.txt', 'restart');
    await srv.restart();
    await getInfoRecovered(s.sandboxId, srv.sdkOpts);
    const again = await Sandbox.connect(s.sandboxId, srv.sdkOpts);
    assert.equal(await again.files.read('/home/user/survives.txt'), 'restart');
    assert.equal(await run(again, 'echo ok'), 'ok');
  });

  srv.test('a template with a start command is saved started on its image; its sandboxes restore from it without an overlay', async () => {
    // The start command draws a random token: sandboxes restored from the build's snapshot all
    // show the one drawn at build time; one that runs the start command itself draws another.
    const start = 'head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n" > /tmp/start-token; echo $$ > /tmp/start-pid; exec sleep infinity';
    const alias = `${RUN}-started`.toLowerCase();
    const info = await Template.build(Template().fromTemplate('base').setStartCmd(`sh -c '${start}'`, 'test -s /tmp/start-token'), alias, srv.sdkOpts);
    const build = JSON.parse(fs.readFileSync(path.join(srv.dataDir, 'templates', info.templateId, 'builds', `${info.buildId}.json`), 'utf8'));
    assert.ok(build.startSnapshot, 'the template was saved started');
    const snapDir = path.join(srv.dataDir, build.startSnapshot);
    const meta = JSON.parse(fs.readFileSync(path.join(snapDir, 'meta.json'), 'utf8'));
    assert.match(meta.rootImage ?? '', /^root-images\/[0-9a-f]+\.erofs$/, 'the started snapshot was taken on a root image');
    assert.match(meta.rootImageDigest ?? '', /^sha256:[0-9a-f]{64}$/);
    assert.equal(meta.diskMB, DISK_MB, "the start check ran with the node's disk size");
    assert.deepEqual(fs.readdirSync(path.join(snapDir, 'layer')), [], 'files beside the checkpoint of a started snapshot on a root image');

    const a = await create({}, alias);
    const b = await create({}, alias);
    const token = await run(a, 'cat /tmp/start-token');
    assert.match(token, /^[0-9a-f]{16}$/);
    assert.equal(await run(b, 'cat /tmp/start-token'), token, 'the start command ran again instead of being restored');
    for (const s of [a, b]) {
      assert.equal(bootRecord(s.sandboxId).runtime.RootImage, path.join(srv.dataDir, meta.rootImage), 'a sandbox of the started template is on its image');
      assert.deepEqual(await runscNames(srv.dataDir, s.sandboxId), ['runsc-sandbox'], 'runsc processes of a restored sandbox on a root image');
      const pid = await run(s, 'cat /tmp/start-pid');
      assert.equal(await run(s, `cat /proc/${pid}/cmdline | tr '\\0' ' '`), 'sleep infinity', 'the started process is running');
    }
    // Each sandbox writes its own disk, of the node's size.
    await a.files.write('/tmp/mine', 'a');
    assert.equal(await run(b, 'cat /tmp/mine 2>/dev/null || echo none'), 'none');
    assert.equal(Number((await run(a, 'df -k / | tail -1')).split(/\s+/)[1]), DISK_MB * 1024);
    assert.equal(await a.pause(), true);
    const back = await Sandbox.connect(a.sandboxId, srv.sdkOpts);
    assert.equal(await run(back, 'cat /tmp/mine'), 'a');

    // runsc restores a checkpoint only with the root size it was taken with: after the node's
    // disk size changed, a create runs the start command itself, on the template's image.
    const saved = [...srv.extraArgs];
    try {
      srv.extraArgs = [...saved.filter((x, i) => x !== '--sandbox-disk-mb' && saved[i - 1] !== '--sandbox-disk-mb'), '--sandbox-disk-mb', String(DISK_MB * 2)];
      await srv.restart();
      const c = await create({}, alias);
      assert.match(await run(c, 'cat /tmp/start-token'), /^[0-9a-f]{16}$/);
      assert.notEqual(await run(c, 'cat /tmp/start-token'), token, 'a sandbox of another disk size was restored from the snapshot');
      assert.equal(Number((await run(c, 'df -k / | tail -1')).split(/\s+/)[1]), DISK_MB * 2 * 1024, 'the disk of a sandbox that ran the start command');
    } finally {
      srv.extraArgs = saved;
      await srv.restart();
    }
  });

  srv.test('a sandbox with a volume boots from an overlay, with a gofer for its mounts', async () => {
    const vol = await Volume.create(`${RUN}-vol`, srv.sdkOpts);
    vols.push(vol);
    const s = await create({ volumeMounts: { '/mnt/v': vol } });
    assert.ok(!onImage(s.sandboxId), 'a sandbox with a volume booted from a root image');
    assert.ok((await runscNames(srv.dataDir, s.sandboxId)).includes('runsc-gofer'));
    await s.files.write('/mnt/v/x.txt', 'on the volume');
    assert.equal(await s.files.read('/mnt/v/x.txt'), 'on the volume');
  });
});
