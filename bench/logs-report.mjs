// Prints the figures of bench/logs.sh from its output directory: commands.run('true') with sandbox
// logs on and off (samples of every round pooled), and the log query benchmark.
//
//   node bench/logs-report.mjs OUT
import fs from 'node:fs';
import path from 'node:path';
import { stats, writeJson } from './lib.mjs';

const out = process.argv[2];
if (!out) {
  console.error('usage: node bench/logs-report.mjs OUT');
  process.exit(2);
}
const pooled = { on: [], off: [] };
for (const f of fs.readdirSync(out)) {
  const m = /^exec-(on|off)-\d+\.json$/.exec(f);
  if (m) pooled[m[1]].push(...JSON.parse(fs.readFileSync(path.join(out, f), 'utf8')).samplesMs);
}
const on = stats(pooled.on);
const off = stats(pooled.off);
const fmt = (s) => `n=${s.n} p50=${s.p50.toFixed(2)} ms p95=${s.p95.toFixed(2)} ms`;
console.log(`commands.run('true') with sandbox logs on : ${fmt(on)}`);
console.log(`commands.run('true') with sandbox logs off: ${fmt(off)}`);
const ratio = on.p50 / off.p50;
console.log(`p50 on/off: ${ratio.toFixed(3)} (${((ratio - 1) * 100).toFixed(1)} %; the target is at most +5 %)`);
const query = fs.existsSync(path.join(out, 'query.txt')) ? fs.readFileSync(path.join(out, 'query.txt'), 'utf8') : '';
const queries = {};
for (const line of query.split('\n')) {
  const m = /^BenchmarkQuery100k\/(\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns\/op/.exec(line);
  if (m) {
    queries[m[1]] = Number(m[2]) / 1e6;
    console.log(`query of a 100,000-entry log, ${m[1]}: ${(Number(m[2]) / 1e6).toFixed(2)} ms`);
  }
}
writeJson(path.join(out, 'report.json'), { exec: { on, off, p50Ratio: ratio }, queryMs: queries });
