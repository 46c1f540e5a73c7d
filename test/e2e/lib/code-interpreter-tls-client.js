// Child process for the code-interpreter TLS test: @e2b/code-interpreter configured with only
// E2B_DOMAIN (+ E2B_API_KEY), over TLS with vmon's self-signed CA in NODE_EXTRA_CA_CERTS (read
// only at process start). Prints one line `E2E_RESULT=<json>`; the parent asserts.

import { Sandbox } from '@e2b/code-interpreter';

const out = {};
let sbx;
try {
  // The server may still be making code-interpreter-v1 (a missing template is a 404 until then).
  for (let i = 0; ; i++) {
    try {
      sbx = await Sandbox.create();
      break;
    } catch (err) {
      if (i >= 300) throw err;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
  out.sandboxId = sbx.sandboxId;
  const exec = await sbx.runCode('print("hi")\n1 + 1');
  out.text = exec.text;
  out.stdout = exec.logs.stdout;
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' });
  out.contextCwd = (await sbx.runCode('import os\nos.getcwd()', { context: ctx })).text;
  out.killed = await sbx.kill();
} catch (err) {
  out.error = `${err.name}: ${err.message}${err.cause ? ` (cause: ${err.cause.code || ''} ${err.cause.message})` : ''}`;
  if (sbx) await sbx.kill().catch(() => {});
}
console.log(`E2E_RESULT=${JSON.stringify(out)}`);
