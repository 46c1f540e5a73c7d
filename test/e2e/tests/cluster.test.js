// A cluster on one machine: `vmon serve --role driver` in the test's network namespace and two
// `vmon serve --role node`, each in a network namespace of its own, joined to the driver through a
// bridge the test makes (10.99.0.0/24: only namespaces this test made are on it). The SDK talks
// to the driver alone, unchanged.
import { describe, before, after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Sandbox } from 'e2b';
import { MiB, hashStream, randomStream } from '../lib/data.js';
import {
  VmonServer,
  apiFetch,
  dataDir,
  handedOut,
  killQuietly,
  runVmon,
  pgrep,
  runId,
  waitFor,
  withLogTail,
} from '../lib/harness.js';

const BRIDGE = 'vmcl0';
const DRIVER_IP = '10.99.0.1';
const NODES = [
  { name: 'node-a', ip: '10.99.0.2' },
  { name: 'node-b', ip: '10.99.0.3' },
];

function ip(...args) {
  execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/**
 * A member's data dir; with base, holding the test data dir's base template (hard links: its
 * layers are read-only).
 */
function memberDir(root, name, base = false) {
  const dir = path.join(root, name);
  fs.mkdirSync(path.join(dir, 'templates'), { recursive: true });
  if (base) execFileSync('cp', ['-al', path.join(dataDir(), 'templates', 'base'), path.join(dir, 'templates', 'base')]);
  return dir;
}

describe('cluster: one driver, two nodes', () => {
  const RUN = runId('cluster');
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-cluster-'));
  const storeDir = path.join(root, 'store');
  const netns = NODES.map((n) => `vmcl-${process.pid}-${n.name}`);
  let driver;
  const nodes = [];
  const created = [];
  const sdk = () => driver.sdkOpts;
  /** `vmon sandbox ls --json` and `vmon node ls --json` on the driver's data dir. */
  const lsJSON = async (...args) => (await runVmon([...args, '--json', '--data-dir', driver.dataDir])).stdout
    .split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const DOMAIN_POLICY = { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] };
  /** Where the store keeps paused sandbox id. */
  const pausedRef = (id) => path.join(storeDir, 'refs', 'paused', `${id}.ref`);
  /**
   * A sandbox resumed on node `on`, which runs it now: files written before its pause, a
   * background loop still counting, and the records agree.
   */
  const assertCameBack = async (sbx, on) => {
    assert.equal(holder(sbx.sandboxId), on);
    assert.equal((await sbx.commands.run('cat /tmp/kept')).stdout, 'kept\n');
    const count = async () => Number((await sbx.commands.run('cat /tmp/count')).stdout);
    const c1 = await count();
    await new Promise((r) => setTimeout(r, 1000));
    assert.ok((await count()) > c1, 'the background loop does not count after the resume');
    assert.equal((await lsJSON('sandbox', 'ls')).find((r) => r.sandboxId === sbx.sandboxId)?.node, on);
  };
  /** The node holding sandbox id, by what its data dir says. */
  const holder = (id) => nodes.find((n) => handedOut(n.dataDir, id))?.name;

  before(async () => {
    // A run killed before its teardown leaves its bridge behind.
    try {
      ip('link', 'del', BRIDGE);
    } catch {
      // none
    }
    ip('link', 'add', BRIDGE, 'type', 'bridge');
    ip('addr', 'add', `${DRIVER_IP}/24`, 'dev', BRIDGE);
    ip('link', 'set', BRIDGE, 'up');
    NODES.forEach((n, i) => {
      ip('netns', 'add', netns[i]);
      ip('link', 'add', `vmcl-${i}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns[i]);
      ip('link', 'set', `vmcl-${i}`, 'master', BRIDGE, 'up');
      ip('-n', netns[i], 'addr', 'add', `${n.ip}/24`, 'dev', 'eth0');
      ip('-n', netns[i], 'link', 'set', 'eth0', 'up');
      ip('-n', netns[i], 'link', 'set', 'lo', 'up');
    });
    // The store the cluster shares, a directory here (a shared filesystem across machines): only
    // node-a has a base template; it publishes it, the driver records it from there, and node-b,
    // which never had one, fetches it.
    const driverDir = memberDir(root, 'driver');
    // The token is issued before the driver runs: it makes the cluster CA the driver then serves.
    const tokens = [(await runVmon(['node', 'join-token', '--data-dir', driverDir])).stdout.trim()];
    assert.match(tokens[0], /^vmonjoin\./);
    driver = new VmonServer({
      name: 'driver', dir: driverDir,
      args: ['--role', 'driver', '--name', 'driver', '--cluster-listen', `${DRIVER_IP}:3100`,
        '--gossip-listen', `${DRIVER_IP}:7946`, '--node-lost-grace', '15s', '--store', storeDir],
    });
    await driver.start();
    // The second through the driver's API, as from another host (the key is the data dir's).
    tokens.push((await runVmon(['node', 'join-token', '--api-url', driver.apiUrl, '--data-dir', driverDir])).stdout.trim());
    assert.match(tokens[1], /^vmonjoin\./);
    assert.notEqual(tokens[1], tokens[0]);
    for (const [i, n] of NODES.entries()) {
      if (n.name === 'node-b') {
        const { buildId } = JSON.parse(fs.readFileSync(path.join(nodes[0].dataDir, 'templates', 'base', 'manifest.json'), 'utf8'));
        await waitFor(() => fs.existsSync(path.join(storeDir, 'refs', 'templates', 'base', buildId, 'manifest.ref')),
          { timeoutMs: 300_000, intervalMs: 500, what: "node-a's base template published to the store" });
      }
      const node = new VmonServer({
        name: n.name, role: 'node', dir: memberDir(root, n.name, n.name === 'node-a'), host: n.ip, port: 3001,
        wrap: ['nsenter', `--net=/run/netns/${netns[i]}`],
        // Two sandboxes each: the third create must find the other node.
        args: ['--role', 'node', '--name', n.name, '--gossip-listen', `${n.ip}:7946`, '--join', `${DRIVER_IP}:3100`,
          '--join-token', tokens[i], '--max-sandboxes', '2', '--warm-pool', '0', '--store', storeDir,
          // node-b enforces no allowOut domains: it has no egress proxy.
          ...(n.name === 'node-b' ? ['--egress-proxy-port', '0'] : [])],
      });
      nodes.push(node);
      await node.start();
    }
    // Both nodes placeable: a create that needs both must not wait for gossip.
    await waitFor(async () => {
      const res = await fetch(`${driver.apiUrl}/health`);
      return res.ok;
    });
  });

  after(async () => {
    // Sandboxes outlive their node's process: they go through the driver first, and whatever a
    // failure left behind (runsc under these data dirs) is killed outright.
    if (driver?.apiKey) await killQuietly(sdk(), ...created).catch(() => {});
    await driver?.killAllSandboxes();
    for (const n of nodes) await n.stop({ cleanup: false }).catch(() => {});
    await driver?.stop().catch(() => {});
    for (const pid of await pgrep(`${root}/`).catch(() => [])) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    for (const ns of netns) {
      try {
        ip('netns', 'del', ns);
      } catch {
        // not made
      }
    }
    try {
      ip('link', 'del', BRIDGE);
    } catch {
      // not made
    }
    // A node's mount namespace is pinned in its data dir and outlives it (as its sandboxes do).
    for (const n of nodes) {
      for (const m of ['mntns/mnt', 'mntns']) spawnSync('umount', ['-l', path.join(n.dataDir, m)]);
    }
    fs.rmSync(root, { recursive: true, force: true });
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
    await onB[0].commands.run('echo kept > /tmp/kept');
    await onB[0].commands.run("sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done'", { background: true });
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
    await assertCameBack(back, 'node-a');
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
    await s.commands.run('echo kept > /tmp/kept');
    await s.commands.run("sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done'", { background: true });
    await b.stop({ cleanup: false, graceMs: 150_000 });
    assert.ok(b.tail.some((l) => /msg=drained/.test(l)), 'node-b did not drain before it exited');
    assert.equal((await Sandbox.getInfo(s.sandboxId, sdk())).state, 'paused');
    assert.ok(fs.existsSync(pausedRef(s.sandboxId)), 'paused but not in the store');
    // node-b is gone: the sandbox comes back on node-a from the store.
    const back = await Sandbox.connect(s.sandboxId, sdk());
    await assertCameBack(back, 'node-a');
    // node-b back (no drain on its next exit): it finds its copy stale and drops it.
    b.extraArgs = b.extraArgs.slice(0, -3);
    await b.start();
    await waitFor(() => !fs.existsSync(path.join(b.dataDir, 'paused', s.sandboxId)),
      { timeoutMs: 30_000, what: "node-b's stale copy dropped once it is back" });
    await bothReady();
    assert.equal((await back.commands.run('cat /tmp/kept')).stdout, 'kept\n');
    await back.kill();
  });

  ctest('a partition longer than the grace period: the record ends, and once healed the node runs nothing twice', async () => {
    const b = nodes[1];
    const nsB = netns[1];
    // The drains just ended take effect at the driver's next look.
    await waitFor(async () => (await lsJSON('node', 'ls')).filter((n) => n.state === 'ready').length === 2,
      { what: 'both nodes ready' });
    const s = await Sandbox.create({ ...sdk(), metadata: { run: RUN } });
    created.push(s);
    const onB = holder(s.sandboxId) === 'node-b';
    const node = onB ? b : nodes[0];
    const ns = onB ? nsB : netns[0];
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
