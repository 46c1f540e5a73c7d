// Sandbox networking and the CIDR egress policy (seed 000, issue 5), through the official SDK
// against real `vmon serve --net tap` processes, with real traffic.
//
// The runner runs inside the node namespace of test/nettopo (scripts/test-e2e.sh sets that up,
// with a private /run/netns): every server here, the SDK and the checks share that namespace, and
// the only way out of it is the fake internet namespace with its responders (lib/net.js INET).
//
// UDP and ICMP refusals: the node rejects them with ICMP admin-prohibited (its REJECT counters
// show it), but gVisor's netstack does not report ICMP errors to datagram sockets, so the guest
// sees a timeout; the tests check that nothing arrived instead. TCP refusals must be fast resets.
//
// Guests have no IPv6 route yet: IPv6 policy entries are checked for acceptance, normalisation
// and their ip6tables rules; enforcement by IPv6 traffic is covered by the Go firewall tests in
// real namespaces (internal/firewall).
//
// The pre-attach window is driven with runsc exec in a pre-started sandbox (the SDK's first
// instruction only comes after create returns); the Go tests of internal/netpool and
// internal/firewall cover closed chains for every protocol.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { before, describe } from 'node:test';
import { ALL_TRAFFIC, Sandbox, SandboxNotFoundError } from 'e2b';
import { useServer, runId, killQuietly, waitFor, apiFetch, listAll, pgrep, runtimeIdOf, waitSandboxGone, getInfoRecovered } from '../lib/harness.js';
import {
  INET,
  ALWAYS_DENIED_HOSTS,
  NODE_UPLINK,
  assertNodeTopology,
  expectReach,
  probe,
  probe1,
  assertAnswered,
  assertRefused,
  assertNotAnswered,
  guestAddr,
  leaseOf,
  leaseAt,
  vmonLinks,
  vmonRules,
  vmonNetns,
  conntrack,
  nodeNetState,
  nodeListener,
  lastClient,
  sendLate,
  startHolder,
  udpListen,
  addGuestAddrs,
  delGuestAddrs,
  linkRejects,
  deniedRejects,
  inputRejects,
  inetStats,
  statsDelta,
  sh,
} from '../lib/net.js';

const { A, B, C, D, V6, TEN } = INET;
const DEFAULT_POOL = '172.20.0.0/16';
const RUN = runId('net');
// Extra `vmon serve` flags for every server here, e.g. VMON_E2E_NET_SERVER_ARGS='--log-level debug'.
const EXTRA = (process.env.VMON_E2E_NET_SERVER_ARGS || '').split(/\s+/).filter(Boolean);
const serverArgs = (...args) => ['--net', 'tap', ...args, ...EXTRA];

/** Registers sandbox bookkeeping on a server: create() tags and tracks, teardown kills. */
function sandboxes(srv) {
  const all = [];
  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...all);
  });
  return {
    all,
    async create(opts = {}) {
      const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN }, ...opts });
      all.push(sbx);
      return sbx;
    },
  };
}

/** POST /v2/sandboxes with a raw body. */
const rawCreate = (srv, body) => apiFetch(srv, '/v2/sandboxes', { method: 'POST', body: JSON.stringify(body) });
/** PUT /sandboxes/{id}/network with a raw body. */
const rawUpdate = (srv, id, body) =>
  apiFetch(srv, `/sandboxes/${id}/network`, { method: 'PUT', body: typeof body === 'string' ? body : JSON.stringify(body) });

function rulesOf(n, headers) {
  const rules = {};
  for (let i = 0; i < n; i++) {
    const h = {};
    for (let j = 0; j < headers; j++) h[`X-H${j}`] = 'v';
    rules[`api${i}.example.com`] = [{ transform: { headers: h } }];
  }
  return rules;
}

// Every way an egress configuration can be invalid (seed "Matching", "HTTPS header rules",
// "SOCKS5 egress proxy"): [name, egress config (the PUT body; on create the `network` object),
// a substring of the message]. internal/api/network_test.go's table, plus a few.
const INVALID = [
  ['unspecified /8 in denyOut', { denyOut: ['192.0.2.1', '198.51.100.0/24', '0.0.0.0/8'] }, 'network.denyOut[2]: "0.0.0.0/8": an unspecified address is only accepted as 0.0.0.0/0'],
  ['::/0 in denyOut', { denyOut: ['::/0'] }, 'an unspecified address is only accepted as 0.0.0.0/0'],
  ['bare 0.0.0.0 in allowOut', { allowOut: ['0.0.0.0'] }, 'network.allowOut[0]'],
  ['domain in denyOut', { denyOut: ['example.com'] }, 'domains are only supported in allowOut'],
  ['garbage entry', { allowOut: ['not a host!'] }, 'not a valid IP address, CIDR or domain'],
  ['bad CIDR', { denyOut: ['203.0.113.0/33'] }, 'not a valid CIDR'],
  ['bad IPv6 CIDR', { denyOut: ['2001:db8::/129'] }, 'network.denyOut[0]'],
  ['empty entry', { allowOut: [''] }, 'an empty entry is not allowed'],
  ['entry with a port', { denyOut: ['203.0.113.1:443'] }, 'ports are not supported'],
  ['wildcard in the middle', { allowOut: ['a.*.example.com'], denyOut: [ALL_TRAFFIC] }, "'*' is only allowed"],
  ['allowOut domain without denyOut 0.0.0.0/0', { allowOut: ['example.com'] }, 'require network.denyOut to contain 0.0.0.0/0'],
  ['11 rule domains', { rules: rulesOf(11, 1) }, 'at most 10 rule domains'],
  ['21 headers in a rule', { rules: rulesOf(1, 21) }, 'at most 20 headers per rule'],
  ['129-character rule domain', { rules: { [`${'a'.repeat(63)}.${'b'.repeat(61)}.com`]: [] } }, '1 to 128 characters long, got 129'],
  ['bare * rule domain', { rules: { '*': [] } }, 'a bare * is not a rule domain'],
  ['two rules for one domain', { rules: { 'a.example': [{}, {}] } }, 'at most 1 rule per domain'],
  ['65-character header name', { rules: { 'a.example': [{ transform: { headers: { ['h'.repeat(65)]: 'v' } } }] } }, 'at most 64 characters'],
  ['2049-character header value', { rules: { 'a.example': [{ transform: { headers: { A: 'v'.repeat(2049) } } }] } }, 'at most 2048 characters'],
  ['CRLF in a header value', { rules: { 'a.example': [{ transform: { headers: { A: 'x\r\nB: y' } } }] } }, 'control characters'],
  ['invalid header name', { rules: { 'a.example': [{ transform: { headers: { 'bad header': 'v' } } }] } }, 'not a valid header name'],
  ['proxy address without a port', { egressProxy: { address: 'proxy.example' } }, 'network.egressProxy.address'],
  ['proxy password without username', { egressProxy: { address: 'p.example:1', password: 'x' } }, 'a password requires a username'],
  ['proxy username of 256 bytes', { egressProxy: { address: 'p.example:1', username: 'u'.repeat(256) } }, 'at most 255 bytes, got 256'],
  ['proxy serverName without tls.enabled', { egressProxy: { address: 'p.example:1', tls: { enabled: false, serverName: 'x.example' } } }, 'requires tls.enabled: true'],
  ['proxy caCert that is not PEM', { egressProxy: { address: 'p.example:1', tls: { enabled: true, caCert: 'nope' } } }, 'no PEM certificate found'],
  ['proxy caCert over 8 KiB', { egressProxy: { address: 'p.example:1', tls: { enabled: true, caCert: 'x'.repeat(8193) } } }, 'at most 8192 bytes'],
  ['allowOut not an array', { allowOut: '203.0.113.1' }, 'expected an array of strings'],
];

// Policies this node validates but cannot enforce (no egress-domains / egress-proxy feature).
const NEEDS_FEATURES = [
  ['allowOut domains under deny-all', { network: { allowOut: ['pypi.org', '*.pythonhosted.org'], denyOut: [ALL_TRAFFIC] } }],
  ['allowOut domain with allow_internet_access:false', { allow_internet_access: false, network: { allowOut: ['pypi.org'] } }],
  ['header rules', { network: { rules: { 'api.example.com': [{ transform: { headers: { Authorization: 'Bearer t' } } }] } } }],
  ['egressProxy', { network: { egressProxy: { address: 'proxy.example.com:1080', username: 'u', password: 'p' } } }],
];

describe('egress policy on a --net tap node', () => {
  before(async () => {
    await assertNodeTopology();
  });
  // Without the egress proxy: this node lacks egress-domains, so the 503/400 paths of policies
  // it cannot enforce are tested here (tests-net/domains.test.js runs a node with it).
  const srv = useServer({ name: 'net-policy', args: serverArgs('--egress-proxy-port', '0') });
  const box = sandboxes(srv);

  srv.test('allow-all default: eth0 with a /30 lease, NAT to the fake internet over TCP, UDP and ICMP', async () => {
    const sbx = await box.create();
    const g = await guestAddr(sbx);
    const lease = leaseOf(g, DEFAULT_POOL);
    assert.ok(lease.index >= 0 && lease.index < 16384, `guest address ${g} is in ${DEFAULT_POOL}`);
    assert.equal(g, lease.guest, 'the guest holds .2 of its /30');
    const guestNet = (await sbx.commands.run('ip -o -4 addr show dev eth0; ip -4 route show default')).stdout;
    assert.match(guestNet, new RegExp(`inet ${g.replaceAll('.', '\\.')}/30 `), guestNet);
    assert.match(guestNet, new RegExp(`default via ${lease.host.replaceAll('.', '\\.')} dev eth0`), guestNet);
    // Guests run no DHCP client: the lease arrives with the node's /init push over the agent
    // channel. Sandbox namespaces never hold a lease address (runsc adopts eth0 by a link-local
    // placeholder, which the push replaces), so the lease in the guest can only come from it.
    assert.equal(guestNet.split('\n').filter((l) => / inet /.test(l)).length, 1, `only the pushed lease on eth0: ${guestNet}`);
    // envd took the push on the node's first /init: a refused push would be retried and only
    // show up as a slower create.
    const envdLog = fs.readFileSync(path.join(srv.dataDir, 'sandboxes', runtimeIdOf(srv.dataDir, sbx.sandboxId), 'console.log'), 'utf8');
    assert.match(envdLog, new RegExp(`guest network configured" interface=eth0 address=${g.replaceAll('.', '\\.')}/30 gateway=${lease.host.replaceAll('.', '\\.')}`), envdLog);
    assert.doesNotMatch(envdLog, /path=\/init/, `no /init request failed:\n${envdLog}`);
    const pooled = vmonNetns().filter((n) => n.startsWith('vmon-net-'));
    assert.ok(pooled.length >= 2, `sandbox namespaces: ${pooled}`);
    for (const ns of pooled) {
      const held = (await sh('ip', ['-n', ns, '-o', '-4', 'addr', 'show', 'dev', 'eth0'])).stdout.trim();
      assert.ok(held === '' || /^\d+: eth0 +inet 169\.254\.0\.2\/32 /.test(held), `${ns} eth0: ${held}`);
    }
    assert.ok((await vmonLinks()).includes(`vmon${lease.index}`), `host end vmon${lease.index} exists in the node`);

    await expectReach(sbx, {
      answered: [`http://${A}`, `http://${B}`, `http://${C}`, `http://${D}`, `tcp://${A}:7`, `udp://${A}:7`, `icmp://${A}`],
    });
    // MASQUERADE: the fake internet sees the node's uplink address, never the lease.
    const r = await probe1(sbx, { proto: 'udp', host: A, port: 9, sport: 40123, payload: 'nat-check' });
    assertAnswered(r);
    assert.match(await lastClient(A), /^192\.0\.2\.2:\d+$/, 'the fake internet sees the node uplink as the source');

    const info = await sbx.getInfo();
    assert.notEqual(info.allowInternetAccess, false);
    assert.equal(info.network?.allowOut, undefined);
    assert.equal(info.network?.denyOut, undefined);
    await sbx.kill();
  });

  srv.test('pre-attach window: a pre-started guest has no address, and what it sends before its policy is attached gets nothing out', async () => {
    // The warm pool (--warm-pool 1, the default) holds a booted base sandbox whose link stays
    // closed until a create hands it out. runsc exec plays a guest that does not wait for the
    // node: it configures the lease itself and sends.
    const root = path.join(srv.dataDir, 'sandboxes');
    const warm = () =>
      fs.readdirSync(root).find((d) => /^w[a-z0-9]{19}$/.test(d) && fs.existsSync(path.join(root, d, 'link')) && !fs.existsSync(path.join(root, d, 'sandbox-id')));
    await waitFor(async () => !!warm(), { what: 'a pre-started sandbox' });
    const wid = warm();
    const lease = leaseAt(DEFAULT_POOL, Number(fs.readFileSync(path.join(root, wid, 'link'), 'utf8')));
    const flags = [`--root=${path.join(srv.dataDir, 'runsc')}`, '--platform=systrap', '--network=sandbox', '--host-uds=open', '--overlay2=none', '--allow-suid'];
    const inGuest = async (script) => (await sh('runsc', [...flags, 'exec', wid, 'sh', '-c', script], { timeoutMs: 30_000 })).stdout;

    assert.equal((await inGuest('ip -o -4 addr show dev eth0')).trim().split('\n').length, 1);
    assert.match(await inGuest('ip -o -4 addr show dev eth0'), / inet 169\.254\.0\.2\/32 /, 'before the push eth0 holds only the placeholder');
    assert.equal((await inGuest('ip -4 route show default')).trim(), '', 'and no default route');

    const before = await inetStats();
    const out = await inGuest(
      `ip addr add ${lease.guest}/30 dev eth0 && ip route add default via ${lease.host} dev eth0 && ` +
        `for t in http://${A}/ http://${C}/; do curl -s -m 2 -o /dev/null "$t"; echo "curl $t $?"; done; ` +
        `ping -c 2 -W 1 ${A} >/dev/null 2>&1; echo "ping $?"`,
    );
    assert.match(out, new RegExp(`curl http://${A.replaceAll('.', '\\.')}/ 28`), `curl timed out (silent DROP):\n${out}`);
    assert.match(out, /ping 1/, `ping got no answer:\n${out}`);
    assert.deepEqual(statsDelta(before, await inetStats()), {}, 'nothing reached the fake internet before attach');

    // Handed out: the policy is attached, /init pushes the same lease, and traffic flows.
    const sbx = await box.create();
    assert.equal(runtimeIdOf(srv.dataDir, sbx.sandboxId), wid, 'the create took the pre-started sandbox');
    const guestNet = (await sbx.commands.run('ip -o -4 addr show dev eth0')).stdout;
    assert.equal(guestNet.trim().split('\n').length, 1, guestNet);
    assert.match(guestNet, new RegExp(` inet ${lease.guest.replaceAll('.', '\\.')}/30 `));
    await expectReach(sbx, { answered: [`http://${A}`, `icmp://${A}`] });
    await sbx.kill();
  });

  srv.test('allowInternetAccess: false refuses everything', async () => {
    const sbx = await box.create({ allowInternetAccess: false });
    assert.equal((await sbx.getInfo()).allowInternetAccess, false);
    await expectReach(sbx, {
      refused: [`http://${A}`, `http://${C}`, `tcp://${A}:7`, `udp://${A}:7`, `udp://${D}:9`, `icmp://${A}`],
    });
    await sbx.kill();
  });

  srv.test('deny-all (denyOut 0.0.0.0/0) + allowOut CIDRs: only the allowed destinations answer', async () => {
    const sbx = await box.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ['203.0.113.10', '198.51.100.0/24'] } });
    const info = await sbx.getInfo();
    assert.deepEqual(info.network.allowOut, ['203.0.113.10/32', '198.51.100.0/24']);
    assert.deepEqual(info.network.denyOut, ['0.0.0.0/0']);
    await expectReach(sbx, {
      answered: [`http://${A}`, `http://${C}`, `http://${D}`, `udp://${A}:7`, `icmp://${A}`],
      refused: [`http://${B}`, `tcp://${B}:7`, `udp://${B}:7`, `icmp://${B}`],
    });
    await sbx.kill();
  });

  srv.test('denyOut a single address', async () => {
    const sbx = await box.create({ network: { denyOut: [B] } });
    assert.deepEqual((await sbx.getInfo()).network.denyOut, ['203.0.113.11/32']);
    await expectReach(sbx, {
      answered: [`http://${A}`, `http://${C}`, `udp://${A}:7`],
      refused: [`http://${B}`, `tcp://${B}:7`, `udp://${B}:7`, `icmp://${B}`],
    });
    await sbx.kill();
  });

  srv.test('denyOut a /24', async () => {
    const sbx = await box.create({ network: { denyOut: ['203.0.113.77/24'] } });
    assert.deepEqual((await sbx.getInfo()).network.denyOut, ['203.0.113.0/24'], 'host bits masked off');
    await expectReach(sbx, {
      answered: [`http://${C}`, `http://${D}`, `udp://${C}:7`],
      refused: [`http://${A}`, `http://${B}`, `tcp://${A}:7`, `udp://${A}:7`, `icmp://${B}`],
    });
    await sbx.kill();
  });

  srv.test('an allowOut CIDR wins over a denyOut CIDR that covers it', async () => {
    const sbx = await box.create({ network: { denyOut: ['203.0.113.0/24'], allowOut: [A] } });
    await expectReach(sbx, {
      answered: [`http://${A}`, `udp://${A}:7`, `http://${C}`],
      refused: [`http://${B}`, `udp://${B}:7`],
    });
    await sbx.kill();
  });

  srv.test('allowInternetAccess: false with an allowOut CIDR allows only that CIDR', async () => {
    const sbx = await box.create({ allowInternetAccess: false, network: { allowOut: [A] } });
    await expectReach(sbx, {
      answered: [`http://${A}`],
      refused: [`http://${B}`, `http://${C}`, `udp://${C}:7`],
    });
    await sbx.kill();
  });

  srv.test('always-denied ranges are refused under the default policy', async () => {
    const sbx = await box.create();
    const g = await guestAddr(sbx);
    const index = leaseOf(g, DEFAULT_POOL).index;
    // The refusals come from the node-wide always-denied chain the policy jumps to (this is the
    // only sandbox sending), not from the fake internet: its hosts in those ranges would answer.
    const rejects = await deniedRejects();
    const guard = await linkRejects(index);
    await expectReach(sbx, {
      answered: [`http://${A}`],
      refused: ALWAYS_DENIED_HOSTS.flatMap((h) => [`http://${h}`, `tcp://${h}:7`, `udp://${h}:7`, `icmp://${h}`]),
    });
    const after = await deniedRejects();
    const n = ALWAYS_DENIED_HOSTS.length;
    assert.ok(after.tcpReset - rejects.tcpReset >= 2 * n, `VMON-DENIED reset the TCP attempts: ${JSON.stringify({ rejects, after })}`);
    assert.ok(
      after.icmpProhibited - rejects.icmpProhibited >= 2 * n,
      `VMON-DENIED rejected the UDP and ICMP attempts with admin-prohibited: ${JSON.stringify({ rejects, after })}`,
    );
    assert.deepEqual(await linkRejects(index), guard, `vmon${index}'s guard refused nothing itself: the policy did`);
    await sbx.kill();
  });

  srv.test('always-denied ranges cannot be lifted by allowOut (CIDR, deny-all + allowOut, ALL_TRAFFIC)', async () => {
    const [listed, denyAll, everything] = await Promise.all([
      box.create({ network: { allowOut: ['10.1.2.3', '192.168.0.0/16', '100.64.1.1', '172.16.0.0/12', '169.254.169.254'] } }),
      box.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ['10.1.2.3', '192.168.7.7', A] } }),
      box.create({ network: { allowOut: [ALL_TRAFFIC] } }),
    ]);
    const denied = ALWAYS_DENIED_HOSTS.flatMap((h) => [`http://${h}`, `udp://${h}:7`]);
    await expectReach(listed, { answered: [`http://${A}`], refused: denied }, 'allowOut listing them');
    await expectReach(denyAll, { answered: [`http://${A}`], refused: [...denied, `http://${B}`] }, 'deny-all + allowOut');
    await expectReach(everything, { answered: [`http://${A}`, `http://${B}`], refused: denied }, 'allowOut ALL_TRAFFIC');
    await Promise.all([listed.kill(), denyAll.kill(), everything.kill()]);
  });

  srv.test('IPv6 entries are accepted, normalised, and rendered into ip6tables', async () => {
    const sbx = await box.create({
      network: { allowOut: ['2001:DB8::10', '2001:db8:1::/48', '::ffff:198.51.100.7'], denyOut: ['2001:db8::/32', '2001:db8:0:0:1::5/64'] },
    });
    const info = await sbx.getInfo();
    assert.deepEqual(info.network.allowOut, ['2001:db8::10/128', '2001:db8:1::/48', '198.51.100.7/32']);
    assert.deepEqual(info.network.denyOut, ['2001:db8::/32', '2001:db8::/64']);
    const index = leaseOf(await guestAddr(sbx), DEFAULT_POOL).index;
    const v6 = (await sh('ip6tables-save', ['-t', 'filter'])).stdout.split('\n');
    // The link's policy chain jumps to the policy's chain, shared by every link with this policy.
    const jump = v6.find((l) => l.startsWith(`-A VMON-E${index} -j VMON-POL-`));
    assert.ok(jump, `VMON-E${index} jumps to a shared policy chain:\n${v6.filter((l) => l.includes(`VMON-E${index}`)).join('\n')}`);
    const chain = jump.split(' ').at(-1);
    for (const rule of [`-A ${chain} -j VMON-DENIED`, `-A ${chain} -d 2001:db8::10/128 -j ACCEPT`, `-A ${chain} -d 2001:db8:1::/48 -j ACCEPT`, `-A ${chain} -d 2001:db8::/32 -j RETURN`, '-A VMON-DENIED -d fc00::/7 -p tcp -j REJECT --reject-with tcp-reset']) {
      assert.ok(v6.includes(rule), `ip6tables has "${rule}":\n${v6.filter((l) => l.includes(chain)).join('\n')}`);
    }
    // IPv4 is unaffected by the IPv6 entries; the guest has no IPv6 route at all.
    await expectReach(sbx, { answered: [`http://${A}`, `http://${B}`, `http://${C}`], refused: [`http://[${V6}]`] });

    await sbx.updateNetwork({ denyOut: ['2001:DB8::1'], allowOut: ['2001:db8:0::10/64'] });
    const upd = await sbx.getInfo();
    assert.deepEqual(upd.network.denyOut, ['2001:db8::1/128']);
    assert.deepEqual(upd.network.allowOut, ['2001:db8::/64']);
    await sbx.kill();
  });

  srv.test('live update: new connections follow the policy, an established TCP connection survives', async () => {
    const sbx = await box.create({ network: { allowPublicTraffic: false } });
    const holder = await startHolder(sbx, A, 7, 'live');
    assert.deepEqual({ tcp: holder.first.tcp, udp: holder.first.udp }, { tcp: 'ok', udp: 'ok' }, 'flows open before any update');

    await sbx.updateNetwork({ denyOut: [A] });
    let info = await sbx.getInfo();
    assert.deepEqual(info.network.denyOut, ['203.0.113.10/32']);
    assert.equal(info.network.allowPublicTraffic, false, 'ingress settings are kept by a live update');
    await expectReach(sbx, { answered: [`http://${B}`, `udp://${B}:7`], refused: [`http://${A}`, `tcp://${A}:7`, `udp://${A}:7`] }, 'after denyOut A');
    let x = await holder.exchange(1);
    assert.equal(x.tcp, 'ok', `the TCP connection opened before the update still works: ${JSON.stringify(x)}`);
    assert.match(x.udp, /^fail/, `UDP is judged per packet, so the old UDP flow is cut: ${JSON.stringify(x)}`);

    await sbx.updateNetwork({ allowInternetAccess: false });
    info = await sbx.getInfo();
    assert.equal(info.allowInternetAccess, false);
    assert.equal(info.network.denyOut, undefined, 'a live update is a full replacement: denyOut cleared');
    assert.equal(info.network.allowPublicTraffic, false);
    await expectReach(sbx, { refused: [`http://${A}`, `http://${B}`, `http://${C}`, `udp://${B}:7`] }, 'after allowInternetAccess:false');
    x = await holder.exchange(2);
    assert.equal(x.tcp, 'ok', `the established TCP connection survives a second update: ${JSON.stringify(x)}`);

    await sbx.updateNetwork({});
    info = await sbx.getInfo();
    assert.notEqual(info.allowInternetAccess, false, 'an empty update clears allowInternetAccess:false');
    assert.equal(info.network.denyOut, undefined);
    await expectReach(sbx, { answered: [`http://${A}`, `http://${B}`, `udp://${A}:7`] }, 'after an empty update');
    x = await holder.exchange(3);
    assert.deepEqual({ tcp: x.tcp, udp: x.udp }, { tcp: 'ok', udp: 'ok' }, 'both old flows work again');
    await sbx.kill();
  });

  srv.test('pause and resume: the policy (and a live update made before the pause) holds from the first restored instruction', async () => {
    const sbx = await box.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: [A, B] } });
    await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: [A] }); // B is denied from now on
    // A guest that sends to the denied B and the allowed A all the time, through every pause and
    // resume: it runs again at the first restored instruction, before /init pushed its new lease.
    await sbx.commands.run(
      `while true; do curl -s -m 1 -o /dev/null http://${B}/; printf x | nc -u -w0 ${B} 7; curl -s -m 1 -o /dev/null http://${A}/; sleep 0.02; done`,
      { background: true, user: 'root' },
    );
    const before = await inetStats();
    for (let cycle = 0; cycle < 3; cycle++) {
      assert.equal(await sbx.pause(), true);
      const back = await Sandbox.connect(sbx.sandboxId, { ...srv.sdkOpts, ...(cycle === 2 ? { onResume: 'reboot' } : {}) });
      const addr = await guestAddr(back);
      const info = await back.getInfo();
      assert.deepEqual(info.network.allowOut, ['203.0.113.10/32'], `cycle ${cycle}: the live update survived the pause`);
      await expectReach(back, { answered: [`http://${A}`], refused: [`http://${B}`, `tcp://${B}:7`, `http://${C}`] }, `after resume ${cycle} (${addr})`);
    }
    const delta = statsDelta(before, await inetStats());
    assert.equal(delta[B], undefined, `the denied host got traffic across pause/resume: ${JSON.stringify(delta)}`);
    assert.ok(delta[A], `the allowed host got nothing: ${JSON.stringify(delta)}`);
    // A paused sandbox holds no link: its lease went back to the pool.
    assert.equal(await sbx.pause(), true);
    const rid = runtimeIdOf(srv.dataDir, sbx.sandboxId);
    // The snapshot is written after pause answers; then the sandbox directory (and link file) goes.
    await waitFor(() => !fs.existsSync(path.join(srv.dataDir, 'sandboxes', rid)), {
      timeoutMs: 30_000,
      what: 'the paused sandbox to give up its directory and link',
    });
    await sbx.kill();
  });

  srv.test('snapshot and fork: forks of a deny-all sandbox are deny-all from their first instruction, each on its own lease', async () => {
    const sbx = await box.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: [A] } });
    await sbx.commands.run(
      `while true; do curl -s -m 1 -o /dev/null http://${B}/; printf x | nc -u -w0 ${B} 7; sleep 0.02; done`,
      { background: true, user: 'root' },
    );
    const before = await inetStats();
    const snap = await sbx.createSnapshot();
    // A sandbox created from a snapshot is a new sandbox: its own create options set its policy
    // (as a template's sandboxes do); forks inherit the source's.
    const fromSnap = await Sandbox.create(snap.snapshotId, {
      ...srv.sdkOpts,
      metadata: { run: RUN },
      network: { denyOut: [ALL_TRAFFIC], allowOut: [A] },
    });
    box.all.push(fromSnap);
    const res = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}/fork`, { method: 'POST', body: '{"count":2}' });
    assert.equal(res.status, 201, res.text);
    const forks = [];
    for (const e of res.json) {
      const f = await Sandbox.connect(e.sandbox.sandboxID, srv.sdkOpts);
      box.all.push(f);
      forks.push(f);
    }
    const addrs = new Set();
    for (const s of [sbx, fromSnap, ...forks]) {
      addrs.add(await guestAddr(s));
      await expectReach(s, { answered: [`http://${A}`], refused: [`http://${B}`, `http://${C}`] }, s.sandboxId);
    }
    assert.equal(addrs.size, 4, `sandboxes share a lease: ${[...addrs]}`);
    const delta = statsDelta(before, await inetStats());
    assert.equal(delta[B], undefined, `the denied host got traffic from a snapshot or fork: ${JSON.stringify(delta)}`);
    await Sandbox.deleteSnapshot(snap.snapshotId, srv.sdkOpts);
  });

  srv.test('a rejected live update (invalid, or needing a missing feature) → 400 and changes nothing', async () => {
    const sbx = await box.create({ network: { denyOut: [B] } });
    for (const [name, body, msg] of INVALID) {
      const res = await rawUpdate(srv, sbx.sandboxId, body);
      assert.equal(res.status, 400, `${name}: ${res.text}`);
      assert.equal(res.json?.code, 400, `${name}: E2B error body: ${res.text}`);
      assert.ok(res.json.message.includes(msg), `${name}: message ${JSON.stringify(res.json.message)} should contain ${JSON.stringify(msg)}`);
    }
    for (const [name, body] of NEEDS_FEATURES) {
      const upd = { ...body.network, ...(body.allow_internet_access === undefined ? {} : { allow_internet_access: body.allow_internet_access }) };
      const res = await rawUpdate(srv, sbx.sandboxId, upd);
      assert.equal(res.status, 400, `${name} as a live update: ${res.text}`);
      assert.match(res.json.message, /cannot enforce this network policy: .*need the egress-(domains|proxy) feature/, `${name}: ${res.text}`);
    }
    const malformed = await rawUpdate(srv, sbx.sandboxId, '{"denyOut": [');
    assert.equal(malformed.status, 400, malformed.text);
    await assert.rejects(sbx.updateNetwork({ denyOut: ['example.com'] }), /domains are only supported in allowOut/);

    const info = await sbx.getInfo();
    assert.deepEqual(info.network.denyOut, ['203.0.113.11/32'], 'the stored policy is unchanged');
    assert.equal(info.network.allowOut, undefined);
    await expectReach(sbx, { answered: [`http://${A}`], refused: [`http://${B}`] }, 'the enforced policy is unchanged');
    await sbx.kill();
  });

  srv.test('PUT /sandboxes/{id}/network on a killed sandbox → 409; on an unknown one → 404', async () => {
    const sbx = await box.create();
    await sbx.updateNetwork({ denyOut: [B] });
    assert.equal(await sbx.kill(), true);
    const res = await rawUpdate(srv, sbx.sandboxId, { denyOut: [ALL_TRAFFIC] });
    assert.equal(res.status, 409, res.text);
    assert.equal(res.json?.code, 409);
    assert.match(res.json.message, /only a running sandbox's network can be updated/);
    await assert.rejects(sbx.updateNetwork({ denyOut: [ALL_TRAFFIC] }), (err) => {
      assert.match(err.message, /409/);
      return true;
    });
    const unknown = await rawUpdate(srv, 'nonexistent0sandbox', { denyOut: [ALL_TRAFFIC] });
    assert.equal(unknown.status, 404, unknown.text);
    await assert.rejects(Sandbox.updateNetwork('nonexistent0sandbox', {}, srv.sdkOpts), SandboxNotFoundError);
  });

  srv.test('every invalid policy on create → 400 with a message, and nothing is created', async () => {
    const count = async () => (await listAll(srv.sdkOpts)).length;
    const before = await count();
    for (const [name, network, msg] of INVALID) {
      const res = await rawCreate(srv, { templateID: 'base', network });
      assert.equal(res.status, 400, `${name}: ${res.text}`);
      assert.equal(res.json?.code, 400, `${name}: E2B error body: ${res.text}`);
      assert.ok(res.json.message.includes(msg), `${name}: message ${JSON.stringify(res.json.message)} should contain ${JSON.stringify(msg)}`);
    }
    await assert.rejects(Sandbox.create({ ...srv.sdkOpts, network: { denyOut: ['0.0.0.0/8'] } }), /only accepted as 0\.0\.0\.0\/0/);
    assert.equal(await count(), before, 'no sandbox was created');
  });

  srv.test('domains, rules and egressProxy on create → 503 sandbox_no_compatible_node', async () => {
    for (const [name, extra] of NEEDS_FEATURES) {
      const res = await rawCreate(srv, { templateID: 'base', ...extra });
      assert.equal(res.status, 503, `${name}: ${res.text}`);
      assert.equal(res.json?.error_code, 'sandbox_no_compatible_node', `${name}: ${res.text}`);
      assert.match(res.json.message, /no node can enforce this network policy/, `${name}: ${res.text}`);
    }
    await assert.rejects(
      Sandbox.create({ ...srv.sdkOpts, network: { allowOut: ['pypi.org'], denyOut: [ALL_TRAFFIC] } }),
      /no node can enforce this network policy/,
    );
  });

  srv.test('isolation: a sandbox cannot reach another sandbox’s address or host end', async () => {
    const [a, b] = await Promise.all([box.create(), box.create()]);
    const [ga, gb] = await Promise.all([guestAddr(a), guestAddr(b)]);
    const la = leaseOf(ga, DEFAULT_POOL);
    const lb = leaseOf(gb, DEFAULT_POOL);
    assert.notEqual(la.index, lb.index);
    await b.commands.run('python3 -m http.server 8000 --bind 0.0.0.0', { background: true, timeoutMs: 0, cwd: '/tmp' });
    await waitFor(async () => (await probe1(b, `http://${gb}:8000`)).outcome === 'answered', {
      timeoutMs: 20_000,
      what: `b's own server on ${gb}:8000`,
    });
    const fwd = await linkRejects(la.index);
    const input = await inputRejects();
    const r = await probe(a, [`http://${gb}:8000`, `tcp://${gb}:22`, `http://${lb.host}:8000`, { proto: 'icmp', host: gb, port: 0, timeoutMs: 1500 }, { proto: 'udp', host: gb, port: 8000, timeoutMs: 1500 }]);
    assertRefused(r[0], 'a → b guest');
    assertRefused(r[1], 'a → b guest, another port');
    assertRefused(r[2], "a → b's host end");
    assertNotAnswered(r[3], 'a → b guest, ICMP');
    assertNotAnswered(r[4], 'a → b guest, UDP');
    const fwd2 = await linkRejects(la.index);
    const input2 = await inputRejects();
    assert.ok(fwd2.tcpReset - fwd.tcpReset >= 2, `vmon${la.index}'s forward chain reset a → b: ${JSON.stringify({ fwd, fwd2 })}`);
    assert.ok(input2.tcpReset - input.tcpReset >= 1, `the node's INPUT rule reset a → b's host end: ${JSON.stringify({ input, input2 })}`);
    await Promise.all([a.kill(), b.kill()]);
  });

  srv.test('isolation: a sandbox reaches no address of the node host', async () => {
    const listener = await nodeListener();
    try {
      // The listener is up on every node address.
      for (const host of ['127.0.0.1', NODE_UPLINK]) {
        await new Promise((resolve, reject) => {
          const c = net.connect(listener.port, host, () => c.end(resolve));
          c.on('error', reject);
        });
      }
      listener.seen.length = 0;
      const sbx = await box.create();
      const lease = leaseOf(await guestAddr(sbx), DEFAULT_POOL);
      // Its own host end, the uplink, and another link's host end (the ready pool always has one).
      const other = (await vmonLinks()).map((n) => Number(n.slice(4))).find((i) => i !== lease.index);
      assert.ok(other !== undefined, 'another vmon link exists');
      const hostAddrs = [lease.host, NODE_UPLINK, leaseAt(DEFAULT_POOL, other).host];
      const input = await inputRejects();
      const results = await probe(sbx, [
        ...hostAddrs.map((h) => ({ proto: 'tcp', host: h, port: listener.port })),
        ...hostAddrs.map((h) => ({ proto: 'udp', host: h, port: listener.port, timeoutMs: 1500 })),
        { proto: 'icmp', host: lease.host, port: 0, timeoutMs: 1500 },
      ]);
      for (const r of results) {
        if (r.target.proto === 'tcp') assertRefused(r, 'guest → node host');
        else assertNotAnswered(r, 'guest → node host');
      }
      assert.deepEqual(listener.seen, [], 'the node listener saw no guest traffic');
      const input2 = await inputRejects();
      assert.ok(input2.tcpReset - input.tcpReset >= hostAddrs.length, `INPUT reset the TCP attempts: ${JSON.stringify({ input, input2 })}`);
      assert.ok(
        input2.icmpProhibited - input.icmpProhibited >= hostAddrs.length + 1,
        `INPUT rejected UDP and ICMP with admin-prohibited: ${JSON.stringify({ input, input2 })}`,
      );
      await sbx.kill();
    } finally {
      await listener.close();
    }
  });

  srv.test('spoofed source addresses are dropped', async () => {
    const sbx = await box.create();
    const g = await guestAddr(sbx);
    // Another lease's guest address, and an address from nowhere.
    const spoofs = [g === '172.20.255.254' ? '172.20.255.250' : '172.20.255.254', '10.99.0.1'];
    await addGuestAddrs(sbx, spoofs);
    try {
      await expectReach(
        sbx,
        {
          dropped: spoofs.flatMap((src) => [
            { proto: 'http', host: A, port: 80, src },
            { proto: 'udp', host: A, port: 7, src },
            { proto: 'udp', host: B, port: 9, src },
          ]),
        },
        'spoofed sources',
      );
    } finally {
      await delGuestAddrs(sbx, spoofs);
    }
    await expectReach(sbx, { answered: [`http://${A}`, `udp://${A}:7`] }, 'own address afterwards');
    await sbx.kill();
  });
});

describe('--egress-internal-allow 10.1.2.0/24', () => {
  before(async () => {
    await assertNodeTopology();
  });
  const srv = useServer({ name: 'net-internal', args: serverArgs('--egress-internal-allow', '10.1.2.0/24') });
  const box = sandboxes(srv);

  srv.test('the exempted block is reachable by default; the rest of the always-denied ranges is not', async () => {
    const sbx = await box.create();
    await expectReach(sbx, {
      answered: [`http://${TEN}`, `tcp://${TEN}:7`, `udp://${TEN}:7`, `icmp://${TEN}`, `http://${A}`],
      refused: ALWAYS_DENIED_HOSTS.filter((h) => h !== TEN).flatMap((h) => [`http://${h}`, `udp://${h}:7`]),
    });
    await sbx.kill();
  });

  srv.test('the sandbox’s own denyOut still applies to the exempted block', async () => {
    const [single, wide, none] = await Promise.all([
      box.create({ network: { denyOut: [TEN] } }),
      box.create({ network: { denyOut: ['10.0.0.0/8'] } }),
      box.create({ allowInternetAccess: false }),
    ]);
    await expectReach(single, { answered: [`http://${A}`], refused: [`http://${TEN}`, `udp://${TEN}:7`] }, 'denyOut 10.1.2.3');
    await expectReach(wide, { answered: [`http://${A}`], refused: [`http://${TEN}`] }, 'denyOut 10.0.0.0/8');
    await expectReach(none, { refused: [`http://${TEN}`, `http://${A}`] }, 'allowInternetAccess:false');
    await Promise.all([single.kill(), wide.kill(), none.kill()]);
  });

  srv.test('deny-all + allowOut reaches the exempted block, never the other ranges', async () => {
    const sbx = await box.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: ['10.1.2.0/24', '192.168.7.7'] } });
    await expectReach(sbx, { answered: [`http://${TEN}`, `udp://${TEN}:7`], refused: [`http://${A}`, `http://${INET.ONE92}`] });
    await sbx.kill();
  });
});

describe('lease reuse on a two-lease pool (--net-pool 172.31.0.0/29)', () => {
  const POOL = '172.31.0.0/29';
  before(async () => {
    await assertNodeTopology();
  });
  const srv = useServer({
    name: 'net-reuse',
    args: serverArgs('--net-pool', POOL, '--warm-pool', '0', '--boot-concurrency', '1'),
  });
  const box = sandboxes(srv);

  srv.test('the ready pool holds one link, refills after a create, and a create beyond the pool fails fast', async () => {
    await waitFor(async () => (await vmonLinks()).length === 1, { timeoutMs: 10_000, what: 'one ready link at start' });
    const a = await box.create();
    await waitFor(async () => (await vmonLinks()).length === 2, { timeoutMs: 10_000, what: 'the ready pool to refill' });
    const x = await box.create();
    const addrs = [await guestAddr(a), await guestAddr(x)].sort();
    assert.deepEqual(addrs, ['172.31.0.2', '172.31.0.6'], 'the two leases of the pool');
    const t0 = Date.now();
    const res = await rawCreate(srv, { templateID: 'base', metadata: { run: RUN } });
    assert.equal(res.status, 429, `a create with every lease taken: ${res.text}`);
    assert.match(res.json.message, /no free address in the network pool/);
    assert.ok(Date.now() - t0 < 5000, `refused in ${Date.now() - t0} ms`);
    await Promise.all([a.kill(), x.kill()]);
    await waitFor(async () => (await vmonLinks()).length === 2, { timeoutMs: 10_000, what: 'released links kept ready' });
  });

  srv.test("a killed sandbox's NAT and conntrack state does not reach the next sandbox on its address", async () => {
    const a = await box.create();
    const x = await box.create(); // holds the other lease, so the next create gets a's
    const ga = await guestAddr(a);
    const SPORT = 40009;

    // a: a UDP flow to A:9 (and a TCP connection to A:7), then proof that late datagrams reach it.
    const la = await udpListen(a, { sport: SPORT, sendTo: A, seconds: 120, tag: 'a' });
    await waitFor(async () => (await la.received()).some((d) => d.data === 'hello-a'), { what: "a's echo from A:9" });
    const mapping = await lastClient(A);
    assert.match(mapping, /^192\.0\.2\.2:\d+$/, 'A:9 saw a through the node NAT');
    await startHolder(a, A, 7, 'reuse');
    let late = await sendLate(A, 2, 'to-a');
    assert.equal(late.client, mapping);
    await waitFor(async () => (await la.received()).filter((d) => /^to-a-/.test(d.data)).length === 2, {
      what: 'late datagrams to reach a while it lives (positive control)',
    });
    const flowsOfA = conntrack().filter((c) => c.src === ga);
    assert.ok(
      flowsOfA.some((c) => c.proto === 'udp' && c.dport === '9') && flowsOfA.some((c) => c.proto === 'tcp' && c.dport === '7'),
      `conntrack holds a's UDP and TCP flows:\n${flowsOfA.map((c) => c.line).join('\n')}`,
    );

    assert.equal(await a.kill(), true);
    const b = await box.create();
    assert.equal(await guestAddr(b), ga, 'b got the lease a had');
    const leftovers = conntrack().filter((c) => c.src === ga || c.dst === ga);
    assert.deepEqual(leftovers.map((c) => c.line), [], "no conntrack entry of a's flows survives a's release");

    // b listens on the very port a used; the fake internet replays to a's old NAT mapping.
    const lb = await udpListen(b, { sport: SPORT, sendTo: null, seconds: 4, tag: 'b' });
    late = await sendLate(A, 3, 'to-b');
    assert.equal(late.client, mapping, 'the fake internet still targets the old mapping');
    assert.equal(late.sent, 3);
    const got = await lb.done();
    assert.deepEqual(got, [], "b must not receive datagrams sent to a's old NAT mapping");

    // Positive control: once b opens its own flow, late datagrams reach b.
    const lb2 = await udpListen(b, { sport: SPORT, sendTo: A, seconds: 60, tag: 'b2' });
    await waitFor(async () => (await lb2.received()).some((d) => d.data === 'hello-b2'), { what: "b's own echo" });
    await sendLate(A, 1, 'to-b2');
    await waitFor(async () => (await lb2.received()).some((d) => d.data === 'to-b2-0'), { what: "datagrams on b's own flow" });
    await Promise.all([b.kill(), x.kill()]);
  });
});

describe('kill -9 of the server and restart: no orphan links, chains, namespaces or conntrack entries', () => {
  const POOL = '172.20.0.0/16';
  let baseline;
  before(async () => {
    await assertNodeTopology();
    baseline = await nodeNetState(POOL);
  });
  const srv = useServer({ name: 'net-restart', args: serverArgs('--warm-pool', '0', '--boot-concurrency', '1') });
  const box = sandboxes(srv);
  const kept = []; // { sbx, lease }
  let doomed;

  const linkIndex = (name) => Number(/(\d+)$/.exec(name)[1]);
  const chainIndices = (chains) => [...new Set(chains.map((c) => Number(/VMON-[A-Z](\d+)$/.exec(c)?.[1])))].sort((x, y) => x - y);

  const runtimeId = (id) => runtimeIdOf(srv.dataDir, id);

  srv.test('after kill -9 and restart only the recovered sandboxes’ links remain, with their policy', async () => {
    assert.deepEqual(
      { ...baseline, guestConntrack: [] },
      { links: [], chains: [], linkRules: [], netns: [], guestConntrack: [] },
      'earlier servers left nothing behind',
    );
    const a = await box.create({ network: { denyOut: [B] } });
    const b = await box.create();
    doomed = await box.create();
    for (const sbx of [a, b]) kept.push({ sbx, lease: leaseOf(await guestAddr(sbx), POOL) });
    const gd = await guestAddr(doomed);
    const holder = await startHolder(a, A, 7, 'restart');
    assert.equal(holder.first.tcp, 'ok');
    assertAnswered(await probe1(doomed, { proto: 'udp', host: A, port: 9, sport: 40077 }));
    assert.ok(conntrack().some((c) => c.src === gd), 'the doomed sandbox has a conntrack entry');
    await waitFor(async () => (await vmonLinks()).length === 4, { timeoutMs: 10_000, what: '3 links in use + 1 ready' });

    const rid = runtimeId(doomed.sandboxId);
    const runtimePids = await pgrep(rid);
    assert.ok(runtimePids.length > 0, `runtime processes of ${doomed.sandboxId} (${rid})`);
    await srv.kill9();
    for (const pid of runtimePids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch (err) {
        if (err.code !== 'ESRCH') throw err;
      }
    }
    await waitFor(async () => (await pgrep(rid)).length === 0, { timeoutMs: 10_000, what: `runtime of ${doomed.sandboxId} to die` });
    await srv.restart();

    await waitSandboxGone(srv.sdkOpts, doomed.sandboxId, 'the doomed sandbox to be reported gone');
    const held = kept.map((k) => k.lease.index).sort((x, y) => x - y);
    let state;
    await waitFor(
      async () => {
        state = await nodeNetState(POOL);
        return state.links.length === 3 && held.every((i) => state.links.includes(`vmon${i}`));
      },
      { timeoutMs: 20_000, what: () => `the recovered links ${held} + 1 ready link (now: ${JSON.stringify(state)})` },
    );
    const linkIdx = state.links.map(linkIndex).sort((x, y) => x - y);
    const nodeWide = state.chains.filter((c) => / VMON-(DENIED|LOG)$/.test(c));
    assert.deepEqual(
      nodeWide,
      ['v4 filter VMON-DENIED', 'v4 filter VMON-LOG', 'v6 filter VMON-DENIED', 'v6 filter VMON-LOG'],
      'the node-wide always-denied and refusal-log chains, once per family',
    );
    // Chains shared by the links of one policy: one per distinct policy and family (the two kept
    // sandboxes' policies differ in IPv4 only), none left over from the doomed sandbox.
    const shared = state.chains.filter((c) => / VMON-(POL|SLOT)-[0-9a-f]+$/.test(c));
    assert.deepEqual(shared.map((c) => c.split(' ').slice(0, 2).join(' ')), ['v4 filter', 'v4 filter', 'v6 filter'], `shared policy chains:\n${shared.join('\n')}`);
    const perLink = state.chains.filter((c) => !nodeWide.includes(c) && !shared.includes(c));
    assert.deepEqual(chainIndices(perLink), linkIdx, `chains only for existing links:\n${state.chains.join('\n')}`);
    const ruleLinks = [...new Set(state.linkRules.flatMap((r) => [...r.matchAll(/(?:vmon|VMON-[A-Z])(\d+)\b/g)].map((m) => Number(m[1]))))];
    assert.deepEqual(ruleLinks.sort((x, y) => x - y), linkIdx, `rules only for existing links:\n${state.linkRules.join('\n')}`);
    // Recovery puts each kept link's policy back as an update does: the new block stacked on top,
    // then the old one removed, so for a moment a rule may show twice. Once settled, none does.
    let twice = [];
    await waitFor(async () => {
      const { rules } = await vmonRules();
      twice = rules.filter((r, i) => rules.indexOf(r) !== i);
      return twice.length === 0;
    }, { timeoutMs: 10_000, what: () => `no rule installed twice after the restart (now: ${JSON.stringify(twice)})` }).catch(() => {});
    assert.deepEqual(twice, [], 'no rule is installed twice after the restart');
    // Pool namespaces are vmon-net-<data-dir scope>-<link index>.
    assert.ok(state.netns.every((n) => /^vmon-net-[a-z0-9]+-\d+$/.test(n)), `pool namespace names: ${state.netns}`);
    assert.deepEqual(
      state.netns.map((n) => Number(n.slice(n.lastIndexOf('-') + 1))).sort((x, y) => x - y),
      linkIdx,
      'one namespace per link',
    );
    const ct = conntrack();
    assert.deepEqual(
      ct.filter((c) => c.src === gd && !kept.some((k) => k.lease.guest === gd)).map((c) => c.line),
      [],
      "the dead sandbox's conntrack entries were flushed",
    );

    for (const s of [a, b]) await getInfoRecovered(s.sandboxId, srv.sdkOpts);
    const a2 = await Sandbox.connect(a.sandboxId, srv.sdkOpts);
    const b2 = await Sandbox.connect(b.sandboxId, srv.sdkOpts);
    await expectReach(a2, { answered: [`http://${A}`], refused: [`http://${B}`, `udp://${B}:7`] }, "a's policy after restart");
    await expectReach(b2, { answered: [`http://${A}`, `http://${B}`] }, "b's policy after restart");
    const x = await holder.exchange(1, a2);
    assert.equal(x.tcp, 'ok', `a's TCP connection survives the server's kill -9 and restart: ${JSON.stringify(x)}`);
    await a2.updateNetwork({ denyOut: [A] });
    await expectReach(a2, { answered: [`http://${B}`], refused: [`http://${A}`] }, 'live update after restart');
  });

  srv.test('after killing every sandbox and stopping the server nothing is left', async () => {
    assert.equal(kept.length, 2, 'needs the sandboxes of the previous test');
    for (const { sbx } of kept) assert.equal(await Sandbox.kill(sbx.sandboxId, srv.sdkOpts), true);
    await srv.stop();
    const state = await nodeNetState(POOL);
    assert.deepEqual(state, { links: [], chains: [], linkRules: [], netns: [], guestConntrack: [] });
    assert.deepEqual(vmonNetns(), []);
    const { chains, rules } = await vmonRules();
    assert.deepEqual({ chains, rules }, { chains: [], rules: [] }, 'no VMON chain and no rule mentioning vmon remains (node-wide rules included)');
  });
});
