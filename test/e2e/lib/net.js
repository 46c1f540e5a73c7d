// Networking helpers for tests-net/: the fake internet built by test/nettopo, probes that run
// inside a sandbox and classify what happened to a connection, and views of the node's network
// state (links, iptables chains, namespaces, conntrack) for leak checks.
//
// The test runner runs inside the topology's "node" namespace (scripts/test-e2e.sh starts it
// there), so `vmon serve`, the SDK and these helpers share that namespace. assertNodeTopology()
// refuses to go on anywhere else: a sandbox with internet access must never reach a real network.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs';
import net from 'node:net';

// Addresses of test/nettopo (keep in sync with test/nettopo/main.go).
export const INET = Object.freeze({
  A: '203.0.113.10',
  B: '203.0.113.11',
  C: '198.51.100.7',
  D: '198.51.100.8',
  V6: '2001:db8::10',
  // Inside the always-denied ranges; they exist only in the fake internet namespace.
  TEN: '10.1.2.3',
  ONE92: '192.168.7.7',
  CGNAT: '100.64.1.1',
  ONE72: '172.16.5.5',
  METADATA: '169.254.169.254',
});
export const ALWAYS_DENIED_HOSTS = [INET.TEN, INET.ONE92, INET.CGNAT, INET.ONE72, INET.METADATA];
export const NODE_UPLINK = '192.0.2.2';
export const INET_UPLINK = '192.0.2.1';
export const CONTROL_URL = `http://${INET_UPLINK}:8080`;
// A refusal (TCP reset, ICMP unreachable or admin-prohibited) must come back this fast; a
// probe waits PROBE_TIMEOUT_MS before calling a destination silent.
export const FAST_REFUSAL_MS = 2000;
export const PROBE_TIMEOUT_MS = 3000;

export function sh(cmd, args, { timeoutMs = 30_000, allowFail = false } = {}) {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { timeout: timeoutMs, maxBuffer: 32 << 20 }, (err, stdout, stderr) => {
      if (err && !allowFail) {
        err.message = `\`${cmd} ${args.join(' ')}\` failed: ${err.message}\nstdout:\n${stdout}\nstderr:\n${stderr}`;
        reject(err);
        return;
      }
      resolve({ stdout, stderr, code: err ? err.code : 0 });
    });
  });
}

/**
 * Throws unless this process runs in the topology's node namespace: an uplink with 192.0.2.2/24,
 * IPv4 and IPv6 default routes only via the fake internet, no interface besides lo, the uplink
 * and vmon links. Never skip: CI runs these tests as root inside the topology.
 */
export async function assertNodeTopology() {
  const where = 'tests-net must run inside the node namespace of `nettopo up` (see scripts/test-e2e.sh)';
  const addrs = (await sh('ip', ['-o', 'addr', 'show'])).stdout;
  assert.match(addrs, /\binet 192\.0\.2\.2\/24\b/, `${where}: no 192.0.2.2/24 here\n${addrs}`);
  const links = (await sh('ip', ['-o', 'link', 'show'])).stdout
    .split('\n')
    .filter(Boolean)
    .map((l) => l.split(':')[1].trim().split('@')[0]);
  const foreign = links.filter((n) => n !== 'lo' && n !== 'uplink0' && !/^vmon\d+$/.test(n));
  assert.deepEqual(foreign, [], `${where}: unexpected interfaces`);
  const r4 = (await sh('ip', ['-4', 'route', 'show', 'default'])).stdout.trim();
  assert.equal(r4, 'default via 192.0.2.1 dev uplink0', `${where}: IPv4 default route`);
  const routes = (await sh('ip', ['-4', 'route', 'show', 'table', 'all'])).stdout.split('\n').filter(Boolean);
  const unexpected = routes.filter(
    (r) => !/^default via 192\.0\.2\.1 dev uplink0\s*$/.test(r) && !/\bdev (uplink0|lo|vmon\d+)\b/.test(r),
  );
  assert.deepEqual(unexpected, [], `${where}: routes through other interfaces`);
  const r6 = (await sh('ip', ['-6', 'route', 'show', 'default'])).stdout.trim();
  assert.match(r6, /^default via 2001:db8:ffff::1 dev uplink0\b[^\n]*$/, `${where}: IPv6 default route`);
  const ok = await fetch(`${CONTROL_URL}/stats`).then((r) => r.ok, () => false);
  assert.ok(ok, `${where}: the fake internet's control API ${CONTROL_URL} does not answer`);
}

// ---------------------------------------------------------------------------------------------
// The fake internet's control API.

async function control(method, path) {
  const res = await fetch(`${CONTROL_URL}${path}`, { method });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${CONTROL_URL}${path}: ${res.status} ${text}`);
  return JSON.parse(text);
}

/** Per-host counters: { '203.0.113.10': { http, tcp7, udp7, udp9 }, … }. */
export const inetStats = () => control('GET', '/stats');
export const inetReset = () => control('POST', '/reset');
/** The last client (as the fake internet saw it, i.e. after NAT) of host:9, '' if none. */
export const lastClient = async (host) => (await control('GET', `/last?host=${host}`)).client;
/** Makes host:9 send `count` datagrams "<payload>-<i>" to its last client. */
export const sendLate = (host, count, payload) =>
  control('POST', `/late?host=${host}&count=${count}&payload=${encodeURIComponent(payload)}`);

/** How many times each host saw anything since `before` (a previous inetStats()). */
export function statsDelta(before, after) {
  const out = {};
  for (const [h, c] of Object.entries(after)) {
    const d = {};
    for (const [k, v] of Object.entries(c)) if (v !== (before[h]?.[k] ?? 0)) d[k] = v - (before[h]?.[k] ?? 0);
    if (Object.keys(d).length) out[h] = d;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Probes inside a sandbox.

// Runs a list of probes in parallel threads and prints one JSON array. Outcomes:
//   answered  the destination answered (HTTP body / echoed payload)
//   refused   fast failure: TCP reset, ICMP unreachable or admin-prohibited (errno given)
//   silent    nothing came back within the timeout
//   broken    connected but the exchange failed afterwards (reset, EOF, wrong echo)
//   error     anything else (errno given)
const PROBE_PY = String.raw`
import base64, errno, json, socket, struct, sys, threading, time
REFUSE = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM,
          errno.EHOSTDOWN, errno.ECONNRESET, errno.EADDRNOTAVAIL}
def fam(h):
    return socket.AF_INET6 if ':' in h else socket.AF_INET
def recv_all(s, until=None):
    data = b''
    while True:
        c = s.recv(65536)
        if not c:
            return data
        data += c
        if until is not None and data.endswith(until):
            return data
def csum(b):
    if len(b) % 2:
        b += b'\0'
    n = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    n = (n >> 16) + (n & 0xffff)
    n += n >> 16
    return ~n & 0xffff
def one(t):
    start = time.monotonic()
    proto, host, port = t['proto'], t['host'], t['port']
    to = t.get('timeoutMs', 3000) / 1000.0
    phase = 'connect'
    r = {}
    s = None
    try:
        if proto in ('tcp', 'http'):
            s = socket.socket(fam(host), socket.SOCK_STREAM)
            s.settimeout(to)
            if t.get('src'):
                s.bind((t['src'], 0))
            s.connect((host, port))
            phase = 'exchange'
            if proto == 'http':
                s.sendall(('GET / HTTP/1.0\r\nHost: %s\r\n\r\n' % host).encode())
                data = recv_all(s).decode(errors='replace')
                head, _, body = data.partition('\r\n\r\n')
                status = head.split(' ')[1] if head.startswith('HTTP/') else '?'
                r = {'outcome': 'answered' if status == '200' else 'broken', 'status': status, 'body': body.strip()}
            else:
                msg = (t.get('payload') or 'ping') + '\n'
                s.sendall(msg.encode())
                data = recv_all(s, b'\n').decode(errors='replace')
                r = {'outcome': 'answered' if data == msg else 'broken', 'body': data.strip()}
        elif proto == 'udp':
            s = socket.socket(fam(host), socket.SOCK_DGRAM)
            s.settimeout(to)
            if t.get('src') or t.get('sport'):
                s.bind((t.get('src') or '', t.get('sport') or 0))
            s.connect((host, port))
            msg = (t.get('payload') or 'ping').encode()
            s.send(msg)
            phase = 'exchange'
            data = s.recv(65536)
            r = {'outcome': 'answered' if data == msg else 'broken', 'body': data.decode(errors='replace')}
        elif proto == 'icmp':
            v6 = ':' in host
            s = socket.socket(fam(host), socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6 if v6 else socket.IPPROTO_ICMP)
            s.settimeout(to)
            s.connect((host, 0))
            body = (t.get('payload') or 'ping').encode()
            typ = 128 if v6 else 8
            hdr = struct.pack('!BBHHH', typ, 0, 0, 0x1234, 1)
            s.send(struct.pack('!BBHHH', typ, 0, csum(hdr + body), 0x1234, 1) + body)
            phase = 'exchange'
            data = s.recv(65536)
            ok = data[0] == (129 if v6 else 0) and data[8:] == body
            r = {'outcome': 'answered' if ok else 'broken', 'body': data[8:].decode(errors='replace'), 'type': data[0]}
        else:
            r = {'outcome': 'error', 'error': 'unknown proto ' + proto}
    except socket.timeout:
        r = {'outcome': 'silent', 'phase': phase}
    except OSError as e:
        name = errno.errorcode.get(e.errno, str(e.errno))
        if phase == 'connect' or proto in ('udp', 'icmp'):
            out = 'refused' if e.errno in REFUSE else 'error'
        else:
            out = 'broken'
        r = {'outcome': out, 'errno': name, 'error': str(e), 'phase': phase}
    finally:
        if s is not None:
            s.close()
    r['ms'] = round((time.monotonic() - start) * 1000)
    return r
targets = json.loads(base64.b64decode(sys.argv[1]))
results = [None] * len(targets)
def run(i):
    results[i] = one(targets[i])
threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
for th in threads: th.start()
for th in threads: th.join()
print(json.dumps(results))
`;

const PROBE_PATH = '/tmp/vmon-net-probe.py';
const installed = new WeakSet();

async function installProbe(sbx) {
  if (installed.has(sbx)) return;
  await sbx.files.write(PROBE_PATH, PROBE_PY);
  installed.add(sbx);
}

/**
 * Run probes inside the sandbox, in parallel; returns one result per target (same order), each
 * { outcome, ms, body?, status?, errno?, error?, target }.
 * A target is { proto: 'http'|'tcp'|'udp'|'icmp', host, port, payload?, src?, sport?, timeoutMs? };
 * strings 'http://h' (port 80), 'tcp://h:p', 'udp://h:p' (port 7 by default) and 'icmp://h' (echo
 * request) are shorthands.
 */
export async function probe(sbx, targets, { timeoutMs = PROBE_TIMEOUT_MS } = {}) {
  const list = targets.map((t) => ({ timeoutMs, ...(typeof t === 'string' ? parseTarget(t) : t) }));
  await installProbe(sbx);
  const arg = Buffer.from(JSON.stringify(list)).toString('base64');
  const longest = Math.max(...list.map((t) => t.timeoutMs));
  // ICMP echo needs an ICMP datagram ("ping") socket, which the guest grants root only.
  const user = list.some((t) => t.proto === 'icmp') ? 'root' : undefined;
  const res = await sbx.commands.run(`python3 ${PROBE_PATH} ${arg}`, { timeoutMs: longest * 2 + 20_000, user });
  const out = JSON.parse(res.stdout);
  return out.map((r, i) => ({ ...r, target: list[i] }));
}

/** One probe; see probe(). */
export async function probe1(sbx, target, opts) {
  return (await probe(sbx, [target], opts))[0];
}

export function parseTarget(s) {
  const m = /^(http|tcp|udp|icmp):\/\/(\[[^\]]+\]|[^:/]+)(?::(\d+))?$/.exec(s);
  if (!m) throw new Error(`bad probe target ${s}`);
  const host = m[2].replace(/^\[|\]$/g, '');
  const port = m[3] ? Number(m[3]) : { http: 80, icmp: 0 }[m[1]] ?? 7;
  return { proto: m[1], host, port };
}

export const describeTarget = (t) =>
  `${t.proto}://${t.host.includes(':') ? `[${t.host}]` : t.host}${t.proto === 'icmp' ? '' : `:${t.port}`}${t.src ? ` from ${t.src}` : ''}`;

const show = (r) => `${describeTarget(r.target)} → ${JSON.stringify({ ...r, target: undefined })}`;

/** HTTP to a fake-internet host answered by that very host. */
export function assertAnswered(r, msg = '') {
  assert.equal(r.outcome, 'answered', `${msg ? `${msg}: ` : ''}${show(r)} should be answered`);
  if (r.target.proto === 'http' && r.target.port === 80 && Object.values(INET).includes(r.target.host)) {
    assert.equal(r.body, `hello from ${r.target.host}`, `${show(r)}: answered by the wrong host`);
  }
}

/** Refused, and fast (a reset or ICMP error, not a timeout). */
export function assertRefused(r, msg = '', { maxMs = FAST_REFUSAL_MS } = {}) {
  assert.equal(r.outcome, 'refused', `${msg ? `${msg}: ` : ''}${show(r)} should be refused fast (reset/ICMP)`);
  assert.ok(r.ms < maxMs, `${msg ? `${msg}: ` : ''}${show(r)}: refusal took ${r.ms} ms (limit ${maxMs} ms)`);
}

/** Not answered (refused or silent) — for UDP, where a refusal depends on ICMP reaching the socket. */
export function assertNotAnswered(r, msg = '') {
  assert.ok(['refused', 'silent'].includes(r.outcome), `${msg ? `${msg}: ` : ''}${show(r)} should not be answered`);
}

/** Silent: dropped without an answer. */
export function assertSilent(r, msg = '') {
  assert.equal(r.outcome, 'silent', `${msg ? `${msg}: ` : ''}${show(r)} should be silently dropped`);
}

// ---------------------------------------------------------------------------------------------
// Sandbox addressing.

/** The guest's IPv4 address on eth0 (`ip -o -4 addr show dev eth0`), e.g. '172.20.0.2'. */
export async function guestAddr(sbx) {
  const out = (await sbx.commands.run('ip -o -4 addr show dev eth0')).stdout;
  const m = /\binet (\d+\.\d+\.\d+\.\d+)\/(\d+)/.exec(out);
  assert.ok(m, `no IPv4 address on eth0 in ${sbx.sandboxId}: ${out}`);
  return m[1];
}

const ip4ToInt = (a) => a.split('.').reduce((n, o) => n * 256 + Number(o), 0);
const intToIp4 = (n) => [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join('.');

/** The lease a guest address belongs to within pool ('172.20.0.0/16'): { index, host, guest }. */
export function leaseOf(guest, pool) {
  const [base] = pool.split('/');
  return leaseAt(pool, Math.floor((ip4ToInt(guest) - ip4ToInt(base)) / 4));
}

/** Lease `index` of pool: the link vmon<index>, host end .1, guest .2 of the index-th /30. */
export function leaseAt(pool, index) {
  const base = ip4ToInt(pool.split('/')[0]) + index * 4;
  return { index, host: intToIp4(base + 1), guest: intToIp4(base + 2) };
}

// ---------------------------------------------------------------------------------------------
// The node's network state, for leak checks (run in the node namespace).

/** vmon<N> links in this namespace, sorted by N. */
export async function vmonLinks() {
  const out = (await sh('ip', ['-o', 'link', 'show'])).stdout;
  return out
    .split('\n')
    .filter(Boolean)
    .map((l) => l.split(':')[1].trim().split('@')[0])
    .filter((n) => /^vmon\d+$/.test(n))
    .sort((a, b) => Number(a.slice(4)) - Number(b.slice(4)));
}

/** VMON-* chains ("v4 filter VMON-F3") and rules that mention vmon, per iptables family. */
export async function vmonRules() {
  const chains = [];
  const rules = [];
  for (const [fam, bin] of [
    ['v4', 'iptables-save'],
    ['v6', 'ip6tables-save'],
  ]) {
    let table = '';
    for (const line of (await sh(bin, [])).stdout.split('\n')) {
      if (line.startsWith('*')) table = line.slice(1);
      else if (/^:VMON-/.test(line)) chains.push(`${fam} ${table} ${line.slice(1).split(' ')[0]}`);
      else if (line.startsWith('-A ') && /vmon/i.test(line)) rules.push(`${fam} ${table} ${line}`);
    }
  }
  return { chains: chains.sort(), rules: rules.sort() };
}

/** The /run/netns entries vmon owns (this runner has a private /run/netns). */
export function vmonNetns() {
  try {
    return fs
      .readdirSync('/run/netns')
      .filter((n) => n.startsWith('vmon-'))
      .sort();
  } catch (err) {
    if (err.code === 'ENOENT') return [];
    throw err;
  }
}

/** Conntrack entries of this namespace: [{ proto, src, dst, sport, dport, mark, line }]. */
export function conntrack() {
  let text;
  try {
    text = fs.readFileSync('/proc/net/nf_conntrack', 'utf8');
  } catch (err) {
    if (err.code === 'ENOENT') return [];
    throw err;
  }
  return text
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const f = line.split(/\s+/);
      const kv = (k) => (line.match(new RegExp(`\\b${k}=(\\S+)`)) || [])[1];
      return { proto: f[2], src: kv('src'), dst: kv('dst'), sport: kv('sport'), dport: kv('dport'), mark: Number(kv('mark') ?? 0), line };
    });
}

/** Links, VMON chains, per-link rules, namespaces and conntrack entries from guests of `pool`. */
export async function nodeNetState(pool = '172.20.0.0/16') {
  const { chains, rules } = await vmonRules();
  const [base, bits] = pool.split('/');
  const lo = ip4ToInt(base);
  const hi = lo + 2 ** (32 - Number(bits));
  const inPool = (a) => a && /^\d+\.\d+\.\d+\.\d+$/.test(a) && ip4ToInt(a) >= lo && ip4ToInt(a) < hi;
  return {
    links: await vmonLinks(),
    chains,
    linkRules: rules.filter((r) => /-i vmon\d|-o vmon\d|VMON-/.test(r)),
    netns: vmonNetns(),
    guestConntrack: conntrack()
      .filter((c) => inPool(c.src))
      .map((c) => c.line),
  };
}

// ---------------------------------------------------------------------------------------------
// Listeners on the node host (this process runs in the node namespace).

/** TCP and UDP listeners on 0.0.0.0:port that record every peer; close() stops them. */
export async function nodeListener() {
  const seen = [];
  const tcp = net.createServer((c) => {
    seen.push(`tcp ${c.remoteAddress}:${c.remotePort}`);
    c.end('node host\n');
  });
  await new Promise((resolve, reject) => {
    tcp.once('error', reject);
    tcp.listen(0, '0.0.0.0', resolve);
  });
  const port = tcp.address().port;
  const udp = dgram.createSocket('udp4');
  udp.on('message', (msg, rinfo) => {
    seen.push(`udp ${rinfo.address}:${rinfo.port}`);
    udp.send(msg, rinfo.port, rinfo.address);
  });
  await new Promise((resolve, reject) => {
    udp.once('error', reject);
    udp.bind(port, '0.0.0.0', resolve);
  });
  return {
    port,
    seen,
    close: async () => {
      await new Promise((r) => tcp.close(() => r()));
      await new Promise((r) => udp.close(() => r()));
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Expectations over a batch of probes.

// Which fake-internet counter a probe bumps when it arrives (ICMP is answered by the kernel).
function counterOf(t) {
  if (t.proto === 'http' && t.port === 80) return 'http';
  if (t.proto === 'tcp' && t.port === 7) return 'tcp7';
  if (t.proto === 'udp' && (t.port === 7 || t.port === 9)) return `udp${t.port}`;
  return null;
}

// How long a UDP/ICMP probe that should go unanswered waits (it can only ever time out, see
// expectReach).
export const UNANSWERED_WAIT_MS = 1500;

/**
 * Probes `answered`, `refused` and `dropped` targets from the sandbox in one parallel batch and
 * checks every outcome, reporting all mismatches at once:
 *  - answered: answered (HTTP to a fake-internet host by that very host), and the host counted it;
 *  - refused: TCP refused fast (reset, < FAST_REFUSAL_MS); UDP and ICMP not answered (the node
 *    rejects them with ICMP admin-prohibited, but gVisor's netstack does not report ICMP errors to
 *    datagram sockets, so the guest only sees a timeout); and the destination never saw it;
 *  - dropped: silent (no answer at all), and the destination never saw it.
 * Returns the probe results.
 */
export async function expectReach(sbx, { answered = [], refused = [], dropped = [] }, what = '') {
  const norm = (t) => (typeof t === 'string' ? parseTarget(t) : t);
  const cases = [
    ...answered.map((t) => ({ want: 'answered', t: norm(t) })),
    ...refused.map((t) => ({ want: 'refused', t: norm(t) })),
    ...dropped.map((t) => ({ want: 'dropped', t: norm(t) })),
  ];
  const targets = cases.map(({ want, t }) =>
    want !== 'answered' && (t.proto === 'udp' || t.proto === 'icmp' || want === 'dropped')
      ? { timeoutMs: UNANSWERED_WAIT_MS, ...t }
      : t,
  );
  const before = await inetStats();
  const results = await probe(sbx, targets);
  // Let datagrams that were (wrongly) let through reach the counters.
  await new Promise((r) => setTimeout(r, 100));
  const delta = statsDelta(before, await inetStats());
  const failures = [];
  results.forEach((r, i) => {
    const { want, t } = cases[i];
    const key = counterOf(t);
    const arrived = key && delta[t.host]?.[key];
    try {
      if (want === 'answered') {
        assertAnswered(r);
        if (key && Object.values(INET).includes(t.host)) {
          assert.ok(arrived > 0, `${describeTarget(t)} answered, but ${t.host} did not count a ${key} arrival`);
        }
        return;
      }
      if (want === 'refused' && (t.proto === 'tcp' || t.proto === 'http')) assertRefused(r);
      else if (want === 'refused') assertNotAnswered(r);
      else assertSilent(r);
      assert.ok(!arrived, `${describeTarget(t)} was ${want} in the guest, but ${t.host} saw ${arrived} ${key} arrival(s)`);
    } catch (err) {
      failures.push(err.message.split('\n')[0]);
    }
  });
  if (failures.length) {
    assert.fail(
      `${what ? `${what}: ` : ''}${failures.length} of ${results.length} probes went wrong:\n  ${failures.join('\n  ')}\n` +
        `fake internet counters moved: ${JSON.stringify(delta)}`,
    );
  }
  return results;
}

// ---------------------------------------------------------------------------------------------
// Long-lived flows inside a sandbox.

const HOLDER_PY = String.raw`
import json, os, socket, sys, time
host, port, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log = open('/tmp/holder-%s.log' % tag, 'a', buffering=1)
t = socket.create_connection((host, port), 5)
u = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_DGRAM)
u.connect((host, port))
def xchg(n):
    res = {'n': n}
    try:
        t.settimeout(3)
        msg = ('tcp-%d\n' % n).encode()
        t.sendall(msg)
        data = b''
        while not data.endswith(b'\n'):
            c = t.recv(100)
            if not c:
                raise Exception('connection closed')
            data += c
        res['tcp'] = 'ok' if data == msg else 'bad %r' % data
    except Exception as e:
        res['tcp'] = 'fail %r' % e
    try:
        msg = ('udp-%d' % n).encode()
        u.send(msg)
        end = time.time() + 1.5
        res['udp'] = 'fail timeout'
        while time.time() < end:
            u.settimeout(max(0.01, end - time.time()))
            if u.recv(100) == msg:
                res['udp'] = 'ok'
                break
    except Exception as e:
        res['udp'] = 'fail %r' % e
    log.write(json.dumps(res) + '\n')
xchg(0)
n = 1
deadline = time.time() + 3600
while time.time() < deadline:
    if os.path.exists('/tmp/holder-%s-%d' % (tag, n)):
        xchg(n)
        n += 1
    time.sleep(0.05)
`;

/**
 * Opens a TCP connection and a connected UDP socket from the sandbox to host:port (an echo
 * service) and keeps them. exchange(n) sends one line over each and resolves
 * { tcp: 'ok'|'fail …', udp: 'ok'|'fail …' }. Results go to a file in the guest, so the holder
 * outlives the command stream (and the server, for restart tests): pass a fresh handle as `via`.
 */
export async function startHolder(sbx, host, port, tag) {
  await sbx.files.write('/tmp/vmon-net-holder.py', HOLDER_PY);
  await sbx.commands.run(`python3 /tmp/vmon-net-holder.py ${host} ${port} ${tag}`, { background: true, timeoutMs: 0 });
  const read = async (via, n) => {
    const out = (await via.commands.run(`cat /tmp/holder-${tag}.log 2>/dev/null || true`)).stdout;
    return out
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l))
      .find((r) => r.n === n);
  };
  const wait = async (via, n) => {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const r = await read(via, n);
      if (r) return r;
      if (Date.now() > deadline) throw new Error(`holder ${tag} did not report exchange ${n}`);
      await new Promise((res) => setTimeout(res, 100));
    }
  };
  const first = await wait(sbx, 0);
  return {
    first,
    async exchange(n, via = sbx) {
      await via.commands.run(`touch /tmp/holder-${tag}-${n}`);
      return wait(via, n);
    },
  };
}

const UDP_LISTEN_PY = String.raw`
import json, socket, sys, time
sport, send_to, seconds, tag = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
log = open('/tmp/udp-%s.log' % tag, 'a', buffering=1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(('0.0.0.0', sport))
if send_to != '-':
    u.sendto(('hello-' + tag).encode(), (send_to, 9))
log.write(json.dumps({'ready': True}) + '\n')
end = time.time() + seconds
while time.time() < end:
    u.settimeout(max(0.01, end - time.time()))
    try:
        d, a = u.recvfrom(2048)
    except socket.timeout:
        break
    log.write(json.dumps({'from': '%s:%d' % a, 'data': d.decode(errors='replace')}) + '\n')
log.write(json.dumps({'done': True}) + '\n')
`;

/**
 * Binds UDP 0.0.0.0:sport in the sandbox for `seconds`, first sending "hello-<tag>" to
 * sendTo:9 unless sendTo is null, and records every datagram it receives. received() lists
 * them ({ from, data }); done() waits for the end.
 */
export async function udpListen(sbx, { sport, sendTo = null, seconds, tag }) {
  await sbx.files.write('/tmp/vmon-net-udp.py', UDP_LISTEN_PY);
  await sbx.commands.run(`python3 /tmp/vmon-net-udp.py ${sport} ${sendTo ?? '-'} ${seconds} ${tag}`, {
    background: true,
    timeoutMs: 0,
  });
  const lines = async () =>
    (await sbx.commands.run(`cat /tmp/udp-${tag}.log 2>/dev/null || true`)).stdout
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l));
  const deadline = Date.now() + 20_000;
  while (!(await lines()).some((l) => l.ready)) {
    if (Date.now() > deadline) throw new Error(`udp listener ${tag} did not start`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    received: async () => (await lines()).filter((l) => l.from),
    done: async () => {
      const end = Date.now() + seconds * 1000 + 20_000;
      while (!(await lines()).some((l) => l.done)) {
        if (Date.now() > end) throw new Error(`udp listener ${tag} did not finish`);
        await new Promise((r) => setTimeout(r, 200));
      }
      return (await lines()).filter((l) => l.from);
    },
  };
}

/** Adds addresses to the guest's eth0 (as root), e.g. to send with a spoofed source. */
export async function addGuestAddrs(sbx, addrs) {
  await sbx.commands.run(addrs.map((a) => `ip addr add ${a}/32 dev eth0`).join(' && '), { user: 'root' });
}
export async function delGuestAddrs(sbx, addrs) {
  await sbx.commands.run(addrs.map((a) => `ip addr del ${a}/32 dev eth0`).join(' ; ') + ' ; true', { user: 'root' });
}

// ---------------------------------------------------------------------------------------------
// Firewall counters: proof that the node's REJECT rules (not a guest's stack) refused a packet.

/** Packet counts of the REJECT rules of link N's forward chain VMON-F<N> (IPv4). */
export async function linkRejects(index) {
  return rejectCounts(['-t', 'filter', '-L', `VMON-F${index}`, '-v', '-n', '-x']);
}

/** Packet counts of the node-wide always-denied chain VMON-DENIED, which every policy jumps to (IPv4). */
export async function deniedRejects() {
  return rejectCounts(['-t', 'filter', '-L', 'VMON-DENIED', '-v', '-n', '-x']);
}

/** Packet counts of the node-wide INPUT REJECT rules for guest links (IPv4). */
export async function inputRejects() {
  return rejectCounts(['-t', 'filter', '-L', 'INPUT', '-v', '-n', '-x'], /vmon/);
}

async function rejectCounts(args, lineFilter = /./) {
  const out = (await sh('iptables', args)).stdout;
  const c = { tcpReset: 0, icmpProhibited: 0 };
  for (const line of out.split('\n')) {
    if (!/REJECT/.test(line) || !lineFilter.test(line)) continue;
    const pkts = Number(line.trim().split(/\s+/)[0]);
    if (/tcp-reset/.test(line)) c.tcpReset += pkts;
    else if (/admin-prohibited/.test(line)) c.icmpProhibited += pkts;
  }
  return c;
}
