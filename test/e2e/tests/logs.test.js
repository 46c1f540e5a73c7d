// Sandbox logs (GET /sandboxes/{id}/logs and /v2/sandboxes/{id}/logs) against a real vmon serve:
// a sandbox's lifecycle (created, paused, resumed, timeout changed, killed) and an egress refusal
// are listed in order with their levels and fields; paging with cursor/limit/direction returns
// each entry exactly once; level and search filter; v1 lines are JSON objects with level and
// logger, as E2B's CLI parses them; an ended sandbox's logs are still served; unknown sandboxes
// are 404 and bad parameters 400 with E2B's error body; `vmon sandbox logs` and E2B's own CLI
// (`e2b sandbox logs`, @e2b/cli unchanged, pointed at vmon) print them.

import assert from 'node:assert/strict';
import { describe } from 'node:test';
import { Sandbox, Template } from 'e2b';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { useServer, runId, killQuietly, apiFetch, runVmon, runChild, waitFor, getInfoRecovered, E2E_DIR } from '../lib/harness.js';

describe('sandbox logs', () => {
  // A small disk, so a test can fill it.
  const srv = useServer({ name: 'logs', args: ['--sandbox-disk-mb', '256'] });
  const RUN = runId('logs');
  const created = [];
  /** The sandbox whose whole life the tests read: created, ran, paused, resumed, timed, killed. */
  let id;
  const SECRET = 'env-value-that-must-not-be-logged';

  const v2 = async (sandboxId, query = '') => {
    const res = await apiFetch(srv, `/v2/sandboxes/${sandboxId}/logs${query}`);
    assert.equal(res.status, 200, `v2 logs${query}: ${res.status} ${res.text}`);
    assert.ok(Array.isArray(res.json?.logs), `v2 body: ${res.text}`);
    return res.json.logs;
  };

  srv.before(async () => {
    const sbx = await Sandbox.create({
      ...srv.sdkOpts,
      metadata: { run: RUN },
      envs: { SECRET_ENV: SECRET },
      // A policy with a domain sends port 80 through the node's egress proxy, which refuses any
      // other name there (no packet leaves the node: the proxy answers 403 itself).
      network: { allowOut: ['allowed.test'], denyOut: ['0.0.0.0/0'] },
    });
    created.push(sbx);
    id = sbx.sandboxId;
    const r = await sbx.commands.run('echo ran');
    assert.equal(r.stdout, 'ran\n');
    const refused = await sbx.commands.run(
      "curl -s -o /dev/null -w '%{http_code}' -m 5 -H 'Host: other.test' http://203.0.113.10/ || true",
    );
    assert.equal(refused.stdout, '403', `the proxy refuses other.test: ${refused.stdout} ${refused.stderr}`);
    assert.equal(await sbx.pause(), true);
    const res = await apiFetch(srv, `/v2/sandboxes/${id}/connect`, { method: 'POST', body: '{"timeout":300}' });
    assert.equal(res.status, 201, `resume: ${res.text}`);
    const again = await Sandbox.connect(id, srv.sdkOpts);
    await again.setTimeout(600_000);
    // The refusal reaches the log through the denied hub, asynchronously.
    await waitFor(async () => (await v2(id, '?search=egress%20refused')).length > 0, {
      timeoutMs: 10_000,
      what: 'the egress refusal in the log',
    });
    assert.equal(await Sandbox.kill(id, srv.sdkOpts), true);
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
  });

  srv.test('v2 lists the lifecycle in order with levels and fields, also after the sandbox ended', async () => {
    const logs = await v2(id);
    const lines = logs.map((l) => `${l.level} ${l.fields.logger} ${l.message}`);
    const want = [
      /^info lifecycleSvc sandbox created from template base$/,
      /^warn egressSvc egress refused: tcp other\.test \(203\.0\.113\.10:80\) by /,
      /^info lifecycleSvc sandbox paused with its memory$/,
      /^info lifecycleSvc sandbox resumed on node /,
      /^info lifecycleSvc sandbox timeout changed: it ends in 600 s$/,
      /^info lifecycleSvc sandbox killed by request$/,
    ];
    // The connect's extension (300 s from the resume) may log a timeout change too; every
    // expected entry must be there, in this order.
    let at = 0;
    for (const re of want) {
      const i = lines.findIndex((l, j) => j >= at && re.test(l));
      assert.ok(i >= 0, `no entry matching ${re} after position ${at}:\n${lines.join('\n')}`);
      at = i + 1;
    }
    assert.match(lines.at(-1), /killed by request/, 'the end is the last entry');
    const byMsg = (re) => logs.find((l) => re.test(l.message));
    const createdE = byMsg(/created from template/);
    assert.equal(createdE.fields.cpu, '2');
    assert.equal(createdE.fields.memoryMB, '512');
    assert.ok(createdE.fields.template, 'template id field');
    const refusal = byMsg(/egress refused/);
    assert.equal(refusal.fields.name, 'other.test');
    assert.equal(refusal.fields.port, '80');
    assert.ok(refusal.fields.destination && refusal.fields.rule !== undefined, JSON.stringify(refusal));
    assert.equal(byMsg(/paused/).fields.memory, 'true');
    assert.equal(byMsg(/killed by request/).fields.reason, 'killed by request');
    for (let i = 1; i < logs.length; i++) {
      assert.ok(Date.parse(logs[i].timestamp) > Date.parse(logs[i - 1].timestamp), 'timestamps strictly increase');
    }
    const all = JSON.stringify(logs);
    assert.ok(!all.includes(SECRET), 'an environment value reached the logs');
  });

  srv.test('paging with cursor, limit and direction returns every entry exactly once', async () => {
    const all = await v2(id);
    assert.ok(all.length >= 6);
    for (const direction of ['forward', 'backward']) {
      for (const limit of [1, 2, 4]) {
        const seen = [];
        let cursor = null;
        for (let page = 0; page < 100; page++) {
          const q = `?limit=${limit}&direction=${direction}${cursor === null ? '' : `&cursor=${cursor}`}`;
          const logs = await v2(id, q);
          assert.ok(logs.length <= limit, `${q}: ${logs.length} entries`);
          if (logs.length === 0) break;
          seen.push(...logs.map((l) => l.timestamp + ' ' + l.message));
          const last = Date.parse(logs.at(-1).timestamp);
          cursor = direction === 'forward' ? last + 1 : last - 1;
        }
        const want = all.map((l) => l.timestamp + ' ' + l.message);
        if (direction === 'backward') want.reverse();
        assert.deepEqual(seen, want, `${direction} limit ${limit}`);
      }
    }
  });

  srv.test('level and search filter', async () => {
    const warn = await v2(id, '?level=warn');
    assert.ok(warn.length >= 1 && warn.every((l) => l.level === 'warn' || l.level === 'error'), JSON.stringify(warn));
    assert.ok(warn.some((l) => l.fields.logger === 'egressSvc'));
    const paused = await v2(id, '?search=paused');
    assert.deepEqual(paused.map((l) => l.message), ['sandbox paused with its memory']);
    assert.deepEqual(await v2(id, '?search=PAUSED'), [], 'search is case-sensitive');
    assert.equal((await v2(id, '?level=error')).length, 0);
  });

  srv.test('v1 lines are JSON objects with level and logger, as E2B\'s CLI parses them', async () => {
    const all = await v2(id);
    const res = await apiFetch(srv, `/sandboxes/${id}/logs?start=0`);
    assert.equal(res.status, 200, res.text);
    assert.equal(res.json.logs.length, all.length);
    assert.equal(res.json.logEntries.length, all.length);
    res.json.logs.forEach((l, i) => {
      const line = JSON.parse(l.line);
      assert.equal(typeof line, 'object');
      assert.equal(line.level, all[i].level);
      assert.equal(line.logger, all[i].fields.logger);
      assert.equal(line.message, all[i].message);
      assert.equal(l.timestamp, all[i].timestamp);
    });
    // start (ms, inclusive) skips what came before, as the CLI's follow mode uses it.
    const from = Date.parse(all[2].timestamp);
    const later = await apiFetch(srv, `/sandboxes/${id}/logs?start=${from}`);
    assert.equal(later.json.logs.length, all.length - 2);
  });

  srv.test('unknown sandboxes are 404; bad parameters 400 with E2B\'s error body', async () => {
    for (const p of ['/v2/sandboxes/nosuchsandbox0000000/logs', '/sandboxes/nosuchsandbox0000000/logs']) {
      const res = await apiFetch(srv, p);
      assert.equal(res.status, 404, `${p}: ${res.text}`);
      assert.equal(res.json.code, 404);
    }
    for (const [q, msg] of [
      ['?limit=5000', /limit must be at most 1000/],
      ['?direction=sideways', /direction must be forward or backward/],
      [`?search=${'x'.repeat(300)}`, /search must be at most 256 characters/],
      ['?level=loud', /level must be/],
      ['?cursor=yesterday', /cursor must be/],
    ]) {
      const res = await apiFetch(srv, `/v2/sandboxes/${id}/logs${q}`);
      assert.equal(res.status, 400, `${q}: ${res.text}`);
      assert.equal(res.json.code, 400);
      assert.match(res.json.message, msg);
    }
  });

  srv.test('a network update and a fork are logged on the source, and the fork has its own log', async () => {
    const src = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
    created.push(src);
    const HEADER_VALUE = 'header-rule-value-that-must-not-be-logged';
    const upd = await apiFetch(srv, `/sandboxes/${src.sandboxId}/network`, {
      method: 'PUT',
      body: JSON.stringify({
        allowOut: ['api.allowed.test', '192.0.2.0/24'],
        denyOut: ['0.0.0.0/0'],
        rules: { 'api.allowed.test': [{ transform: { headers: { 'X-Api-Key': HEADER_VALUE } } }] },
      }),
    });
    assert.ok(upd.status === 200 || upd.status === 204, `network update: ${upd.status} ${upd.text}`);
    const res = await apiFetch(srv, `/sandboxes/${src.sandboxId}/fork`, { method: 'POST', body: '{"count":1,"timeout":120}' });
    assert.equal(res.status, 201, res.text);
    const forkId = res.json[0].sandbox.sandboxID;
    created.push(await Sandbox.connect(forkId, srv.sdkOpts));
    const logs = await v2(src.sandboxId);
    const net = logs.find((l) => l.message === 'network policy updated');
    assert.ok(net, JSON.stringify(logs));
    assert.equal(net.fields.allowOut, 'api.allowed.test,192.0.2.0/24');
    assert.equal(net.fields.denyOut, '0.0.0.0/0');
    assert.equal(net.fields.ruleDomains, '1');
    assert.ok(!JSON.stringify(logs).includes(HEADER_VALUE), 'a header-rule value reached the logs');
    const forked = logs.find((l) => l.message.startsWith('sandbox forked to'));
    assert.ok(forked, JSON.stringify(logs));
    assert.equal(forked.fields.forks, forkId);
    const own = await v2(forkId);
    assert.equal(own[0].message, `sandbox created as a fork of ${src.sandboxId}`, JSON.stringify(own));
    assert.equal(own[0].fields.forkOf, src.sandboxId);
    assert.ok(!own.some((l) => /network policy updated|created from template/.test(l.message)), 'a fork has its own log');
  });

  srv.test('processes, the OOM killer, a full disk and the start command\'s output are logged by envd', async () => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN }, envs: { SECRET_ENV: SECRET }, timeoutMs: 600_000 });
    created.push(sbx);
    await assert.rejects(sbx.commands.run('echo $SECRET_ENV; exit 3'), (err) => err.exitCode === 3);
    const bg = await sbx.commands.run('sleep 300', { background: true });
    assert.equal(await bg.kill(), true);
    const oom = await sbx.commands.run('python3 -c "a = bytearray(600 * 2**20)"', { timeoutMs: 120_000 }).catch((e) => e);
    assert.match(String(oom.error ?? oom), /signal: killed/, `the 600 MiB allocation was not SIGKILLed: ${oom}`);
    const full = await sbx.commands.run('dd if=/dev/zero of=/home/user/fill bs=1M count=400 2>&1; sleep 3; rm -f /home/user/fill', { timeoutMs: 120_000 }).catch((e) => e);
    assert.match(full.stdout ?? String(full), /No space left on device/, `the disk did not fill: ${full.stdout ?? full}`);
    const want = [
      [/^warn processSvc process \d+ exited with code 3: echo \$SECRET_ENV; exit 3$/, { exitCode: '3' }],
      [/^warn processSvc process \d+ was killed by SIGKILL: sleep 300$/, { signal: 'SIGKILL' }],
      [/^error limitsSvc out of memory: killed process \d+ \(python3\)/, { reason: 'oom-kill', comm: 'python3' }],
      [/^warn processSvc process \d+ was killed by SIGKILL: python3 -c/, { signal: 'SIGKILL' }],
      [/^warn limitsSvc disk full: /, { reason: 'disk-full' }],
    ];
    let logs = [];
    await waitFor(async () => {
      logs = await v2(sbx.sandboxId);
      return want.every(([re]) => logs.some((l) => re.test(`${l.level} ${l.fields.logger} ${l.message}`)));
    }, { timeoutMs: 15_000, what: () => `envd's entries:\n${logs.map((l) => `${l.level} ${l.fields.logger} ${l.message}`).join('\n')}` });
    const lines = logs.map((l) => `${l.level} ${l.fields.logger} ${l.message}`);
    let at = 0;
    for (const [re, fields] of want) {
      const i = lines.findIndex((l, j) => j >= at && re.test(l));
      assert.ok(i >= 0, `no entry matching ${re} after position ${at}:\n${lines.join('\n')}`);
      for (const [k, v] of Object.entries(fields)) assert.equal(logs[i].fields[k], v, `${k} of ${lines[i]}`);
      if (fields.reason !== 'disk-full') assert.ok(logs[i].fields.pid, `pid of ${lines[i]}`);
      at = i + 1;
    }
    const started = logs.find((l) => /started: echo \$SECRET_ENV/.test(l.message));
    assert.equal(started.level, 'info');
    assert.equal(started.fields.user, 'user');
    assert.ok(!JSON.stringify(logs).includes(SECRET), 'an environment value reached the logs');
    // The sandbox lived through all of it.
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n');

    // A template's start command runs in the build and is restored running: its output after the
    // sandbox was created is in the sandbox's log, the build's is not.
    const tpl = `${RUN}-ticker`.toLowerCase();
    await Template.build(Template().fromTemplate('base').setStartCmd(`sh -c 'i=0; while :; do i=$((i+1)); echo tick $i; echo tock $i >&2; sleep 1; done'`, 'true'), tpl, srv.sdkOpts);
    const ticker = await Sandbox.create(tpl, { ...srv.sdkOpts, metadata: { run: RUN } });
    created.push(ticker);
    let out = [];
    await waitFor(async () => {
      out = (await v2(ticker.sandboxId)).filter((l) => l.fields.source === 'start command');
      return out.length >= 4;
    }, { timeoutMs: 20_000, what: () => `the start command's output: ${JSON.stringify(out)}` });
    const ticks = out.filter((l) => l.fields.stream === 'stdout').map((l) => Number(l.message.replace('tick ', '')));
    assert.ok(ticks.length >= 2, JSON.stringify(out));
    ticks.forEach((n, i) => i > 0 && assert.equal(n, ticks[i - 1] + 1, `ticks in order: ${ticks}`));
    assert.ok(out.every((l) => (l.fields.stream === 'stdout' ? l.level === 'info' : l.level === 'warn')), JSON.stringify(out));
    const first = (await v2(ticker.sandboxId))[0];
    assert.match(first.message, /^sandbox created from template /, 'nothing of the build comes before the sandbox was created');
  });

  srv.test('what a sandbox did just before its kill is in its log', async () => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
    created.push(sbx);
    // envd holds its latest events back for a moment to send them together: the kill must read
    // them before the sandbox goes.
    await assert.rejects(sbx.commands.run('exit 7'), (err) => err.exitCode === 7);
    assert.equal(await sbx.kill(), true);
    const lines = (await v2(sbx.sandboxId)).map((l) => `${l.level} ${l.fields.logger} ${l.message}`);
    const exited = lines.findIndex((l) => /^warn processSvc process \d+ exited with code 7: exit 7$/.test(l));
    const killed = lines.findIndex((l) => /^info lifecycleSvc sandbox killed by request$/.test(l));
    assert.ok(exited >= 0 && killed > exited, `the exit, then the kill:\n${lines.join('\n')}`);
  });

  srv.test('vmon sandbox logs prints the log, filtered by level or as JSON', async () => {
    const base = ['sandbox', 'logs', id, '--api-url', srv.apiUrl, '--api-key', srv.apiKey];
    const { stdout } = await runVmon(base);
    assert.match(stdout, /INFO +lifecycle +sandbox created from template base/);
    assert.match(stdout, /WARN +egress +egress refused: tcp other\.test/);
    assert.match(stdout, /sandbox killed by request +reason="killed by request"/);
    const warn = await runVmon([...base, '--level', 'warn']);
    assert.ok(!/INFO/.test(warn.stdout) && /WARN/.test(warn.stdout), warn.stdout);
    const json = await runVmon([...base, '--json']);
    const entries = json.stdout.trim().split('\n').map((l) => JSON.parse(l));
    assert.equal(entries.length, (await v2(id)).length);
    await assert.rejects(runVmon(['sandbox', 'logs', 'nosuchsandbox0000000', '--api-url', srv.apiUrl, '--api-key', srv.apiKey]), /404/);
  });

  // E2B's CLI, unchanged: it reads v1 `logs[]` from `?start=<ms>` and parses each line as JSON.
  const E2B_CLI = path.join(E2E_DIR, 'node_modules', '.bin', 'e2b');
  const cliEnv = () => ({ ...process.env, E2B_API_KEY: srv.apiKey, E2B_API_URL: srv.apiUrl, E2B_SANDBOX_URL: srv.apiUrl,
    NO_COLOR: '1', FORCE_COLOR: '0' });

  srv.test('e2b sandbox logs (E2B\'s CLI) prints the log, with --level, --loggers and --format json', async () => {
    const r = await runChild([E2B_CLI, 'sandbox', 'logs', id, '--format', 'json'], { env: cliEnv(), timeoutMs: 60_000 });
    assert.equal(r.code, 0, `e2b sandbox logs: ${r.stdout}\n${r.stderr}`);
    const printed = r.stdout.trim().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
    const all = await v2(id);
    assert.equal(printed.length, all.length, r.stdout);
    printed.forEach((p, i) => {
      assert.equal(p.message, all[i].message);
      assert.equal(p.logger, all[i].fields.logger.replace('Svc', ''));
      assert.equal(p.timestamp, new Date(all[i].timestamp).toISOString());
    });
    const warn = await runChild([E2B_CLI, 'sandbox', 'logs', id, '--format', 'json', '--level', 'WARN'], { env: cliEnv() });
    const warned = warn.stdout.trim().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
    assert.ok(warned.length >= 1 && warned.every((p) => /^(warn|error)$/i.test(p.level)), warn.stdout);
    const only = await runChild([E2B_CLI, 'sandbox', 'logs', id, '--format', 'json', '--loggers', 'lifecycle'], { env: cliEnv() });
    const lifecycle = only.stdout.trim().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
    assert.ok(lifecycle.length >= 5 && lifecycle.every((p) => p.logger === 'lifecycle'), only.stdout);
    const pretty = await runChild([E2B_CLI, 'sandbox', 'logs', id], { env: cliEnv() });
    assert.equal(pretty.code, 0, pretty.stderr);
    assert.match(pretty.stdout, /sandbox created from template base/);
    assert.match(pretty.stdout, /egress refused: tcp other\.test/);
  });

  srv.test('e2b sandbox logs --follow prints new entries until the sandbox ends', async () => {
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
    created.push(sbx);
    const child = spawn(E2B_CLI, ['sandbox', 'logs', sbx.sandboxId, '--follow', '--format', 'json'], {
      env: cliEnv(),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    const exited = new Promise((resolve) => child.on('exit', (c, s) => resolve(c ?? s)));
    try {
      await waitFor(() => out.includes('sandbox created from template base'), { timeoutMs: 15_000, what: () => `the created entry: ${out} ${err}` });
      await sbx.setTimeout(450_000);
      await waitFor(() => out.includes('it ends in 450 s'), { timeoutMs: 15_000, what: () => `the timeout entry: ${out} ${err}` });
      await sbx.kill();
      const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r('still running'), 30_000))]);
      assert.equal(code, 0, `the CLI stops following once the sandbox ended: ${out} ${err}`);
      const msgs = out.trim().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l).message);
      assert.equal(new Set(msgs).size, msgs.length, `an entry printed twice: ${out}`);
    } finally {
      child.kill('SIGKILL');
    }
  });

  srv.test('logs outlast a restart of vmon: an ended sandbox\'s are still served, a paused one\'s go on', async () => {
    const before = await v2(id);
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
    created.push(sbx);
    assert.equal(await sbx.pause(), true);
    await srv.restart();
    assert.deepEqual(await v2(id), before, 'the ended sandbox\'s log after a restart');
    const res = await apiFetch(srv, `/v2/sandboxes/${sbx.sandboxId}/connect`, { method: 'POST', body: '{"timeout":120}' });
    assert.equal(res.status, 201, `resume after restart: ${res.text}`);
    const msgs = (await v2(sbx.sandboxId)).map((l) => l.message);
    assert.deepEqual(msgs.slice(0, 2), ['sandbox created from template base', 'sandbox paused with its memory']);
    assert.match(msgs[2], /^sandbox resumed on node /);

    // envd's entries across a pause and a restart of vmon with the sandbox running: each once.
    const back = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
    await back.commands.run('echo before-pause');
    assert.equal(await back.pause(), true);
    const again = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
    await again.commands.run('echo after-resume');
    await srv.restart();
    await getInfoRecovered(sbx.sandboxId, srv.sdkOpts);
    const last = await Sandbox.connect(sbx.sandboxId, srv.sdkOpts);
    await last.commands.run('echo after-restart');
    let logs = [];
    await waitFor(async () => {
      logs = await v2(sbx.sandboxId, '?search=exited%20with%20code%200');
      return logs.some((l) => l.message.endsWith('echo after-restart'));
    }, { timeoutMs: 15_000, what: () => `the last command's exit: ${JSON.stringify(logs)}` });
    for (const cmd of ['echo before-pause', 'echo after-resume', 'echo after-restart']) {
      const n = (await v2(sbx.sandboxId)).filter((l) => l.message.endsWith(`started: ${cmd}`)).length;
      assert.equal(n, 1, `"${cmd}" started ${n} times in the log`);
    }
  });

  srv.test('the cap drops the oldest entries and says so; an ended sandbox\'s log and record go after the retention', async () => {
    srv.extraArgs = [...srv.extraArgs, '--sandbox-log-max-bytes', '16384', '--sandbox-log-retention', '1m'];
    await srv.restart();
    const sbx = await Sandbox.create({ ...srv.sdkOpts, metadata: { run: RUN } });
    created.push(sbx);
    // Each command adds two entries of about 250 bytes: 80 of them pass the 16 KiB cap.
    for (let i = 0; i < 80; i++) await sbx.commands.run(`echo entry-${i}`);
    let logs = [];
    await waitFor(async () => {
      logs = await v2(sbx.sandboxId);
      return logs.some((l) => l.message.endsWith('echo entry-79'));
    }, { timeoutMs: 15_000, what: 'the last command in the log' });
    const bytes = logs.reduce((n, l) => n + JSON.stringify(l).length, 0);
    assert.ok(bytes < 2 * 16384, `the log holds ${bytes} bytes of entries under a 16 KiB cap`);
    assert.notEqual(logs[0].message, 'sandbox created from template base', 'the oldest entry is still there');
    const drop = logs.find((l) => /older entries dropped/.test(l.message));
    assert.ok(drop, `no entry says what was dropped: ${logs.map((l) => l.message).join('\n')}`);
    assert.equal(drop.level, 'warn');
    assert.ok(Number(drop.fields.dropped) > 0, JSON.stringify(drop));
    // Every command still in the log is there once, in order.
    const kept = logs.map((l) => /started: echo entry-(\d+)$/.exec(l.message)?.[1]).filter(Boolean).map(Number);
    kept.forEach((n, i) => i > 0 && assert.equal(n, kept[i - 1] + 1, `commands in order: ${kept}`));
    assert.equal(kept.at(-1), 79);

    // Ended: served for the retention (1 min here), then gone with the sandbox's record.
    const ended = sbx.sandboxId;
    await sbx.kill();
    assert.match((await v2(ended)).at(-1).message, /killed by request/);
    const listed = async () => (await runVmon(['sandbox', 'ls', '--all', '--limit', '0', '--data-dir', srv.dataDir])).stdout.includes(ended);
    assert.equal(await listed(), true, 'the killed record is kept during the retention');
    await waitFor(async () => (await apiFetch(srv, `/v2/sandboxes/${ended}/logs`)).status === 404, {
      timeoutMs: 120_000, intervalMs: 2_000, what: 'the log to go after its retention',
    });
    await waitFor(async () => !(await listed()), { timeoutMs: 30_000, intervalMs: 1_000, what: 'the record to go with its log' });
  });
});
