// Several drivers on one PostgreSQL database (lib/cluster.js starts the server from Debian's
// binaries, in a temporary directory): a sandbox made through one driver is served, paused,
// resumed and killed through another; expiry happens once; losing a driver loses nothing.
import { describe, before, after, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { Sandbox, Template } from 'e2b';
import { assertCameBack, holderIn, leaveTraces, scrapeMetrics, startCluster, stopCluster } from '../lib/cluster.js';
import { apiFetch, killQuietly, runId, waitFor, withLogTail } from '../lib/harness.js';

describe('cluster: two drivers on one PostgreSQL database', () => {
  const RUN = runId('cluster-pg');
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-cluster-pg-'));
  let cl;
  let d1;
  let d2;
  const nodes = [];
  const created = [];
  const via = (d, extra = {}) => ({ ...d.sdkOpts, ...extra });
  /** Lines of a driver's log (its whole file: the tail is short) that match re. */
  const logLines = (d, re) => fs.readFileSync(d.logFile, 'utf8').split('\n').filter((l) => re.test(l));

  before(async () => {
    cl = await startCluster(root, {
      drivers: 2,
      nodes: [
        { name: 'node-a', ip: '10.99.0.2', base: true, args: ['--max-sandboxes', '6'] },
        { name: 'node-b', ip: '10.99.0.3', args: ['--max-sandboxes', '6'] },
      ],
      driverArgs: ['--node-lost-grace', '15s'],
      driverArgsOf: (i) => ['--metrics-listen', `127.0.0.1:${19470 + i}`],
    });
    [d1, d2] = cl.drivers;
    nodes.push(...cl.nodes);
  });

  after(async () => {
    for (const d of [d2, d1]) {
      if (d?.apiKey) await killQuietly(via(d), ...created).catch(() => {});
      await d?.killAllSandboxes();
    }
    await stopCluster(cl);
  });

  const members = { logTail: () => [d1, d2, ...nodes].filter(Boolean).map((s) => s.logTail(30)).join('\n') };
  const ctest = (name, fn) => test(name, withLogTail(members, fn));

  ctest('a sandbox created through one driver is connected, paused, resumed and killed through the other', async () => {
    await waitFor(() => nodes.every((n) => n.tail.some((l) => /joined the cluster's gossip/.test(l))), { what: 'both nodes in the gossip' });
    // Each driver hears of both nodes (the second one through the gossip the database led it to).
    for (const d of [d1, d2]) {
      await waitFor(() => d.tail.filter((l) => /node (joined|back|ready)|node=node-[ab]/.test(l)).length > 0, { timeoutMs: 30_000, what: `${d.name} sees the nodes` });
    }
    const metrics = (i) => scrapeMetrics(`http://127.0.0.1:${19470 + i}/metrics`);
    const before = await Promise.all([metrics(0), metrics(1)]);
    const sbx = await waitFor(async () => Sandbox.create(via(d1, { metadata: { run: RUN } })), { timeoutMs: 30_000, what: 'a create through driver 1' });
    created.push(sbx);
    await leaveTraces(sbx);
    const holder = holderIn(cl, sbx.sandboxId);
    assert.ok(holder, 'no node holds it');

    // Driver 2 reaches it at once: its memory follows the record driver 1 made.
    const other = await Sandbox.connect(sbx.sandboxId, via(d2));
    assert.equal((await other.commands.run('cat /tmp/kept')).stdout, 'kept\n');
    await other.files.write('/tmp/through-2', 'two');
    assert.equal(await sbx.files.read('/tmp/through-2'), 'two');
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, via(d2))).metadata.run, RUN);

    // Paused through driver 2, resumed through driver 1 (by connect), and it carries on.
    assert.equal(await other.pause(), true);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId, via(d1))).state, 'paused');
    const back = await Sandbox.connect(sbx.sandboxId, via(d1));
    await assertCameBack(cl, back, holderIn(cl, sbx.sandboxId));
    // Listing through either driver shows it running.
    for (const d of [d1, d2]) {
      const listed = await Sandbox.list(via(d, { query: { metadata: { run: RUN } } })).nextItems();
      assert.deepEqual(listed.map((s) => [s.sandboxId, s.state]), [[sbx.sandboxId, 'running']], `listed through ${d.name}`);
    }

    // Killed through driver 2: gone through driver 1 too, and from its node.
    assert.equal(await Sandbox.kill(sbx.sandboxId, via(d2)), true);
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, via(d1)), /not found/i);
    await waitFor(() => !holderIn(cl, sbx.sandboxId), { what: 'the sandbox gone from its node' });
    await assert.rejects(back.commands.run('true', { requestTimeoutMs: 10_000 }));

    // Its log reads the same through either driver: the lifecycle entries both wrote, in order
    // (the drivers' part is in the database they share).
    const want = [/^info lifecycleSvc sandbox created from template base/, /^info lifecycleSvc sandbox paused with its memory/,
      /^info lifecycleSvc sandbox resumed on node /, /^info lifecycleSvc sandbox killed by request/];
    for (const d of [d1, d2]) {
      const res = await apiFetch(d, `/v2/sandboxes/${sbx.sandboxId}/logs`);
      assert.equal(res.status, 200, res.text);
      const lines = res.json.logs.map((l) => `${l.level} ${l.fields.logger} ${l.message}`).filter((l) => / lifecycleSvc /.test(l));
      // In this order, each once (a connect may add a timeout change between them).
      let at = -1;
      for (const re of want) {
        const hits = lines.filter((l) => re.test(l));
        assert.equal(hits.length, 1, `${re} through ${d.name}:\n${lines.join('\n')}`);
        const i = lines.indexOf(hits[0]);
        assert.ok(i > at, `${re} out of order through ${d.name}:\n${lines.join('\n')}`);
        at = i;
      }
    }

    // Each driver's /metrics: its own operations, and its statements on the shared database.
    const after = await Promise.all([metrics(0), metrics(1)]);
    const moved = (i, k) => (after[i][k] ?? 0) - (before[i][k] ?? 0);
    assert.equal(moved(0, 'vmon_sandboxes_created_total{template="base"}'), 1);
    assert.equal(moved(1, 'vmon_sandboxes_created_total{template="base"}'), 0);
    assert.equal(moved(1, 'vmon_sandbox_operations_total{op="pause",outcome="ok"}'), 1);
    for (const i of [0, 1]) {
      assert.equal(after[i]['vmon_info{role="driver"}'], 1);
      assert.ok(moved(i, 'vmon_database_queries_total{engine="postgres"}') > 0, `driver ${i + 1} ran no statements`);
    }
  });

  ctest('a short timeout expires exactly once across the drivers', async () => {
    const ids = [];
    for (const d of [d1, d2, d1]) {
      const sbx = await Sandbox.create(via(d, { timeoutMs: 4_000, metadata: { run: RUN } }));
      created.push(sbx);
      ids.push(sbx.sandboxId);
    }
    for (const id of ids) {
      await waitFor(async () => {
        try {
          await Sandbox.getInfo(id, via(d2));
          return false;
        } catch (err) {
          return /not found/i.test(err.message);
        }
      }, { timeoutMs: 30_000, what: `${id} expired` });
      await waitFor(() => !holderIn(cl, id), { what: `${id} gone from its node` });
    }
    // A moment for a second expiry, if one were coming, to show in the logs.
    await new Promise((r) => setTimeout(r, 2000));
    for (const id of ids) {
      const kills = [d1, d2].flatMap((d) => logLines(d, new RegExp(`sandbox killed.*sandbox=${id}`)).map((l) => `${d.name}: ${l}`));
      assert.equal(kills.length, 1, `kills of ${id} recorded:\n${kills.join('\n')}`);
      assert.match(kills[0], /reason=timeout/);
    }
  });

  ctest('a template built through a load balancer that sends each step of the build to another driver', async () => {
    // Create and upload through driver 1, the upload's URL and the start through driver 2, the
    // status polls to either in turn: no call of the build finds the driver that served the last.
    const routes = [
      { kind: 'create', re: /^POST \/v[23]\/templates$/, to: 0 },
      { kind: 'upload URL', re: /^GET \/templates\/[^/]+\/files\//, to: 1 },
      { kind: 'upload', re: /^PUT \/templates\/[^/]+\/files\//, to: 0 },
      { kind: 'start', re: /^POST \/v2\/templates\/[^/]+\/builds\//, to: 1 },
      { kind: 'status', re: /^GET \/templates\/[^/]+\/builds\/[^/]+\/status/ },
    ];
    const served = [];
    let turn = 0;
    const lb = http.createServer((req, res) => {
      const line = `${req.method} ${req.url.split('?')[0]}`;
      const route = routes.find((r) => r.re.test(line));
      const to = route?.to ?? turn++ % 2;
      served.push({ kind: route?.kind ?? line, to });
      const target = new URL([d1, d2][to].apiUrl);
      const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers }, (r) => {
        res.writeHead(r.statusCode, r.headers);
        r.pipe(res);
      });
      up.on('error', (err) => res.destroy(err));
      req.pipe(up);
    });
    await new Promise((r) => lb.listen(0, '127.0.0.1', r));
    try {
      const lbUrl = `http://127.0.0.1:${lb.address().port}`;
      const ctxDir = fs.mkdtempSync(path.join(root, 'ctx-'));
      fs.writeFileSync(path.join(ctxDir, 'hello.txt'), 'copied through two drivers\n');
      const name = `${RUN}-lb`.toLowerCase().replace(/[^a-z0-9-_]/g, '-');
      const lines = [];
      await Template.build(
        Template({ fileContextPath: ctxDir })
          .fromTemplate('base')
          .copy('hello.txt', '/opt/hello.txt')
          .runCmd('echo "$(whoami) built" > /opt/built', { user: 'root' }),
        name, { apiKey: d1.apiKey, apiUrl: lbUrl, onBuildLogs: (e) => lines.push(e.message) });
      for (const { kind, to } of routes.filter((r) => r.to !== undefined)) {
        assert.ok(served.some((x) => x.kind === kind && x.to === to), `no ${kind} call went to driver ${to + 1}: ${JSON.stringify(served)}`);
      }
      const polls = served.filter((x) => x.kind === 'status');
      assert.ok(polls.some((x) => x.to === 0) && polls.some((x) => x.to === 1), `status polls: ${JSON.stringify(polls)}`);
      // The log came whole and in order, whichever driver answered each poll.
      const at = (re) => lines.findIndex((l) => re.test(l));
      assert.ok(at(/building on node/) >= 0 && at(/building on node/) < at(/publishing the build to the cluster's store/),
        `the build log:\n${lines.join('\n')}`);
      for (const re of [/building on node/, /publishing the build to the cluster's store/, /^tagged /]) {
        assert.equal(lines.filter((l) => re.test(l)).length, 1, `${re} not once in the build log:\n${lines.join('\n')}`);
      }
      // Driver 2 ran it (it took the start), and driver 1 serves its sandboxes.
      assert.equal(logLines(d1, /template build failed/).length, 0);
      const s = await Sandbox.create(name, via(d1, { metadata: { run: RUN } }));
      created.push(s);
      assert.equal((await s.commands.run('cat /opt/hello.txt /opt/built')).stdout, 'copied through two drivers\nroot built\n');
      assert.equal(await s.kill(), true);
    } finally {
      lb.close();
    }
  });

  ctest('driver 1 killed mid-burst: driver 2 keeps serving, and nothing made before is lost', async () => {
    const before1 = await Sandbox.create(via(d1, { metadata: { run: RUN } }));
    const before2 = await Sandbox.create(via(d2, { metadata: { run: RUN } }));
    created.push(before1, before2);
    const burst = [d1, d2, d1, d2].map((d) => Sandbox.create(via(d, { metadata: { run: RUN }, requestTimeoutMs: 60_000 })).then(
      (s) => ({ d, s }), (err) => ({ d, err })));
    await new Promise((r) => setTimeout(r, 300));
    d1.proc.kill('SIGKILL');
    await d1.exited;
    const results = await Promise.all(burst);
    for (const r of results) if (r.s) created.push(r.s);
    for (const r of results.filter((x) => x.d === d2)) {
      assert.ok(r.s, `a create through driver 2 failed when driver 1 died: ${r.err?.message}`);
    }
    // What was made through driver 1 before it died is served through driver 2.
    for (const sbx of [before1, before2, ...results.filter((r) => r.s).map((r) => r.s)]) {
      const s = await Sandbox.connect(sbx.sandboxId, via(d2));
      assert.equal((await s.commands.run(`echo ${sbx.sandboxId}`)).stdout, `${sbx.sandboxId}\n`);
    }
    // Driver 2 now expires sandboxes too (it leads once driver 1's database session ended).
    const short = await Sandbox.create(via(d2, { timeoutMs: 3_000, metadata: { run: RUN } }));
    await waitFor(async () => {
      try {
        await Sandbox.getInfo(short.sandboxId, via(d2));
        return false;
      } catch (err) {
        return /not found/i.test(err.message);
      }
    }, { timeoutMs: 30_000, what: 'a sandbox expired by driver 2 alone' });
    const listed = await Sandbox.list(via(d2, { query: { metadata: { run: RUN } } })).nextItems();
    for (const sbx of [before1, before2]) assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId), `${sbx.sandboxId} not listed`);
  });
});
