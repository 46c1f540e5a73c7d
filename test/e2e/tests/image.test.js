// vmon's container image (`make image`, cmd/vmon-image), proved by using it: the OCI layout at
// bin/image is pushed to the fixture registry (test/registry --oci-layout), a template is built
// from it with the SDK's Template().fromImage, and in a sandbox of that template the image's own
// vmon runs: `vmon version` prints the version built, `vmon doctor` runs its checks.
//
// Inside a gVisor sandbox a node's checks cannot all pass (no KVM, the sandbox's own cgroups,
// disk and privileges are gVisor's); the test asserts what the image itself must provide and
// prints the rest. The image is required: `make image` builds it (make test-e2e does).

import assert from 'node:assert/strict';
import { describe, before, after } from 'node:test';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';
import { Sandbox, Template, CommandExitError } from 'e2b';
import { useServer, runId, killQuietly, apiFetch, REPO_ROOT } from '../lib/harness.js';

const LAYOUT = process.env.VMON_IMAGE_LAYOUT || path.join(REPO_ROOT, 'bin', 'image');

/** Starts the fixture registry with the image pushed; resolves to { addr, ref, proc }. */
async function startRegistry() {
  const bin = process.env.VMON_TEST_REGISTRY_BIN || path.join(REPO_ROOT, 'bin', 'vmon-test-registry');
  const proc = spawn(bin, ['--oci-layout', `vmon=${LAYOUT}`], { stdio: ['ignore', 'pipe', 'inherit'] });
  const rl = readline.createInterface({ input: proc.stdout });
  const line = await new Promise((resolve, reject) => {
    proc.once('exit', (code) => reject(new Error(`test registry exited with ${code} before it was ready`)));
    rl.once('line', resolve);
  });
  const info = JSON.parse(line);
  return { addr: info.addr, ref: info.images.vmon, proc };
}

/** The config of the layout's one image. */
function layoutConfig() {
  const blob = (digest) => JSON.parse(fs.readFileSync(path.join(LAYOUT, 'blobs', ...digest.split(':')), 'utf8'));
  const index = JSON.parse(fs.readFileSync(path.join(LAYOUT, 'index.json'), 'utf8'));
  assert.equal(index.manifests.length, 1);
  return blob(blob(index.manifests[0].digest).config.digest);
}

/** `vmon doctor` output as { name: level } ("[ok  ] name: detail" lines). */
function doctorLevels(out) {
  const levels = {};
  for (const line of out.split('\n')) {
    const m = /^\[(ok|warn|FAIL)\s*\] (.+?): /.exec(line);
    if (m) levels[m[2]] = m[1];
  }
  return levels;
}

describe('container image (make image)', () => {
  const registry = {};
  const args = [];
  before(async () => {
    assert.ok(
      fs.existsSync(path.join(LAYOUT, 'index.json')),
      `no OCI image layout at ${LAYOUT}: run \`make image\` first (or set VMON_IMAGE_LAYOUT)`,
    );
    Object.assign(registry, await startRegistry());
    args.push('--insecure-registry', registry.addr);
  });
  after(() => {
    if (registry.proc && registry.proc.exitCode === null) registry.proc.kill('SIGTERM');
  });

  const srv = useServer({ name: 'image', args });
  const RUN = runId('img');
  const alias = `${RUN}-vmon`.toLowerCase().replace(/[^a-z0-9-_]/g, '-');
  const created = [];

  srv.after(async () => {
    await killQuietly(srv.sdkOpts, ...created);
    const listed = await apiFetch(srv, '/templates');
    for (const t of listed.json ?? []) {
      if (t.aliases.some((a) => a.startsWith(RUN.toLowerCase()))) {
        await apiFetch(srv, `/templates/${t.templateID}`, { method: 'DELETE' });
      }
    }
  });

  srv.test('the registry serves the image make image built, by its digest', async () => {
    const want = fs.readFileSync(`${LAYOUT}.digest`, 'utf8').trim();
    const res = await fetch(`http://${registry.addr}/v2/vmon-test/vmon/manifests/latest`, {
      method: 'HEAD',
      headers: { Accept: 'application/vnd.oci.image.manifest.v1+json' },
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('docker-content-digest'), want);
  });

  srv.test('a sandbox made from the image runs its vmon: version and doctor', async () => {
    await Template.build(Template().fromImage(registry.ref), alias, { ...srv.sdkOpts });
    const sb = await Sandbox.create(alias, { ...srv.sdkOpts, metadata: { run: RUN } });
    created.push(sb);
    const run = async (cmd) => {
      try {
        return await sb.commands.run(cmd, { user: 'root', timeoutMs: 120_000 });
      } catch (err) {
        if (err instanceof CommandExitError) return err;
        throw err;
      }
    };

    // The image's vmon is the one make image put in: the version its label records (make build's
    // git description, never the unset "dev").
    const cfg = layoutConfig();
    const want = cfg.config.Labels['org.opencontainers.image.version'];
    assert.notEqual(want, 'dev');
    assert.deepEqual([cfg.config.Entrypoint, cfg.config.Cmd], [['vmon'], ['serve']]);
    assert.ok(cfg.config.Env.includes('VMON_MOUNT_NAMESPACE_MODE=inherit'), cfg.config.Env.join(' '));
    const version = await run('vmon version');
    assert.equal(version.exitCode, 0, version.stderr);
    assert.equal(version.stdout.trim(), want);

    // What the Debian layer brings, on the image's PATH.
    const tools = await run('command -v vmon envd vmon-code-interpreter runsc iptables ip mmdebstrap mkfs.ext4');
    assert.equal(tools.exitCode, 0, `missing tools: ${tools.stdout}${tools.stderr}`);
    const found = tools.stdout.trim().split('\n');
    assert.deepEqual(found.slice(0, 4), ['vmon', 'envd', 'vmon-code-interpreter', 'runsc'].map((b) => `/usr/local/bin/${b}`));
    for (const [i, b] of ['iptables', 'ip', 'mmdebstrap', 'mkfs.ext4'].entries()) {
      assert.match(found[4 + i], new RegExp(`^/usr/s?bin/${b.replace('.', '\\.')}$`));
    }

    const doctor = await run('vmon doctor --data-dir /var/lib/vmon');
    console.log(`vmon doctor in a sandbox of the image (exit ${doctor.exitCode}):\n${doctor.stdout}${doctor.stderr}`);
    const levels = doctorLevels(doctor.stdout);
    // Every check reports (internal/doctor.Run's list).
    assert.ok(Object.keys(levels).length >= 16, `doctor reported ${Object.keys(levels).length} checks:\n${doctor.stdout}`);
    // What the image itself provides must pass: the pinned static runsc, envd and the code-execution
    // service beside vmon, iptables and mmdebstrap from Debian.
    for (const name of [
      'runtime (gVisor runsc)',
      'envd (guest agent)',
      'code-execution service (code-interpreter-v1)',
      'iptables (sandbox networking)',
      'mmdebstrap (builds the base template)',
      "mkfs.erofs (builds templates' root images)",
      'data dir path length',
    ]) {
      assert.equal(levels[name], 'ok', `doctor: ${name} is ${levels[name]}:\n${doctor.stdout}`);
    }
    // The image's runsc is the patched one (a stock runsc fails doctor).
    assert.match(doctor.stdout, /\/usr\/local\/bin\/runsc \(gVisor v0\.0\.0-[0-9]+-[0-9a-f]+, static, with vmon's patches\)/);
    // No base template in a fresh data dir: a warning, never a failure.
    assert.equal(levels['template base'], 'warn');
    // Only what a gVisor sandbox cannot give a node may fall short: no loop devices (the disk
    // limit fails), no cgroup2 mount (gVisor shows v1 hierarchies), the sandbox's free disk,
    // the pids controller where gVisor's cgroups lack it, and KSM, which gVisor's kernel lacks.
    const sandboxBound = new Set([
      'memory merging (KSM, for --memory-merge)',
      'sandbox disk limit',
      'cgroup v2 (CPU and memory limits)',
      'disk space (/var/lib/vmon)',
      'sandbox host task limit (pids cgroup)',
      'template base',
    ]);
    for (const [name, level] of Object.entries(levels)) {
      if (!sandboxBound.has(name)) assert.equal(level, 'ok', `doctor: ${name} is ${level}:\n${doctor.stdout}`);
    }
    const failed = Object.values(levels).includes('FAIL');
    assert.equal(doctor.exitCode, failed ? 1 : 0, 'doctor exits 1 exactly when a check fails');
  });
});
