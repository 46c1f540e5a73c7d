// Child process for the --tls-cert test: the SDK in header mode over HTTPS (E2B_API_URL and
// E2B_SANDBOX_URL are https://127.0.0.1:<port>), trusting the operator's certificate through
// NODE_EXTRA_CA_CERTS, which Node reads only at process start.
// Prints one line `E2E_RESULT=<json>`; the parent test asserts.

import { Sandbox } from 'e2b';

const out = {};
let sbx;
try {
  sbx = await Sandbox.create();
  out.sandboxId = sbx.sandboxId;
  const r = await sbx.commands.run('echo tls && whoami');
  out.run = { stdout: r.stdout, exitCode: r.exitCode };
  await sbx.files.write('/home/user/t.txt', 'over-https');
  out.read = await sbx.files.read('/home/user/t.txt');
  out.killed = await sbx.kill();
} catch (err) {
  out.error = `${err.name}: ${err.message}`;
  if (sbx) await sbx.kill().catch(() => {});
}
console.log(`E2E_RESULT=${JSON.stringify(out)}`);
