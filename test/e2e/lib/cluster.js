// A vmon cluster on one machine for the tests: `vmon serve --role driver` in the test's network
// namespace and nodes (`vmon serve --role node`), each in a network namespace of its own, joined
// to the driver through a bridge the test makes (10.99.0.0/24: only namespaces the test made are
// on it). The artifact store they share is a directory or a real S3 server (SeaweedFS's weed,
// built by scripts/weed.sh) listening on the bridge.
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import dnsPacket from 'dns-packet';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { VmonServer, dataDir, handedOut, pgrep, runVmon, waitFor } from './harness.js';

export { scrapeMetrics } from './harness.js';

export const BRIDGE = 'vmcl0';
export const DRIVER_IP = '10.99.0.1';
const S3_PORT = 8333;
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

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

/** Resolves once something accepts TCP connections on host:port. */
async function listening(host, port, what) {
  await waitFor(() => new Promise((resolve) => {
    const s = net.connect({ host, port }, () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  }), { timeoutMs: 60_000, intervalMs: 250, what });
}

/**
 * SeaweedFS's weed serving S3 on the bridge, with one bucket, and the environment vmon's S3
 * client reads its endpoint and credentials from.
 */
async function startWeed(root) {
  const bin = execFileSync('sh', [path.join(REPO, 'scripts', 'weed.sh'), ...(process.env.CI === 'true' ? [] : ['--cached'])],
    { encoding: 'utf8' }).trim();
  const dir = path.join(root, 'weed');
  fs.mkdirSync(path.join(dir, 'data'), { recursive: true });
  const keys = { accessKey: 'vmonclusteraccess', secretKey: 'vmonclustersecret0123456789' };
  fs.writeFileSync(path.join(dir, 's3.json'), JSON.stringify({
    identities: [{ name: 'vmon', credentials: [keys], actions: ['Admin', 'Read', 'Write', 'List', 'Tagging'] }],
  }));
  const log = fs.openSync(path.join(dir, 'weed.log'), 'a');
  const proc = spawn(bin, ['server', `-dir=${path.join(dir, 'data')}`, `-ip=${DRIVER_IP}`, `-ip.bind=${DRIVER_IP}`,
    '-s3', `-s3.port=${S3_PORT}`, `-s3.config=${path.join(dir, 's3.json')}`,
    // Small volumes, a fixed number: weed's default (30 GiB each, as many as the disk holds)
    // answers 500 on a small disk.
    '-master.volumeSizeLimitMB=256', '-volume.max=100'], { cwd: dir, stdio: ['ignore', log, log], detached: true });
  await listening(DRIVER_IP, S3_PORT, 'weed S3 listening');
  const env = {
    AWS_ENDPOINT_URL_S3: `http://${DRIVER_IP}:${S3_PORT}`,
    AWS_ACCESS_KEY_ID: keys.accessKey,
    AWS_SECRET_ACCESS_KEY: keys.secretKey,
    AWS_REGION: 'us-east-1',
  };
  // The bucket, made through weed's own shell (the S3 API would need a signed request).
  await waitFor(() => {
    const r = spawnSync(bin, ['shell', `-master=${DRIVER_IP}:9333`], { input: 's3.bucket.create -name vmon-cluster\n', encoding: 'utf8' });
    return r.status === 0 && !/error/i.test(r.stdout + r.stderr);
  }, { timeoutMs: 60_000, intervalMs: 1000, what: 'the S3 bucket made' });
  return { proc, env, spec: 's3://vmon-cluster/store', logTail: () => fs.readFileSync(path.join(dir, 'weed.log'), 'utf8').split('\n').slice(-20).join('\n') };
}

/**
 * A PostgreSQL server for drivers sharing a database (bin/vmon-test-pg: Debian's binaries, a
 * temporary directory, a Unix socket), and the DSN of a fresh database on it.
 */
async function startPostgres() {
  const bin = process.env.VMON_TEST_PG_BIN || path.join(REPO, 'bin', 'vmon-test-pg');
  const proc = spawn(bin, [], { stdio: ['pipe', 'pipe', 'inherit'] });
  const line = await new Promise((resolve, reject) => {
    let buf = '';
    proc.stdout.on('data', (d) => {
      buf += d;
      const i = buf.indexOf('\n');
      if (i >= 0) resolve(buf.slice(0, i));
    });
    proc.once('exit', (code) => reject(new Error(`vmon-test-pg exited (${code}) before it was ready`)));
    // A missing binary (make test-e2e builds it) emits no exit, only an error.
    proc.once('error', (err) => reject(new Error(`vmon-test-pg (${bin}) did not start: ${err.message}`)));
  });
  const { dsn } = JSON.parse(line);
  return {
    dsn,
    stop: () => new Promise((resolve) => {
      proc.once('exit', resolve);
      proc.stdin.end();
    }),
  };
}

/**
 * The nodes' fake internet, in the test's own namespace: HTTP servers on documentation addresses
 * (INTERNET hosts, put on the bridge; each answers "hello from <address>") and a DNS server on the
 * bridge (DNS_ADDR) answering INTERNET_NAMES, the nodes' upstream (--egress-upstream-dns). Nothing
 * else is reachable: the test's namespace has no uplink.
 */
export const INTERNET = ['203.0.113.10', '203.0.113.11'];
export const INTERNET_NAMES = { 'allowed.test': '203.0.113.10', 'denied.test': '203.0.113.11' };
const DNS_PORT = 5353;
export const DNS_ADDR = `${DRIVER_IP}:${DNS_PORT}`;

async function startInternet() {
  for (const a of INTERNET) ip('addr', 'add', `${a}/32`, 'dev', BRIDGE);
  const servers = [];
  const asked = [];
  for (const a of INTERNET) {
    const srv = http.createServer((req, res) => res.end(`hello from ${a}\n`));
    await new Promise((resolve, reject) => srv.once('error', reject).listen(80, a, resolve));
    servers.push(srv);
  }
  const answer = (msg) => {
    const q = dnsPacket.decode(msg);
    const qs = q.questions ?? [];
    asked.push(...qs.map((x) => x.name));
    const answers = qs.filter((x) => x.type === 'A' && INTERNET_NAMES[x.name.toLowerCase()])
      .map((x) => ({ type: 'A', name: x.name, ttl: 5, data: INTERNET_NAMES[x.name.toLowerCase()] }));
    const known = qs.every((x) => INTERNET_NAMES[x.name.toLowerCase()]);
    return dnsPacket.encode({ id: q.id, type: 'response', flags: dnsPacket.RECURSION_DESIRED | dnsPacket.RECURSION_AVAILABLE |
      (known ? 0 : 3), questions: qs, answers });
  };
  const udp = dgram.createSocket('udp4');
  udp.on('message', (msg, rinfo) => {
    try {
      udp.send(answer(msg), rinfo.port, rinfo.address);
    } catch {
      // not a DNS message
    }
  });
  await new Promise((resolve) => udp.bind(DNS_PORT, DRIVER_IP, resolve));
  const tcp = net.createServer((sock) => {
    let buf = Buffer.alloc(0);
    sock.on('error', () => {});
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
        const len = buf.readUInt16BE(0);
        try {
          const out = answer(buf.subarray(2, 2 + len));
          const hdr = Buffer.alloc(2);
          hdr.writeUInt16BE(out.length);
          sock.write(Buffer.concat([hdr, out]));
        } catch {
          sock.destroy();
        }
        buf = buf.subarray(2 + len);
      }
    });
  });
  await new Promise((resolve) => tcp.listen(DNS_PORT, DRIVER_IP, resolve));
  return {
    asked,
    close: () => {
      for (const srv of servers) srv.close();
      udp.close();
      tcp.close();
    },
  };
}

/**
 * Starts a driver and `nodes` ({ name, ip, base, args }) on a store ('dir' or 's3'). Only nodes
 * with `base` start with a base template: the first of them publishes it, and the others wait
 * until it is in the store, then fetch it from there. With `drivers` > 1 (or `database`
 * 'postgres') the drivers share a PostgreSQL database (c.drivers; c.driver is the first); each
 * also gets driverArgsOf(its index).
 */
export async function startCluster(root, opts) {
  const c = { root, nodes: [], drivers: [], netns: [], driver: null, weed: null };
  try {
    return await start(c, opts);
  } catch (err) {
    // Whatever came up goes: the test's after hook never sees a cluster that failed to start.
    await stopCluster(c);
    throw err;
  }
}

async function start(c, { nodes: spec, store = 'dir', driverArgs = [], driverArgsOf = () => [], sharedNetns = false, drivers = 1, database }) {
  const { root } = c;
  // With sharedNetns, every node runs in one network namespace, on the first node's address.
  c.netns = sharedNetns ? [`vmcl-${process.pid}-shared`] : spec.map((n) => `vmcl-${process.pid}-${n.name}`);
  c.nsOf = (i) => c.netns[sharedNetns ? 0 : i];
  // A run killed before its teardown leaves its bridge behind.
  try {
    ip('link', 'del', BRIDGE);
  } catch {
    // none
  }
  ip('link', 'add', BRIDGE, 'type', 'bridge');
  ip('addr', 'add', `${DRIVER_IP}/24`, 'dev', BRIDGE);
  ip('link', 'set', BRIDGE, 'up');
  c.netns.forEach((_, i) => {
    const n = spec[i];
    ip('netns', 'add', c.netns[i]);
    c.made = i + 1;
    ip('link', 'add', `vmcl-${i}`, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', c.netns[i]);
    ip('link', 'set', `vmcl-${i}`, 'master', BRIDGE, 'up');
    ip('-n', c.netns[i], 'addr', 'add', `${n.ip}/24`, 'dev', 'eth0');
    ip('-n', c.netns[i], 'link', 'set', 'eth0', 'up');
    ip('-n', c.netns[i], 'link', 'set', 'lo', 'up');
  });
  // Each node's only way to the fake internet is the bridge.
  c.netns.forEach((ns) => ip('-n', ns, 'route', 'add', '203.0.113.0/24', 'via', DRIVER_IP));
  c.internet = await startInternet();
  let storeSpec = path.join(root, 'store');
  let env = {};
  if (store === 's3') {
    c.weed = await startWeed(root);
    storeSpec = c.weed.spec;
    env = c.weed.env;
  }
  c.store = storeSpec;
  // The drivers' environment: the store's, and the database they share (nodes get the store's).
  let denv = env;
  if (drivers > 1 || database === 'postgres') {
    c.pg = await startPostgres();
    denv = { ...env, VMON_DATABASE: c.pg.dsn };
  }
  c.env = denv;
  const driverDir = memberDir(root, 'driver');
  // The token is issued before the driver runs: it makes the cluster CA the driver then serves
  // (in the database the drivers share, if they do).
  const tokens = [(await runVmon(['node', 'join-token', '--data-dir', driverDir], { env: denv })).stdout.trim()];
  assert.match(tokens[0], /^vmonjoin\./);
  c.drivers = [];
  for (let i = 0; i < drivers; i++) {
    const name = i === 0 ? 'driver' : `driver-${i + 1}`;
    const dir = i === 0 ? driverDir : memberDir(root, name);
    // The first driver made the admin key; the others serve with it (the database knows it).
    if (i > 0) fs.copyFileSync(path.join(driverDir, 'api-key'), path.join(dir, 'api-key'));
    const d = new VmonServer({
      name, dir, env: denv,
      args: ['--role', 'driver', '--name', name, '--cluster-listen', `${DRIVER_IP}:${3100 + i}`,
        '--gossip-listen', `${DRIVER_IP}:${7946 + i}`, '--store', storeSpec, ...driverArgs, ...driverArgsOf(i)],
    });
    await d.start();
    c.drivers.push(d);
  }
  c.driver = c.drivers[0];
  // The others through the driver's API, as from another host (the key is the data dir's).
  while (tokens.length < spec.length) {
    tokens.push((await runVmon(['node', 'join-token', '--api-url', c.driver.apiUrl, '--data-dir', driverDir])).stdout.trim());
    assert.match(tokens.at(-1), /^vmonjoin\./);
  }
  assert.equal(new Set(tokens).size, tokens.length, 'join tokens repeat');
  let published = null;
  for (const [i, n] of spec.entries()) {
    if (!n.base && published) await published();
    const host = sharedNetns ? spec[0].ip : n.ip;
    const node = new VmonServer({
      name: n.name, role: 'node', dir: memberDir(root, n.name, n.base), host, port: n.port ?? 3001, env,
      wrap: ['nsenter', `--net=/run/netns/${c.nsOf(i)}`],
      args: ['--role', 'node', '--name', n.name, '--gossip-listen', `${host}:${n.gossipPort ?? 7946}`, ...c.drivers.flatMap((_, j) => ['--join', `${DRIVER_IP}:${3100 + j}`]),
        '--join-token', tokens[i], '--warm-pool', '0', '--store', storeSpec, '--egress-upstream-dns', DNS_ADDR, ...(n.args ?? [])],
    });
    c.nodes.push(node);
    await node.start();
    if (n.base && !published) {
      // Its base build in the store: a manifest line in its log says so.
      published = () => waitFor(() => node.tail.some((l) => /template published to the store.*template=base/.test(l)),
        { timeoutMs: 300_000, intervalMs: 500, what: `${n.name}'s base template published to the store` });
    }
  }
  for (const d of c.drivers) await waitFor(async () => (await fetch(`${d.apiUrl}/health`)).ok, { what: `${d.name} healthy` });
  return c;
}

/** Stops what startCluster started and removes it. */
export async function stopCluster(c) {
  if (!c) return;
  for (const n of c.nodes) await n.stop({ cleanup: false }).catch(() => {});
  for (const d of c.drivers ?? []) await d.stop().catch(() => {});
  for (const pid of await pgrep(`${c.root}/`).catch(() => [])) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  c.internet?.close();
  await c.pg?.stop();
  if (c.weed) {
    try {
      process.kill(-c.weed.proc.pid, 'SIGKILL');
    } catch {
      // gone
    }
  }
  for (const ns of c.netns.slice(0, c.made ?? c.netns.length)) {
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
  for (const n of c.nodes) {
    for (const m of ['mntns/mnt', 'mntns']) spawnSync('umount', ['-l', path.join(n.dataDir, m)]);
  }
  fs.rmSync(c.root, { recursive: true, force: true });
}

/** The node of cluster c holding sandbox id, by what its data dir says. */
export function holderIn(c, id) {
  return c.nodes.find((n) => handedOut(n.dataDir, id))?.name;
}

/** `vmon <args> --json` on the driver's data dir (or database), one object per line. */
export async function lsJSON(c, ...args) {
  return (await runVmon([...args, '--json', '--data-dir', c.driver.dataDir], { env: c.env })).stdout
    .split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

/**
 * Sandbox sbx resumed on node `on` of cluster c, which runs it now: a file written before its
 * pause (/tmp/kept), a background loop still counting (/tmp/count), and the records agree.
 */
export async function assertCameBack(c, sbx, on) {
  assert.equal(holderIn(c, sbx.sandboxId), on);
  assert.equal((await sbx.commands.run('cat /tmp/kept')).stdout, 'kept\n');
  const count = async () => Number((await sbx.commands.run('cat /tmp/count')).stdout);
  const c1 = await count();
  await new Promise((r) => setTimeout(r, 1000));
  assert.ok((await count()) > c1, 'the background loop does not count after the resume');
  assert.equal((await lsJSON(c, 'sandbox', 'ls')).find((r) => r.sandboxId === sbx.sandboxId)?.node, on);
}

/** Writes /tmp/kept and starts a loop counting in /tmp/count, for assertCameBack. */
export async function leaveTraces(sbx) {
  await sbx.commands.run('echo kept > /tmp/kept');
  await sbx.commands.run("sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done'", { background: true });
}
