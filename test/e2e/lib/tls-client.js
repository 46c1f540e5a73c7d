// Child process for the host-mode ingress test: the SDK configured the way an
// E2B cloud user configures it, with only E2B_DOMAIN (+ E2B_API_KEY) set, over
// TLS with vmon's self-signed CA in NODE_EXTRA_CA_CERTS (which Node reads only
// at process start, hence a child process).
//
// It records what it observes and prints one line `E2E_RESULT=<json>`; the
// parent test makes the assertions, so a failure shows every observation.

import { Sandbox } from 'e2b';

const RUN = process.env.E2E_RUN || 'tls';
const out = { env: { E2B_DOMAIN: process.env.E2B_DOMAIN, E2B_API_URL: process.env.E2B_API_URL ?? null, E2B_SANDBOX_URL: process.env.E2B_SANDBOX_URL ?? null } };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function httpGet(url, headers) {
  try {
    const res = await fetch(url, { headers });
    const text = await res.text();
    let json;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { status: res.status, text: text.slice(0, 2000), json };
  } catch (err) {
    return { error: `${err.name}: ${err.message}${err.cause ? ` (cause: ${err.cause.code || ''} ${err.cause.message})` : ''}` };
  }
}

let sbx;
try {
  sbx = await Sandbox.create({ metadata: { run: RUN } });
  out.sandboxId = sbx.sandboxId;
  out.sandboxDomain = sbx.sandboxDomain;

  const r = await sbx.commands.run('echo hi && whoami');
  out.run = { stdout: r.stdout, exitCode: r.exitCode };

  await sbx.files.write('/home/user/tls.txt', `over-tls-${RUN}`);
  out.read = await sbx.files.read('/home/user/tls.txt');

  const listed = Sandbox.list({ query: { metadata: { run: RUN } } });
  out.listed = (await listed.nextItems()).map((s) => s.sandboxId);

  await sbx.commands.run(`mkdir -p /home/user/www && printf 'served-%s\\n' ${RUN} > /home/user/www/marker.txt`);
  const server = await sbx.commands.run('python3 -m http.server 8000', {
    background: true,
    cwd: '/home/user/www',
    timeoutMs: 0,
  });
  out.serverPid = server.pid;
  out.host = sbx.getHost(8000);

  const deadline = Date.now() + 20_000;
  let got;
  for (;;) {
    got = await httpGet(`https://${out.host}/marker.txt`);
    if (got.status === 200 || Date.now() > deadline) break;
    await sleep(250);
  }
  out.http = got;
  out.httpServerStderr = server.stderr.slice(-1000);

  const dl = await sbx.downloadUrl('/home/user/tls.txt');
  out.signedUrl = dl.replace(/signature=[^&]+/, 'signature=…');
  out.signed = await httpGet(dl);

  out.unknown = await httpGet('https://8000-nonexistent0sandbox.localhost/');

  out.killed = await sbx.kill();
  out.afterKill = await httpGet(`https://${out.host}/marker.txt`);
  out.isRunningAfterKill = await sbx.isRunning();
} catch (err) {
  out.error = { name: err?.name, message: err?.message, stack: err?.stack, cause: err?.cause ? String(err.cause) : undefined };
} finally {
  if (sbx && out.killed === undefined) {
    try {
      out.killedInFinally = await sbx.kill();
    } catch (err) {
      out.killError = String(err);
    }
  }
}
console.log(`E2E_RESULT=${JSON.stringify(out)}`);
