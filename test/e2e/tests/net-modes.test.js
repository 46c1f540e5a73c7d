// --net modes without CAP_NET_ADMIN (seed 000, "Network modes"; issue 5 item 1), on the real
// binary with the capability dropped by setpriv: `auto` starts with the seed's exact warning and
// refuses every create with a clear error; `tap` refuses to start; `user` is not available on
// Linux yet and says so. Runs in the SDK stage's loopback-only namespace.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { describe, test } from 'node:test';
import { Sandbox } from 'e2b';
import { useServer, apiFetch, listAll, pgrep, dataDir, freePort, vmonBin, runChild } from '../lib/harness.js';

const WARNING = 'no CAP_NET_ADMIN: this node cannot network sandboxes and will reject creates';
// Out of the bounding and inheritable sets, so neither vmon nor anything it runs gets it back.
const NO_NET_ADMIN = ['setpriv', '--bounding-set=-net_admin', '--inh-caps=-net_admin', '--'];

/** Runs `vmon serve` to its exit (bounded); resolves { code, output }. */
async function serveUntilExit(args, { wrap = NO_NET_ADMIN, timeoutMs = 30_000 } = {}) {
  const port = await freePort();
  const argv = [...wrap, vmonBin(), 'serve', '--data-dir', dataDir(), '--listen', `127.0.0.1:${port}`, ...args];
  const { code, stdout, stderr } = await runChild(argv, { timeoutMs });
  return { code, output: stdout + stderr };
}

describe('--net auto without CAP_NET_ADMIN', () => {
  const srv = useServer({ name: 'net-auto-nocap', args: ['--net', 'auto', '--warm-pool', '0'], wrap: NO_NET_ADMIN });

  srv.test('starts with the exact warning and refuses every create with a clear error', async () => {
    const status = fs.readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8');
    const capEff = BigInt('0x' + /^CapEff:\s*([0-9a-f]+)/m.exec(status)[1]);
    assert.equal(capEff & (1n << 12n), 0n, 'vmon runs without CAP_NET_ADMIN (bit 12)');
    assert.ok(fs.readFileSync(srv.logFile, 'utf8').includes(WARNING), `the log carries the warning:\n${srv.logTail()}`);

    const before = (await pgrep('runsc')).length;
    await assert.rejects(Sandbox.create({ ...srv.sdkOpts }), (err) => {
      assert.ok(err.message.includes(WARNING), err.message);
      return true;
    });
    const raw = await apiFetch(srv, '/sandboxes', { method: 'POST', body: JSON.stringify({ templateID: 'base' }) });
    assert.equal(raw.status, 503, raw.text);
    assert.equal(raw.json?.message, WARNING);
    assert.equal((await listAll(srv.sdkOpts)).length, 0, 'no sandbox record was left');
    assert.equal((await pgrep('runsc')).length, before, 'no runsc was started');
  });
});

// These servers never become ready, so they run to their exit rather than through useServer.
describe('--net tap and --net user', () => {
  test('--net tap without CAP_NET_ADMIN refuses to start', async () => {
    const { code, output } = await serveUntilExit(['--net', 'tap']);
    assert.notEqual(code, 0, output);
    assert.match(output, /--net tap needs CAP_NET_ADMIN/, output);
    assert.ok(!output.includes('vmon serving'), `it must not serve:\n${output}`);
  });

  test('--net user is not available on Linux yet and says so', async () => {
    const { code, output } = await serveUntilExit(['--net', 'user'], { wrap: [] });
    assert.notEqual(code, 0, output);
    assert.match(output, /--net user is not available on Linux yet: use --net tap or auto/, output);
  });

  test('VMON_NET=tap is the same as --net tap', async () => {
    process.env.VMON_NET = 'tap';
    try {
      const { code, output } = await serveUntilExit([]);
      assert.notEqual(code, 0, output);
      assert.match(output, /--net tap needs CAP_NET_ADMIN/, output);
    } finally {
      delete process.env.VMON_NET;
    }
  });
});
