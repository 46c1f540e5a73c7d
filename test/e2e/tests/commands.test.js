// commands.*: output, exit codes, env, cwd, users, background + kill, stdin,
// signals, long output, timeouts, list and connect. One sandbox for the file.

import assert from 'node:assert/strict';
import { describe } from 'node:test';
import {
  Sandbox,
  CommandExitError,
  TimeoutError,
  NotFoundError,
  InvalidArgumentError,
} from 'e2b';
import { useServer, runId, killQuietly, waitFor, sleep } from '../lib/harness.js';
import { sha256 } from '../lib/data.js';

// Hooks live inside describe(): Node 20 does not await root-level hooks in order.
describe('commands', () => {
  const srv = useServer({ name: 'commands' });
  const RUN = runId('commands');
  let sbx;

  srv.before(async () => {
    sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, sbx);
  });

  const isExit = (code, check) => (err) => {
    assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.name}: ${err?.message}`);
    assert.equal(err.exitCode, code, `exit code (error: ${err.error})`);
    if (check) check(err);
    return true;
  };

  async function listed(pid) {
    return (await sbx.commands.list()).find((p) => p.pid === pid);
  }

  srv.test('output of a simple command, as the default user in its home', async () => {
    const r = await sbx.commands.run('echo hi && whoami');
    assert.deepEqual({ stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode }, { stdout: 'hi\nuser\n', stderr: '', exitCode: 0 });
    const env = await sbx.commands.run('pwd; echo "$HOME|$USER"; id -u');
    assert.equal(env.stdout, '/home/user\n/home/user|user\n1000\n');
    const err = await sbx.commands.run('echo to-stderr >&2');
    assert.equal(err.stdout, '');
    assert.equal(err.stderr, 'to-stderr\n');
  });

  srv.test('streaming callbacks receive stdout and stderr', async () => {
    const out = [];
    const errs = [];
    const r = await sbx.commands.run('echo one; echo two >&2; echo three', {
      onStdout: (d) => out.push(d),
      onStderr: (d) => errs.push(d),
    });
    assert.equal(out.join(''), 'one\nthree\n');
    assert.equal(errs.join(''), 'two\n');
    assert.equal(r.stdout, 'one\nthree\n');
  });

  srv.test('non-zero exit → CommandExitError with exitCode, stdout and stderr', async () => {
    await assert.rejects(
      sbx.commands.run('echo out; echo err >&2; exit 3'),
      isExit(3, (e) => {
        assert.equal(e.stdout, 'out\n');
        assert.equal(e.stderr, 'err\n');
        assert.ok(e.error, 'the end event carries an error text for a non-zero exit');
      }),
    );
    await assert.rejects(sbx.commands.run('false'), isExit(1));
    await assert.rejects(sbx.commands.run('exit 255'), isExit(255));
    await assert.rejects(sbx.commands.run('definitely-not-a-command-e2e'), isExit(127));
  });

  srv.test('per-command envs and cwd', async () => {
    await sbx.commands.run('mkdir -p /tmp/e2e-cwd/sub');
    const r = await sbx.commands.run('echo "$FOO|$BAR"; pwd', {
      envs: { FOO: 'foo value', BAR: 'x=y' },
      cwd: '/tmp/e2e-cwd/sub',
    });
    assert.equal(r.stdout, 'foo value|x=y\n/tmp/e2e-cwd/sub\n');
    const after1 = await sbx.commands.run('echo "${FOO:-unset}"; pwd');
    assert.equal(after1.stdout, 'unset\n/home/user\n', 'envs and cwd apply to one command only');
    // PATH still works with custom envs
    const withPath = await sbx.commands.run('command -v python3 git node curl', { envs: { X: '1' } });
    assert.equal(withPath.stdout.trim().split('\n').length, 4, `tools on PATH: ${withPath.stdout}`);
  });

  srv.test('a cwd that does not exist is rejected', async () => {
    await assert.rejects(sbx.commands.run('pwd', { cwd: '/no/such/dir-e2e' }), (err) => {
      assert.ok(
        err instanceof InvalidArgumentError || err instanceof NotFoundError,
        `expected InvalidArgumentError, got ${err?.name}: ${err?.message}`,
      );
      return true;
    });
  });

  srv.test("user 'root' vs default user", async () => {
    // As in E2B's envd, the template's default workdir applies to every user; HOME is the user's.
    const root = await sbx.commands.run('whoami; id -u; pwd; echo $HOME', { user: 'root' });
    assert.equal(root.stdout, 'root\n0\n/home/user\n/root\n');
    const user = await sbx.commands.run('whoami', { user: 'user' });
    assert.equal(user.stdout, 'user\n');
    // root can do what user cannot
    await assert.rejects(sbx.commands.run('touch /etc/e2e-owned-by-root'), isExit(1));
    await sbx.commands.run('touch /etc/e2e-owned-by-root && stat -c %U /etc/e2e-owned-by-root', { user: 'root' });
    const owner = await sbx.commands.run('stat -c %U /etc/e2e-owned-by-root');
    assert.equal(owner.stdout, 'root\n');
    // passwordless sudo for the default user
    const sudo = await sbx.commands.run('sudo -n whoami');
    assert.equal(sudo.stdout, 'root\n');
  });

  srv.test('background command: pid, list, kill', async () => {
    const h = await sbx.commands.run('sleep 300', { background: true });
    assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`);
    assert.equal(h.exitCode, undefined, 'still running');
    const p = await listed(h.pid);
    assert.ok(p, `commands.list() has pid ${h.pid}`);
    assert.equal(p.cmd, '/bin/bash');
    assert.deepEqual(p.args, ['-l', '-c', 'sleep 300']);

    assert.equal(await h.kill(), true);
    await assert.rejects(h.wait(), isExit(-1));
    await waitFor(async () => !(await listed(h.pid)), { what: `pid ${h.pid} gone from commands.list()` });
    assert.equal(await sbx.commands.kill(h.pid), false, 'killing a gone process reports false');
  });

  srv.test('commands.list() shows every running command', async () => {
    const a = await sbx.commands.run('sleep 301', { background: true });
    const b = await sbx.commands.run('sleep 302', { background: true, cwd: '/tmp', envs: { MARK: 'b' } });
    try {
      const procs = await sbx.commands.list();
      const pa = procs.find((p) => p.pid === a.pid);
      const pb = procs.find((p) => p.pid === b.pid);
      assert.ok(pa && pb, `both listed: ${JSON.stringify(procs)}`);
      assert.deepEqual(pa.args, ['-l', '-c', 'sleep 301']);
      assert.deepEqual(pb.args, ['-l', '-c', 'sleep 302']);
      assert.equal(pb.cwd, '/tmp');
      assert.equal(pb.envs.MARK, 'b');
    } finally {
      assert.equal(await sbx.commands.kill(a.pid), true);
      assert.equal(await sbx.commands.kill(b.pid), true);
    }
  });

  srv.test('stdin: sendStdin and closeStdin', async () => {
    const h = await sbx.commands.run('cat; echo "<eof>"', { background: true, stdin: true });
    await sbx.commands.sendStdin(h.pid, 'hello ');
    await h.sendStdin(new TextEncoder().encode('world\n'));
    await waitFor(() => h.stdout.includes('hello world\n'), { what: 'cat to echo stdin before EOF' });
    await sbx.commands.closeStdin(h.pid);
    const r = await h.wait();
    assert.equal(r.stdout, 'hello world\n<eof>\n');

    const wc = await sbx.commands.run('wc -c', { background: true, stdin: true });
    await wc.sendStdin('x'.repeat(100_000));
    await wc.closeStdin();
    assert.equal((await wc.wait()).stdout.trim(), '100000');
  });

  srv.test('without stdin:true a command reads EOF instead of hanging', async () => {
    const r = await sbx.commands.run('cat; echo done', { timeoutMs: 15_000 });
    assert.equal(r.stdout, 'done\n');
  });

  srv.test('signals: SIGTERM reaches a trap, SIGKILL from the SDK ends with exit -1', async () => {
    const h = await sbx.commands.run(
      "trap 'echo got-term; exit 42' TERM; echo ready; while true; do sleep 0.1; done",
      { background: true },
    );
    await waitFor(() => h.stdout.includes('ready'), { what: 'trap installed' });
    await sbx.commands.run(`kill -TERM ${h.pid}`);
    await assert.rejects(h.wait(), isExit(42, (e) => assert.match(e.stdout, /got-term/)));

    // An ignored TERM is inherited across exec; only the SDK's SIGKILL ends it.
    const k = await sbx.commands.run("trap '' TERM; echo ready; exec sleep 300", { background: true });
    await waitFor(() => k.stdout.includes('ready'), { what: 'second process started' });
    await sbx.commands.run(`kill -TERM ${k.pid}`);
    await sleep(500);
    assert.equal(k.exitCode, undefined, 'an ignored SIGTERM does not end the process');
    assert.ok(await listed(k.pid), 'still listed after SIGTERM');
    assert.equal(await sbx.commands.kill(k.pid), true, 'SIGKILL cannot be ignored');
    await assert.rejects(k.wait(), isExit(-1));
  });

  srv.test('long output (≈6.9 MB through seq) arrives complete and in order', async () => {
    const N = 1_000_000;
    let chunks = 0;
    const r = await sbx.commands.run(`seq 1 ${N}; seq 1 100000 >&2`, {
      onStdout: () => {
        chunks += 1;
      },
      timeoutMs: 180_000,
    });
    let expected = '';
    for (let i = 1; i <= N; i++) expected += `${i}\n`;
    assert.equal(r.stdout.length, expected.length, 'stdout length');
    assert.equal(sha256(r.stdout), sha256(expected), 'stdout content');
    let expectedErr = '';
    for (let i = 1; i <= 100000; i++) expectedErr += `${i}\n`;
    assert.equal(sha256(r.stderr), sha256(expectedErr), 'stderr content');
    assert.ok(chunks > 10, `output is streamed in chunks (got ${chunks})`);
  });

  srv.test('a command that outlives timeoutMs is stopped with TimeoutError', async () => {
    const t0 = Date.now();
    await assert.rejects(sbx.commands.run('sleep 10', { timeoutMs: 1000 }), TimeoutError);
    const took = Date.now() - t0;
    assert.ok(took < 6000, `rejected after ${took} ms`);
    await waitFor(
      async () => !(await sbx.commands.list()).some((p) => p.args?.includes('sleep 10')),
      { timeoutMs: 5000, what: 'timed-out process killed in the sandbox' },
    );
  });

  srv.test('timeoutMs: 0 lets a command outlive the request timeout', async () => {
    const t0 = Date.now();
    const h = await sbx.commands.run('sleep 4; echo survived', {
      background: true,
      timeoutMs: 0,
      requestTimeoutMs: 1500,
    });
    const r = await h.wait();
    assert.equal(r.stdout, 'survived\n');
    assert.ok(Date.now() - t0 >= 4000, 'ran for its full 4 s');

    const fg = await sbx.commands.run('sleep 3; echo fg-ok', { timeoutMs: 0, requestTimeoutMs: 1000 });
    assert.equal(fg.stdout, 'fg-ok\n');
  });

  srv.test('commands.connect(pid) re-attaches to a running command', async () => {
    const h = await sbx.commands.run('for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.5; done; exit 3', {
      background: true,
    });
    await waitFor(() => h.stdout.includes('tick1'), { what: 'first tick' });
    await h.disconnect();
    const seen = [];
    const c = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) });
    assert.equal(c.pid, h.pid);
    await assert.rejects(c.wait(), isExit(3));
    assert.match(seen.join(''), /tick6\n/, `output after connect: ${JSON.stringify(seen.join(''))}`);
    await assert.rejects(sbx.commands.connect(999_999), NotFoundError);
  });

  srv.test('sandbox still healthy after all of the above', async () => {
    const r = await sbx.commands.run('echo ok');
    assert.equal(r.stdout, 'ok\n');
    const procs = await sbx.commands.list();
    assert.ok(!procs.some((p) => p.args?.some((a) => a.startsWith('sleep 30'))), `no leftover sleeps: ${JSON.stringify(procs)}`);
  });
});
