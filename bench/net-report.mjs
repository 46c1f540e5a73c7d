// Prints bench/net.sh's figures table and writes its JSON summary.
//
//   node bench/net-report.mjs --dir OUT --summary FILE [--failed "names"]
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs, stats, writeJson } from './lib.mjs';

const args = parseArgs(process.argv.slice(2));
const dir = args.dir;
const readJson = (f) => {
  try {
    return JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
  } catch {
    return null;
  }
};
const meta = readJson('meta.json') ?? {};
const f1 = (x) => (x == null || Number.isNaN(x) ? '–' : Number(x).toFixed(1));
const mean = (a) => (a.length ? a.reduce((x, y) => x + y, 0) / a.length : null);

// Phase 1: the rounds of one server configuration pooled into one sample.
function creates(label) {
  const total = [];
  const create = [];
  const firstRun = [];
  const failures = [];
  for (const f of fs.readdirSync(dir).filter((f) => f.startsWith(`create-${label}-`)).sort()) {
    const j = readJson(f);
    if (!j) continue;
    total.push(...j.samplesMs.total);
    create.push(...j.samplesMs.create);
    firstRun.push(...j.samplesMs.firstRun);
    failures.push(...j.failures);
  }
  return { total: stats(total), create: stats(create), firstRun: stats(firstRun), failures };
}

// go test -bench result lines: "BenchmarkX/sub-2   50   123 ns/op   3.4 p50-ms   9.9 p99-ms".
function benchLines(file) {
  let text = '';
  try {
    text = fs.readFileSync(path.join(dir, file), 'utf8');
  } catch {
    return [];
  }
  const out = [];
  for (const line of text.split('\n')) {
    const m = line.match(/^(Benchmark\S+)\s+(\d+)\s+(.*)$/);
    if (!m) continue;
    const metrics = {};
    const parts = m[3].trim().split(/\s+/);
    for (let i = 0; i + 1 < parts.length; i += 2) metrics[parts[i + 1]] = Number(parts[i]);
    out.push({ name: m[1].replace(/-\d+$/, ''), n: Number(m[2]), metrics });
  }
  return out;
}

const pool = creates('pool');
const nopool = creates('nopool');
const attach = benchLines('attach.txt');
const tput = benchLines('throughput.txt');

const lines = [];
lines.push(`vmon networking benchmark — ${meta.startedAt ?? '?'}`);
lines.push(`command: ${meta.command ?? 'bench/net.sh'}; git ${meta.git ?? '?'}${meta.gitDirty ? ' (dirty)' : ''}; ${meta.cpus ?? '?'} CPUs; kernel ${meta.kernel ?? '?'}`);
lines.push('');
if (pool.total.n || nopool.total.n) {
  lines.push(`1. Sandbox.create() → first commands.run('true'), ms (cold boots, --warm-pool 0; ${meta.rounds ?? '?'} alternating rounds of ${meta.creates ?? '?'} sequential creates per server)`);
  lines.push('');
  lines.push('| ready link pool | n | min | p50 | p95 | max | create() p50 | first run p50 | failures |');
  lines.push('|---|---|---|---|---|---|---|---|---|');
  for (const [name, s] of [['on (default: one link per boot slot)', pool], ['off (`--net-ready-links 0`)', nopool]]) {
    lines.push(`| ${name} | ${s.total.n} | ${f1(s.total.min)} | ${f1(s.total.p50)} | ${f1(s.total.p95)} | ${f1(s.total.max)} | ${f1(s.create.p50)} | ${f1(s.firstRun.p50)} | ${s.failures.length} |`);
  }
  if (pool.total.n && nopool.total.n) {
    lines.push('');
    lines.push(`without − with the pool: p50 ${f1(nopool.total.p50 - pool.total.p50)} ms, p95 ${f1(nopool.total.p95 - pool.total.p95)} ms`);
  }
  lines.push('');
}
if (attach.length) {
  lines.push('2. Policy attach and live update with N attached links in one namespace, ms (target ≤ 10)');
  lines.push('');
  lines.push('| links | attach p50 | attach p99 | update p50 | update p99 | iterations |');
  lines.push('|---|---|---|---|---|---|');
  const by = {};
  for (const b of attach) {
    const m = b.name.match(/links=(\d+)\/(attach|update)/);
    if (!m) continue;
    by[m[1]] ??= {};
    by[m[1]][m[2]] = b;
  }
  for (const [n, r] of Object.entries(by).sort((a, b) => Number(a[0]) - Number(b[0]))) {
    lines.push(`| ${n} | ${f1(r.attach?.metrics['p50-ms'])} | ${f1(r.attach?.metrics['p99-ms'])} | ${f1(r.update?.metrics['p50-ms'])} | ${f1(r.update?.metrics['p99-ms'])} | ${r.attach?.n ?? '–'} |`);
  }
  lines.push('');
}
const tputRuns = tput.filter((b) => b.metrics['ratio-vs-plain'] != null);
const ratios = tputRuns.map((b) => b.metrics['ratio-vs-plain']);
if (tputRuns.length) {
  const row = (name, key) => {
    const v = tputRuns.map((b) => b.metrics[key]);
    return `| ${name} | ${v.length} | ${f1(mean(v))} | ${f1(Math.min(...v))} | ${f1(Math.max(...v))} |`;
  };
  lines.push(`3. TCP throughput guest → fake internet, MB/s (64 MiB per connection, ${tputRuns[0].n} per path and run, paths alternating; target policy/plain ≥ 0.9)`);
  lines.push('');
  lines.push('| path | runs | mean | min | max |');
  lines.push('|---|---|---|---|---|');
  lines.push(row('plain veth, no vmon rules', 'plain-MB/s'));
  lines.push(row('vmon<N> with an attached deny-all + allowOut policy', 'policy-MB/s'));
  lines.push('');
  lines.push(`policy/plain per run: ${ratios.map((r) => r.toFixed(2)).join(', ')}; mean ${mean(ratios)?.toFixed(2) ?? '–'}`);
  lines.push('');
}
const failed = (args.failed ?? '').trim();
if (failed) lines.push(`FAILED: ${failed}`);
lines.push(`data: ${dir}; summary: ${args.summary}`);
console.log(lines.join('\n'));

writeJson(args.summary, {
  meta,
  create: { pool, nopool },
  attach,
  throughput: { runs: tput, ratios, meanRatio: mean(ratios) },
  failed: failed ? failed.split(/\s+/) : [],
});
if (!pool.total.n && !nopool.total.n && !attach.length && !tputRuns.length) process.exit(1);
