// Templates: the SDK's Template builder against vmon's build API, with images from local OCI
// registries (test/registry, go-containerregistry's registry in-process on loopback; no public
// registry is reachable here). Builds run in build sandboxes; every sandbox made from a template
// gets its files, env, workdir, user and a running, ready start command.

import assert from 'node:assert/strict';
import { describe, before, after } from 'node:test';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { Sandbox, Template, BuildError } from 'e2b';
import { useServer, runId, killQuietly, apiFetch, pgrep, waitFor, REPO_ROOT } from '../lib/harness.js';

/** Start a fixture registry; resolves to { addr, proc }. */
async function startRegistry(extra = []) {
  const bin = process.env.VMON_TEST_REGISTRY_BIN || path.join(REPO_ROOT, 'bin', 'vmon-test-registry');
  const proc = spawn(bin, extra, { stdio: ['ignore', 'pipe', 'inherit'] });
  const rl = readline.createInterface({ input: proc.stdout });
  const line = await new Promise((resolve, reject) => {
    proc.once('exit', (code) => reject(new Error(`test registry exited with ${code} before it was ready`)));
    rl.once('line', resolve);
  });
  const info = JSON.parse(line);
  return { addr: info.addr, proc };
}

function stopRegistry(r) {
  if (r?.proc && r.proc.exitCode === null) r.proc.kill('SIGTERM');
}

/**
 * Finds, among the host cgroups runsc made under "vmon", the one sandbox of a template with
 * memoryMB and returns its CPU quota. The host limit is the guest's memory plus the runtime's
 * headroom (limits.Derive: 64 MiB + 1/32). Handles cgroup v2 and v1/hybrid layouts.
 */
function hostCgroupLimits(memoryMB) {
  const read = (f) => { try { return fs.readFileSync(f, 'utf8').trim(); } catch { return null; } };
  const ls = (d) => { try { return fs.readdirSync(d); } catch { return []; } };
  const want = String((memoryMB + 64 + Math.floor(memoryMB / 32)) * 1024 * 1024);
  const hits = [];
  for (const [memBase, file] of [['/sys/fs/cgroup', 'memory.max'], ['/sys/fs/cgroup/memory', 'memory.limit_in_bytes']]) {
    for (const id of ls(`${memBase}/vmon`)) {
      if (read(`${memBase}/vmon/${id}/${file}`) === want) hits.push(id);
    }
  }
  assert.equal(hits.length, 1, `sandbox cgroups with a ${memoryMB} MB limit: ${hits}`);
  const id = hits[0];
  const v2 = read(`/sys/fs/cgroup/vmon/${id}/cpu.max`);
  if (v2) {
    const [q, p] = v2.split(' ');
    return { cpuQuotaUS: Number(q), cpuPeriodUS: Number(p) };
  }
  for (const base of ['/sys/fs/cgroup/cpu', '/sys/fs/cgroup/cpu,cpuacct']) {
    const q = read(`${base}/vmon/${id}/cpu.cfs_quota_us`);
    if (q) return { cpuQuotaUS: Number(q), cpuPeriodUS: Number(read(`${base}/vmon/${id}/cpu.cfs_period_us`)) };
  }
  throw new Error(`no CPU controller files for sandbox cgroup ${id}`);
}

/** A build log collector that also records the SDK's own lines (uploads). */
function collectLogs() {
  const lines = [];
  const fn = (e) => lines.push(`${e.level} ${e.message}`);
  fn.lines = lines;
  fn.text = () => lines.join('\n');
  return fn;
}

describe('templates (Template builder, OCI images, start/ready)', () => {
  const registry = {};
  const authRegistry = {};
  // Filled in before the server starts (useServer's before hook runs after this describe's).
  const args = ['--template-ready-timeout', '5s'];
  before(async () => {
    Object.assign(registry, await startRegistry());
    Object.assign(authRegistry, await startRegistry(['--user', 'reguser', '--password', 'regpass']));
    args.push(
      '--insecure-registry', registry.addr,
      '--insecure-registry', authRegistry.addr,
      // docker.io references are served by the local registry (a pull-through mirror's role).
      '--registry-mirror', `docker.io=${registry.addr}`,
    );
  });
  after(() => {
    stopRegistry(registry);
    stopRegistry(authRegistry);
  });

  const srv = useServer({ name: 'templates', args });
  const RUN = runId('tpl');
  const name = (s) => `${RUN}-${s}`.toLowerCase().replace(/[^a-z0-9-_]/g, '-');
  const created = [];
  let ctxDir;

  srv.before(async () => {
    ctxDir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmon-tpl-'));
    fs.mkdirSync(path.join(ctxDir, 'tree', 'sub', 'deeper'), { recursive: true });
    fs.writeFileSync(path.join(ctxDir, 'tree', 'top.txt'), 'top\n');
    fs.writeFileSync(path.join(ctxDir, 'tree', 'sub', 'mid.txt'), 'mid\n');
    fs.writeFileSync(path.join(ctxDir, 'tree', 'sub', 'deeper', 'leaf.sh'), '#!/bin/sh\necho leaf\n', { mode: 0o755 });
    fs.symlinkSync('top.txt', path.join(ctxDir, 'tree', 'link.txt'));
    fs.writeFileSync(path.join(ctxDir, 'single.txt'), 'single\n');
  });

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
    if (ctxDir) fs.rmSync(ctxDir, { recursive: true, force: true });
    // The data dir is shared between runs: remove this run's templates.
    const listed = await apiFetch(srv, '/templates');
    for (const t of listed.json ?? []) {
      if (t.aliases.some((a) => a.startsWith(RUN.toLowerCase()))) {
        await apiFetch(srv, `/templates/${t.templateID}`, { method: 'DELETE' });
      }
    }
  });

  const opts = () => ({ ...srv.sdkOpts });

  async function create(template, extra = {}) {
    const sb = await Sandbox.create(template, { ...opts(), metadata: { run: RUN }, ...extra });
    created.push(sb);
    return sb;
  }

  async function run(sb, cmd, o = {}) {
    const r = await sb.commands.run(cmd, o);
    return r.stdout;
  }

  /** No build sandbox may outlive its build. */
  async function assertNoBuildSandboxes() {
    await waitFor(
      () => {
        const dir = path.join(srv.dataDir, 'sandboxes');
        // Build sandboxes run as "build" + 20 characters; API sandbox ids have 20.
        return fs.readdirSync(dir).filter((n) => /^build[a-z0-9]{20}$/.test(n)).length === 0;
      },
      { timeoutMs: 15_000, what: 'build sandboxes to be removed' },
    );
  }

  srv.test('from an OCI image: layers, whiteouts, ownership, ENV/WORKDIR/USER, multi-arch index', async () => {
    const logs = collectLogs();
    const t = Template().fromImage(`${registry.addr}/vmon-test/busybox:latest`).runCmd('id -un > /tmp/build-user; touch /home/app/built');
    const info = await Template.build(t, name('img'), { ...opts(), onBuildLogs: logs });
    assert.ok(info.templateId, 'template id');
    const sb = await create(name('img'));
    // The image's USER, WORKDIR and ENV are the sandbox's defaults.
    assert.equal(await run(sb, 'whoami'), 'app\n');
    assert.equal(await run(sb, 'pwd'), '/opt/app\n');
    assert.equal(await run(sb, 'echo $FIXTURE_ENV'), 'from-image\n');
    // Layer 3 deleted a file of layer 2 and made a directory opaque.
    assert.equal(await run(sb, 'test -e /etc/removed-later && echo present || echo gone'), 'gone\n');
    assert.equal(await run(sb, 'ls /opt/app/dir-replaced'), 'new.txt\n');
    assert.equal(await run(sb, 'stat -c "%u:%g %a" /opt/app/data.txt; cat /opt/app/data.txt'), '1234:1234 640\nfixture-data\n');
    // The RUN step ran as the image's user and its writes are in the template.
    assert.equal(await run(sb, 'cat /tmp/build-user; ls /home/app/built'), 'app\n/home/app/built\n');
    // vmon provisioned the default user in an image that did not have it.
    assert.match(await run(sb, 'grep ^user: /etc/passwd'), /^user:x:\d+:\d+::\/home\/user:/);
    // The amd64 image of the index was picked (the arm64 one has /arch.txt).
    assert.equal(await run(sb, 'test -e /arch.txt && echo arm64 || echo amd64'), 'amd64\n');
  });

  srv.test('docker.io references go through --registry-mirror', async () => {
    const t = Template().fromImage('docker.io/vmon-test/busybox-root:latest').runCmd('echo mirrored > /mirrored', { user: 'root' });
    await Template.build(t, name('mirror'), opts());
    const sb = await create(name('mirror'));
    // No USER in the image: sandboxes run as the default user in its home.
    assert.equal(await run(sb, 'whoami; pwd; cat /mirrored'), 'user\n/home/user\nmirrored\n');
  });

  srv.test('from base: COPY a tree (upload skipped the second time), RUN as root and user, envs/workdir/user', async () => {
    const mk = () =>
      Template({ fileContextPath: ctxDir })
        .fromTemplate('base')
        .copy('tree', '/opt/tree')
        .copy('single.txt', '/srv/', { user: 'root', mode: 0o600 })
        .runCmd('whoami > /tmp/as-user && echo "$(whoami)" > ~/who')
        .runCmd(['apt-get --version > /dev/null', 'whoami > /root-was'], { user: 'root' })
        .setEnvs({ TPL_ENV: 'tpl value', OTHER: 'x' })
        .setWorkdir('/opt/tree')
        .setUser('user');
    const first = collectLogs();
    await Template.build(mk(), name('base'), { ...opts(), onBuildLogs: first });
    assert.match(first.text(), /Uploaded 'tree'/);

    const sb = await create(name('base'));
    assert.equal(await run(sb, 'cat /opt/tree/top.txt /opt/tree/sub/mid.txt; /opt/tree/sub/deeper/leaf.sh; readlink /opt/tree/link.txt'),
      'top\nmid\nleaf\ntop.txt\n');
    assert.equal(await run(sb, 'stat -c "%U %a" /opt/tree/top.txt /srv/single.txt'), 'user 644\nroot 600\n');
    assert.equal(await run(sb, 'cat /tmp/as-user /home/user/who /root-was'), 'user\nuser\nroot\n');
    assert.equal(await run(sb, 'echo "$TPL_ENV|$OTHER"; pwd; whoami'), 'tpl value|x\n/opt/tree\nuser\n');
    // The sandbox's own envs override the template's.
    const sb2 = await create(name('base'), { envs: { OTHER: 'mine' } });
    assert.equal(await run(sb2, 'echo "$TPL_ENV|$OTHER"'), 'tpl value|mine\n');

    // The same steps again: uploads are skipped and every step comes from the cache.
    const second = collectLogs();
    await Template.build(mk(), name('base'), { ...opts(), onBuildLogs: second });
    assert.match(second.text(), /Skipping upload of 'tree', already cached/);
    const cached = second.lines.filter((l) => /CACHED \[\d+\/\d+\]/.test(l)).length;
    assert.equal(cached, 7, `all 7 steps cached:\n${second.text()}`);
    await assertNoBuildSandboxes();
  });

  srv.test('fromDockerfile (as the SDK translates it) and the SDK default image', async () => {
    const dockerfile = [
      `FROM ${registry.addr}/vmon-test/busybox-root:latest`,
      'ENV GREETING=hello',
      'ARG UNUSED',
      'WORKDIR /app',
      'COPY single.txt ./',
      'RUN echo "$GREETING from $(whoami)" > /app/greeting && chown -R user /app',
    ].join('\n');
    await Template.build(Template({ fileContextPath: ctxDir }).fromDockerfile(dockerfile), name('dockerfile'), opts());
    const sb = await create(name('dockerfile'));
    // No USER in the Dockerfile: the SDK ends with the default user; WORKDIR stays.
    assert.equal(await run(sb, 'whoami; pwd; cat greeting single.txt; echo $GREETING'), 'user\n/app\nhello from root\nsingle\nhello\n');

    // Template() without from* asks for E2B's base image, which is vmon's base template.
    await Template.build(Template().runCmd('python3 --version > /tmp/py'), name('default'), opts());
    assert.match(await run(await create(name('default')), 'cat /tmp/py'), /^Python 3\./);
  });

  srv.test('start + ready command: a server answers through ingress right after create', async () => {
    const t = Template()
      .fromTemplate('base')
      .setWorkdir('/srv/www')
      .runCmd('echo served-by-template > /srv/www/index.html', { user: 'root' })
      .setStartCmd('python3 -m http.server 8080', 'curl -sf http://localhost:8080/ > /dev/null');
    await Template.build(t, name('web'), { ...opts(), cpuCount: 1, memoryMB: 384 });
    const sb = await create(name('web'));
    // The template's resources are the sandbox's.
    const info = await sb.getInfo();
    assert.equal(info.cpuCount, 1);
    assert.equal(info.memoryMB, 384);
    // The host enforces them on the sandbox's cgroup. gVisor shows the guest at least two vCPUs
    // whatever the quota (runsc --cpu-num-from-quota floors at 2), so nproc alone cannot tell.
    assert.deepEqual(hostCgroupLimits(384), { cpuQuotaUS: 100000, cpuPeriodUS: 100000 });
    assert.ok(Number(await run(sb, 'nproc')) <= 2);
    const memKB = Number((await run(sb, "awk '/MemTotal/ {print $2}' /proc/meminfo")).trim());
    assert.equal(memKB, 384 * 1024, `MemTotal ${memKB} kB for a 384 MB template`);
    // No retry: the server must already be listening when create returned.
    const res = await fetch(`${srv.apiUrl}/index.html`, { headers: { 'E2b-Sandbox-Id': sb.sandboxId, 'E2b-Sandbox-Port': '8080' } });
    assert.equal(res.status, 200);
    assert.equal(await res.text(), 'served-by-template\n');
    assert.match(await run(sb, 'pgrep -f "http.server 8080" | head -1'), /^\d+\n$/);
  });

  srv.test('a template with a start command is saved started: every sandbox is restored with it running', async () => {
    // The start command draws a random token: sandboxes restored from the build's snapshot all
    // show the one it drew at build time; a start command run per sandbox would draw a new one.
    const start = 'head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n" > /tmp/start-token; echo $$ > /tmp/start-pid; exec sleep infinity';
    const t = Template().fromTemplate('base').setStartCmd(`sh -c '${start}'`, 'test -s /tmp/start-token');
    await Template.build(t, name('started'), opts());
    const a = await create(name('started'));
    const b = await create(name('started'));
    const token = await run(a, 'cat /tmp/start-token');
    assert.match(token, /^[0-9a-f]{16}$/);
    assert.equal(await run(b, 'cat /tmp/start-token'), token, 'the start command ran again instead of being restored');
    const pid = (await run(a, 'cat /tmp/start-pid')).trim();
    assert.equal((await run(a, `cat /proc/${pid}/cmdline | tr '\\0' ' '`)).trim(), 'sleep infinity', 'the started process is running');
    // Each sandbox has its own files on its own disk.
    await a.files.write('/tmp/mine', 'a');
    assert.equal(await run(b, 'cat /tmp/mine 2>/dev/null || echo none'), 'none\n');
    assert.match(await run(a, "df -k / | awk 'NR==2 {print $2}'"), /^\d+\n$/);
    // Restored sandboxes pause and resume like any other.
    assert.equal(await a.pause(), true);
    const back = await Sandbox.connect(a.sandboxId, opts());
    assert.equal(await run(back, 'cat /tmp/mine'), 'a');
  });

  srv.test('tags, aliases and exists', async () => {
    const n = name('tags');
    assert.equal(await Template.exists(n, opts()), false);
    await Template.build(Template().fromTemplate('base').runCmd('echo one > /version', { user: 'root' }), `${n}:v1`, opts());
    await Template.build(Template().fromTemplate('base').runCmd('echo two > /version', { user: 'root' }), `${n}:v2`, opts());
    assert.equal(await Template.exists(n, opts()), true);
    assert.equal(await run(await create(`${n}:v1`), 'cat /version'), 'one\n');
    assert.equal(await run(await create(`${n}:v2`), 'cat /version'), 'two\n');
    // The first build also became the default tag.
    assert.equal(await run(await create(n), 'cat /version'), 'one\n');

    const tagged = await Template.assignTags(`${n}:v2`, ['prod', 'default'], opts());
    assert.deepEqual([...tagged.tags].sort(), ['default', 'prod']);
    assert.equal(await run(await create(`${n}:prod`), 'cat /version'), 'two\n');
    assert.equal(await run(await create(n), 'cat /version'), 'two\n');
    const tags = await Template.getTags(n, opts());
    assert.deepEqual(tags.map((t) => t.tag).sort(), ['default', 'prod', 'v1', 'v2']);
    await Template.removeTags(n, ['prod'], opts());
    await assert.rejects(create(`${n}:prod`), (err) => err.statusCode === 404 || /404|not found/i.test(err.message));
    await assert.rejects(create(`${n}:never`), (err) => /404|not found|no tag/i.test(err.message));
  });

  srv.test('registry credentials: wrong ones fail at the base step, right ones work', async () => {
    const ref = `${authRegistry.addr}/vmon-test/busybox-root:latest`;
    await assert.rejects(
      Template.build(Template().fromImage(ref, { username: 'reguser', password: 'wrong' }), name('auth-bad'), opts()),
      (err) => err instanceof BuildError && /credentials|unauthori[sz]ed|denied/i.test(err.message) && /base image/.test(err.message),
    );
    await assert.rejects(Template.build(Template().fromImage(ref), name('auth-none'), opts()), BuildError);
    await Template.build(Template().fromImage(ref, { username: 'reguser', password: 'regpass' }), name('auth-ok'), opts());
    assert.equal(await run(await create(name('auth-ok')), 'echo ok'), 'ok\n');
  });

  srv.test('failures: unknown image, failing RUN, never-ready, missing upload, invalid name', async () => {
    await assert.rejects(
      Template.build(Template().fromImage(`${registry.addr}/vmon-test/nope:latest`), name('noimg'), opts()),
      (err) => err instanceof BuildError && /not found/i.test(err.message),
    );

    const failing = Template()
      .fromTemplate('base')
      .runCmd('echo fine')
      .runCmd('echo some output; echo on-stderr >&2; exit 7');
    await assert.rejects(Template.build(failing, name('failrun'), opts()), (err) => {
      assert.ok(err instanceof BuildError, `${err}`);
      assert.match(err.message, /step 2/);
      assert.match(err.message, /exited with code 7/);
      assert.match(err.message, /some output/);
      assert.match(err.message, /on-stderr/);
      return true;
    });

    const t0 = Date.now();
    const neverReady = Template().fromTemplate('base').setStartCmd('sleep 1000', 'false');
    await assert.rejects(Template.build(neverReady, name('never'), opts()), (err) => {
      assert.ok(err instanceof BuildError, `${err}`);
      assert.match(err.message, /start\/ready command: ready command did not succeed within 5s/);
      return true;
    });
    assert.ok(Date.now() - t0 < 120_000, 'the ready check is bounded');

    // A COPY step whose files were never uploaded, through the raw API.
    const res = await apiFetch(srv, '/v3/templates', { method: 'POST', body: JSON.stringify({ name: name('nofiles') }) });
    assert.equal(res.status, 202, res.text);
    const { templateID, buildID } = res.json;
    const start = await apiFetch(srv, `/v2/templates/${templateID}/builds/${buildID}`, {
      method: 'POST',
      body: JSON.stringify({ fromTemplate: 'base', force: false, steps: [{ type: 'COPY', args: ['x', '/x', '', ''], force: false, filesHash: 'f'.repeat(64) }] }),
    });
    assert.equal(start.status, 202, start.text);
    let status;
    await waitFor(async () => {
      status = (await apiFetch(srv, `/templates/${templateID}/builds/${buildID}/status?logsOffset=0`)).json;
      return status.status === 'error';
    }, { timeoutMs: 60_000, what: 'the build to fail' });
    assert.equal(status.reason.step, '1');
    assert.match(status.reason.message, /never uploaded/);
    assert.ok(status.logEntries.some((e) => e.level === 'error' && /step 1/.test(e.message)), JSON.stringify(status.logEntries));

    // Invalid names never create anything.
    for (const bad of ['Bad Name!', 'UPPER/ok:tag:x', 'a:' + '0'.repeat(8) + '-0000-0000-0000-' + '0'.repeat(12)]) {
      const r = await apiFetch(srv, '/v3/templates', { method: 'POST', body: JSON.stringify({ name: bad }) });
      assert.equal(r.status, 400, `${bad}: ${r.text}`);
    }

    // Failed templates and unknown ones cannot start sandboxes; nothing half-built is listed ready.
    for (const ref of [name('failrun'), name('never'), name('noimg'), name('nofiles'), 'no-such-template']) {
      await assert.rejects(create(ref), (err) => [400, 404].includes(err.statusCode) || /not found|not ready/i.test(err.message), ref);
    }
    const listed = await apiFetch(srv, '/templates');
    for (const t of listed.json.filter((t) => t.aliases.some((a) => a.startsWith(RUN.toLowerCase())))) {
      if ([name('failrun'), name('never'), name('noimg'), name('nofiles')].some((n) => t.aliases.includes(n))) {
        assert.equal(t.buildStatus, 'error', JSON.stringify(t));
      }
    }
    await assertNoBuildSandboxes();
    assert.deepEqual(await pgrep(`runsc.*${srv.dataDir}.* build[a-z0-9]{20}$`), []);
  });

  // `vmon template build` of a rootfs while the server runs (code-interpreter-v1-rootfs): the
  // server finds a template built on disk since it started when a build names it. And a start
  // command that runs a vmon guest program this node lacks is refused at once, not after the
  // ready timeout.
  srv.test('a rootfs built on disk while the server runs can be built from; a missing vmon guest program is refused at once', async () => {
    const late = `late-${RUN}`.toLowerCase().replace(/[^a-z0-9-]/g, '-').slice(0, 40);
    const dir = path.join(srv.dataDir, 'templates', late);
    const base = path.join(srv.dataDir, 'templates', 'base');
    fs.mkdirSync(dir);
    try {
      const manifest = JSON.parse(fs.readFileSync(path.join(base, 'manifest.json'), 'utf8'));
      const cp = spawn('cp', ['-al', path.join(base, manifest.rootfs), path.join(dir, manifest.rootfs)]);
      assert.equal(await new Promise((r) => cp.on('exit', r)), 0, 'hard-link copy of base');
      fs.writeFileSync(path.join(dir, 'manifest.json'), JSON.stringify({ ...manifest, id: late }));
      await Template.build(Template().fromTemplate(late).runCmd(`echo ${RUN} > /tmp/late`), name('fromlate'), opts());
      const sbx = await Sandbox.create(name('fromlate'), opts());
      try {
        assert.equal((await sbx.commands.run('cat /tmp/late')).stdout.trim(), RUN);
      } finally {
        await sbx.kill();
      }
    } finally {
      await apiFetch(srv, `/templates/${name('fromlate')}`, { method: 'DELETE' }).catch(() => {});
      await apiFetch(srv, `/templates/${late}`, { method: 'DELETE' }).catch(() => {});
      fs.rmSync(dir, { recursive: true, force: true });
    }

    const missing = Template().fromTemplate('base').setStartCmd('/opt/vmon/bin/vmon-no-such-program --serve', 'true');
    await assert.rejects(Template.build(missing, name('noprog'), opts()), (err) => {
      // Refused when the build starts, not by a ready check that timed out.
      assert.match(err.message, /vmon-no-such-program, which this node does not have/);
      assert.doesNotMatch(err.message, /ready command/);
      return true;
    });
  });

  srv.test('status polling pages logs by logsOffset; delete removes the template', async () => {
    const n = name('del');
    // The run id keeps the step out of the build cache, whose hits print nothing.
    const t = Template().fromTemplate('base').runCmd(`echo ${RUN}; for i in $(seq 1 150); do echo line-$i; done`);
    const info = await Template.build(t, n, opts());
    const all = [];
    for (let offset = 0; ; ) {
      const r = await apiFetch(srv, `/templates/${info.templateId}/builds/${info.buildId}/status?logsOffset=${offset}`);
      assert.equal(r.status, 200);
      assert.ok(r.json.logEntries.length <= 100);
      if (r.json.logEntries.length === 0) break;
      all.push(...r.json.logEntries);
      offset += r.json.logEntries.length;
    }
    assert.ok(all.some((e) => e.message === 'line-150'), 'the last line of output is in the log');
    assert.equal(new Set(all.map((e) => `${e.timestamp}|${e.message}`)).size, all.length, 'pages do not overlap');

    const del = await apiFetch(srv, `/templates/${info.templateId}`, { method: 'DELETE' });
    assert.equal(del.status, 204, del.text);
    assert.equal(await Template.exists(n, opts()), false);
    await assert.rejects(create(n), (err) => err.statusCode === 404 || /not found/i.test(err.message));
    assert.equal((await apiFetch(srv, `/templates/${info.templateId}`, { method: 'DELETE' })).status, 404);
    assert.equal((await apiFetch(srv, '/templates/base', { method: 'DELETE' })).status, 400);
  });
  srv.test('kill -9 of the server mid-build: the build fails cleanly and nothing is left', async () => {
    const n = name('crash');
    const info = await Template.buildInBackground(
      Template().fromTemplate('base').runCmd(`echo ${RUN}; touch /tmp/started; sleep 60`),
      n,
      opts(),
    );
    // Wait until the RUN step is running in its build sandbox.
    await waitFor(async () => {
      const r = await apiFetch(srv, `/templates/${info.templateId}/builds/${info.buildId}/status?logsOffset=0`);
      return r.json.logEntries.some((e) => e.message === RUN);
    }, { timeoutMs: 60_000, what: 'the RUN step to start' });
    await srv.kill9();
    await srv.start();
    const r = await apiFetch(srv, `/templates/${info.templateId}/builds/${info.buildId}/status?logsOffset=0`);
    assert.equal(r.json.status, 'error', r.text);
    assert.match(r.json.reason.message, /interrupted by a server restart/);
    assert.ok(r.json.logEntries.some((e) => e.message === RUN), 'the log survived the restart');
    await assertNoBuildSandboxes();
    assert.deepEqual(await pgrep(`runsc.*${srv.dataDir}.* build[a-z0-9]{20}$`), []);
    for (const sub of ['build-scratch']) {
      const dir = path.join(srv.dataDir, sub);
      assert.deepEqual(fs.existsSync(dir) ? fs.readdirSync(dir) : [], [], `${sub} is empty`);
    }
    assert.deepEqual(fs.readdirSync(path.join(srv.dataDir, 'layers')).filter((d) => d.startsWith('.tmp-')), []);
    await assert.rejects(create(n), (err) => [400, 404].includes(err.statusCode) || /not found|not ready/i.test(err.message));
    // The template builds fine afterwards.
    await Template.build(Template().fromTemplate('base').runCmd(`echo ${RUN} > /tmp/ok`), n, opts());
    assert.equal(await run(await create(n), 'cat /tmp/ok'), `${RUN}\n`);
  });
});
