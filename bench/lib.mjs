// Shared helpers of the benchmark scripts: the e2b SDK (from test/e2e's pinned node_modules),
// SDK options from the environment run.sh sets, timing and percentiles, process helpers.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

export const BENCH_DIR = path.dirname(fileURLToPath(import.meta.url));
export const REPO_ROOT = path.resolve(BENCH_DIR, '..');
export const E2E_DIR = path.join(REPO_ROOT, 'test', 'e2e');

// Keep the SDK hermetic: everything it needs is passed as options (as test/e2e/lib/harness.js does).
for (const k of ['E2B_DEBUG', 'E2B_DOMAIN', 'E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  delete process.env[k];
}

/** The official e2b SDK, resolved from test/e2e/node_modules (e2b@2.51.0, pinned there). */
export function loadSdk() {
  const require = createRequire(path.join(E2E_DIR, 'package.json'));
  const sdk = require('e2b');
  let version = '?';
  try {
    version = JSON.parse(fs.readFileSync(path.join(E2E_DIR, 'node_modules', 'e2b', 'package.json'), 'utf8')).version;
  } catch {
    /* reported as ? */
  }
  return { ...sdk, sdkVersion: version };
}

/** SDK options in header mode (plain HTTP on 127.0.0.1), from run.sh's environment. */
export function sdkOpts() {
  const url = process.env.VMON_BENCH_URL;
  const keyFile = process.env.VMON_BENCH_KEY_FILE;
  if (!url || !keyFile) throw new Error('VMON_BENCH_URL and VMON_BENCH_KEY_FILE must be set (run bench/run.sh)');
  const u = new URL(url);
  if (u.hostname !== '127.0.0.1') throw new Error(`refusing non-loopback URL ${url}`);
  const apiKey = fs.readFileSync(keyFile, 'utf8').trim();
  return { apiKey, apiUrl: url, sandboxUrl: url, requestTimeoutMs: 60_000 };
}

export const now = () => performance.now();
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Nearest-rank percentile (q in 0..1) of an array of numbers. */
export function percentile(values, q) {
  if (!values.length) return null;
  const s = [...values].sort((a, b) => a - b);
  const rank = Math.max(1, Math.ceil(q * s.length));
  return s[rank - 1];
}

/** min/p50/p95/max/mean of a sample, rounded to 0.1 ms. */
export function stats(values) {
  const r = (x) => (x == null ? null : Math.round(x * 10) / 10);
  if (!values.length) return { n: 0, min: null, p50: null, p95: null, max: null, mean: null };
  return {
    n: values.length,
    min: r(Math.min(...values)),
    p50: r(percentile(values, 0.5)),
    p95: r(percentile(values, 0.95)),
    max: r(Math.max(...values)),
    mean: r(values.reduce((a, b) => a + b, 0) / values.length),
  };
}

export function writeJson(file, obj) {
  fs.writeFileSync(file, JSON.stringify(obj, null, 2) + '\n');
}

/** Parse `--key value` / `--flag` arguments into an object (numbers stay strings). */
export function parseArgs(argv) {
  const out = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a.startsWith('--')) {
      const k = a.slice(2);
      if (i + 1 < argv.length && !argv[i + 1].startsWith('--')) out[k] = argv[++i];
      else out[k] = true;
    } else out._.push(a);
  }
  return out;
}

/**
 * Run a command to completion. Resolves { code, signal, stdout, stderr }; never rejects on a
 * non-zero exit (callers decide). `timeoutMs` bounds it (SIGKILL afterwards).
 */
export function run(cmd, args, { stdio, env, detached = false, timeoutMs = 60_000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, {
      stdio: stdio ?? ['ignore', 'pipe', 'pipe'],
      env: env ?? process.env,
      detached,
    });
    let stdout = '';
    let stderr = '';
    child.stdout?.on('data', (c) => (stdout += c));
    child.stderr?.on('data', (c) => (stderr += c));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

/** Like run() but throws on a non-zero exit, with stderr in the message. */
export async function runOk(cmd, args, opts) {
  const r = await run(cmd, args, opts);
  if (r.code !== 0) {
    throw new Error(`${cmd} ${args.join(' ')} exited ${r.code ?? r.signal}: ${(r.stderr || r.stdout).trim().slice(-800)}`);
  }
  return r;
}

/** Every process whose command line contains `needle` (all of them without one): [{ pid, argv }]. */
export function processesMatching(needle = '') {
  const out = [];
  for (const ent of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(ent)) continue;
    let raw;
    try {
      raw = fs.readFileSync(`/proc/${ent}/cmdline`, 'utf8');
    } catch {
      continue;
    }
    if (!raw || !raw.includes(needle)) continue;
    const argv = raw.replace(/\0+$/, '').split('\0');
    out.push({ pid: Number(ent), argv });
  }
  return out;
}

/** A "Field:   N kB" value of a /proc file in bytes, or null. */
export function procKb(file, field) {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+)\\s+kB`, 'm').exec(fs.readFileSync(file, 'utf8'));
    return m ? Number(m[1]) * 1024 : null;
  } catch {
    return null;
  }
}

export const MiB = 1024 * 1024;
