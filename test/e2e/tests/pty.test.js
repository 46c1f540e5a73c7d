// pty.*: create with onData, input, resize, kill, exit.

import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Sandbox, CommandExitError } from 'e2b';
import { useServer, runId, killQuietly, waitFor } from '../lib/harness.js';

// Hooks live inside describe(): Node 20 does not await root-level hooks in order.
describe('pty', () => {
  const srv = useServer({ name: 'pty' });
  const RUN = runId('pty');
  let sbx;

  srv.before(async () => {
    sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, sbx);
  });

  const enc = (s) => new TextEncoder().encode(s);

  /** Create a PTY whose output is accumulated as text in `term.out`. */
  async function openPty(opts = {}) {
    const decoder = new TextDecoder();
    const term = { out: '', chunks: 0 };
    term.handle = await sbx.pty.create({
      cols: 80,
      rows: 24,
      onData: (data) => {
        assert.ok(data instanceof Uint8Array, 'onData receives bytes');
        term.chunks += 1;
        term.out += decoder.decode(data, { stream: true });
      },
      ...opts,
    });
    term.pid = term.handle.pid;
    term.send = (s) => sbx.pty.sendInput(term.pid, enc(s));
    /** Wait until the output (from `from` on) matches `re`; returns the match. */
    term.expect = async (re, what, from = 0) =>
      waitFor(() => re.exec(term.out.slice(from)), {
        timeoutMs: 15_000,
        what: () => `${what}; pty output so far: ${JSON.stringify(term.out.slice(-400))}`,
      });
    return term;
  }

  srv.test('pty: create, input, output, size, env, user', async () => {
    const term = await openPty();
    assert.ok(Number.isInteger(term.pid) && term.pid > 0, `pid ${term.pid}`);

    // $((40+2)) is only expanded by the shell, so "pty42ok" cannot be the echo of our input.
    await term.send('echo pty$((40+2))ok\n');
    await term.expect(/pty42ok/, 'command output through the pty');

    let mark = term.out.length;
    await term.send('stty size; echo "term=$TERM user=$(whoami) tty=$(tty)"\n');
    await term.expect(/24 80/, 'initial 24 rows x 80 cols', mark);
    await term.expect(/term=xterm-256color user=user tty=\/dev\/pts\/\d+/, 'TERM, user and tty', mark);

    const procs = await sbx.commands.list();
    const p = procs.find((x) => x.pid === term.pid);
    assert.ok(p, 'the pty shows up in commands.list()');
    assert.equal(p.cmd, '/bin/bash');

    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 });
    mark = term.out.length;
    await term.send('stty size\n');
    await term.expect(/30 100/, 'size after resize', mark);

    // Ctrl-C interrupts the foreground job, the shell survives.
    mark = term.out.length;
    // The child prints only once it runs in the foreground process group.
    await term.send("bash -c 'echo started-$((5)); exec sleep 100'\n");
    await term.expect(/started-5/, 'foreground job running', mark);
    await term.send('\x03');
    await term.send('echo after-$((1+1))-interrupt\n');
    await term.expect(/after-2-interrupt/, 'shell alive after ^C', mark);

    assert.equal(await sbx.pty.kill(term.pid), true);
    await assert.rejects(term.handle.wait(), (err) => {
      assert.ok(err instanceof CommandExitError, `expected CommandExitError, got ${err?.name}: ${err?.message}`);
      assert.equal(err.exitCode, -1);
      return true;
    });
    await waitFor(async () => !(await sbx.commands.list()).some((x) => x.pid === term.pid), { what: 'pty gone from list' });
    assert.equal(await sbx.pty.kill(term.pid), false, 'killing a gone pty reports false');
  });

  srv.test('pty: exit status of the shell is reported', async () => {
    const term = await openPty({ cols: 120, rows: 40, envs: { PTY_VAR: 'pty-env' }, cwd: '/tmp' });
    await term.send('echo "$PTY_VAR $(pwd) $(stty size)"\n');
    await term.expect(/pty-env \/tmp 40 120/, 'envs, cwd and size from create()');
    await term.send('exit 7\n');
    await assert.rejects(term.handle.wait(), (err) => {
      assert.ok(err instanceof CommandExitError);
      assert.equal(err.exitCode, 7);
      return true;
    });
  });

  srv.test('pty as root', async () => {
    const term = await openPty({ user: 'root' });
    await term.send('echo "who=$(whoami)"\n');
    await term.expect(/who=root/, 'root shell');
    await term.send('exit\n');
    const r = await term.handle.wait();
    assert.equal(r.exitCode, 0);
  });

  srv.test('pty.connect re-attaches to a running pty', async () => {
    const term = await openPty();
    await term.send('echo first-$((2*3))\n');
    await term.expect(/first-6/, 'output before disconnect');
    await term.handle.disconnect();
    const decoder = new TextDecoder();
    let out = '';
    const again = await sbx.pty.connect(term.pid, {
      onData: (d) => {
        out += decoder.decode(d, { stream: true });
      },
    });
    assert.equal(again.pid, term.pid);
    await sbx.pty.sendInput(term.pid, enc('echo second-$((3*3))\n'));
    await waitFor(() => /second-9/.test(out), { timeoutMs: 15_000, what: () => `output after pty.connect: ${JSON.stringify(out)}` });
    assert.equal(await sbx.pty.kill(term.pid), true);
    await assert.rejects(again.wait(), CommandExitError);
  });
});
