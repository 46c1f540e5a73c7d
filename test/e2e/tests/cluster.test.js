// A cluster on one machine (lib/cluster.js): `vmon serve --role driver` in the test's network
// namespace and nodes (`vmon serve --role node`), each in a network namespace of its own, joined
// to the driver through a bridge the test makes. The SDK talks to the driver alone, unchanged.
import { describe, before, after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Sandbox, Template, Volume } from 'e2b';
import { MiB, hashStream, randomStream } from '../lib/data.js';
import { DRIVER_IP, assertCameBack, holderIn, leaveTraces, lsJSON as clusterLs, startCluster, stopCluster } from '../lib/cluster.js';
import {
  apiFetch,
  handedOut,
  killQuietly,
  runVmon,
  runId,
  waitFor,
  withLogTail,
} from '../lib/harness.js';

/**
 * Sandbox sbx of cluster c is reached through the driver as a client reaches it: output streamed
 * as it comes, a file up and down (checked by digest), a watch event, a guest HTTP server.
 */
async function assertReachable(c, sbx) {
  const chunks = [];
  const r = await sbx.commands.run('for i in 1 2 3; do echo line $i; sleep 0.2; done', { onStdout: (d) => chunks.push(d) });
  assert.equal(r.stdout, 'line 1\nline 2\nline 3\n');
  assert.ok(chunks.length >= 2, `output came in ${chunks.length} chunk(s), not streamed`);
  const gen = randomStream(4 * MiB);
  await sbx.files.write('/tmp/blob', gen.stream);
  assert.deepEqual(await hashStream(await sbx.files.read('/tmp/blob', { format: 'stream' })), { bytes: 4 * MiB, sha256: gen.digest() });
  const events = [];
  const handle = await sbx.files.watchDir('/tmp', (e) => events.push(e), { timeoutMs: 0 });
  await sbx.files.write('/tmp/watched.txt', 'w');
  await waitFor(() => events.some((e) => e.name === 'watched.txt'), { what: 'a watch event through the driver' });
  await handle.stop();
  await sbx.files.write('/tmp/www/page.txt', `served by ${sbx.sandboxId}`);
  await sbx.commands.run('python3 -m http.server 8000 --directory /tmp/www >/dev/null 2>&1', { background: true });
  const res = await waitFor(async () => {
    const g = await fetch(`${c.driver.apiUrl}/page.txt`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } });
    return g.status === 200 ? g : null;
  }, { what: 'the guest HTTP server through the driver' });
  assert.equal(await res.text(), `served by ${sbx.sandboxId}`);
}

const NODES = [
  // Two sandboxes each: the third create must find the other node.
  { name: 'node-a', ip: '10.99.0.2', base: true, args: ['--max-sandboxes', '2'] },
  // node-b never had a base template (it fetches node-a's from the store) and enforces no
  // allowOut domains: it has no egress proxy.
  { name: 'node-b', ip: '10.99.0.3', args: ['--max-sandboxes', '2', '--egress-proxy-port', '0'] },
];

describe('cluster: one driver, two nodes', () => {
  const RUN = runId('cluster');
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-cluster-'));
  const storeDir = path.join(root, 'store');
  let cl;
  let driver;
  const nodes = [];
  const created = [];
  const sdk = () => driver.sdkOpts;
  /** `vmon sandbox ls --json` and `vmon node ls --json` on the driver's data dir. */
  const lsJSON = (...args) => clusterLs(cl, ...args);
  const DOMAIN_POLICY = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };
  /** Where the store keeps paused sandbox id. */
  const pausedRef = (id) => path.join(storeDir, 'refs', 'paused', `${id}.ref`);
  /** The node holding sandbox id, by what its data dir says. */
  const holder = (id) => holderIn(cl, id);

  before(async () => {
    cl = await startCluster(root, { nodes: NODES, driverArgs: ['--node-lost-grace', '15s'] });
    driver = cl.driver;
    nodes.push(...cl.nodes);
  });

  after(async () => {
    // Sandboxes outlive their node's process: they go through the driver first, and whatever a
    // failure left behind (runsc under these data dirs) is killed by stopCluster.
    if (driver?.apiKey) await killQuietly(sdk(), ...created).catch(() => {});
    await driver?.killAllSandboxes();
    await stopCluster(cl);
  });

  // A failure shows every member's log tail.
  const members = { logTail: () => [driver, ...nodes].filter(Boolean).map((s) => s.logTail(30)).join('\n') };
  const ctest = (name, fn) => test(name, withLogTail(members, fn));

  ctest('a sandbox runs on a node, reached through the driver: streamed output, 100 MiB both ways, file watch, a guest server', async () => {
    await waitFor(() => nodes.every((n) => n.tail.some((l) => /joined the cluster's gossip/.test(l))), {
      what: 'both nodes in the gossip',
    });
    const sbx = await waitFor(async () => Sandbox.create({ ...sdk(), metadata: { run: RUN } }), {
      timeoutMs: 30_000, what: 'a create through the driver',
    });
    created.push(sbx);
    assert.ok(holder(sbx.sandboxId), 'no node holds the sandbox');
    // node-b never had a base template: it fetched node-a's build from the store.
    const build = (n) => JSON.parse(fs.readFileSync(path.join(n.dataDir, 'templates', 'base', 'manifest.json'), 'utf8')).buildId;
    assert.equal(build(nodes[1]), build(nodes[0]));
    const chunks = [];
    const r = await sbx.commands.run('for i in 1 2 3; do echo line $i; sleep 0.2; done', { onStdout: (d) => chunks.push(d) });
    assert.equal(r.stdout, 'line 1\nline 2\nline 3\n');
    assert.ok(chunks.length >= 2, `output came in ${chunks.length} chunk(s), not streamed`);
    // 100 MiB up and down through driver and tunnel, streamed: the driver does not buffer it.
    const SIZE = 100 * MiB;
    const peakBefore = driver.peakRss();
    const gen = randomStream(SIZE);
    await sbx.files.write('/tmp/big', gen.stream);
    const digest = gen.digest();
    assert.deepEqual(await hashStream(await sbx.files.read('/tmp/big', { format: 'stream' })), { bytes: SIZE, sha256: digest });
    const signed = await fetch(await sbx.downloadUrl('/tmp/big'));
    assert.equal(signed.status, 200);
    assert.deepEqual(await hashStream(signed.body), { bytes: SIZE, sha256: digest }, 'a signed URL through the driver');
    const growth = driver.peakRss() - peakBefore;
    assert.ok(growth < 64 * MiB, `the driver's peak RSS grew by ${(growth / MiB).toFixed(1)} MiB moving 100 MiB`);
    // File watching: a stream the guest feeds for as long as it lasts.
    const events = [];
    const handle = await sbx.files.watchDir('/tmp', (e) => events.push(e), { timeoutMs: 0 });
    await sbx.files.write('/tmp/watched.txt', 'w');
    await waitFor(() => events.some((e) => e.name === 'watched.txt'), { what: 'a watch event through the driver' });
    await handle.stop();
    // A guest HTTP server through the driver's edge.
    await sbx.files.write('/tmp/www/page.txt', 'served by the guest');
    await sbx.commands.run('python3 -m http.server 8000 --directory /tmp/www >/dev/null 2>&1', { background: true });
    const res = await waitFor(async () => {
      const r = await fetch(`${driver.apiUrl}/page.txt`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' } });
      return r.status === 200 ? r : null;
    }, { what: 'the guest HTTP server through the driver' });
    assert.equal(await res.text(), 'served by the guest');
    assert.equal(await sbx.kill(), true);
    await waitFor(() => !holder(sbx.sandboxId), { what: 'the sandbox gone from its node' });
  });

  ctest('placement by features: a domain policy only ever lands on the node that enforces domains', async () => {
    const nodesListed = await waitFor(async () => {
      const ns = await lsJSON('node', 'ls');
      return ns.length === 2 && ns.every((n) => n.state === 'ready') ? ns : null;
    }, { what: 'both nodes in `vmon node ls`' });
    const byName = Object.fromEntries(nodesListed.map((n) => [n.name, n]));
    assert.ok(byName['node-a'].features.includes('egress-domains'), JSON.stringify(byName['node-a']));
    assert.ok(!byName['node-b'].features.includes('egress-domains'), JSON.stringify(byName['node-b']));
    assert.equal(byName['node-a'].address, '10.99.0.2:3001');
    for (let i = 0; i < 3; i++) {
      const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN }, network: DOMAIN_POLICY });
      created.push(s);
      assert.equal(holder(s.sandboxId), 'node-a');
      const rows = await lsJSON('sandbox', 'ls');
      assert.equal(rows.find((r) => r.sandboxId === s.sandboxId)?.node, 'node-a', JSON.stringify(rows));
      await s.kill();
    }
  });

  ctest('a full node passes the create on; both nodes fill, then the cluster is full', async () => {
    const sbxs = [];
    for (let i = 0; i < 4; i++) {
      const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
      created.push(s);
      sbxs.push(s);
    }
    const where = sbxs.map((s) => holder(s.sandboxId));
    assert.deepEqual(where.slice().sort(), ['node-a', 'node-a', 'node-b', 'node-b'], `placed on ${where}`);
    await assert.rejects(Sandbox.create({ ...sdk(), metadata: { run: RUN } }), (err) => {
      assert.match(String(err.message), /full|capacity|429/i, String(err));
      return true;
    });
    for (const s of sbxs) assert.equal(await s.kill(), true);
  });

  ctest('a node killed with -9: creates land on the other node at once; restarted, its sandboxes run again', async () => {
    const [a, b] = nodes;
    const onA = [];
    // Fill node-a's share first so that a sandbox lives on it.
    while (onA.length === 0) {
      const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
      created.push(s);
      if (holder(s.sandboxId) === 'node-a') onA.push(s);
      else await s.kill();
    }
    await a.kill9();
    // Told, not hidden: within seconds its sandbox is listed unreachable, and traffic to it gets
    // the edge's 502 at once.
    await waitFor(async () => (await lsJSON('sandbox', 'ls')).find((r) => r.sandboxId === onA[0].sandboxId)?.state === 'unreachable',
      { timeoutMs: 20_000, what: 'the sandbox of the killed node listed unreachable' });
    const began = Date.now();
    const edge = await fetch(`${driver.apiUrl}/health`, { headers: { 'E2b-Sandbox-Id': onA[0].sandboxId, 'E2b-Sandbox-Port': '49983' } });
    assert.equal(edge.status, 502);
    assert.equal((await edge.json()).sandboxId, onA[0].sandboxId);
    assert.ok(Date.now() - began < 2000, `the 502 took ${Date.now() - began} ms`);
    // The only node that enforces domains is gone: no node can take a domain policy.
    const refused = await apiFetch(driver, '/sandboxes', { method: 'POST',
      body: JSON.stringify({ templateID: 'base', network: DOMAIN_POLICY }) });
    assert.equal(refused.status, 503, refused.text);
    assert.match(refused.text, /sandbox_no_compatible_node/);
    for (let i = 0; i < 2; i++) {
      const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
      created.push(s);
      assert.equal(holder(s.sandboxId), 'node-b');
      assert.equal((await s.commands.run('echo up')).stdout, 'up\n');
      await s.kill();
    }
    assert.ok(b.proc, 'node-b still runs');
    // Back with the same data dir (no token needed again): the sandbox that lived through it is
    // reached through the driver as before.
    await a.restart();
    const s = onA[0];
    const r = await waitFor(async () => s.commands.run('echo still here'), { timeoutMs: 30_000, what: 'the sandbox on the restarted node' });
    assert.equal(r.stdout, 'still here\n');
    await waitFor(async () => (await lsJSON('sandbox', 'ls')).find((x) => x.sandboxId === s.sandboxId)?.state === 'running',
      { what: 'the sandbox listed running again' });
    assert.equal(await s.kill(), true);
  });

  ctest('a drained node gets nothing new; a drain with pause pauses its sandboxes, which resume on the other node, still counting', async () => {
    await waitFor(async () => (await lsJSON('node', 'ls')).filter((n) => n.state === 'ready').length === 2,
      { timeoutMs: 30_000, what: 'both nodes ready again' });
    await runVmon(['node', 'drain', 'node-a', '--data-dir', driver.dataDir]);
    await waitFor(async () => (await lsJSON('node', 'ls')).find((n) => n.name === 'node-a')?.state === 'draining',
      { what: 'node-a listed draining' });
    const onB = [];
    for (let i = 0; i < 2; i++) {
      const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
      created.push(s);
      onB.push(s);
      assert.equal(holder(s.sandboxId), 'node-b');
    }
    await assert.rejects(Sandbox.create({ ...sdk(), metadata: { run: RUN } }), /full|draining|429/i);
    await leaveTraces(onB[0]);
    const { stdout } = await runVmon(['node', 'drain', 'node-b', '--pause', '--wait', '2m', '--data-dir', driver.dataDir], { timeoutMs: 150_000 });
    assert.match(stdout, /drained/);
    for (const s of onB) assert.equal((await Sandbox.getInfo(s.sandboxId, sdk())).state, 'paused');
    // A pause is done when its sandbox is in the store.
    for (const s of onB) assert.ok(fs.existsSync(pausedRef(s.sandboxId)), `${s.sandboxId} paused but not in the store`);
    // node-b stays drained; node-a takes sandboxes again.
    await runVmon(['node', 'drain', 'node-a', '--undo', '--data-dir', driver.dataDir]);
    await waitFor(async () => (await lsJSON('node', 'ls')).find((n) => n.name === 'node-a')?.state === 'ready',
      { what: 'node-a ready again' });
    // Resumed on node-a, which never ran it: its memory (a loop still counting) and files came along.
    const back = await Sandbox.connect(onB[0].sandboxId, sdk());
    await assertCameBack(cl, back, 'node-a');
    // node-b drops its stale copy; the store's was spent by the resume.
    await waitFor(() => !fs.existsSync(path.join(nodes[1].dataDir, 'paused', back.sandboxId)),
      { what: "node-b's stale copy dropped" });
    assert.ok(!fs.existsSync(pausedRef(back.sandboxId)), 'a resumed sandbox is still in the store');
    await runVmon(['node', 'drain', 'node-b', '--undo', '--data-dir', driver.dataDir]);
    await back.kill();
    // Killing a sandbox paused on node-b removes it there and from the store.
    await Sandbox.kill(onB[1].sandboxId, sdk());
    assert.ok(!fs.existsSync(pausedRef(onB[1].sandboxId)), 'a killed paused sandbox is still in the store');
  });

  ctest('a node stopped with --drain-on-exit pauses its sandboxes into the store; stopped, they resume on the other node', async () => {
    const b = nodes[1];
    const bothReady = () => waitFor(async () => (await lsJSON('node', 'ls')).filter((n) => n.state === 'ready').length === 2,
      { timeoutMs: 30_000, what: 'both nodes ready' });
    await b.stop({ cleanup: false });
    b.extraArgs = [...b.extraArgs, '--drain-on-exit', '--drain-timeout', '2m'];
    await b.start();
    await bothReady();
    // A sandbox on node-b: node-a takes nothing new meanwhile.
    await runVmon(['node', 'drain', 'node-a', '--data-dir', driver.dataDir]);
    await waitFor(async () => (await lsJSON('node', 'ls')).find((n) => n.name === 'node-a')?.state === 'draining',
      { what: 'node-a listed draining' });
    const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
    created.push(s);
    assert.equal(holder(s.sandboxId), 'node-b');
    await runVmon(['node', 'drain', 'node-a', '--undo', '--data-dir', driver.dataDir]);
    await leaveTraces(s);
    await b.stop({ cleanup: false, graceMs: 150_000 });
    assert.ok(b.tail.some((l) => /msg=drained/.test(l)), 'node-b did not drain before it exited');
    assert.equal((await Sandbox.getInfo(s.sandboxId, sdk())).state, 'paused');
    assert.ok(fs.existsSync(pausedRef(s.sandboxId)), 'paused but not in the store');
    // node-b is gone: the sandbox comes back on node-a from the store.
    const back = await Sandbox.connect(s.sandboxId, sdk());
    await assertCameBack(cl, back, 'node-a');
    // node-b back (no drain on its next exit): it finds its copy stale and drops it.
    b.extraArgs = b.extraArgs.slice(0, -3);
    await b.start();
    await waitFor(() => !fs.existsSync(path.join(b.dataDir, 'paused', s.sandboxId)),
      { timeoutMs: 30_000, what: "node-b's stale copy dropped once it is back" });
    await bothReady();
    assert.equal((await back.commands.run('cat /tmp/kept')).stdout, 'kept\n');
    await back.kill();
  });

  ctest('a volume lives on the node that made it: its sandboxes run there, and its content API goes there through the driver', async () => {
    await waitFor(async () => (await lsJSON('node', 'ls')).filter((n) => n.state === 'ready').length === 2,
      { timeoutMs: 30_000, what: 'both nodes ready' });
    const vopts = { apiUrl: driver.apiUrl };
    const vol = await Volume.create(`${RUN}-vol`.replace(/[^a-z0-9-]/g, '-'), sdk());
    try {
      const up = await vol.writeFile('/from-api.txt', 'written through the driver', { ...vopts, force: true });
      assert.equal(up.size, 26);
      // Two sandboxes mounting it share it, on its node; with that node full (two each), a third
      // gets the capacity error though the other node has room.
      const users = [];
      for (let i = 0; i < 2; i++) {
        const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN }, volumeMounts: { '/data': vol } });
        created.push(s);
        users.push(s);
      }
      const home = holderIn(cl, users[0].sandboxId);
      assert.ok(fs.existsSync(path.join(cl.nodes.find((n) => n.name === home).dataDir, 'volumes', `${vol.volumeId}.img`)),
        "the volume's image is not on the node its sandboxes run on");
      assert.equal(holderIn(cl, users[1].sandboxId), home, 'two sandboxes of one volume on different nodes');
      await assert.rejects(Sandbox.create({ ...sdk(), metadata: { run: RUN }, volumeMounts: { '/data': vol } }), /full|capacity|429/i);
      const other = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
      created.push(other);
      assert.notEqual(holderIn(cl, other.sandboxId), home, 'a sandbox without the volume');
      await other.kill();
      assert.equal((await users[0].commands.run('cat /data/from-api.txt')).stdout, 'written through the driver');
      await users[1].commands.run('head -c 5000000 /dev/urandom > /data/big && sha256sum /data/big | cut -d" " -f1 > /data/big.sum');
      // Read back through the driver, streamed from the node.
      const big = await vol.readFile('/big', { ...vopts, format: 'bytes' });
      assert.equal(big.length, 5_000_000);
      const sum = (await vol.readFile('/big.sum', vopts)).trim();
      const { createHash } = await import('node:crypto');
      assert.equal(createHash('sha256').update(big).digest('hex'), sum);
      assert.ok((await vol.list('/', vopts)).some((e) => e.name === 'big'));
      // A paused sandbox with a volume resumes on the volume's node only.
      await users[0].pause();
      const back = await Sandbox.connect(users[0].sandboxId, sdk());
      assert.equal(holderIn(cl, back.sandboxId), home);
      for (const s of users) await Sandbox.kill(s.sandboxId, sdk());
      // Deleted through the driver: the record and the image on its node.
      assert.equal(await Volume.destroy(vol.volumeId, sdk()), true);
      await assert.rejects(Volume.getInfo(vol.volumeId, sdk()), /not found|404/i);
      const homeDir = cl.nodes.find((n) => n.name === home).dataDir;
      assert.ok(!fs.existsSync(path.join(homeDir, 'volumes', `${vol.volumeId}.img`)), "the volume's image is still on its node");
    } finally {
      await Volume.destroy(vol.volumeId, sdk()).catch(() => {});
    }
  });

  ctest('a partition longer than the grace period: the record ends, and once healed the node runs nothing twice', async () => {
    const b = nodes[1];
    const nsB = cl.netns[1];
    // The drains just ended take effect at the driver's next look.
    await waitFor(async () => (await lsJSON('node', 'ls')).filter((n) => n.state === 'ready').length === 2,
      { what: 'both nodes ready' });
    const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
    created.push(s);
    const onB = holder(s.sandboxId) === 'node-b';
    const node = onB ? b : nodes[0];
    const ns = onB ? nsB : cl.netns[0];
    const rules = [['INPUT', '-s'], ['OUTPUT', '-d']];
    const iptables = (op) => {
      for (const [chain, dir] of rules) {
        execFileSync('nsenter', [`--net=/run/netns/${ns}`, 'iptables', op, chain, dir, DRIVER_IP, '-j', 'DROP']);
      }
    };
    iptables('-I');
    let healed = false;
    try {
      await waitFor(async () => (await lsJSON('sandbox', 'ls')).find((r) => r.sandboxId === s.sandboxId)?.state === 'unreachable',
        { timeoutMs: 20_000, what: 'the partitioned sandbox listed unreachable' });
      // Past the grace period (15 s) its record ends; the node, cut off, still runs it.
      const ended = await waitFor(async () => {
        const r = (await lsJSON('sandbox', 'ls', '--all')).find((x) => x.sandboxId === s.sandboxId);
        return r?.state === 'killed' ? r : null;
      }, { timeoutMs: 40_000, what: 'the record of the partitioned sandbox ended' });
      assert.match(ended.reason, /its node was lost/);
      assert.ok(handedOut(node.dataDir, s.sandboxId), 'the node stopped the sandbox on its own');
      iptables('-D');
      healed = true;
      // Healed: the node rejoins, and what no record owns any more is destroyed there.
      await waitFor(() => !handedOut(node.dataDir, s.sandboxId), { timeoutMs: 60_000, what: 'the stray destroyed on its node' });
      await waitFor(async () => (await lsJSON('node', 'ls')).find((n) => n.name === node.name)?.state === 'ready',
        { timeoutMs: 30_000, what: 'the node ready again' });
      const again = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
      created.push(again);
      assert.equal((await again.commands.run('echo fine')).stdout, 'fine\n');
      await again.kill();
    } finally {
      if (!healed) iptables('-D');
    }
  });
});

describe('cluster on an S3 store: one driver, three nodes', () => {
  const RUN = runId('cluster-s3');
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-cluster-s3-'));
  const NODES3 = [
    { name: 'node-a', ip: '10.99.0.2', base: true, args: ['--max-sandboxes', '2'] },
    { name: 'node-b', ip: '10.99.0.3', args: ['--max-sandboxes', '2'] },
    { name: 'node-c', ip: '10.99.0.4', args: ['--max-sandboxes', '2'] },
  ];
  let cl;
  const created = [];
  const sdk = () => cl.driver.sdkOpts;

  before(async () => {
    cl = await startCluster(root, { nodes: NODES3, store: 's3' });
  });

  after(async () => {
    if (cl?.driver?.apiKey) await killQuietly(sdk(), ...created).catch(() => {});
    await cl?.driver?.killAllSandboxes();
    await stopCluster(cl);
  });

  const members = { logTail: () => [cl?.driver, ...(cl?.nodes ?? [])].filter(Boolean).map((s) => s.logTail(30)).join('\n') +
    (cl?.weed ? `\n--- weed ---\n${cl.weed.logTail()}` : '') };
  const ctest = (name, fn) => test(name, withLogTail(members, fn));

  ctest('creates spread over the three nodes, each reached through the driver; the two that never had base boot it from the S3 store', async () => {
    await waitFor(async () => (await clusterLs(cl, 'node', 'ls')).filter((n) => n.state === 'ready').length === 3,
      { timeoutMs: 60_000, what: 'three nodes ready' });
    const sbxs = [];
    for (let i = 0; i < 6; i++) {
      const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
      created.push(s);
      sbxs.push(s);
      assert.equal((await s.commands.run('echo up')).stdout, 'up\n');
    }
    const where = sbxs.map((s) => holderIn(cl, s.sandboxId));
    assert.deepEqual([...where].sort(), ['node-a', 'node-a', 'node-b', 'node-b', 'node-c', 'node-c'], `placed on ${where}`);
    // Every node's sandboxes are reached through the driver.
    for (const n of ['node-a', 'node-b', 'node-c']) await assertReachable(cl, sbxs[where.indexOf(n)]);
    const build = (n) => JSON.parse(fs.readFileSync(path.join(n.dataDir, 'templates', 'base', 'manifest.json'), 'utf8')).buildId;
    for (const n of cl.nodes.slice(1)) assert.equal(build(n), build(cl.nodes[0]), `${n.name}'s base`);
    for (const s of sbxs) assert.equal(await s.kill(), true);
  });

  ctest('a sandbox paused on a drained node resumes on another through the S3 store', async () => {
    const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
    created.push(s);
    const from = holderIn(cl, s.sandboxId);
    await leaveTraces(s);
    const { stdout } = await runVmon(['node', 'drain', from, '--pause', '--wait', '2m', '--data-dir', cl.driver.dataDir], { timeoutMs: 150_000 });
    assert.match(stdout, /drained/);
    assert.equal((await Sandbox.getInfo(s.sandboxId, sdk())).state, 'paused');
    const back = await Sandbox.connect(s.sandboxId, sdk());
    const to = holderIn(cl, back.sandboxId);
    assert.ok(to && to !== from, `resumed on ${to}, paused on ${from}`);
    await assertCameBack(cl, back, to);
    await runVmon(['node', 'drain', from, '--undo', '--data-dir', cl.driver.dataDir]);
    assert.equal(await back.kill(), true);
  });

  ctest('a domain policy follows a sandbox resumed on another node (its own stopped): the allowed domain still answers, a denied destination is still refused, and its log holds what both nodes saw', async () => {
    const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN }, network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] } });
    created.push(s);
    const from = holderIn(cl, s.sandboxId);
    const curl = async (sbx, url) => (await sbx.commands.run(`curl -s -m 5 ${url}; echo " rc=$?"`)).stdout.trim();
    const check = async (sbx, where) => {
      assert.equal(await curl(sbx, 'http://allowed.test/'), 'hello from 203.0.113.10\n rc=0', `allowed.test on ${where}`);
      assert.doesNotMatch(await curl(sbx, 'http://203.0.113.11/'), /hello/, `a denied address answered on ${where}`);
      assert.doesNotMatch(await curl(sbx, 'http://denied.test/'), /hello/, `a denied name answered on ${where}`);
    };
    await check(s, from);
    await s.commands.run('sh -c "exit 3"').catch(() => {});
    await leaveTraces(s);
    await runVmon(['node', 'drain', from, '--pause', '--wait', '2m', '--data-dir', cl.driver.dataDir], { timeoutMs: 150_000 });
    // Its node is stopped, not only drained: the sandbox comes back from the store elsewhere.
    const fromNode = cl.nodes.find((n) => n.name === from);
    await fromNode.stop({ cleanup: false });
    try {
      assert.equal((await Sandbox.getInfo(s.sandboxId, sdk())).state, 'paused');
      const back = await Sandbox.connect(s.sandboxId, sdk());
      const to = holderIn(cl, back.sandboxId);
      assert.ok(to && to !== from, `resumed on ${to}, paused on ${from}`);
      await assertCameBack(cl, back, to);
      await check(back, to);
      await back.commands.run('sh -c "exit 4"').catch(() => {});

      assert.equal(await back.kill(), true);
    } finally {
      await fromNode.start();
      await runVmon(['node', 'drain', from, '--undo', '--data-dir', cl.driver.dataDir]);
    }
    await waitFor(async () => (await clusterLs(cl, 'node', 'ls')).find((n) => n.name === from)?.state === 'ready',
      { timeoutMs: 60_000, what: `${from} back and listed ready again` });
    // Back, it dropped the copy the sandbox left there.
    await waitFor(() => !fs.existsSync(path.join(fromNode.dataDir, 'paused', s.sandboxId)), { timeoutMs: 30_000, what: `${from}'s stale copy dropped` });

    // Its log, read through the driver, holds the driver's part (the lifecycle) and what each
    // node saw while it ran there (processes, egress refusals), each event once: the node that
    // resumed it read envd's earlier events again.
    let lines = [];
    await waitFor(async () => {
      const res = await apiFetch(cl.driver, `/v2/sandboxes/${s.sandboxId}/logs`);
      assert.equal(res.status, 200, res.text);
      lines = res.json.logs.map((l) => `${l.level} ${l.fields.logger} ${l.message}`);
      return [/^info lifecycleSvc sandbox resumed on node /, /^warn processSvc process \d+ exited with code 3: /,
        /^warn processSvc process \d+ exited with code 4: /].every((re) => lines.some((l) => re.test(l))) &&
        lines.filter((l) => /^warn egressSvc egress refused: tcp 203\.0\.113\.11 /.test(l)).length >= 2;
    }, { timeoutMs: 15_000, what: () => `the cluster's log of the sandbox:\n${lines.join('\n')}` });
    for (const re of [/exited with code 3/, /exited with code 4/, /started: echo kept/]) {
      assert.equal(lines.filter((l) => re.test(l)).length, 1, `${re} not once:\n${lines.join('\n')}`);
    }
    const at = (re) => lines.findIndex((l) => re.test(l));
    assert.ok(at(/exited with code 3/) < at(/resumed on node/) && at(/resumed on node/) < at(/exited with code 4/),
      `the log is out of order:\n${lines.join('\n')}`);
  });

  ctest('a snapshot starts sandboxes on another node when its own is drained; a fork spills over to other nodes when its node is full', async () => {
    const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
    created.push(s);
    const from = holderIn(cl, s.sandboxId);
    await leaveTraces(s);
    const snap = await s.createSnapshot();
    await s.commands.run('echo after > /tmp/kept');
    const fromNode = cl.nodes.find((n) => n.name === from);

    await runVmon(['node', 'drain', from, '--data-dir', cl.driver.dataDir]);
    try {
      await waitFor(async () => (await clusterLs(cl, 'node', 'ls')).find((n) => n.name === from)?.state === 'draining',
        { what: `${from} listed draining` });
      const t = await Sandbox.create(snap.snapshotId, { ...sdk(), metadata: { run: RUN } });
      created.push(t);
      const on = holderIn(cl, t.sandboxId);
      assert.ok(on && on !== from, `started on ${on}, the snapshot's node is ${from}`);
      assert.equal((await t.commands.run('cat /tmp/kept')).stdout, 'kept\n', 'the files are not the snapshot\'s');
      const count = async () => Number((await t.commands.run('cat /tmp/count')).stdout);
      const c1 = await count();
      await new Promise((r) => setTimeout(r, 1000));
      assert.ok((await count()) > c1, 'the restored loop does not count');
      assert.ok(fromNode.tail.some((l) => /snapshot in the store/.test(l)), `${from} did not put the snapshot in the store`);
      assert.ok(cl.nodes.find((n) => n.name === on).tail.some((l) => /snapshot fetched from the store/.test(l)), `${on} did not fetch it`);
      assert.equal(await t.kill(), true);
    } finally {
      await runVmon(['node', 'drain', from, '--undo', '--data-dir', cl.driver.dataDir]);
    }
    await waitFor(async () => (await clusterLs(cl, 'node', 'ls')).find((n) => n.name === from)?.state === 'ready',
      { what: `${from} listed ready again` });

    // Two slots per node: the source holds one, the first fork the other; the next two forks
    // start on other nodes from the store.
    const res = await apiFetch(cl.driver, `/sandboxes/${s.sandboxId}/fork`, { method: 'POST', body: '{"count":3,"timeout":600}' });
    assert.equal(res.status, 201, res.text);
    const forks = [];
    for (const entry of res.json) {
      assert.ok(entry.sandbox, `fork entry without a sandbox: ${JSON.stringify(entry)}`);
      const f = await Sandbox.connect(entry.sandbox.sandboxID, sdk());
      created.push(f);
      forks.push(f);
      assert.equal((await f.commands.run('cat /tmp/kept')).stdout, 'after\n');
    }
    const where = forks.map((f) => holderIn(cl, f.sandboxId));
    assert.equal(where.filter((w) => w === from).length, 1, `forks on ${where}, the source on ${from}`);
    assert.ok(where.every(Boolean), `forks on ${where}`);
    assert.deepEqual((await clusterLs(cl, 'sandbox', 'ls')).filter((r) => forks.some((f) => f.sandboxId === r.sandboxId)).map((r) => r.node).sort(),
      [...where].sort(), 'the records name the nodes that run the forks');
    for (const f of [...forks, s]) assert.equal(await f.kill(), true);
  });

  ctest('a template built through the driver (a COPY, a RUN, a start command) boots on nodes that never had it', async () => {
    const ctxDir = fs.mkdtempSync(path.join(root, 'ctx-'));
    fs.writeFileSync(path.join(ctxDir, 'hello.txt'), 'copied through the driver\n');
    const name = `${RUN}-built`.toLowerCase().replace(/[^a-z0-9-_]/g, '-');
    // The start command draws a token: every sandbox restored from the build's started snapshot
    // shows the one drawn at build time, on whichever node it lands.
    const start = 'head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n" > /tmp/start-token; exec sleep infinity';
    const lines = [];
    await Template.build(
      Template({ fileContextPath: ctxDir })
        .fromTemplate('base')
        .copy('hello.txt', '/opt/hello.txt')
        .runCmd('echo "$(whoami) built" > /opt/built', { user: 'root' })
        .setStartCmd(`sh -c '${start}'`, 'test -s /tmp/start-token'),
      name, { ...sdk(), onBuildLogs: (e) => lines.push(e.message) });
    const builder = lines.map((l) => /building on node (\S+)/.exec(l)?.[1]).find(Boolean);
    assert.ok(builder, `the build log names no node:\n${lines.join('\n')}`);
    assert.ok(lines.some((l) => /publishing the build to the cluster's store/.test(l)), lines.join('\n'));

    // The node that built it is drained: sandboxes of it land on the two that never had it.
    await runVmon(['node', 'drain', builder, '--data-dir', cl.driver.dataDir]);
    try {
      await waitFor(async () => (await clusterLs(cl, 'node', 'ls')).find((n) => n.name === builder)?.state === 'draining',
        { what: `${builder} listed draining` });
      const sbxs = [];
      for (let i = 0; i < 2; i++) {
        const s = await Sandbox.create(name, { ...sdk(), metadata: { run: RUN } });
        created.push(s);
        sbxs.push(s);
      }
      const where = sbxs.map((s) => holderIn(cl, s.sandboxId));
      assert.ok(where.every((w) => w && w !== builder), `placed on ${where}, built on ${builder}`);
      let token;
      for (const s of sbxs) {
        assert.equal((await s.commands.run('cat /opt/hello.txt /opt/built')).stdout, 'copied through the driver\nroot built\n');
        const t = (await s.commands.run('cat /tmp/start-token')).stdout;
        assert.match(t, /^[0-9a-f]{16}$/);
        token ??= t;
        assert.equal(t, token, 'a sandbox ran the start command again instead of being restored from the build');
        assert.match((await s.commands.run('pgrep -x sleep')).stdout, /^\d+/, 'the started process is not running');
      }
      for (const n of cl.nodes.filter((n) => where.includes(n.name))) {
        assert.ok(n.tail.some((l) => /template fetched from the store.*layers=[1-9]/.test(l)), `${n.name} did not fetch the build`);
      }
      for (const s of sbxs) assert.equal(await s.kill(), true);
    } finally {
      await runVmon(['node', 'drain', builder, '--undo', '--data-dir', cl.driver.dataDir]);
    }
  });
});

describe('cluster: two nodes sharing one network namespace', () => {
  const RUN = runId('cluster-shared');
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-cluster-shared-'));
  // node-b keeps clear of node-a: its own link and chain prefix, sandbox addresses, refusal log
  // group and egress ports.
  const B_NET = ['--net-scope', 'vmb', '--net-pool', '172.21.0.0/16', '--nflog-group', '5381',
    '--egress-proxy-port', '15381', '--egress-dns-port', '15354'];
  const NODES2 = [
    { name: 'node-a', ip: '10.99.0.2', base: true, args: ['--max-sandboxes', '2'] },
    { name: 'node-b', ip: '10.99.0.2', port: 3002, gossipPort: 7947, args: ['--max-sandboxes', '2', ...B_NET] },
  ];
  let cl;
  const created = [];
  const sdk = () => cl.driver.sdkOpts;
  const links = () => execFileSync('ip', ['-n', cl.netns[0], '-o', 'link', 'show'], { encoding: 'utf8' });

  before(async () => {
    cl = await startCluster(root, { nodes: NODES2, sharedNetns: true });
  });

  after(async () => {
    if (cl?.driver?.apiKey) await killQuietly(sdk(), ...created).catch(() => {});
    await cl?.driver?.killAllSandboxes();
    await stopCluster(cl);
  });

  const members = { logTail: () => [cl?.driver, ...(cl?.nodes ?? [])].filter(Boolean).map((s) => s.logTail(30)).join('\n') };
  const ctest = (name, fn) => test(name, withLogTail(members, fn));

  ctest('a third node with the first one\'s network settings stops at once, naming the flag to change', async () => {
    const token = (await runVmon(['node', 'join-token', '--api-url', cl.driver.apiUrl, '--data-dir', cl.driver.dataDir])).stdout.trim();
    const dir = path.join(root, 'node-c');
    fs.mkdirSync(dir);
    const r = spawnSync('nsenter', [`--net=/run/netns/${cl.netns[0]}`, process.env.VMON_BIN, 'serve', '--role', 'node',
      '--name', 'node-c', '--data-dir', dir, '--listen', '10.99.0.2:3003', '--gossip-listen', '10.99.0.2:7948',
      '--join', `${DRIVER_IP}:3100`, '--join-token', token, '--warm-pool', '0', '--egress-proxy-port', '15382',
      '--egress-dns-port', '15355'], { encoding: 'utf8', timeout: 120_000 });
    // Its mount namespace is pinned in its data dir, as a node's is.
    for (const m of ['mntns/mnt', 'mntns']) spawnSync('umount', ['-l', path.join(dir, m)]);
    assert.notEqual(r.status, 0, `node-c started beside node-a with its settings:\n${r.stderr}`);
    assert.match(r.stderr, /another vmon node in this network namespace already uses the link and chain prefix "vmon".*--net-scope/);
    assert.doesNotMatch(r.stderr, /building template|removing sandbox link/, 'node-c went on before it stopped');
  });

  ctest('both nodes run sandboxes side by side; one killed and restarted leaves the other\'s alone', async () => {
    await waitFor(async () => (await clusterLs(cl, 'node', 'ls')).filter((n) => n.state === 'ready').length === 2,
      { timeoutMs: 60_000, what: 'both nodes ready' });
    const on = {};
    while (!on['node-a'] || !on['node-b']) {
      const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN }, network: { denyOut: ['198.51.100.0/24'] } });
      created.push(s);
      const h = holderIn(cl, s.sandboxId);
      if (on[h]) await s.kill();
      else on[h] = s;
    }
    for (const s of Object.values(on)) assert.equal((await s.commands.run('echo up')).stdout, 'up\n');
    assert.match(links(), /\bvmon\d+[@:]/, 'no link of node-a');
    assert.match(links(), /\bvmb\d+[@:]/, 'no link of node-b');
    const [a] = cl.nodes;
    await a.kill9();
    assert.equal((await on['node-b'].commands.run('echo alone')).stdout, 'alone\n');
    await a.restart();
    // node-a's recovery cleans up after itself only: node-b's sandbox and links are untouched.
    const r = await waitFor(async () => on['node-a'].commands.run('echo back'), { timeoutMs: 60_000, what: 'node-a\'s sandbox after its restart' });
    assert.equal(r.stdout, 'back\n');
    assert.equal((await on['node-b'].commands.run('echo still')).stdout, 'still\n');
    assert.match(links(), /\bvmb\d+[@:]/, "node-b's links gone after node-a's restart");
    for (const s of Object.values(on)) assert.equal(await s.kill(), true);
  });
});
