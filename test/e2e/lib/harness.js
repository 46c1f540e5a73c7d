// Test harness: starts and stops a real `vmon serve`, hands the SDK options to
// the tests, and prints the server's log tail when a test fails.
//
// Contract with the server (see issue 3 and test/e2e/README.md):
//   vmon serve --data-dir <dir> --listen 127.0.0.1:<port> [extra flags]
//   prints E2B_API_KEY=… / E2B_API_URL=… / E2B_SANDBOX_URL=… on first start,
//   keeps the admin key in <dir>/api-key (0600), answers GET /health with a 2xx.
//
// Environment:
//   VMON_BIN            path of the vmon binary (default <repo>/bin/vmon)
//   VMON_TEST_DATA_DIR  data dir with the `base` template already built (required)
//   VMON_E2E_LOG_DIR    where server logs go (default <data dir>/e2e-logs)
//   VMON_E2E_READY_TIMEOUT_MS  how long to wait for /health (default 120000)

import assert from 'node:assert/strict';
import { spawn, spawnSync, execFile } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { before, after, test } from 'node:test';
import { Sandbox, SandboxNotFoundError } from 'e2b';

const here = path.dirname(fileURLToPath(import.meta.url));
export const E2E_DIR = path.resolve(here, '..');
export const REPO_ROOT = path.resolve(E2E_DIR, '..', '..');

// The SDK reads these from the environment; options override most of them, but
// E2B_DEBUG and E2B_DOMAIN would change how it derives URLs. Keep the tests
// hermetic: everything the SDK needs is passed as options.
for (const k of ['E2B_DEBUG', 'E2B_DOMAIN', 'E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  delete process.env[k];
}

const LOG_TAIL_LINES = 80;

export function vmonBin() {
  const bin = process.env.VMON_BIN || path.join(REPO_ROOT, 'bin', 'vmon');
  try {
    fs.accessSync(bin, fs.constants.X_OK);
  } catch (err) {
    throw new Error(
      `vmon binary not found or not executable at ${bin} (${err.code}). ` +
        'Build it first (e.g. `go build -o bin/vmon ./cmd/vmon` at the repo root) or set VMON_BIN.',
    );
  }
  return bin;
}

export function dataDir() {
  const dir = process.env.VMON_TEST_DATA_DIR;
  if (!dir) {
    throw new Error(
      'VMON_TEST_DATA_DIR is not set: point it at a vmon data dir in which the `base` ' +
        'template is already built (the tests never build templates).',
    );
  }
  if (!fs.existsSync(dir) || !fs.statSync(dir).isDirectory()) {
    throw new Error(`VMON_TEST_DATA_DIR=${dir} does not exist or is not a directory`);
  }
  return path.resolve(dir);
}

export function logDir() {
  return process.env.VMON_E2E_LOG_DIR || path.join(dataDir(), 'e2e-logs');
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Poll `fn` until it returns a truthy value (which is returned) or the time is
 * up; then throw with `what` and the last value/error seen.
 */
export async function waitFor(fn, { timeoutMs = 10_000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
      last = v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      const detail = last instanceof Error ? `${last.name}: ${last.message}` : JSON.stringify(last);
      const desc = typeof what === 'function' ? what() : what;
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${desc} (last: ${detail})`);
    }
    await sleep(intervalMs);
  }
}

/**
 * Run `vmon <args…>` to completion (with env added to the environment); resolves { stdout,
 * stderr }, rejects with both on failure.
 */
export function runVmon(args, { timeoutMs = 60_000, env = {} } = {}) {
  const bin = vmonBin();
  return new Promise((resolve, reject) => {
    execFile(bin, args, { timeout: timeoutMs, maxBuffer: 16 << 20, env: { ...process.env, ...env } }, (err, stdout, stderr) => {
      if (err) {
        err.message = `\`vmon ${args.join(' ')}\` failed: ${err.message}\nstdout:\n${stdout}\nstderr:\n${stderr}`;
        reject(err);
        return;
      }
      resolve({ stdout, stderr });
    });
  });
}

/** GET a URL with node's http(s) (not fetch: lets us pin SNI/Host and a CA). */
function probe(url, { ca, host, timeoutMs = 2000 } = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const mod = u.protocol === 'https:' ? https : http;
    const req = mod.request(
      {
        hostname: u.hostname,
        port: u.port || (u.protocol === 'https:' ? 443 : 80),
        path: u.pathname + u.search,
        method: 'GET',
        headers: host ? { Host: host } : {},
        servername: host,
        ca,
        timeout: timeoutMs,
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

/**
 * One `vmon serve` process. `args` are extra flags. For TLS, pass
 * `{ tls: true, port: 443, args: ['--tls', 'self-signed', '--domain', 'localhost'] }`.
 */
export class VmonServer {
  constructor({ name, args = [], port, tls = false, domain = 'localhost', headerTlsCA, wrap = [], dir, host, role, env = {} } = {}) {
    this.name = name || 'vmon';
    // A data dir of its own (default: VMON_TEST_DATA_DIR), the host it listens on (default
    // 127.0.0.1), and its role: a `node` serves no API, and is ready once it says it serves.
    this.ownDataDir = dir;
    this.host = host || '127.0.0.1';
    this.role = role;
    // Variables added to its environment (e.g. the S3 store's endpoint and credentials).
    this.env = env;
    // A command vmon runs under, e.g. setpriv dropping a capability: [cmd, ...its args].
    this.wrap = wrap;
    // With --tls-cert/--tls-key in header mode: the CA (PEM path) the client trusts for 127.0.0.1.
    this.headerTlsCA = headerTlsCA;
    this.extraArgs = args;
    this.fixedPort = port;
    this.tls = tls;
    this.domain = domain;
    this.proc = null;
    this.tail = [];
    this.printed = {}; // KEY=VALUE lines the server printed on stdout
    this.caPath = null;
    this.starts = 0;
  }

  get listen() {
    return `${this.host}:${this.port}`;
  }

  /** Base URL of the API as the parent process reaches it. */
  get apiUrl() {
    if (this.headerTlsCA) return `https://127.0.0.1:${this.port}`;
    return this.tls ? `https://api.${this.domain}` : `http://127.0.0.1:${this.port}`;
  }

  /** SDK connection options in header mode (plain HTTP, one listener for API and envd). */
  get sdkOpts() {
    if (this.tls) throw new Error('sdkOpts is for header mode; TLS tests run the SDK in a child process');
    return { apiKey: this.apiKey, apiUrl: this.apiUrl, sandboxUrl: this.apiUrl };
  }

  _record(chunk, stream) {
    this.logStream?.write(chunk);
    const text = chunk.toString('utf8');
    for (const line of text.split('\n')) {
      if (!line) continue;
      this.tail.push(`[${stream}] ${line}`);
      if (stream === 'stdout') {
        const m = /^\s*(?:export\s+)?(E2B_[A-Z_]+)=(\S+)/.exec(line);
        if (m) this.printed[m[1]] = m[2].replace(/^["']|["']$/g, '');
      }
      const ca = /(\/\S*ca\.pem)\b/.exec(line);
      if (ca) this.caPath = this.caPathPrinted = ca[1];
    }
    if (this.tail.length > LOG_TAIL_LINES * 4) this.tail.splice(0, this.tail.length - LOG_TAIL_LINES);
  }

  logTail(n = LOG_TAIL_LINES) {
    const lines = this.tail.slice(-n);
    return `--- last ${lines.length} lines of vmon (${this.name}) log, full log: ${this.logFile} ---\n${lines.join('\n')}\n--- end of vmon log ---`;
  }

  async start() {
    const bin = vmonBin();
    this.dataDir = this.ownDataDir ?? dataDir();
    if (this.port === undefined) this.port = this.fixedPort ?? (await freePort());
    const args = ['serve', '--data-dir', this.dataDir, '--listen', this.listen, ...this.extraArgs];
    await fsp.mkdir(logDir(), { recursive: true });
    this.starts += 1;
    this.startedAt = new Date();
    const stamp = this.startedAt.toISOString().replace(/[:.]/g, '-');
    this.logFile = path.join(logDir(), `${this.name}-${stamp}-${this.starts}.log`);
    this.logStream = fs.createWriteStream(this.logFile, { flags: 'a' });
    const argv = [...this.wrap, bin, ...args];
    this.logStream.write(`# ${argv.join(' ')}\n`);
    this.tail.push(`[harness] start #${this.starts}: ${argv.join(' ')}`);

    const proc = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...this.env } });
    this.proc = proc;
    proc.stdout.on('data', (c) => this._record(c, 'stdout'));
    proc.stderr.on('data', (c) => this._record(c, 'stderr'));
    let exited = null;
    const exitedP = new Promise((resolve) => {
      proc.once('exit', (code, signal) => {
        exited = { code, signal };
        this.tail.push(`[harness] vmon exited code=${code} signal=${signal}`);
        resolve(exited);
      });
    });
    proc.once('error', (err) => {
      exited = { code: null, signal: null, error: err };
      this.tail.push(`[harness] spawn error: ${err.message}`);
    });
    this.exited = exitedP;

    const timeoutMs = Number(process.env.VMON_E2E_READY_TIMEOUT_MS || 120_000);
    const deadline = Date.now() + timeoutMs;
    let lastErr;
    for (;;) {
      if (exited) {
        throw new Error(
          `vmon serve exited before it was ready (code=${exited.code} signal=${exited.signal}` +
            `${exited.error ? ` error=${exited.error.message}` : ''})\n${this.logTail()}`,
        );
      }
      if (this.role === 'node') {
        if (this.tail.some((l) => /^\[stdout\] vmon node \S+ serving on /.test(l))) break;
        if (Date.now() > deadline) {
          await this.stop({ cleanup: false });
          throw new Error(`vmon node not serving after ${timeoutMs} ms\n${this.logTail()}`);
        }
        await sleep(100);
        continue;
      }
      try {
        let status;
        if (this.tls) {
          const caPath = this.caPath || path.join(this.dataDir, 'tls', 'ca.pem');
          if (!fs.existsSync(caPath)) throw new Error(`CA ${caPath} not written yet`);
          status = await probe(`https://127.0.0.1:${this.port}/health`, {
            ca: fs.readFileSync(caPath),
            host: `api.${this.domain}`,
          });
        } else if (this.headerTlsCA) {
          status = await probe(`${this.apiUrl}/health`, { ca: fs.readFileSync(this.headerTlsCA) });
        } else {
          status = await probe(`${this.apiUrl}/health`);
        }
        if (status >= 200 && status < 300) break;
        lastErr = new Error(`GET /health answered ${status}`);
      } catch (err) {
        lastErr = err;
      }
      if (Date.now() > deadline) {
        await this.stop({ cleanup: false });
        throw new Error(
          `vmon serve not ready after ${timeoutMs} ms (last /health: ${lastErr?.message})\n${this.logTail()}`,
        );
      }
      await sleep(100);
    }

    if (this.role === 'node') {
      this.tail.push(`[harness] node serving on ${this.listen}`);
      return this;
    }
    const keyFile = path.join(this.dataDir, 'api-key');
    if (!fs.existsSync(keyFile)) {
      throw new Error(`vmon serve is up but ${keyFile} does not exist\n${this.logTail()}`);
    }
    this.apiKey = fs.readFileSync(keyFile, 'utf8').trim();
    if (this.tls) this.caPath = this.caPath || path.join(this.dataDir, 'tls', 'ca.pem');
    this.tail.push(`[harness] ready on ${this.listen}`);
    return this;
  }

  /** Kill every sandbox this server still lists (best effort, for teardown). */
  async killAllSandboxes() {
    if (this.tls || !this.apiKey || !this.proc || this.proc.exitCode !== null || this.proc.signalCode) return [];
    const killed = [];
    try {
      const p = Sandbox.list({ ...this.sdkOpts, requestTimeoutMs: 10_000 });
      const ids = [];
      while (p.hasNext) for (const s of await p.nextItems()) ids.push(s.sandboxId);
      for (const id of ids) {
        try {
          if (await Sandbox.kill(id, { ...this.sdkOpts, requestTimeoutMs: 30_000 })) killed.push(id);
        } catch (err) {
          this.tail.push(`[harness] teardown kill ${id} failed: ${err.message}`);
        }
      }
    } catch (err) {
      this.tail.push(`[harness] teardown list failed: ${err.message}`);
    }
    if (killed.length) this.tail.push(`[harness] teardown killed leftover sandboxes: ${killed.join(', ')}`);
    return killed;
  }

  /** SIGTERM, then SIGKILL after `graceMs`. With cleanup, kills leftover sandboxes first. */
  async stop({ cleanup = true, graceMs = 20_000 } = {}) {
    const proc = this.proc;
    if (!proc) return;
    if (cleanup) await this.killAllSandboxes();
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      let timer;
      const res = await Promise.race([
        this.exited,
        new Promise((resolve) => {
          timer = setTimeout(() => resolve(null), graceMs);
        }),
      ]);
      clearTimeout(timer);
      if (!res) {
        this.tail.push(`[harness] vmon ignored SIGTERM for ${graceMs} ms, sending SIGKILL`);
        proc.kill('SIGKILL');
        await this.exited;
      }
    }
    this._detach();
  }

  /** `kill -9` the server (its sandboxes' processes are not touched). */
  async kill9() {
    const proc = this.proc;
    if (!proc) throw new Error('server not running');
    this.tail.push(`[harness] SIGKILL vmon pid ${proc.pid}`);
    proc.kill('SIGKILL');
    await this.exited;
    this._detach();
  }

  /** Start again on the same data dir and port. */
  async restart() {
    if (this.proc) await this.stop({ cleanup: false });
    return this.start();
  }

  _detach() {
    // Children of vmon (runsc…) may have inherited its stdout/stderr; do not
    // let them keep the test process alive.
    this.proc?.stdout?.destroy();
    this.proc?.stderr?.destroy();
    this.logStream?.end();
    this.logStream = null;
    this.proc = null;
  }

  /** Peak resident set (VmHWM) of the server process, in bytes. */
  peakRss() {
    return procStatusBytes(this.proc.pid, 'VmHWM');
  }
}

export function procStatusBytes(pid, field) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = new RegExp(`^${field}:\\s+(\\d+)\\s+kB`, 'm').exec(status);
  if (!m) throw new Error(`no ${field} in /proc/${pid}/status`);
  return Number(m[1]) * 1024;
}

/**
 * Register before/after hooks that start a server and stop it. Call it inside a
 * describe() callback, first among that suite's hooks: Node 20 neither awaits
 * root-level hooks in order nor reliably runs root-level async after hooks. Returns the VmonServer, whose
 * fields are filled in once `before` ran, and whose `.test()` wraps node:test's
 * `test()` so that a failure carries the server's log tail.
 */
export function useServer(opts = {}) {
  const server = new VmonServer(opts);
  before(async () => {
    await server.start();
  });
  // Teardown registered with server.after() runs before the server stops.
  const teardown = [];
  after(async () => {
    let first;
    for (const fn of teardown) {
      try {
        await fn();
      } catch (err) {
        console.error(`teardown failed: ${err?.stack || err}`);
        first ??= err;
      }
    }
    await server.stop();
    if (first) throw first;
  });
  server.before = (fn) => before(withLogTail(server, fn));
  server.after = (fn) => {
    teardown.push(fn);
  };
  server.test = (name, optsOrFn, maybeFn) => {
    const fn = typeof optsOrFn === 'function' ? optsOrFn : maybeFn;
    const topts = typeof optsOrFn === 'function' ? {} : optsOrFn;
    return test(name, topts, withLogTail(server, fn));
  };
  return server;
}

/** Wrap a test function so that a failure is reported with the server's log tail. */
export function withLogTail(server, fn) {
  return async (t) => {
    try {
      return await fn(t);
    } catch (err) {
      // A test file's stderr is shown line by line by every reporter (TAP
      // escapes multi-line t.diagnostic() into one line).
      console.error(`${t?.name ? `failed: ${t.name}\n` : ''}${server.logTail()}`);
      throw err;
    }
  };
}

/** A short unique string for tagging this run's sandboxes (metadata values). */
export function runId(prefix = 'e2e') {
  return `${prefix}-${process.pid}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

/** Raw fetch against the API with the key (or another key, or none when key === null). */
export async function apiFetch(server, pathname, { method = 'GET', key, body, headers = {} } = {}) {
  const h = { ...headers };
  const k = key === undefined ? server.apiKey : key;
  if (k !== null) h['X-API-KEY'] = k;
  if (body !== undefined && !('Content-Type' in h)) h['Content-Type'] = 'application/json';
  const res = await fetch(`${server.apiUrl}${pathname}`, { method, headers: h, body });
  const text = await res.text();
  let json;
  try {
    json = text ? JSON.parse(text) : undefined;
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json };
}

/**
 * The template named alias as the API shows it: its summary from GET /templates (undefined when
 * there is none), its detail with every build, and whether a build of it is waiting or building.
 */
export async function templateState(server, alias) {
  const summary = ((await apiFetch(server, '/templates')).json ?? []).find((x) => x.aliases?.includes(alias));
  const detail = summary && (await apiFetch(server, `/templates/${summary.templateID}`)).json;
  const busy = (detail?.builds ?? []).some((b) => b.status === 'waiting' || b.status === 'building');
  return { summary, detail, busy };
}

/** All sandboxes the server lists (all pages), optionally filtered by metadata. */
export async function listAll(opts, query) {
  const p = Sandbox.list({ ...opts, ...(query ? { query } : {}) });
  const out = [];
  while (p.hasNext) out.push(...(await p.nextItems()));
  return out;
}

/** Kill sandboxes, ignoring the ones already gone; for after() hooks. */
export async function killQuietly(opts, ...sandboxes) {
  await Promise.all(
    sandboxes
      .filter(Boolean)
      .map((s) => Sandbox.kill(typeof s === 'string' ? s : s.sandboxId, opts).catch(() => false)),
  );
}

/**
 * The mount table of vmon serve on data dir `dir`: it keeps its mounts (sandbox roots and disks,
 * runsc's) in a mount namespace of its own, pinned at <dir>/mntns/mnt, which outlives the server
 * as its sandboxes do. This process's own table holds only that pin. "" before any server ran.
 */
export function vmonMountinfo(dir = dataDir()) {
  const pin = path.join(dir, 'mntns', 'mnt');
  if (!fs.existsSync(pin)) return '';
  const r = spawnSync('nsenter', [`--mount=${pin}`, 'cat', '/proc/self/mountinfo'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`nsenter --mount=${pin}: ${r.stderr}`);
  return r.stdout;
}

/** PIDs of processes whose command line matches `pattern` (pgrep -f), this process excluded. */
export function pgrep(pattern) {
  return new Promise((resolve, reject) => {
    execFile('pgrep', ['-f', pattern], (err, stdout) => {
      if (err && err.code === 1) return resolve([]); // no match
      if (err) return reject(err);
      resolve(stdout.split('\n').filter(Boolean).map(Number).filter((pid) => pid !== process.pid));
    });
  });
}

/**
 * The runtime id sandbox `id` runs under: a sandbox served from the warm pool keeps the id it was
 * pre-started with, and the node records the API id in <data-dir>/sandboxes/<runtime id>/sandbox-id.
 * Falls back to `id` itself.
 */
export function runtimeIdOf(dir, id) {
  return handedOut(dir, id) ?? id;
}

/** The runtime id under which the node with data dir `dir` holds sandbox `id`, or null. */
export function handedOut(dir, id) {
  const root = path.join(dir, 'sandboxes');
  for (const rid of fs.readdirSync(root)) {
    try {
      if (fs.readFileSync(path.join(root, rid, 'sandbox-id'), 'utf8').trim() === id) return rid;
    } catch {
      // not handed out yet
    }
  }
  return fs.existsSync(path.join(root, id)) ? id : null;
}

/**
 * Wait until the API reports sandbox `id` gone (SandboxNotFoundError from getInfo); the 503 of a
 * sandbox a restarted server is still recovering means not yet.
 */
export async function waitSandboxGone(sdkOpts, id, what, timeoutMs = 15_000) {
  await waitFor(
    async () => {
      try {
        await Sandbox.getInfo(id, sdkOpts);
        return false;
      } catch (err) {
        if (err instanceof SandboxNotFoundError) return true;
        if (err.name === 'ServiceBusyError') return false;
        throw err;
      }
    },
    { timeoutMs, what },
  );
}

/**
 * Sandbox.getInfo of a sandbox a restarted server may still be recovering: until it is back it
 * answers 503 (ServiceBusyError), which this waits out.
 */
export async function getInfoRecovered(id, sdkOpts, timeoutMs = 60_000) {
  let info;
  await waitFor(
    async () => {
      try {
        info = await Sandbox.getInfo(id, sdkOpts);
        return true;
      } catch (err) {
        if (err.name === 'ServiceBusyError') return false;
        throw err;
      }
    },
    { timeoutMs, intervalMs: 200, what: `sandbox ${id} to be recovered after the restart` },
  );
  return info;
}

/**
 * Run `script` in a child node process with `env` (Node reads NODE_EXTRA_CA_CERTS only at start)
 * and return { code, stdout, stderr }; the child is killed after timeoutMs.
 */
export async function runNodeChild(script, env, { args = [], timeoutMs = 180_000 } = {}) {
  return runChild([process.execPath, ...args, script], { cwd: E2E_DIR, env, timeoutMs });
}

/** Run argv to its exit and return { code, stdout, stderr }; the child is killed after timeoutMs. */
export async function runChild(argv, { cwd, env = process.env, timeoutMs = 180_000 } = {}) {
  const child = spawn(argv[0], argv.slice(1), { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const code = await new Promise((resolve) => child.on('exit', (c, s) => resolve(c ?? s)));
  clearTimeout(timer);
  return { code, stdout, stderr };
}

/** The samples of a Prometheus text exposition at url: { 'name{labels}': value }. */
export async function scrapeMetrics(url) {
  const res = await fetch(url);
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/plain/);
  const out = {};
  for (const line of (await res.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$/.exec(line);
    assert.ok(m, `an exposition line that does not parse: ${line}`);
    out[m[1]] = Number(m[2]);
  }
  return out;
}

/** The boot record (boot.json) the node wrote for sandbox runtime `rid`. */
export function bootRecordOf(dataDir, rid) {
  return JSON.parse(fs.readFileSync(path.join(dataDir, 'sandboxes', rid, 'boot.json'), 'utf8'));
}

/** Whether sandbox runtime `rid` booted from a root image rather than an overlay. */
export function onRootImage(dataDir, rid) {
  return Boolean(bootRecordOf(dataDir, rid).runtime.RootImage);
}

/**
 * Host bytes the writable disk of sandbox runtime `rid` takes: its disk image on an overlay, or,
 * on a root image, the unlinked layer file in <data>/root-layers its runsc-sandbox holds open.
 */
export async function sandboxDiskBytes(dataDir, rid) {
  if (!onRootImage(dataDir, rid)) return fs.statSync(path.join(dataDir, 'sandboxes', rid, 'disk.img')).blocks * 512;
  const layers = `${path.join(dataDir, 'root-layers')}/`;
  let bytes = 0;
  let found = 0;
  for (const pid of await pgrep(rid)) {
    let fds = [];
    try {
      if (!fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('runsc-sandbox\0')) continue;
      fds = fs.readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue; // gone meanwhile
    }
    for (const fd of fds) {
      const link = `/proc/${pid}/fd/${fd}`;
      try {
        if (!fs.readlinkSync(link).startsWith(layers)) continue;
        bytes += fs.statSync(link).blocks * 512;
        found++;
      } catch {
        // closed meanwhile
      }
    }
  }
  if (found === 0) throw new Error(`sandbox ${rid} on a root image holds no layer file in ${layers}`);
  return bytes;
}
