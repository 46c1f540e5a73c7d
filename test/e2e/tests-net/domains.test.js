// allowOut domains (seed 000 "Matching", issue 12 items 1–3 and 7): guest TCP to ports 80 and 443
// judged by the HTTP Host header and the TLS SNI at the node's transparent egress proxy, re-dialed
// by name from the node, through the official SDK against a real `vmon serve --net tap`, with real
// traffic into the fake internet of test/nettopo (its DNS serves egress.TestZone: a.test →
// 203.0.113.10, x.b.test → 203.0.113.11, deep.x.b.test → 198.51.100.7, b.test and other.test →
// 198.51.100.8, private.test → 10.1.2.3, meta.test → 169.254.169.254; HTTPS origins use the
// topology's own CA, which the guests here trust explicitly and the node never does).
//
// The whole name table (every precedence step, wildcard edges, IP literals, names resolving into
// always-denied ranges) runs against the proxy in Go (internal/egressproxy); the redirect and
// SO_ORIGINAL_DST path in real namespaces too. These tests show the assembled product.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { before, describe } from 'node:test';
import { ALL_TRAFFIC, Sandbox, Secret, SecretNotFoundError } from 'e2b';
import { useServer, runId, killQuietly, apiFetch, waitFor, runVmon } from '../lib/harness.js';
import { INET, CONTROL_URL, FAST_REFUSAL_MS, assertNodeTopology, probe1, assertRefused, assertAnswered, inetStats, statsDelta, startHolder } from '../lib/net.js';

const { A, B } = INET; // 203.0.113.10 (a.test), 203.0.113.11 (x.b.test)
const OTHER = '198.51.100.8'; // b.test, other.test
const RUN = runId('dom');
const EXTRA = (process.env.VMON_E2E_NET_SERVER_ARGS || '').split(/\s+/).filter(Boolean);
const CA_PATH = '/tmp/fake-internet-ca.pem';

const DOMAINS = { allowOut: ['a.test', '*.b.test', 'private.test', 'meta.test'], denyOut: [ALL_TRAFFIC] };

/**
 * curl inside the sandbox; never throws on curl's own failure. Returns
 * { rc, status, ms, body, headers } with headers lower-cased.
 */
async function curl(sbx, args) {
  const cmd =
    `rm -f /tmp/c.body /tmp/c.hdr; curl -sS -m 8 -o /tmp/c.body -D /tmp/c.hdr -w '%{http_code} %{time_total}' ${args}; ` +
    `echo " rc=$?"; echo ---; cat /tmp/c.body 2>/dev/null; echo; echo ---; cat /tmp/c.hdr 2>/dev/null`;
  const res = await sbx.commands.run(cmd, { timeoutMs: 30_000 });
  const [head, body, hdr] = res.stdout.split('\n---\n');
  const m = /^(\d{3}) ([\d.]+) rc=(\d+)/.exec(head.trim());
  assert.ok(m, `curl output: ${res.stdout} ${res.stderr}`);
  const headers = {};
  for (const line of (hdr || '').split(/\r?\n/)) {
    const i = line.indexOf(':');
    if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  return { rc: Number(m[3]), status: Number(m[1]), ms: Math.round(Number(m[2]) * 1000), body: (body || '').trim(), headers, stderr: res.stderr };
}

const show = (r) => JSON.stringify({ rc: r.rc, status: r.status, ms: r.ms, body: r.body.slice(0, 200), stderr: r.stderr });

function assertServedBy(r, host, what) {
  assert.equal(r.rc, 0, `${what}: ${show(r)}`);
  assert.equal(r.status, 200, `${what}: ${show(r)}`);
  assert.equal(r.body, `hello from ${host}`, `${what}: answered by the wrong origin: ${show(r)}`);
}

function assertDenied403(r, what, rule) {
  assert.equal(r.status, 403, `${what}: ${show(r)}`);
  assert.equal(r.headers['x-vmon-egress'], 'denied', `${what}: ${show(r)}`);
  if (rule) assert.ok(r.body.includes(rule), `${what}: the 403 should name ${rule}: ${show(r)}`);
  assert.ok(r.ms < FAST_REFUSAL_MS, `${what}: refusal took ${r.ms} ms`);
}

function assertTLSRefused(r, what) {
  assert.notEqual(r.rc, 0, `${what}: ${show(r)}`);
  assert.equal(r.status, 0, `${what}: ${show(r)}`);
  assert.ok(r.ms < FAST_REFUSAL_MS, `${what}: refusal took ${r.ms} ms: ${show(r)}`);
}

describe('allowOut domains on a --net tap node (egress-domains)', () => {
  let caPem;
  before(async () => {
    await assertNodeTopology();
    const res = await fetch(`${CONTROL_URL}/ca`);
    assert.equal(res.status, 200);
    caPem = await res.text();
    // The node verifies intercepted flows' origins; the fake internet's CA is trusted through
    // the test-only setting (never by default).
    const caFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-dom-')), 'origin-ca.pem');
    fs.writeFileSync(caFile, caPem);
    process.env.VMON_TEST_EGRESS_ORIGIN_CA = caFile;
  });
  const srv = useServer({ name: 'net-domains', args: ['--net', 'tap', ...EXTRA] });
  const all = [];
  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...all);
  });
  const create = async (network) => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN }, network });
    all.push(sbx);
    await sbx.files.write(CA_PATH, caPem);
    return sbx;
  };

  srv.test('port 80: the Host header decides and the node re-dials the name, not the address the guest chose', async () => {
    const sbx = await create(DOMAINS);
    const before = await inetStats();
    assertServedBy(await curl(sbx, `-H 'Host: a.test' http://${OTHER}/`), A, 'a.test via another address');
    assertServedBy(await curl(sbx, `-H 'Host: A.Test.' http://${OTHER}/`), A, 'case and trailing dot');
    assertServedBy(await curl(sbx, `-H 'Host: x.b.test' http://${A}/`), B, 'wildcard subdomain');
    assertServedBy(await curl(sbx, `-H 'Host: deep.x.b.test' http://${A}/`), '198.51.100.7', 'deep subdomain');
    const r = await curl(sbx, `-H 'Host: a.test' http://${OTHER}/`);
    assert.equal(r.headers['x-host'], 'a.test', 'the origin sees the Host the guest sent');
    // The origin sees the node, and the address the guest dialed got nothing.
    assert.equal(statsDelta(before, await inetStats())[OTHER]?.http, undefined, 'the guest-chosen address was dialed');

    assertDenied403(await curl(sbx, `-H 'Host: b.test' http://${A}/`), 'apex of a wildcard', 'denyOut 0.0.0.0/0');
    assertDenied403(await curl(sbx, `-H 'Host: other.test' http://${A}/`), 'unlisted name', 'denyOut 0.0.0.0/0');
    assertDenied403(await curl(sbx, `-H 'Host: ${A}' http://${A}/`), 'IP literal Host', 'denyOut 0.0.0.0/0');
    assertDenied403(await curl(sbx, `http://${A}/`), 'no Host but the address');
    // Guest DNS goes to 8.8.8.8 (implicitly allowed with domains); a name works end to end.
    assertServedBy(await curl(sbx, 'http://a.test/'), A, 'by name through the guest resolver');
  });

  srv.test('port 80: a kept-alive connection cannot switch to another Host, even an allowed one', async () => {
    const sbx = await create(DOMAINS);
    // Two requests on one TCP connection, the second for another allowed name.
    await sbx.files.write(
      '/tmp/twohosts.py',
      [
        'import socket',
        `s = socket.create_connection(('${A}', 80), timeout=10)`,
        'f = s.makefile("rb")',
        'def get(host):',
        "    s.sendall(('GET / HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % host).encode())",
        '    status = f.readline().split()[1].decode()',
        '    n = 0',
        '    while True:',
        '        line = f.readline().strip()',
        '        if not line: break',
        "        if line.lower().startswith(b'content-length:'): n = int(line.split(b':')[1])",
        '    return status, f.read(n).decode().strip()',
        "print(*get('a.test'))",
        "print(*get('x.b.test'))",
      ].join('\n'),
    );
    const res = await sbx.commands.run('python3 /tmp/twohosts.py', { timeoutMs: 30_000 });
    const lines = res.stdout.trim().split('\n');
    assert.equal(lines[0], `200 hello from ${A}`, `first request: ${res.stdout}`);
    assert.match(lines[1], /^403 /, `second request on the same connection: ${res.stdout}`);
    assert.match(res.stdout, /differs from this connection's first request/);
  });

  srv.test('port 443: the SNI decides, TLS is not terminated, the name is re-dialed', async () => {
    const sbx = await create(DOMAINS);
    // The guest verifies the origin's own certificate: the proxy did not terminate TLS.
    const ok = await curl(sbx, `--cacert ${CA_PATH} --resolve a.test:443:${OTHER} https://a.test/`);
    assertServedBy(ok, A, 'a.test over TLS via another address');
    assert.equal(ok.headers['x-sni'], 'a.test');
    assertServedBy(await curl(sbx, `--cacert ${CA_PATH} --resolve deep.x.b.test:443:${A} https://deep.x.b.test/`), '198.51.100.7', 'deep subdomain over TLS');
    // Fronting: an allowed SNI with another Host reaches only the allowed name's origin.
    const fronted = await curl(sbx, `--cacert ${CA_PATH} --resolve a.test:443:${OTHER} -H 'Host: other.test' https://a.test/`);
    assertServedBy(fronted, A, 'domain fronting reaches only the SNI name');
    assertTLSRefused(await curl(sbx, `--cacert ${CA_PATH} --resolve other.test:443:${A} https://other.test/`), 'unlisted SNI');
    assertTLSRefused(await curl(sbx, `--cacert ${CA_PATH} --resolve b.test:443:${A} https://b.test/`), 'apex SNI');
    assertTLSRefused(await curl(sbx, `-k https://${A}/`), 'no SNI (an address)');
  });

  srv.test('a name resolving into an always-denied range is never dialed; other ports follow CIDR rules', async () => {
    const sbx = await create(DOMAINS);
    assertDenied403(await curl(sbx, `-H 'Host: private.test' http://${A}/`), 'name → 10.1.2.3', 'always-denied');
    assertTLSRefused(await curl(sbx, `-k --resolve meta.test:443:${A} https://meta.test/`), 'name → 169.254.169.254');
    // Port 7 carries no name: denyOut 0.0.0.0/0 refuses it at once, as a reset.
    assertRefused(await probe1(sbx, `tcp://${A}:7`), 'TCP to another port of an allowed name’s address');
    // Address rules still allow by CIDR, unproxied.
    const mixed = await create({ allowOut: ['a.test', `${OTHER}/32`], denyOut: [ALL_TRAFFIC] });
    assertAnswered(await probe1(mixed, `tcp://${OTHER}:7`), 'allowOut CIDR on another port');
    const direct = await curl(mixed, `-H 'Host: other.test' http://${OTHER}/`);
    assert.equal(direct.status, 200, show(direct));
    assert.equal(direct.headers['x-vmon-egress'], undefined, 'an allowOut CIDR flow is not proxied');
  });

  srv.test('live update swaps the domains for new flows; an established TLS flow survives', async () => {
    const sbx = await create(DOMAINS);
    // A TLS connection to a.test that sends one request, waits for a file, then sends another.
    await sbx.files.write(
      '/tmp/hold.py',
      [
        'import socket, ssl, sys, os, time',
        `ctx = ssl.create_default_context(cafile='${CA_PATH}')`,
        `s = ctx.wrap_socket(socket.create_connection(('${OTHER}', 443), timeout=10), server_hostname='a.test')`,
        'def get(p):',
        "    s.sendall(('GET /%s HTTP/1.1\\r\\nHost: a.test\\r\\n\\r\\n' % p).encode())",
        "    d = b''",
        "    while b'hello from' not in d: d += s.recv(4096)",
        "    return d.decode().split('\\r\\n\\r\\n', 1)[1].strip()",
        "print(get('one'), flush=True)",
        "while not os.path.exists('/tmp/go'): time.sleep(0.05)",
        "print(get('two'), flush=True)",
      ].join('\n'),
    );
    const out = [];
    const held = await sbx.commands.run('python3 /tmp/hold.py', { background: true, timeoutMs: 60_000, onStdout: (d) => out.push(d) });
    await waitFor(() => out.join('').includes('hello from'), { timeoutMs: 15_000, what: 'the first request on the held connection' });

    await sbx.updateNetwork({ allowOut: ['x.b.test'], denyOut: [ALL_TRAFFIC] });
    assertDenied403(await curl(sbx, `-H 'Host: a.test' http://${OTHER}/`), 'the removed domain, new flow');
    assertTLSRefused(await curl(sbx, `--cacert ${CA_PATH} --resolve a.test:443:${OTHER} https://a.test/`), 'the removed domain over TLS');
    assertServedBy(await curl(sbx, `-H 'Host: x.b.test' http://${OTHER}/`), B, 'the added domain');

    await sbx.files.write('/tmp/go', '');
    const res = await held.wait();
    assert.equal(res.stdout.trim().split('\n').at(-1), `hello from ${A}`, `the established flow: ${res.stdout} ${res.stderr}`);

    const info = await sbx.getInfo();
    assert.deepEqual(info.network.allowOut, ['x.b.test']);
    // Dropping the domains altogether: port 80 falls back to the CIDR rules (a reset, no 403).
    await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC] });
    assertRefused(await probe1(sbx, `http://${A}`), 'port 80 without domains');
  });

  srv.test('the domain policy survives kill -9 and restart of the server', async () => {
    const sbx = await create(DOMAINS);
    assertServedBy(await curl(sbx, `-H 'Host: a.test' http://${OTHER}/`), A, 'before the restart');
    await srv.kill9();
    await srv.restart();
    await waitFor(async () => (await apiFetch(srv, `/sandboxes/${sbx.sandboxId}`)).status === 200, {
      timeoutMs: 20_000,
      what: 'the sandbox to be recovered',
    });
    assertServedBy(await curl(sbx, `-H 'Host: a.test' http://${OTHER}/`), A, 'after the restart');
    assertDenied403(await curl(sbx, `-H 'Host: other.test' http://${A}/`), 'after the restart', 'denyOut 0.0.0.0/0');
  });

  srv.test('header rules: intercepted with the node CA the guest trusts, the most specific rule wins', async () => {
    const rule = (auth) => [{ transform: { headers: { Authorization: auth } } }];
    const sbx = await create({
      allowOut: ['a.test', '*.b.test'],
      denyOut: [ALL_TRAFFIC],
      rules: { '*.b.test': rule('Bearer wild'), 'x.b.test': rule('Bearer exact'), 'other.test': rule('Bearer never') },
    });
    // envd appended the node's CA to the guest's trust store at /init: no --cacert here.
    const nodeCA = fs.readFileSync(path.join(srv.dataDir, 'egress', 'ca.pem'), 'utf8').trim();
    const store = (await sbx.commands.run('cat /etc/ssl/certs/ca-certificates.crt')).stdout;
    assert.ok(store.includes(nodeCA), 'the node CA is in the guest trust store');
    const exact = await curl(sbx, `--resolve x.b.test:443:${OTHER} -H 'Authorization: Bearer guest' https://x.b.test/`);
    assertServedBy(exact, B, 'exact rule');
    assert.equal(exact.headers['x-auth'], 'Bearer exact', 'the rule replaced the guest header');
    const wild = await curl(sbx, `--resolve deep.x.b.test:443:${A} https://deep.x.b.test/`);
    assertServedBy(wild, '198.51.100.7', 'wildcard rule');
    assert.equal(wild.headers['x-auth'], 'Bearer wild', 'no merge: the wildcard alone');
    // No rule: not intercepted, the origin's own certificate and the guest's own header.
    const plain = await curl(sbx, `--cacert ${CA_PATH} --resolve a.test:443:${OTHER} -H 'Authorization: Bearer guest' https://a.test/`);
    assertServedBy(plain, A, 'no rule');
    assert.equal(plain.headers['x-auth'], 'Bearer guest');
    // Rules grant nothing.
    assertTLSRefused(await curl(sbx, `--resolve other.test:443:${A} https://other.test/`), 'a rule without access');
  });

  srv.test('domain fronting: an intercepted flow refuses a Host other than its TLS server name; a spliced one reaches only the SNI name', async () => {
    const sbx = await create({
      allowOut: ['a.test', '*.b.test'],
      denyOut: [ALL_TRAFFIC],
      rules: { 'x.b.test': [{ transform: { headers: { Authorization: 'Bearer exact' } } }] },
    });
    const via = (host) => curl(sbx, `--resolve x.b.test:443:${OTHER} -H 'Host: ${host}' https://x.b.test/`);
    for (const host of ['X.B.Test', 'x.b.test:443']) {
      const r = await via(host);
      assertServedBy(r, B, `intercepted, Host ${host}`);
      assert.equal(r.headers['x-auth'], 'Bearer exact', `intercepted, Host ${host}`);
    }
    const before = await inetStats();
    // Another allowed name, a name no rule or domain covers, the same name on another port.
    for (const host of ['a.test', 'other.test', 'x.b.test:8443']) {
      assertDenied403(await via(host), `intercepted, Host ${host}`, 'differs from the TLS server name');
    }
    const delta = statsDelta(before, await inetStats());
    assert.equal(delta[A]?.https, undefined, `a fronted request reached an origin: ${JSON.stringify(delta)}`);
    assert.equal(delta[B]?.https, undefined, `a fronted request reached an origin: ${JSON.stringify(delta)}`);
    // Not intercepted (no rule covers a.test): the SNI decides where the flow goes, and TLS is
    // not terminated, so the Host inside reaches that origin as the guest sent it.
    const spliced = await curl(sbx, `--cacert ${CA_PATH} --resolve a.test:443:${OTHER} -H 'Host: other.test' https://a.test/`);
    assertServedBy(spliced, A, 'spliced: only the SNI name');
    assert.equal(spliced.headers['x-host'], 'other.test', 'spliced: the origin sees the Host the guest sent');
  });

  srv.test('egressProxy: allowed TCP goes through the SOCKS5 server, by name or by address; failures fail closed', async () => {
    const socks = async () => (await fetch(`${CONTROL_URL}/socks`)).json();
    await fetch(`${CONTROL_URL}/reset`, { method: 'POST' });
    const network = (egressProxy) => ({ allowOut: ['a.test', `${B}/32`], denyOut: [ALL_TRAFFIC], egressProxy });
    const sbx = await create(network({ address: '198.51.100.7:1081', username: 'vmon', password: 's3cret' }));
    assertServedBy(await curl(sbx, `-H 'Host: a.test' http://${OTHER}/`), A, 'domain flow through SOCKS5');
    assertAnswered(await probe1(sbx, `tcp://${B}:7`), 'address flow on another port through SOCKS5');
    assertRefused(await probe1(sbx, `tcp://${OTHER}:7`), 'denied flow');
    const asked = await socks();
    assert.deepEqual(asked.names, ['a.test'], `remote DNS for the domain flow: ${JSON.stringify(asked)}`);
    assert.ok(asked.dials.includes(`${B}:7`), `the address flow went by address: ${JSON.stringify(asked)}`);
    assert.ok(!asked.dials.some((d) => d.startsWith(OTHER)), `a denied flow reached the proxy: ${JSON.stringify(asked)}`);
    const info = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}`);
    assert.equal(info.json.network.egressProxy.address, '198.51.100.7:1081');
    assert.equal(info.json.network.egressProxy.password, undefined, 'GET hides the password');

    // The hop in TLS, verified against caCert for serverName. The JS SDK (2.x) sends only
    // address, username and password, so this one goes through the API directly.
    const res = await apiFetch(srv, '/v2/sandboxes', {
      method: 'POST',
      body: JSON.stringify({
        templateID: 'base',
        metadata: { run: RUN },
        network: network({ address: '198.51.100.7:1082', tls: { enabled: true, caCert: caPem, serverName: 'socks.test' } }),
      }),
    });
    assert.equal(res.status, 201, res.text);
    const tlsBox = await Sandbox.connect(res.json.sandboxID, srv.sdkOpts);
    all.push(tlsBox);
    assertServedBy(await curl(tlsBox, `-H 'Host: a.test' http://${OTHER}/`), A, 'through SOCKS5 over TLS');

    // Wrong credentials, an unreachable proxy: the guest gets a refusal, the origin nothing.
    const before = await inetStats();
    for (const egressProxy of [
      { address: '198.51.100.7:1081', username: 'vmon', password: 'wrong' },
      { address: '198.51.100.8:1080' },
    ]) {
      const bad = await create(network(egressProxy));
      const r = await curl(bad, `-H 'Host: a.test' http://${OTHER}/`);
      assert.equal(r.status, 502, `${JSON.stringify(egressProxy)}: ${show(r)}`);
      // The guest's connect completes (the proxy accepted it) and is reset once the proxy
      // fails: a refusal, fast, and never an answer.
      const p = await probe1(bad, `tcp://${B}:7`);
      assert.ok(['refused', 'broken'].includes(p.outcome) && p.ms < FAST_REFUSAL_MS, `${JSON.stringify(egressProxy)}: address flow: ${JSON.stringify(p)}`);
    }
    const delta = statsDelta(before, await inetStats());
    assert.equal(delta[A]?.http, undefined, `an origin was reached without the proxy: ${JSON.stringify(delta)}`);
    assert.equal(delta[B]?.tcp7, undefined, `an origin was reached without the proxy: ${JSON.stringify(delta)}`);
  });

  srv.test('"*" covers every name (never an address); a live update adding an egressProxy keeps an established flow', async () => {
    const sbx = await create({ allowOut: ['*', `${B}/32`], denyOut: [ALL_TRAFFIC] });
    assertServedBy(await curl(sbx, `-H 'Host: other.test' http://${A}/`), OTHER, '"*" and a name');
    assertDenied403(await curl(sbx, `-H 'Host: ${A}' http://${A}/`), '"*" and an IP literal');
    // An established TCP flow (allowed by address) before the update.
    const holder = await startHolder(sbx, B, 7, 'swap');
    assert.equal(holder.first.tcp, 'ok');
    await fetch(`${CONTROL_URL}/reset`, { method: 'POST' });
    await sbx.updateNetwork({ allowOut: ['*', `${B}/32`], denyOut: [ALL_TRAFFIC], egressProxy: { address: '198.51.100.7:1080' } });
    const x = await holder.exchange(1);
    assert.equal(x.tcp, 'ok', `the established flow survives the update: ${JSON.stringify(x)}`);
    // New flows now go through the SOCKS5 server.
    assertAnswered(await probe1(sbx, `tcp://${B}:7`), 'a new flow after the update');
    assertServedBy(await curl(sbx, `-H 'Host: a.test' http://${OTHER}/`), A, 'a name after the update');
    const asked = await (await fetch(`${CONTROL_URL}/socks`)).json();
    assert.ok(asked.dials.includes(`${B}:7`) && asked.names.includes('a.test'), `the new flows went through the proxy: ${JSON.stringify(asked)}`);
  });

  srv.test('secrets: ${e2b.secrets.NAME} in a rule is filled in on the node, never in the sandbox', async () => {
    const name = `tok-${RUN}`.toLowerCase();
    const created = await Secret.create(name, 'sk-live-1', { ...srv.sdkOpts, metadata: { purpose: 'e2e' } });
    assert.equal(created.name, name);
    assert.equal(created.version, 1);
    assert.deepEqual(created.metadata, { purpose: 'e2e' });
    const info = await Secret.getInfo(created.secretId, srv.sdkOpts);
    assert.equal(JSON.stringify(info).includes('sk-live-1'), false, 'the value is never read back');

    const rules = { 'x.b.test': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } }] };
    // An unknown secret is refused at create and at a live update.
    await assert.rejects(
      Sandbox.create({ ...srv.sdkOpts, network: { allowOut: ['*.b.test'], denyOut: [ALL_TRAFFIC], rules: { 'x.b.test': [{ transform: { headers: { A: Secret.fill('nope') } } }] } } }),
      /secret "nope" does not exist/,
    );
    const sbx = await create({ allowOut: ['*.b.test'], denyOut: [ALL_TRAFFIC], rules });
    await assert.rejects(
      sbx.updateNetwork({ allowOut: ['*.b.test'], denyOut: [ALL_TRAFFIC], rules: { 'x.b.test': [{ transform: { headers: { A: Secret.fill('nope') } } }] } }),
      /secret "nope" does not exist/,
    );
    const r = await curl(sbx, `--resolve x.b.test:443:${OTHER} https://x.b.test/`);
    assertServedBy(r, B, 'with a secret');
    assert.equal(r.headers['x-auth'], 'Bearer sk-live-1', 'the origin got the value');
    // Nothing in the sandbox holds it (but what the test origin echoed back, which curl saved).
    const grep = await sbx.commands.run(`rm -f /tmp/c.body /tmp/c.hdr; grep -rl sk-live-1 /etc /home /tmp /proc/self/environ 2>/dev/null || true`);
    assert.equal(grep.stdout.trim(), '', 'the value is inside the sandbox');

    await Secret.update(name, 'sk-live-2', srv.sdkOpts);
    assert.equal((await curl(sbx, `--resolve x.b.test:443:${OTHER} https://x.b.test/`)).headers['x-auth'], 'Bearer sk-live-2', 'a new version applies at once');
    assert.equal(await Secret.destroy(name, srv.sdkOpts), true);
    await assert.rejects(Secret.getInfo(name, srv.sdkOpts), SecretNotFoundError);
    const after = await curl(sbx, `--resolve x.b.test:443:${OTHER} -H 'Authorization: Bearer guest' https://x.b.test/`);
    assert.equal(after.status, 200, show(after));
    assert.equal(after.headers['x-auth'], '', 'a deleted secret is no longer sent, nor the guest value');
  });

  srv.test('what was blocked: a stream of refusals from the kernel and the proxy, repeats counted', async () => {
    const sbx = await create({ allowOut: ['a.test'], denyOut: [ALL_TRAFFIC] });
    const unknown = await apiFetch(srv, '/sandboxes/nosuchsandbox0/network/denied?follow=false');
    assert.equal(unknown.status, 404, unknown.text);
    const anon = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}/network/denied?follow=false`, { key: null });
    assert.equal(anon.status, 401, anon.text);

    // Watch the stream while the guest is refused.
    const events = [];
    const ac = new AbortController();
    const res = await fetch(`${srv.apiUrl}/sandboxes/${sbx.sandboxId}/network/denied`, { headers: { 'X-API-KEY': srv.apiKey }, signal: ac.signal });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /text\/event-stream/);
    const reading = (async () => {
      const dec = new TextDecoder();
      let buf = '';
      try {
        for await (const chunk of res.body) {
          buf += dec.decode(chunk, { stream: true });
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const data = block.split('\n').find((l) => l.startsWith('data: '));
            if (data) events.push(JSON.parse(data.slice(6)));
          }
        }
      } catch (err) {
        if (err.name !== 'AbortError') throw err;
      }
    })();

    for (let i = 0; i < 3; i++) assertRefused(await probe1(sbx, `tcp://${B}:7`), 'denyOut, kernel');
    // UDP 443 (QUIC) never unlocks a domain: the address rules refuse it.
    await probe1(sbx, { proto: 'udp', host: A, port: 443, timeoutMs: 500 });
    assertDenied403(await curl(sbx, `-H 'Host: other.test' http://${A}/`), 'denyOut, proxy');
    // Not port 53: the node's resolver answers this policy's DNS, to any address.
    await probe1(sbx, { proto: 'udp', host: '10.1.2.3', port: 7, timeoutMs: 500 });
    const has = (f) => events.some(f);
    await waitFor(
      () =>
        has((e) => e.proto === 'tcp' && e.dst === B && e.port === 7 && e.stage === 'denyOut' && e.rule === '0.0.0.0/0' && e.count === 1 && !e.repeats) &&
        has((e) => e.dst === B && e.port === 7 && e.repeats && e.count === 2) &&
        has((e) => e.name === 'other.test' && e.port === 80 && e.stage === 'denyOut') &&
        has((e) => e.proto === 'udp' && e.dst === '10.1.2.3' && e.port === 7 && e.stage === 'always-denied' && e.rule === '10.0.0.0/8') &&
        has((e) => e.proto === 'udp' && e.dst === A && e.port === 443 && e.stage === 'denyOut'),
      { timeoutMs: 15_000, what: () => `the refusals on the stream (so far: ${JSON.stringify(events)})` },
    );
    assert.ok(events.every((e) => e.sandboxID === sbx.sandboxId));
    ac.abort();
    await reading;

    // The CLI prints the backlog.
    const { stdout } = await runVmon(['sandbox', 'denied', sbx.sandboxId, '--api-url', srv.apiUrl, '--api-key', srv.apiKey]);
    assert.match(stdout, new RegExp(`blocked tcp ${B.replace(/\./g, '\\.')}:7 +\\[denyOut 0\\.0\\.0\\.0/0\\]`), stdout);
    assert.match(stdout, /blocked tcp other\.test \(203\.0\.113\.10:80\) +\[denyOut/, stdout);
    assert.match(stdout, /\(2 more\)/, stdout);
  });
});

// Guest DNS under the default flags (--egress-dns filter): the node answers the DNS of policies
// with allowOut domains (which open 8.8.8.8) and forwards only names their domains cover, in a
// canonical form; DNS to an address a policy allows by CIDR, and the DNS of policies without
// domains, is left to the address rules. The fake internet's DNS servers (203.0.113.53, 8.8.8.8)
// log every question as asked (GET /dns).
describe('guest DNS under the default flags: only allowed names leave, lower-cased', () => {
  before(async () => {
    await assertNodeTopology();
  });
  const srv = useServer({ name: 'net-dns-filter', args: ['--net', 'tap', ...EXTRA] });
  const all = [];
  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...all);
  });
  const dnsLog = async () => (await (await fetch(`${CONTROL_URL}/dns`)).json()).names || [];
  // A resolver-independent query: a raw DNS message over UDP or TCP to any server address.
  // Prints the rcode, the answer count and whether the answer's question is the one sent, byte
  // for byte (letter case included); "silent" when nothing answers.
  const QUERY_PY = [
    'import socket, struct, sys, random',
    'name, server, proto = sys.argv[1], sys.argv[2], sys.argv[3]',
    'qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\\0"',
    'q = struct.pack(">HHHHHH", random.randint(0, 65535), 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", 1, 1)',
    'try:',
    '    if proto == "udp":',
    '        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.sendto(q, (server, 53)); r = s.recv(4096)',
    '    else:',
    '        s = socket.create_connection((server, 53), timeout=3); s.sendall(struct.pack(">H", len(q)) + q); r = s.recv(4096)[2:]',
    'except OSError as e:',
    '    print("silent", type(e).__name__); sys.exit(0)',
    'rcode = r[3] & 15',
    'ancount = struct.unpack(">H", r[6:8])[0]',
    'print(rcode, ancount, "same" if r[12:12 + len(qname) + 4] == q[12:] else "other")',
  ].join('\n');
  const create = async (network) => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN }, network });
    all.push(sbx);
    await sbx.files.write('/tmp/q.py', QUERY_PY);
    return sbx;
  };
  const q = async (sbx, name, server, proto) =>
    (await sbx.commands.run(`python3 /tmp/q.py ${name} ${server} ${proto}`, { timeoutMs: 20_000 })).stdout.trim();

  srv.test('allowed names resolve; every other name, to any server, over UDP or TCP, is REFUSED and never leaves', async () => {
    await fetch(`${CONTROL_URL}/dns/reset`, { method: 'POST' });
    const sbx = await create({ allowOut: ['a.test'], denyOut: [ALL_TRAFFIC] });
    assert.equal(await q(sbx, 'a.test', '8.8.8.8', 'udp'), '0 1 same', 'an allowed name resolves');
    assert.equal(await q(sbx, 'a.test', '8.8.8.8', 'tcp'), '0 1 same', 'over TCP too');
    assert.equal(await q(sbx, 'a.test', OTHER, 'udp'), '0 1 same', 'whatever server the guest asks');
    for (const [name, server, proto] of [
      ['c2VjcmV0LWRhdGEx.exfil.test', '8.8.8.8', 'udp'],
      ['c2VjcmV0LWRhdGEy.exfil.test', '8.8.8.8', 'tcp'],
      ['c2VjcmV0LWRhdGEz.exfil.test', '203.0.113.53', 'udp'],
      ['other.test', '8.8.8.8', 'udp'],
      ['other.test', '8.8.8.8', 'tcp'],
    ]) {
      assert.equal(await q(sbx, name, server, proto), '5 0 same', `${name} via ${server}/${proto} is REFUSED`);
    }
    const asked = await dnsLog();
    assert.ok(!asked.some((n) => n.toLowerCase().includes('exfil') || n.toLowerCase() === 'other.test'), `a refused name reached a DNS server: ${JSON.stringify(asked)}`);
    assert.ok(asked.includes('a.test'), `the allowed name was forwarded: ${JSON.stringify(asked)}`);
    // The guest's own resolver (getent) and a name-based flow work end to end.
    assert.match((await sbx.commands.run('getent hosts a.test')).stdout, /203\.0\.113\.10/);
    const ok = await sbx.commands.run(`curl -sS -m 8 -o /dev/null -w '%{http_code}' http://a.test/`);
    assert.equal(ok.stdout, '200');
    // The refusals are on the stream, named.
    const res = await apiFetch(srv, `/sandboxes/${sbx.sandboxId}/network/denied?follow=false`);
    assert.match(res.text, /"stage":"dns"/);
    assert.match(res.text, /"name":"c2vjcmv0lwrhdgex\.exfil\.test"/);
  });

  srv.test('a mixed-case question goes upstream lower-cased; the guest gets its own question back', async () => {
    await fetch(`${CONTROL_URL}/dns/reset`, { method: 'POST' });
    const sbx = await create({ allowOut: ['a.test'], denyOut: [ALL_TRAFFIC] });
    assert.equal(await q(sbx, 'A.tEsT', '8.8.8.8', 'udp'), '0 1 same', 'UDP: answered, for the question as asked');
    assert.equal(await q(sbx, 'a.TEST', '8.8.8.8', 'tcp'), '0 1 same', 'TCP: answered, for the question as asked');
    const asked = await dnsLog();
    assert.deepEqual(asked, ['a.test', 'a.test'], `what the DNS server was asked: ${JSON.stringify(asked)}`);
  });

  srv.test('DNS to a resolver the policy allows by CIDR, and of policies without domains, is left to the address rules', async () => {
    await fetch(`${CONTROL_URL}/dns/reset`, { method: 'POST' });
    // A resolver allowed by CIDR, no domains: it answers every name itself.
    const cidr = await create({ allowOut: ['8.8.8.8'], denyOut: [ALL_TRAFFIC] });
    assert.equal(await q(cidr, 'other.test', '8.8.8.8', 'udp'), '0 1 same', 'allowOut 8.8.8.8 without domains');
    assert.equal(await q(cidr, 'Other.Test', '8.8.8.8', 'tcp'), '0 1 same', 'over TCP, as asked');
    // Domains and a resolver the user named: that one is reached directly, 8.8.8.8 is filtered.
    const named = await create({ allowOut: ['a.test', '203.0.113.53'], denyOut: [ALL_TRAFFIC] });
    assert.equal(await q(named, 'x.b.test', '203.0.113.53', 'udp'), '0 1 same', 'the named resolver answers any name');
    assert.equal(await q(named, 'x.b.test', '8.8.8.8', 'udp'), '5 0 same', '8.8.8.8 is still filtered');
    // Deny-all without domains: DNS is refused like any flow, by the address rules.
    const deny = await create({ denyOut: [ALL_TRAFFIC] });
    assert.match(await q(deny, 'a.test', '8.8.8.8', 'udp'), /^silent /, 'deny-all: no DNS at all');
    const asked = await dnsLog();
    assert.deepEqual(asked, ['other.test', 'Other.Test', 'x.b.test'], `what the DNS servers were asked: ${JSON.stringify(asked)}`);
  });

  srv.test('a policy that reaches any address resolves everything', async () => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN }, network: { denyOut: ['198.51.100.0/24'] } });
    all.push(sbx);
    assert.match((await sbx.commands.run('getent hosts other.test')).stdout, /198\.51\.100\.8/);
  });
});
