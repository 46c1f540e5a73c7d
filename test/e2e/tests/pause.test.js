// Stateful sandboxes through the official SDK: pause and resume keep memory, processes, files and
// listening sockets across any number of cycles; a filesystem-only pause keeps files and boots
// afresh; lifecycle onTimeout 'pause' and autoResume; a paused sandbox holds no runtime, link or
// memory; a node restart while paused, a damaged snapshot, the snapshot disk budget, and
// `kill -9` of the node in the middle of a pause or resume leave every sandbox running or paused.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe } from 'node:test';
import { Sandbox, SandboxNotFoundError, InvalidArgumentError } from 'e2b';
import { useServer, killQuietly, waitFor, sleep, runtimeIdOf, runVmon, apiFetch, pgrep, listAll, vmonBin, templateState, vmonMountinfo, runChild, getInfoRecovered } from '../lib/harness.js';

// Written through a rename: a read never sees the file truncated and empty.
const COUNTER = 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv -f /tmp/count.new /tmp/count; sleep 0.05; done';
// A python process holding a variable only in its memory, publishing it and its pid.
const PY_HOLDER = `python3 -c "
import os, time
state = {'n': 0, 'secret': os.urandom(8).hex()}
while True:
    state['n'] += 1
    open('/tmp/py.tmp', 'w').write('%d %s %d' % (os.getpid(), state['secret'], state['n']))
    os.replace('/tmp/py.tmp', '/tmp/py')
    time.sleep(0.05)
"`;
const SERVER = 'python3 -m http.server 8080 --bind 0.0.0.0 --directory /home/user/www';

/** The helpers of a pause suite over server srv; created collects its sandboxes. */
function pauseHelpers(srv, created) {
  async function create(opts = {}) {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000, ...opts });
    created.push(sbx);
    return sbx;
  }

  async function run(sbx, cmd) {
    return (await sbx.commands.run(cmd, { user: 'root' })).stdout.trim();
  }

  async function guestGet(id, pathname, port = 8080) {
    const res = await fetch(`${srv.apiUrl}${pathname}`, {
      headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': String(port) },
      signal: AbortSignal.timeout(30_000),
    });
    return { status: res.status, text: await res.text() };
  }

  // A pause answers once the sandbox stopped with its memory saved; its snapshot is then written
  // to disk in the background.
  async function pausedOnDisk(id) {
    await waitFor(() => fs.existsSync(path.join(srv.dataDir, 'paused', id, 'meta.json')), {
      timeoutMs: 60_000,
      what: `the snapshot of paused sandbox ${id}`,
    });
  }

  // A paused sandbox holds no runsc process, no sandbox directory (so no mount, no link) and no
  // memory; its snapshot is on disk.
  async function holdsNothing(id, rid) {
    await pausedOnDisk(id);
    assert.deepEqual(await pgrep(`runsc.* ${rid}$`), [], 'runsc processes of a paused sandbox');
    assert.ok(!fs.existsSync(path.join(srv.dataDir, 'sandboxes', rid)), 'a paused sandbox kept its directory');
    const mounts = vmonMountinfo(srv.dataDir);
    assert.ok(mounts.includes(' - '), 'no mount table read from vmon serve\'s namespace');
    assert.ok(!mounts.includes(path.join(srv.dataDir, 'sandboxes', rid)), 'a paused sandbox kept a mount');
    assert.ok(fs.existsSync(path.join(srv.dataDir, 'paused', id, 'meta.json')), 'no snapshot for a paused sandbox');
  }
  return { create, run, guestGet, pausedOnDisk, holdsNothing };
}

describe('pause and resume', () => {
  const srv = useServer({ name: 'pause', args: ['--sandbox-disk-mb', '512'] });
  const created = [];
  srv.after(async () => killQuietly(srv.sdkOpts, ...created));

  const { create, run, guestGet, pausedOnDisk, holdsNothing } = pauseHelpers(srv, created);

  srv.test('ten pause/resume cycles keep files, processes, memory and listening sockets', async () => {
    const sbx = await create();
    const id = sbx.sandboxId;
    const rid = runtimeIdOf(srv.dataDir, id); // a warm-pool sandbox runs under its pre-start id
    const bootId = await run(sbx, 'cat /proc/sys/kernel/random/boot_id');
    await sbx.files.write('/home/user/www/index.html', 'served from the guest');
    await sbx.commands.run(COUNTER, { background: true });
    await sbx.commands.run(PY_HOLDER, { background: true });
    await sbx.commands.run(SERVER, { background: true });
    await sbx.commands.run('cd /tmp && export PAUSE_ENV=kept && exec sleep 100000', { background: true, cwd: '/tmp' });
    await waitFor(async () => (await guestGet(id, '/index.html')).status === 200, { timeoutMs: 20_000, what: 'the guest server' });
    const [pyPid, secret] = (await run(sbx, 'cat /tmp/py')).split(' ');
    const sleepPid = await run(sbx, 'pgrep -x sleep | head -1');
    let count = 0;
    let pyN = 0;
    for (let cycle = 0; cycle < 10; cycle++) {
      await sbx.files.write(`/home/user/cycle-${cycle}.txt`, `written before pause ${cycle}`);
      assert.equal(await sbx.pause(), true, `pause ${cycle}`);
      assert.equal(await sbx.pause(), false, 'a second pause reports "already paused" (409)');
      const info = await Sandbox.getInfo(id, srv.sdkOpts);
      assert.equal(info.state, 'paused');
      if (cycle === 0) {
        await holdsNothing(id, rid);
        const paused = await listAll(srv.sdkOpts, { state: ['paused'] });
        assert.ok(paused.some((s) => s.sandboxId === id && s.state === 'paused'), 'listed with state=paused');
        const running = await listAll(srv.sdkOpts, { state: ['running'] });
        assert.ok(!running.some((s) => s.sandboxId === id), 'a paused sandbox is not listed as running');
        assert.equal((await guestGet(id, '/index.html')).status, 502, 'ingress to a paused sandbox without autoResume');
      }
      const res = await apiFetch(srv, `/v2/sandboxes/${id}/connect`, { method: 'POST', body: '{"timeout":600}' });
      assert.equal(res.status, 201, `connect of a paused sandbox answers 201: ${res.text}`);
      const again = await apiFetch(srv, `/v2/sandboxes/${id}/connect`, { method: 'POST', body: '{"timeout":600}' });
      assert.equal(again.status, 200, 'connect of a running sandbox answers 200');

      const c = Number(await run(sbx, 'cat /tmp/count'));
      assert.ok(c > count, `cycle ${cycle}: counter at ${c}, was ${count} (stopped?)`);
      const [pid2, secret2, n2] = (await run(sbx, 'cat /tmp/py')).split(' ');
      assert.equal(pid2, pyPid, `cycle ${cycle}: the python process was restarted`);
      assert.equal(secret2, secret, `cycle ${cycle}: the python process lost its memory`);
      assert.ok(Number(n2) > pyN, `cycle ${cycle}: python counter did not go on`);
      count = c;
      pyN = Number(n2);
      const page = await guestGet(id, '/index.html');
      assert.deepEqual(page, { status: 200, text: 'served from the guest' }, `cycle ${cycle}: guest server through ingress`);
    }
    for (let cycle = 0; cycle < 10; cycle++) {
      assert.equal(await sbx.files.read(`/home/user/cycle-${cycle}.txt`), `written before pause ${cycle}`);
    }
    assert.equal(await run(sbx, 'cat /proc/sys/kernel/random/boot_id'), bootId, 'boot_id changed across memory resumes');
    assert.equal(await run(sbx, `cat /proc/${sleepPid}/environ | tr '\\0' '\\n' | grep PAUSE_ENV`), 'PAUSE_ENV=kept');
    assert.equal(await run(sbx, `readlink /proc/${sleepPid}/cwd`), '/tmp');
    // The guest clock follows the host's, not the time spent paused.
    const guestNow = Number(await run(sbx, 'date +%s'));
    assert.ok(Math.abs(guestNow - Date.now() / 1000) < 5, `guest clock ${guestNow} vs host ${Date.now() / 1000}`);
    // Still an ordinary sandbox: kill works and leaves no snapshot.
    assert.equal(await sbx.kill(), true);
    assert.ok(!fs.existsSync(path.join(srv.dataDir, 'paused', id)));
  });


  srv.test('lifecycle: pause at expiry, resume by connect or by an ingress request', async () => {
    const sbx = await create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: true } });
    const id = sbx.sandboxId;
    const info = await Sandbox.getInfo(id, srv.sdkOpts);
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true });
    await sbx.files.write('/home/user/www/hello.html', 'auto-resumed');
    await sbx.commands.run(SERVER, { background: true });
    await sbx.commands.run(COUNTER, { background: true });
    await waitFor(async () => (await Sandbox.getInfo(id, srv.sdkOpts)).state === 'paused', {
      timeoutMs: 30_000,
      what: 'the sandbox to pause at expiry',
    });
    await pausedOnDisk(id);
    const before = fs.readFileSync(path.join(srv.dataDir, 'paused', id, 'meta.json'), 'utf8');
    assert.match(before, /"memory": true/);
    // A request for a guest port resumes it, transparently.
    const page = await guestGet(id, '/hello.html');
    assert.deepEqual(page, { status: 200, text: 'auto-resumed' });
    assert.equal((await Sandbox.getInfo(id, srv.sdkOpts)).state, 'running');
    assert.ok(Number(await run(sbx, 'cat /tmp/count')) > 0);

    // keepMemory:false pauses at expiry too; connect resumes it, traffic does not.
    const fsOnly = await create({ timeoutMs: 3_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } });
    await fsOnly.files.write('/home/user/f.txt', 'files only');
    await waitFor(async () => (await Sandbox.getInfo(fsOnly.sandboxId, srv.sdkOpts)).state === 'paused', {
      timeoutMs: 30_000,
      what: 'the filesystem-only sandbox to pause at expiry',
    });
    assert.equal((await guestGet(fsOnly.sandboxId, '/', 49983)).status, 502, 'traffic must not resume a filesystem-only pause');
    const back = await Sandbox.connect(fsOnly.sandboxId, { ...srv.sdkOpts, timeoutMs: 600_000 });
    assert.equal(await back.files.read('/home/user/f.txt'), 'files only');

    // The server refuses what the SDK refuses client-side, for other clients.
    const bad = await apiFetch(srv, '/v2/sandboxes', {
      method: 'POST',
      body: JSON.stringify({ templateID: 'base', autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } }),
    });
    assert.equal(bad.status, 400, bad.text);
    await assert.rejects(
      Sandbox.create({ ...srv.sdkOpts, lifecycle: { onTimeout: { action: 'pause', keepMemory: false }, autoResume: true } }),
      InvalidArgumentError,
    );
  });

  // A command streaming when its sandbox is paused ends with the reason, not as if the sandbox
  // had died ("The sandbox was killed"); after the resume the same process is reached again.
  srv.test('a command stream cut by a pause says the sandbox was paused; the process is reached after resume', async () => {
    const sbx = await create();
    const handle = await sbx.commands.run('for i in $(seq 1 600); do echo tick $i; sleep 0.1; done', { background: true, timeoutMs: 0 });
    await waitFor(() => handle.stdout.includes('tick 3'), { what: 'the command to stream' });
    const ended = handle.wait().then(
      () => null,
      (err) => err,
    );
    assert.equal(await sbx.pause(), true);
    const err = await ended;
    assert.ok(err, 'the stream of a paused sandbox ended without an error');
    assert.match(err.message, /the sandbox was paused: process \d+ keeps its state/, `stream error: ${err.message}`);
    assert.doesNotMatch(err.message, /killed/);
    const back = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
    const again = await back.commands.connect(handle.pid);
    const before = again.stdout.length;
    await waitFor(() => again.stdout.length > before && /tick \d+/.test(again.stdout), { what: 'the same process to stream after the resume' });
    assert.equal(await again.kill(), true);
  });

  srv.test('unknown, killed and paused sandboxes answer as E2B does', async () => {
    await assert.rejects(Sandbox.connect('nosuchsandbox0000000', srv.sdkOpts), SandboxNotFoundError);
    await assert.rejects(Sandbox.pause('nosuchsandbox0000000', srv.sdkOpts), SandboxNotFoundError);
    const sbx = await create();
    assert.equal(await sbx.pause(), true);
    // A paused sandbox's timeout is stopped: setTimeout is refused until it runs again.
    const t = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}/timeout`, { method: 'POST', body: '{"timeout":60}' });
    assert.equal(t.status, 409, t.text);
    const r = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}/resume`, { method: 'POST', body: '{"timeout":60}' });
    assert.equal(r.status, 201, `deprecated /resume: ${r.text}`);
    const r2 = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}/resume`, { method: 'POST', body: '{}' });
    assert.equal(r2.status, 409, 'resume of a running sandbox');
    assert.equal(await sbx.pause(), true);
    assert.equal(await sbx.kill(), true, 'kill of a paused sandbox');
    assert.ok(!fs.existsSync(path.join(srv.dataDir, 'paused', sbx.sandboxId)), 'kill left the snapshot');
    await assert.rejects(Sandbox.connect(sbx.sandboxId, srv.sdkOpts), SandboxNotFoundError);
    await assert.rejects(sbx.pause(), SandboxNotFoundError);
  });

  srv.test('a damaged snapshot is refused and the sandbox stays paused', async () => {
    const sbx = await create();
    await sbx.files.write('/home/user/x.txt', 'x');
    assert.equal(await sbx.pause(), true);
    await pausedOnDisk(sbx.sandboxId);
    const dir = path.join(srv.dataDir, 'paused', sbx.sandboxId);
    const meta = JSON.parse(fs.readFileSync(path.join(dir, 'meta.json'), 'utf8'));
    const victim = meta.files.find((f) => f.path.startsWith('checkpoint/') && f.size > 4096);
    assert.ok(victim, `no checkpoint file to damage in ${JSON.stringify(meta.files)}`);
    const file = path.join(dir, victim.path);
    const fd = fs.openSync(file, 'r+');
    const byte = Buffer.alloc(1);
    fs.readSync(fd, byte, 0, 1, 100);
    byte[0] ^= 0xff;
    fs.writeSync(fd, byte, 0, 1, 100);
    fs.closeSync(fd);
    const res = await apiFetch(srv, `/v2/sandboxes/${sbx.sandboxId}/connect`, { method: 'POST', body: '{}' });
    assert.equal(res.status, 500, res.text);
    assert.match(res.json.message, /damaged/);
    assert.equal((await getInfoRecovered(sbx.sandboxId, srv.sdkOpts)).state, 'paused');
    assert.ok(!fs.existsSync(path.join(srv.dataDir, 'sandboxes', sbx.sandboxId)), 'a refused resume left a sandbox directory');
    assert.deepEqual(await pgrep(`runsc.* ${sbx.sandboxId}$`), []);
    // Repaired, it resumes with its files.
    byte[0] ^= 0xff;
    const fd2 = fs.openSync(file, 'r+');
    fs.writeSync(fd2, byte, 0, 1, 100);
    fs.closeSync(fd2);
    const back = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
    assert.equal(await back.files.read('/home/user/x.txt'), 'x');
  });



  srv.test('resume after a node restart while paused', async () => {
    const sbx = await create();
    await sbx.commands.run(COUNTER, { background: true });
    await sbx.files.write('/home/user/r.txt', 'across restart');
    await sleep(300);
    assert.equal(await sbx.pause(), true);
    await srv.kill9();
    await srv.restart();
    assert.equal((await getInfoRecovered(sbx.sandboxId, srv.sdkOpts)).state, 'paused');
    const back = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
    assert.equal(await back.files.read('/home/user/r.txt'), 'across restart');
    const c1 = Number(await run(back, 'cat /tmp/count'));
    await sleep(300);
    assert.ok(Number(await run(back, 'cat /tmp/count')) > c1, 'the counter did not go on after a restart and resume');
    // A sandbox recovered as running can be paused again (its image record survived the restart).
    assert.equal(await back.pause(), true);
    assert.equal((await Sandbox.connect(sbx.sandboxId, srv.sdkOpts)).sandboxId, sbx.sandboxId);
  });

  srv.test('kill -9 of the node during pause or resume leaves every sandbox running or paused', async () => {
    for (const [op, delayMs] of [['pause', 0], ['pause', 60], ['pause', 150], ['resume', 0], ['resume', 100], ['resume', 250]]) {
      const sbx = await create();
      await sbx.files.write('/home/user/crash.txt', `${op}-${delayMs}`);
      await sbx.commands.run(COUNTER, { background: true });
      if (op === 'resume') assert.equal(await sbx.pause(), true);
      const call =
        op === 'pause'
          ? apiFetch(srv, `/sandboxes/${sbx.sandboxId}/pause`, { method: 'POST', body: '{}' })
          : apiFetch(srv, `/v2/sandboxes/${sbx.sandboxId}/connect`, { method: 'POST', body: '{}' });
      call.catch(() => {});
      await sleep(delayMs);
      await srv.kill9();
      await srv.restart();
      const state = (await getInfoRecovered(sbx.sandboxId, srv.sdkOpts)).state;
      assert.ok(state === 'running' || state === 'paused', `${op} +${delayMs} ms: state ${state}`);
      // Whatever it became, it works: connect resumes it if needed and its files are there.
      const back = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
      assert.equal(await back.files.read('/home/user/crash.txt'), `${op}-${delayMs}`, `${op} +${delayMs} ms (${state})`);
      // Nothing left that no record owns: no unfinished snapshot, no stray runtime.
      const pausedDir = path.join(srv.dataDir, 'paused');
      const leftovers = fs.existsSync(pausedDir) ? fs.readdirSync(pausedDir).filter((n) => n.startsWith('.tmp-')) : [];
      assert.deepEqual(leftovers, [], 'unfinished snapshot directories');
      assert.equal((await pgrep(`runsc.* ${runtimeIdOf(srv.dataDir, sbx.sandboxId)}$`)).length > 0, true, 'the running sandbox has its runtime');
      await back.kill();
    }
    const { stdout } = await runVmon(['sandbox', 'ls', '--data-dir', srv.dataDir]);
    assert.doesNotMatch(stdout, /creating/, `no sandbox left half-created:\n${stdout}`);
  });

  // A checkpoint holds envd's process, whose code is mapped from the host again at every restore:
  // an upgrade that replaced the binary in place would crash every paused sandbox on resume.
  srv.test('a paused sandbox resumes with its memory after envd is upgraded; old builds go once unused', async () => {
    // The envd builds in the data dir, by the sha256 of their binary.
    const envdBuilds = () =>
      fs.readdirSync(path.join(srv.dataDir, 'envd')).map((d) =>
        crypto.createHash('sha256').update(fs.readFileSync(path.join(srv.dataDir, 'envd', d, 'envd'))).digest('hex'));
    let upgradedSum;
    const sbx = await create();
    await sbx.commands.run(COUNTER, { background: true });
    await sleep(300);
    const oldSum = await run(sbx, 'sha256sum /opt/vmon/bin/envd | cut -c1-64');
    assert.equal(await sbx.pause(), true);
    await pausedOnDisk(sbx.sandboxId);
    await srv.stop({ cleanup: false });
    // Another build of envd: the same program with bytes appended (a different content hash).
    const upgraded = path.join(srv.dataDir, 'envd-upgraded');
    fs.copyFileSync(path.join(path.dirname(vmonBin()), 'envd'), upgraded);
    // Unique per run: an earlier run's template builds may still name the build it made.
    fs.appendFileSync(upgraded, Buffer.from(`\0vmon e2e upgrade marker ${crypto.randomUUID()}\0`));
    fs.chmodSync(upgraded, 0o755);
    // The code-interpreter service is installed with envd, from beside it.
    const service = path.join(path.dirname(vmonBin()), 'vmon-code-interpreter');
    if (fs.existsSync(service)) fs.copyFileSync(service, path.join(srv.dataDir, 'vmon-code-interpreter'));
    const saved = [...srv.extraArgs];
    // The server remakes code-interpreter-v1 for a new envd when the data dir has its rootfs. A
    // build saved started would keep the upgraded envd in use (template builds are kept, and
    // their started snapshots with them); saved unstarted, it leaves nothing on it.
    srv.extraArgs.push('--envd-path', upgraded, '--template-start-snapshots=false');
    try {
      await srv.start();
      const back = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
      const c1 = Number(await run(back, 'cat /tmp/count'));
      await sleep(300);
      assert.ok(Number(await run(back, 'cat /tmp/count')) > c1, 'the counter did not go on after the upgrade and resume');
      assert.equal(await run(back, 'sha256sum /opt/vmon/bin/envd | cut -c1-64'), oldSum, 'the resumed sandbox runs the envd it was paused with');
      const fresh = await create();
      const newSum = await run(fresh, 'sha256sum /opt/vmon/bin/envd | cut -c1-64');
      assert.notEqual(newSum, oldSum, 'a new sandbox runs the upgraded envd');
      const builds = envdBuilds();
      assert.ok(builds.includes(oldSum) && builds.includes(newSum), `both envd builds are kept while both are in use: ${builds}`);
      upgradedSum = newSum;
      await back.kill();
      await fresh.kill();
      // Its build sandbox runs the upgraded envd too: let the build end before the server stops.
      await waitFor(async () => !(await templateState(srv, 'code-interpreter-v1')).busy, {
        timeoutMs: 300_000, intervalMs: 500, what: 'the code-interpreter-v1 build on the upgraded envd to end',
      });
    } finally {
      srv.extraArgs.length = 0;
      srv.extraArgs.push(...saved);
      fs.rmSync(upgraded, { force: true });
      fs.rmSync(path.join(srv.dataDir, 'vmon-code-interpreter'), { force: true });
    }
    // With nothing on the upgraded build any more, the next start removes it and keeps its own
    // (and any other a snapshot of this data dir still needs).
    await srv.restart();
    const builds = envdBuilds();
    assert.ok(builds.includes(oldSum), `the running envd build is kept: ${builds}`);
    assert.ok(!builds.includes(upgradedSum), `an unused envd build was kept: ${builds}`);
  });
});

// What a pause does with a sandbox's files on the host, where it has some: on an overlay, the
// kind without a root image (--root-images=false; a sandbox with a volume).
describe('pause and resume on an overlay (--root-images=false)', () => {
  const srv = useServer({ name: 'pause-overlay', args: ['--sandbox-disk-mb', '512', '--root-images=false'] });
  const created = [];
  srv.after(async () => killQuietly(srv.sdkOpts, ...created));
  const { create, run, pausedOnDisk } = pauseHelpers(srv, created);

  srv.test('a filesystem-only pause keeps files and boots afresh', async () => {
    const sbx = await create();
    const bootId = await run(sbx, 'cat /proc/sys/kernel/random/boot_id');
    await sbx.files.write('/home/user/keep.txt', 'kept');
    await sbx.commands.run('echo sudo-written | sudo tee /etc/vmon-pause-test', { user: 'user' });
    await sbx.commands.run('sleep 100000', { background: true });
    assert.equal(await sbx.pause({ keepMemory: false }), true);
    const resumed = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
    assert.equal(await resumed.files.read('/home/user/keep.txt'), 'kept');
    assert.equal(await run(resumed, 'cat /etc/vmon-pause-test'), 'sudo-written');
    assert.equal(await run(resumed, 'pgrep -x sleep || echo none'), 'none', 'processes survived a filesystem-only pause');
    assert.notEqual(await run(resumed, 'cat /proc/sys/kernel/random/boot_id'), bootId, 'boot_id must change on a reboot');
    // onResume 'reboot' forces a fresh boot even when memory was kept.
    await run(resumed, 'sleep 100000 >/dev/null 2>&1 &');
    assert.equal(await resumed.pause(), true);
    const rebooted = await Sandbox.connect(sbx.sandboxId, { ...srv.sdkOpts, onResume: 'reboot' });
    assert.equal(await run(rebooted, 'pgrep -x sleep || echo none'), 'none');
    assert.equal(await rebooted.files.read('/home/user/keep.txt'), 'kept');
  });

  // A mount namespace made on the host while a sandbox runs (`unshare -m`, a service with
  // PrivateTmp, a container runtime) used to get a copy of the sandbox's disk mount: the disk
  // stayed mounted there after the pause's unmount, and ext4 wrote to the image when that copy
  // went, so every resume answered 500 "damaged". vmon serve's mounts are in a namespace of its
  // own, so the foreign namespace holds none of them.
  srv.test('a mount namespace made on the host while a sandbox runs is held across its pause and resume', async () => {
    const sbx = await create();
    const id = sbx.sandboxId;
    await sbx.files.write('/home/user/ns.txt', 'kept across a foreign namespace');
    await sbx.commands.run(PY_HOLDER, { background: true });
    await waitFor(async () => (await run(sbx, 'cat /tmp/py 2>/dev/null || true')) !== '', { what: 'the python holder' });
    const [pyPid, secret] = (await run(sbx, 'cat /tmp/py')).split(' ');
    const foreign = spawn('unshare', ['-m', '--propagation', 'private', 'sleep', '60'], { stdio: 'ignore' });
    const gone = new Promise((resolve) => foreign.on('exit', resolve));
    try {
      const own = fs.readlinkSync('/proc/self/ns/mnt');
      await waitFor(() => fs.readlinkSync(`/proc/${foreign.pid}/ns/mnt`) !== own && fs.readFileSync(`/proc/${foreign.pid}/comm`, 'utf8').trim() === 'sleep', {
        what: 'the foreign mount namespace',
      });
      const rid = runtimeIdOf(srv.dataDir, id);
      assert.ok(vmonMountinfo(srv.dataDir).includes(path.join(srv.dataDir, 'sandboxes', rid, 'disk')), 'the running sandbox\'s disk is not mounted in vmon\'s namespace');
      const foreignMounts = fs.readFileSync(`/proc/${foreign.pid}/mountinfo`, 'utf8');
      assert.ok(!foreignMounts.includes(path.join(srv.dataDir, 'sandboxes')), `the foreign namespace got vmon's mounts:\n${foreignMounts}`);

      assert.equal(await sbx.betaPause(), true, 'pause with the foreign namespace held');
      await pausedOnDisk(id);
      const back = await Sandbox.connect(id, srv.sdkOpts);
      assert.equal(await back.files.read('/home/user/ns.txt'), 'kept across a foreign namespace');
      const [pid2, secret2] = (await run(back, 'cat /tmp/py')).split(' ');
      assert.equal(pid2, pyPid, 'the python process was restarted');
      assert.equal(secret2, secret, 'the python process lost its memory');
      assert.ok(foreign.exitCode === null, 'the foreign namespace was held across the pause and resume');
    } finally {
      foreign.kill('SIGKILL');
      await gone;
    }
  });

  // Second line of defence: a mount of the sandbox's disk vmon cannot unmount (here a bind mount
  // made inside vmon serve's own namespace) makes a pause fail with the sandbox still running and
  // no snapshot written, instead of sealing an image that changes when that mount goes: refused
  // before the checkpoint when the mount is there first, and when it appears while the pause runs,
  // the sandbox goes on from the checkpoint just taken, memory and all.
  srv.test('a pause while the disk is mounted elsewhere fails and the sandbox keeps running', async () => {
    const sbx = await create();
    const id = sbx.sandboxId;
    const rid = runtimeIdOf(srv.dataDir, id);
    await sbx.files.write('/home/user/held.txt', 'held');
    await sbx.commands.run(COUNTER, { background: true });
    await sbx.commands.run(PY_HOLDER, { background: true });
    await waitFor(async () => (await run(sbx, 'cat /tmp/py 2>/dev/null || true')) !== '', { what: 'the python holder' });
    const [pyPid, secret] = (await run(sbx, 'cat /tmp/py')).split(' ');
    const pin = path.join(srv.dataDir, 'mntns', 'mnt');
    const holder = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-e2e-holder-'));
    const inVmon = (...argv) => runChild(['nsenter', `--mount=${pin}`, ...argv]);
    const hold = async () => {
      const r = await inVmon('mount', '--bind', path.join(srv.dataDir, 'sandboxes', rid, 'disk'), holder);
      assert.equal(r.code, 0, r.stderr);
    };
    const release = async () => {
      const r = await inVmon('umount', holder);
      assert.equal(r.code, 0, r.stderr);
    };
    const stillRunning = async (what) => {
      assert.equal((await Sandbox.getInfo(id, srv.sdkOpts)).state, 'running', what);
      const c1 = Number(await run(sbx, 'cat /tmp/count'));
      await sleep(300);
      assert.ok(Number(await run(sbx, 'cat /tmp/count')) > c1, `${what}: the sandbox stopped`);
      assert.equal(await sbx.files.read('/home/user/held.txt'), 'held', what);
      const [pid2, secret2] = (await run(sbx, 'cat /tmp/py')).split(' ');
      assert.equal(pid2, pyPid, `${what}: the python process was restarted`);
      assert.equal(secret2, secret, `${what}: the python process lost its memory`);
      const pausedDir = path.join(srv.dataDir, 'paused');
      const left = fs.existsSync(pausedDir) ? fs.readdirSync(pausedDir).filter((n) => n.includes(id)) : [];
      assert.deepEqual(left, [], `${what}: a refused pause left a snapshot`);
      assert.ok(!fs.existsSync(path.join(srv.dataDir, 'sandboxes', rid, 'pausing')), `${what}: a refused pause left its mark`);
    };
    try {
      await hold();
      const res = await apiFetch(srv, `/sandboxes/${id}/pause`, { method: 'POST', body: '{}' });
      assert.equal(res.status, 503, res.text);
      assert.match(res.json.message, /mounted outside the sandbox.*keeps running/);
      await assert.rejects(sbx.betaPause(), 'the SDK\'s pause reports the failure');
      await stillRunning('mounted before the pause');
      await release();

      // The mount appears while the pause runs. A checkpoint here takes some 100 ms (even with
      // hundreds of MiB of memory), so the mount is made at once: whether the check before the
      // checkpoint or the one after it sees the mount, the pause must fail and the sandbox go on
      // (a 100 ms delay let the whole pause finish first on a fast run, as CI saw).
      const pausing = apiFetch(srv, `/sandboxes/${id}/pause`, { method: 'POST', body: '{}' });
      await sleep(10);
      await hold();
      const res2 = await pausing;
      assert.equal(res2.status, 503, res2.text);
      await stillRunning('mounted during the pause');
    } finally {
      await inVmon('umount', holder);
      fs.rmdirSync(holder);
    }
    // Once that mount is gone it pauses and resumes as any other.
    assert.equal(await sbx.betaPause(), true);
    const back = await Sandbox.connect(id, srv.sdkOpts);
    assert.equal(await back.files.read('/home/user/held.txt'), 'held');
    assert.equal((await run(back, 'cat /tmp/py')).split(' ')[1], secret, 'memory after the pause that worked');
  });
});

describe('snapshot disk budget', () => {
  // Room for about one small paused sandbox.
  const srv = useServer({ name: 'pause-budget', args: ['--max-snapshot-disk', '200'] });
  const created = [];
  srv.after(async () => killQuietly(srv.sdkOpts, ...created));

  srv.test('a pause past --max-snapshot-disk answers 507 and the sandbox keeps running', async () => {
    const a = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000 });
    const b = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 600_000 });
    created.push(a, b);
    assert.equal(await a.pause({ keepMemory: false }), true, 'a small files-only pause fits');
    await waitFor(() => fs.existsSync(path.join(srv.dataDir, 'paused', a.sandboxId, 'meta.json')), { timeoutMs: 60_000, what: 'the first snapshot' });
    // b fills memory and disk beyond what is left.
    await b.commands.run('head -c 300M /dev/urandom > /home/user/big');
    const res = await apiFetch(srv, `/sandboxes/${b.sandboxId}/pause`, { method: 'POST', body: '{}' });
    assert.equal(res.status, 507, res.text);
    assert.match(res.json.message, /max-snapshot-disk/);
    assert.equal((await Sandbox.getInfo(b.sandboxId, srv.sdkOpts)).state, 'running');
    assert.equal((await b.commands.run('echo alive')).stdout.trim(), 'alive');
    const pausedDir = path.join(srv.dataDir, 'paused');
    assert.deepEqual(fs.readdirSync(pausedDir).filter((n) => n.startsWith('.tmp-')), [], 'half-written snapshot');
    assert.deepEqual(fs.readdirSync(pausedDir), [a.sandboxId]);
  });
});
