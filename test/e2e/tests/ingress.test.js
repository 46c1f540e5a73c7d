// Ingress, both ways the SDK addresses a sandbox:
//  - header mode (E2B_SANDBOX_URL, plain HTTP): E2b-Sandbox-Id / E2b-Sandbox-Port
//    headers, reaching a server bound to the guest's loopback;
//  - host mode (only E2B_DOMAIN, TLS with `--tls self-signed` on :443):
//    <port>-<id>.localhost names, in a child node process that trusts vmon's CA.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import fs from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { describe } from 'node:test';
import { Sandbox } from 'e2b';
import { useServer, runId, killQuietly, waitFor, runNodeChild, E2E_DIR } from '../lib/harness.js';
import { MiB, hashStream } from '../lib/data.js';

const RUN = runId('ingress');

describe('header mode (E2b-Sandbox-Id / E2b-Sandbox-Port)', () => {
  const srv = useServer({ name: 'ingress-headers' });
  let sbx;
  let server;

  srv.before(async () => {
    sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
  });
  srv.after(async () => {
    await killQuietly(srv.sdkOpts, sbx);
  });

  const get = (id, port, p = '/', extra = {}) =>
    fetch(`${srv.apiUrl}${p}`, { headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': String(port), ...extra } });

  srv.test('reaches an HTTP server bound to the guest loopback', async () => {
    await sbx.commands.run(
      `mkdir -p /home/user/www && printf 'served-%s\\n' ${RUN} > /home/user/www/marker.txt && head -c ${5 * MiB} /dev/urandom > /home/user/www/big.bin && sha256sum /home/user/www/big.bin`,
    );
    server = await sbx.commands.run('python3 -m http.server 8000 --bind 127.0.0.1', {
      background: true,
      cwd: '/home/user/www',
      timeoutMs: 0,
    });
    // The guest itself sees the server only on loopback.
    await waitFor(
      async () => (await sbx.commands.run('curl -s -o /dev/null -w %{http_code} http://127.0.0.1:8000/marker.txt')).stdout === '200',
      { timeoutMs: 20_000, what: 'python http.server listening in the guest' },
    );
    const res = await get(sbx.sandboxId, 8000, '/marker.txt');
    assert.equal(res.status, 200);
    assert.equal(await res.text(), `served-${RUN}\n`);

    const want = (await sbx.commands.run('sha256sum /home/user/www/big.bin | cut -d" " -f1')).stdout.trim();
    const big = await get(sbx.sandboxId, 8000, '/big.bin');
    assert.equal(big.status, 200);
    assert.deepEqual(await hashStream(big.body), { bytes: 5 * MiB, sha256: want }, '5 MiB through the tunnel intact');

    const missing = await get(sbx.sandboxId, 8000, '/no-such-file');
    assert.equal(missing.status, 404, 'the guest server’s own status passes through');
    await missing.text();
  });

  srv.test('concurrent requests through the tunnel', async () => {
    const results = await Promise.all(
      Array.from({ length: 16 }, async () => {
        const res = await get(sbx.sandboxId, 8000, '/marker.txt');
        return `${res.status} ${await res.text()}`;
      }),
    );
    for (const r of results) assert.equal(r, `200 served-${RUN}\n`);
  });

  srv.test('a closed guest port → 502', async () => {
    const res = await get(sbx.sandboxId, 8001, '/');
    assert.equal(res.status, 502);
    await res.text();
  });

  srv.test('an unknown sandbox → 502 with E2B’s JSON body', async () => {
    const id = 'nonexistent0sandbox';
    for (const port of [8000, 49983]) {
      const res = await get(id, port, '/');
      assert.equal(res.status, 502);
      assert.match(res.headers.get('content-type') || '', /application\/json/);
      assert.deepEqual(await res.json(), { sandboxId: id, message: 'The sandbox was not found', code: 502 });
    }
  });

  srv.test('allowPublicTraffic:false → guest ports need the traffic access token; envd does not', async () => {
    const priv = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN }, network: { allowPublicTraffic: false } });
    try {
      assert.match(priv.trafficAccessToken ?? '', /^\S{16,}$/, 'create returns a traffic access token');
      assert.equal(sbx.trafficAccessToken, undefined, 'public sandboxes get none');
      await priv.commands.run('python3 -m http.server 8001 --bind 127.0.0.1', { background: true, timeoutMs: 0 });
      await waitFor(
        async () => (await priv.commands.run('curl -s -o /dev/null -w %{http_code} http://127.0.0.1:8001/')).stdout === '200',
        { timeoutMs: 20_000, what: 'http.server in the private sandbox' },
      );
      const denied = await get(priv.sandboxId, 8001, '/');
      assert.equal(denied.status, 403);
      assert.equal((await denied.json()).code, 403);
      const wrong = await get(priv.sandboxId, 8001, '/', { 'e2b-traffic-access-token': 'wrong' });
      assert.equal(wrong.status, 403);
      await wrong.text();
      const ok = await get(priv.sandboxId, 8001, '/', { 'e2b-traffic-access-token': priv.trafficAccessToken });
      assert.equal(ok.status, 200);
      await ok.text();
      // The SDK's own envd traffic is authorised by the envd access token alone.
      assert.equal((await priv.commands.run('echo private')).stdout, 'private\n');
    } finally {
      await killQuietly(srv.sdkOpts, priv);
    }
  });

  srv.test('maskRequestHost: the guest service sees the masked Host, kept by a network update', async () => {
    const masked = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN }, network: { maskRequestHost: 'internal-${PORT}.example' } });
    try {
      // A server that answers with the Host it was sent.
      await masked.files.write(
        '/tmp/host.py',
        [
          'from http.server import BaseHTTPRequestHandler, HTTPServer',
          'class H(BaseHTTPRequestHandler):',
          '    def do_GET(self):',
          "        b = self.headers.get('Host', '').encode()",
          '        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)',
          "HTTPServer(('127.0.0.1', 8002), H).serve_forever()",
        ].join('\n'),
      );
      await masked.commands.run('python3 /tmp/host.py', { background: true, timeoutMs: 0 });
      await waitFor(
        async () => (await masked.commands.run('curl -s -o /dev/null -w %{http_code} http://127.0.0.1:8002/')).stdout === '200',
        { timeoutMs: 20_000, what: 'the Host echo server' },
      );
      const res = await get(masked.sandboxId, 8002, '/');
      assert.equal(res.status, 200);
      assert.equal(await res.text(), 'internal-8002.example');
      assert.equal((await masked.getInfo()).network?.maskRequestHost, 'internal-${PORT}.example');
      await masked.updateNetwork({ denyOut: ['198.51.100.7'] });
      const again = await get(masked.sandboxId, 8002, '/');
      assert.equal(await again.text(), 'internal-8002.example', 'an egress update keeps the ingress settings');
    } finally {
      await killQuietly(srv.sdkOpts, masked);
    }
  });

  srv.test('after kill the same address answers 502', async () => {
    const id = sbx.sandboxId;
    assert.equal(await sbx.kill(), true);
    const res = await get(id, 8000, '/marker.txt');
    assert.equal(res.status, 502);
    assert.deepEqual(await res.json(), { sandboxId: id, message: 'The sandbox was not found', code: 502 });
    sbx = undefined;
  });
});

describe('host mode over TLS (--tls self-signed, E2B_DOMAIN=localhost)', () => {
  // Port 443 because the SDK builds https://<port>-<id>.<domain> URLs without a port.
  const srv = useServer({
    name: 'ingress-tls',
    port: 443,
    tls: true,
    args: ['--tls', 'self-signed', '--domain', 'localhost'],
  });

  srv.test('the CA is written to the data dir and its path printed', async () => {
    const want = path.join(srv.dataDir, 'tls', 'ca.pem');
    assert.equal(srv.caPathPrinted, want, 'vmon prints the CA path for NODE_EXTRA_CA_CERTS');
    const st = fs.statSync(want);
    assert.ok(st.isFile());
    assert.match(fs.readFileSync(want, 'utf8'), /^-----BEGIN CERTIFICATE-----/m);
    const keyFiles = fs.readdirSync(path.dirname(want)).filter((f) => /key/.test(f));
    for (const f of keyFiles) {
      const mode = fs.statSync(path.join(path.dirname(want), f)).mode & 0o777;
      assert.equal(mode & 0o077, 0, `${f} is private (mode ${mode.toString(8)})`);
    }
  });

  let childSandboxId;

  srv.test('the unchanged SDK with only E2B_DOMAIN set: create, run, files, getHost, signed URL, 502', async () => {
    const env = { ...process.env };
    for (const k of Object.keys(env)) if (k.startsWith('E2B_')) delete env[k];
    Object.assign(env, {
      NODE_EXTRA_CA_CERTS: srv.caPath,
      E2B_DOMAIN: 'localhost',
      E2B_API_KEY: srv.apiKey,
      E2E_RUN: RUN,
    });
    const { code, stdout, stderr } = await runNodeChild(path.join(E2E_DIR, 'lib', 'tls-client.js'), env, {
      args: ['--dns-result-order=ipv4first'],
    });
    const line = stdout.split('\n').find((l) => l.startsWith('E2E_RESULT='));
    assert.ok(line, `child printed no result (exit ${code})\nstdout:\n${stdout}\nstderr:\n${stderr}`);
    const out = JSON.parse(line.slice('E2E_RESULT='.length));
    const ctx = `\nchild observations: ${JSON.stringify(out, null, 2)}\nchild stderr:\n${stderr.slice(-3000)}`;
    childSandboxId = out.sandboxId;

    assert.equal(out.error, undefined, `the child failed${ctx}`);
    assert.equal(code, 0, `child exit code${ctx}`);
    assert.equal(out.env.E2B_API_URL, null);
    assert.equal(out.env.E2B_SANDBOX_URL, null);
    assert.match(out.sandboxId, /^[a-z0-9]+$/);
    assert.deepEqual(out.run, { stdout: 'hi\nuser\n', exitCode: 0 }, ctx);
    assert.equal(out.read, `over-tls-${RUN}`, ctx);
    assert.deepEqual(out.listed, [out.sandboxId], ctx);
    assert.equal(out.host, `8000-${out.sandboxId}.localhost`, ctx);
    assert.equal(out.http?.status, 200, `GET https://${out.host}/marker.txt${ctx}`);
    assert.equal(out.http.text, `served-${RUN}\n`, ctx);
    assert.match(out.signedUrl, new RegExp(`^https://49983-${out.sandboxId}\\.localhost/files\\?`), ctx);
    assert.equal(out.signed?.status, 200, `signed download URL${ctx}`);
    assert.equal(out.signed.text, `over-tls-${RUN}`, ctx);
    assert.equal(out.unknown?.status, 502, `unknown sandbox host${ctx}`);
    assert.deepEqual(out.unknown.json, { sandboxId: 'nonexistent0sandbox', message: 'The sandbox was not found', code: 502 }, ctx);
    assert.equal(out.killed, true, ctx);
    assert.equal(out.afterKill?.status, 502, `after kill${ctx}`);
    assert.equal(out.isRunningAfterKill, false, ctx);
  });

  srv.test('nothing of this run is left', async () => {
    assert.ok(childSandboxId, 'the child created a sandbox');
    // This process has no NODE_EXTRA_CA_CERTS: ask the list endpoint over
    // https with the CA pinned on the request.
    const body = await new Promise((resolve, reject) => {
      const req = https.request(
        {
          hostname: '127.0.0.1',
          port: 443,
          path: `/v2/sandboxes?metadata=${encodeURIComponent(`run=${RUN}`)}`,
          servername: 'api.localhost',
          headers: { Host: 'api.localhost', 'X-API-KEY': srv.apiKey },
          ca: fs.readFileSync(srv.caPath),
        },
        (res) => {
          let data = '';
          res.on('data', (d) => (data += d));
          res.on('end', () => resolve({ status: res.statusCode, data }));
        },
      );
      req.on('error', reject);
      req.end();
    });
    assert.equal(body.status, 200, body.data);
    assert.deepEqual(JSON.parse(body.data), [], `no sandbox of this run listed (child created ${childSandboxId})`);
  });
});

describe('operator certificate (--tls-cert/--tls-key), header mode over HTTPS', () => {
  const certDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-cert-'));
  const cert = path.join(certDir, 'cert.pem');
  const key = path.join(certDir, 'key.pem');
  // An operator's own certificate for the listener's address, made before the server starts.
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
    '-keyout', key, '-out', cert, '-days', '1', '-subj', '/CN=127.0.0.1',
    '-addext', 'subjectAltName=IP:127.0.0.1',
  ], { stdio: 'ignore' });
  const srv = useServer({ name: 'ingress-cert', headerTlsCA: cert, args: ['--tls-cert', cert, '--tls-key', key] });
  srv.after(() => fs.rmSync(certDir, { recursive: true, force: true }));

  srv.test('the SDK works over HTTPS with the operator certificate', async () => {
    const env = { ...process.env };
    for (const k of Object.keys(env)) if (k.startsWith('E2B_')) delete env[k];
    Object.assign(env, {
      NODE_EXTRA_CA_CERTS: cert,
      E2B_API_KEY: srv.apiKey,
      E2B_API_URL: srv.apiUrl,
      E2B_SANDBOX_URL: srv.apiUrl,
    });
    const { code, stdout, stderr } = await runNodeChild(path.join(E2E_DIR, 'lib', 'https-header-client.js'), env, {
      timeoutMs: 120_000,
    });
    const line = stdout.split('\n').find((l) => l.startsWith('E2E_RESULT='));
    assert.ok(line, `child printed no result (exit ${code})\n${stdout}\n${stderr}`);
    const out = JSON.parse(line.slice('E2E_RESULT='.length));
    assert.equal(out.error, undefined, `child failed: ${JSON.stringify(out)}\n${stderr}`);
    assert.deepEqual(out.run, { stdout: 'tls\nuser\n', exitCode: 0 });
    assert.equal(out.read, 'over-https');
    assert.equal(out.killed, true);
    // Plain HTTP on the TLS listener reaches neither the API nor a sandbox (Go answers 400).
    const plain = await fetch(`http://127.0.0.1:${srv.port}/sandboxes`, { headers: { 'X-API-KEY': srv.apiKey } });
    assert.equal(plain.status, 400);
    assert.match(await plain.text(), /HTTP request to an HTTPS server/);
  });
});
