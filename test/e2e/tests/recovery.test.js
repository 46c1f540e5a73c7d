// Restart recovery: `kill -9` of `vmon serve` during activity, restart on the
// same data dir; live sandboxes come back usable with their files and
// processes, a sandbox whose runtime died meanwhile is reported gone, and once
// everything is killed and the server stopped nothing is left on the host.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe } from 'node:test';
import { Sandbox, SandboxNotFoundError } from 'e2b';
import { useServer, runId, listAll, killQuietly, waitFor, sleep, dataDir, pgrep, runtimeIdOf, waitSandboxGone, vmonMountinfo, apiFetch, getInfoRecovered } from '../lib/harness.js';

// Hooks live inside describe(): Node 20 does not await root-level hooks in order.
describe('restart recovery', () => {
  const RUN = runId('recovery');
  const live = []; // { sbx, content, tickPid }
  let doomed; // sandbox whose runtime we kill while the server is down
  let hostBaseline;


  // Runtime ids are read before the server is killed: a warm-pool sandbox runs under the id it was
  // pre-started with (see runtimeIdOf).
  const runtimeIds = new Map();
  function rememberRuntimeIds() {
    for (const id of [...live.map((l) => l.sbx.sandboxId), doomed.sandboxId]) runtimeIds.set(id, runtimeIdOf(srv.dataDir, id));
  }
  const rid = (id) => runtimeIds.get(id) ?? id;

  function cmdline(pid) {
    try {
      return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
    } catch {
      return '(gone)';
    }
  }

  // The host's mounts under `dir`, or those of another table (vmon serve's namespace). vmon serve
  // keeps its mounts in a namespace of its own pinned at <dir>/mntns/mnt, which outlives it as its
  // sandboxes do: that pin is all the host's table may hold of it.
  function mountsUnder(dir, table = fs.readFileSync('/proc/self/mountinfo', 'utf8')) {
    return table
      .split('\n')
      .filter((l) => l.includes(dir))
      .filter((l) => !l.includes(path.join(dir, 'mntns')));
  }

  // This data dir's namespaces only (vmon-net-<scope>-<N>, scope from the data dir's path):
  // other vmon servers on the host keep theirs in the same /run/netns.
  const netnsScope = crypto.createHash('sha256').update(path.resolve(dataDir())).digest('hex').slice(0, 6);
  function netnsEntries() {
    try {
      return fs.readdirSync('/run/netns').filter((n) => n.startsWith(`vmon-net-${netnsScope}-`));
    } catch (err) {
      if (err.code === 'ENOENT') return [];
      throw err;
    }
  }

  /** Paths under `dir` whose name contains one of `ids`, with their type. */
  function pathsWithIds(dir, ids) {
    const found = [];
    const walk = (d, depth) => {
      let entries;
      try {
        entries = fs.readdirSync(d, { withFileTypes: true });
      } catch {
        return;
      }
      for (const e of entries) {
        const p = path.join(d, e.name);
        const type = e.isDirectory() ? 'dir' : e.isSocket() ? 'socket' : e.isFile() ? 'file' : e.isSymbolicLink() ? 'symlink' : 'other';
        if (ids.some((id) => e.name.includes(id))) found.push({ path: p, type });
        if (e.isDirectory() && depth < 8) walk(p, depth + 1);
      }
    };
    walk(dir, 0);
    return found;
  }

  // Registered before useServer(): the baseline is taken before the server
  // starts, and leftovers are killed before it stops (hooks run in order).
  before(async () => {
    // What the host had before this file's server and sandboxes existed
    // (earlier files' leftovers are theirs to answer for).
    hostBaseline = {
      netns: netnsEntries(),
      mounts: mountsUnder(dataDir()),
      vmonMounts: mountsUnder(dataDir(), vmonMountinfo(dataDir())),
      runsc: await pgrep('runsc'),
    };
  });

  after(async () => {
    if (srv.proc) await killQuietly(srv.sdkOpts, ...live.map((l) => l.sbx), doomed, ...forked);
  });

  const srv = useServer({ name: 'recovery' });

  srv.test('sandboxes survive kill -9 of the server and a restart', async () => {
    for (const n of ['1', '2']) {
      const sbx = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 900_000, metadata: { run: RUN, n } });
      const content = `persist-${n}-${RUN}`;
      await sbx.files.write('/home/user/persist.txt', content);
      await sbx.commands.run(`echo ${content}-viacmd > /tmp/persist-cmd.txt`);
      // A long background process that leaves a trail we can check later.
      const tick = await sbx.commands.run('while true; do date +%s%N >> /home/user/ticks; sleep 0.2; done', {
        background: true,
        timeoutMs: 0,
      });
      live.push({ sbx, content, tickPid: tick.pid, tick });
    }
    doomed = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 900_000, metadata: { run: RUN, n: 'doomed' } });
    const infoBefore = new Map();
    for (const { sbx } of live) infoBefore.set(sbx.sandboxId, await sbx.getInfo());

    // "During activity": a streaming command is in flight on sandbox 1 and an
    // upload is running on sandbox 2 when the server dies.
    const streaming = live[0].sbx.commands.run('for i in $(seq 1 100); do echo s$i; sleep 0.1; done', { timeoutMs: 0 });
    const streamingDone = streaming.then(
      () => 'resolved',
      (err) => err,
    );
    const upload = live[1].sbx.files
      .write('/home/user/during.bin', new Blob([new Uint8Array(8 * 1024 * 1024)]))
      .then(
        () => 'resolved',
        (err) => err,
      );
    await sleep(300);

    rememberRuntimeIds();
    const runtimePids = await pgrep(rid(doomed.sandboxId));
    await srv.kill9();
    // Background handles lose their stream with the server; that is expected.
    for (const l of live) l.tick.wait().catch(() => {});
    const streamResult = await streamingDone;
    await upload;
    assert.notEqual(streamResult, 'resolved', 'a command streaming through a killed server cannot complete normally');

    // The sandbox processes do not depend on the server process.
    for (const { sbx } of live) {
      assert.ok((await pgrep(rid(sbx.sandboxId))).length > 0, `runtime processes of ${sbx.sandboxId} survive the server's SIGKILL`);
    }

    // Kill the doomed sandbox's runtime while the server is down.
    assert.ok(runtimePids.length > 0, `found runtime processes for ${doomed.sandboxId} (pgrep -f <id>)`);
    for (const pid of runtimePids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch (err) {
        if (err.code !== 'ESRCH') throw err;
      }
    }
    await waitFor(async () => (await pgrep(rid(doomed.sandboxId))).length === 0, {
      timeoutMs: 10_000,
      what: `runtime of ${doomed.sandboxId} to die`,
    });

    await srv.restart();

    for (const { sbx, content, tickPid } of live) {
      const id = sbx.sandboxId;
      // Recovery settles sandboxes behind the API: until then they answer 503.
      const info = await getInfoRecovered(id, srv.sdkOpts);
      assert.equal(info.state, 'running', `${id} is running after restart`);
      assert.deepEqual(info.metadata, infoBefore.get(id).metadata, 'metadata kept');
      assert.ok(Math.abs(info.endAt - infoBefore.get(id).endAt) <= 1000, `expiry kept: ${info.endAt.toISOString()}`);

      const again = await Sandbox.connect(id, srv.sdkOpts);
      assert.equal(await again.files.read('/home/user/persist.txt'), content, 'file written before the crash');
      assert.equal((await again.commands.run('cat /tmp/persist-cmd.txt')).stdout, `${content}-viacmd\n`);

      const procs = await again.commands.list();
      assert.ok(
        procs.some((p) => p.pid === tickPid),
        `background process ${tickPid} still listed after restart: ${JSON.stringify(procs)}`,
      );
      const count = async () => Number((await again.commands.run('wc -l < /home/user/ticks')).stdout.trim());
      const c1 = await count();
      await sleep(1200);
      const c2 = await count();
      assert.ok(c2 > c1, `background process still running (ticks ${c1} → ${c2})`);

      // New work is fine too.
      assert.equal((await again.commands.run('echo after-restart')).stdout, 'after-restart\n');
    }

    // The sandbox whose runtime died is reported gone, not running (allow the
    // server a moment in case it reconciles just after answering /health).
    await waitSandboxGone(srv.sdkOpts, doomed.sandboxId, `${doomed.sandboxId}, whose runtime died while the server was down, to be reported gone`);
    await assert.rejects(Sandbox.connect(doomed.sandboxId, srv.sdkOpts), SandboxNotFoundError);
    const listed = await listAll(srv.sdkOpts, { metadata: { run: RUN } });
    assert.deepEqual(
      listed.map((s) => s.sandboxId).sort(),
      live.map((l) => l.sbx.sandboxId).sort(),
      'only the live sandboxes are listed',
    );
    assert.equal(await Sandbox.kill(doomed.sandboxId, srv.sdkOpts), false);
  });

  // The pid of a process whose command line holds every one of `parts`, or 0.
  function findProcess(...parts) {
    for (const pid of fs.readdirSync('/proc')) {
      if (!/^\d+$/.test(pid)) continue;
      const cl = cmdline(pid);
      if (parts.every((p) => cl.includes(p))) return Number(pid);
    }
    return 0;
  }

  // kill -9 of the server while a fork checkpoints its source, and again once that checkpoint is
  // written: after the restart the source runs as before, with the processes and memory it had,
  // and the API answers at once, with 503 for the source until it is back.
  const forked = [];
  srv.test('kill -9 during a fork: the source comes back running with its memory; recovery does not hold the API', async () => {
    for (const when of ['while checkpointing', 'once checkpointed']) {
      const sbx = await Sandbox.create({ ...srv.sdkOpts, timeoutMs: 900_000, metadata: { run: RUN, n: `fork ${when}` } });
      forked.push(sbx);
      // A process only a checkpoint keeps (no start command would bring it back), holding a secret
      // in its memory and counting.
      await sbx.commands.run(
        `python3 -c "import os,time,secrets
s=secrets.token_hex(8); n=0
while True:
  n+=1; open('/tmp/py.new','w').write(f'{os.getpid()} {s} {n}'); os.rename('/tmp/py.new','/tmp/py'); time.sleep(0.1)"`,
        { background: true, timeoutMs: 0 },
      );
      const state = async (s) => (await s.commands.run('cat /tmp/py 2>/dev/null || true')).stdout.trim().split(' ');
      await waitFor(async () => (await state(sbx)).length === 3, { what: 'python to start counting' });
      const [pid, secret] = await state(sbx);
      const runtimeId = runtimeIdOf(srv.dataDir, sbx.sandboxId);

      const fork = apiFetch(srv, `/sandboxes/${sbx.sandboxId}/fork`, { method: 'POST', body: '{"count":1}' }).catch((err) => err);
      const pausedDir = path.join(srv.dataDir, 'paused');
      const checkpointed = () =>
        fs.existsSync(pausedDir) &&
        fs.readdirSync(pausedDir).some((d) => d.startsWith(`.tmp-${sbx.sandboxId}-`) && fs.existsSync(path.join(pausedDir, d, 'checkpoint', 'complete')));
      if (when === 'while checkpointing') {
        await waitFor(() => findProcess('checkpoint', runtimeId) !== 0, { intervalMs: 5, timeoutMs: 30_000, what: 'the fork\'s checkpoint to start' });
      } else {
        await waitFor(checkpointed, { intervalMs: 5, timeoutMs: 60_000, what: 'the fork\'s checkpoint to be written' });
      }
      const phase = findProcess('checkpoint', runtimeId) ? 'checkpoint running' : checkpointed() ? 'checkpoint written' : 'checkpoint not seen';
      await srv.kill9();
      await fork;
      console.log(`# kill -9 ${when}: ${phase} at the kill`);

      const began = Date.now();
      await srv.restart();
      const ready = Date.now() - began;
      const first = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}`);
      console.log(`# restart to /health ${ready} ms; the source's first answer: ${first.status}`);
      assert.ok([200, 503].includes(first.status), `GET of a recovering sandbox answered ${first.status}: ${first.text}`);
      if (first.status === 503) assert.match(first.json?.message ?? '', /recover/, 'a 503 says the sandbox is being recovered');
      await waitFor(async () => (await apiFetch(srv, `/sandboxes/${sbx.sandboxId}`)).json?.state === 'running', {
        timeoutMs: 120_000,
        intervalMs: 200,
        what: `${sbx.sandboxId} to be running again after the restart`,
      });
      console.log(`# the source was running again ${Date.now() - began} ms after the restart began`);

      // Running as before: the same python, with its secret, still counting.
      const again = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
      const [pid2, secret2, n2] = await state(again);
      assert.deepEqual([pid2, secret2], [pid, secret], 'the source lost its processes or memory');
      await sleep(500);
      assert.ok(Number((await state(again))[2]) > Number(n2), 'the source\'s process stopped counting');
      assert.equal((await again.commands.run('echo fine')).stdout, 'fine\n');
    }
    for (const sbx of forked) assert.equal(await Sandbox.kill(sbx.sandboxId, srv.sdkOpts), true);
  });

  srv.test('after killing everything and stopping the server nothing is left', async () => {
    assert.equal(live.length, 2, 'needs the sandboxes of the previous test');
    for (const { sbx } of live) assert.equal(await Sandbox.kill(sbx.sandboxId, srv.sdkOpts), true);
    assert.deepEqual(await listAll(srv.sdkOpts, { metadata: { run: RUN } }), []);
    const apiIds = [...live.map((l) => l.sbx.sandboxId), doomed.sandboxId];
    const ids = [...new Set([...apiIds, ...apiIds.map(rid)])];

    await srv.stop();

    for (const id of ids) {
      const pids = await pgrep(id);
      assert.deepEqual(pids.map((p) => `${p}: ${cmdline(p)}`), [], `no processes for ${id}`);
    }
    // Only runsc processes of this data dir: other vmon instances may run on the same host.
    const runsc = (await pgrep('runsc'))
      .filter((p) => !hostBaseline.runsc.includes(p))
      .filter((p) => cmdline(p).includes(srv.dataDir));
    assert.deepEqual(runsc.map((p) => `${p}: ${cmdline(p)}`), [], 'no runsc processes started by this file remain');

    // Nothing of vmon's reaches the host's table (not even runsc's null-netns).
    const mounts = mountsUnder(srv.dataDir);
    const newMounts = mounts.filter((m) => !hostBaseline.mounts.includes(m));
    assert.deepEqual(newMounts, [], `no new mounts under ${srv.dataDir} in the host's namespace`);
    // And in vmon's own namespace, nothing of a sandbox is left.
    const vmonTable = vmonMountinfo(srv.dataDir);
    assert.ok(vmonTable.includes(' - '), 'no mount table read from vmon serve\'s namespace');
    const vmonMounts = mountsUnder(srv.dataDir, vmonTable);
    const newSandboxMounts = vmonMounts.filter((m) => !hostBaseline.vmonMounts.includes(m) && m.includes(path.join(srv.dataDir, 'sandboxes')));
    assert.deepEqual(newSandboxMounts, [], `no new sandbox mounts under ${srv.dataDir} in vmon's namespace`);
    assert.deepEqual(vmonMounts.filter((m) => ids.some((id) => m.includes(id))), [], 'no mounts for these sandboxes');

    const netns = netnsEntries();
    assert.deepEqual(netns.filter((n) => !hostBaseline.netns.includes(n)), [], 'no new /run/netns/vmon-* entries');
    assert.deepEqual(netns.filter((n) => ids.some((id) => n.includes(id))), [], 'no netns named for these sandboxes');

    // Regular files (logs, records) may stay; directories and sockets of a
    // killed sandbox may not.
    // A sandbox's log stays for --sandbox-log-retention after it ended, by design.
    const leftovers = pathsWithIds(srv.dataDir, ids)
      .filter((p) => p.type !== 'file')
      .filter((p) => !p.path.startsWith(path.join(srv.dataDir, 'sandbox-logs') + path.sep));
    assert.deepEqual(leftovers, [], 'no directories or sockets left for killed sandboxes');
  });
});
